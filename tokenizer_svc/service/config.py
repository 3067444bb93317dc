"""Every server setting with its default; `istanbul serve` flags map onto these one to one."""

from __future__ import annotations

from dataclasses import dataclass, field

MiB = 1 << 20


@dataclass(frozen=True)
class LaneConfig:
    """The long lane (long_lane.py): documents too big or too slow for a shared batch."""

    doc_bytes: int = 256 * 1024     # a document above this runs in the long lane
    piece_bytes: int = 4096         # a document that may hold a piece this long, too (runs of
                                    # piece_bytes / 4 characters; see may_hold_long_piece)
    chunk_bytes: int = 256 * 1024   # encoded per step; cancellation is checked between steps
    max_waiting: int = 16           # long requests queued or running; more: RESOURCE_EXHAUSTED


@dataclass(frozen=True)
class Limits:
    """Per-request and server-wide limits (GetInfo reports them)."""

    max_message_bytes: int = 64 * MiB     # one request message (RESOURCE_EXHAUSTED)
    max_text_bytes: int = 16 * MiB        # one document's UTF-8 bytes (INVALID_ARGUMENT)
    max_batch_items: int = 65536          # documents or sequences in a batch request
    max_decode_ids: int = 16 * MiB        # ids in one detokenize request or batch
    max_queued_bytes: int = 512 * MiB     # input bytes accepted but not yet answered, server-wide
    max_stream_inflight: int = 256        # requests of one stream in progress at once

    def __post_init__(self):
        for name, value in self.__dict__.items():
            if int(value) < 1:
                raise ValueError(f"limit {name} must be at least 1, got {value}")


@dataclass(frozen=True)
class BatchingConfig:
    """Dynamic batching: the first request waits up to `window_s` for others to join it.

    `eager`: close a batch early when no other request is on its way (see batcher.py).
    `enabled=False` gives every request its own GPU call at once (the benchmark's baseline).
    """

    enabled: bool = True
    window_s: float = 0.002
    eager: bool = True
    max_items: int = 1024                 # documents in one GPU call
    max_bytes: int = 16 * MiB             # input bytes in one GPU call

    def __post_init__(self):
        if self.window_s < 0 or self.max_items < 1 or self.max_bytes < 1:
            raise ValueError(f"invalid batching settings {self}")

    @property
    def effective_window_s(self) -> float:
        return self.window_s if self.enabled else 0.0

    @property
    def effective_max_items(self) -> int:
        return self.max_items if self.enabled else 1


@dataclass(frozen=True)
class ServerConfig:
    host: str = "127.0.0.1"               # loopback unless told otherwise (--listen-public)
    port: int = 50051                     # 0: any free port (TokenizerServer.port tells which)
    limits: Limits = field(default_factory=Limits)
    batching: BatchingConfig = field(default_factory=BatchingConfig)
    auth_tokens: tuple = ()               # accepted bearer tokens; empty: no authentication
    tls_cert: bytes | None = None         # PEM certificate chain and key: serve TLS
    tls_key: bytes | None = None
    metrics_port: int | None = None       # Prometheus /metrics on this HTTP port (0: any free)
    metrics_host: str = "127.0.0.1"
    metrics_auth: bool = False            # /metrics also requires one of auth_tokens
    shutdown_grace_s: float = 30.0        # in-flight requests get this long to finish on SIGTERM
    drain_delay_s: float = 0.0            # NOT_SERVING this long before refusing new requests
    stall_timeout_s: float = 30.0         # a GPU worker busy this long without progress: health
                                          # NOT_SERVING (and at exit: give up waiting for it)
    long_lane: LaneConfig = field(default_factory=LaneConfig)
    reuse_port: bool = False              # bind with SO_REUSEPORT: one of several workers on
                                          # the port (workers.py); else a taken port fails
    gpu_keep_clock_s: float = 0.0         # the shared GPU process spins the GPU between
                                          # batches this long after a request (clock_keeper.py)
    event_loop: str = "auto"              # each process's asyncio loop: auto | uvloop | asyncio
                                          # (event_loop.py)

    def __post_init__(self):
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ValueError("TLS needs both a certificate and a key")
        if self.metrics_auth and not self.auth_tokens:
            raise ValueError("metrics authentication needs bearer tokens (--auth-token-file)")

    @property
    def address(self) -> str:
        host = f"[{self.host}]" if ":" in self.host and not self.host.startswith("[") else self.host
        return f"{host}:{self.port}"
