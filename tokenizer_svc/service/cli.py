"""`istanbul serve` (also `python -m tokenizer_svc`): run the gRPC tokenizer service;
`istanbul health HOST:PORT`: probe one (exit 0 if SERVING; for container healthchecks).

    istanbul serve --vocab o200k_base --port 50051 [--adapter 0] [--metrics-port 9090]
    istanbul serve --vocab o200k_base --port 50051 --workers 4    # 4 processes, one port
    istanbul health 127.0.0.1:50051

The port is bound at once and answers health checks with NOT_SERVING while the GPU device
and the vocabulary load; then SERVING. SIGTERM or SIGINT drain it: health NOT_SERVING, the
calls that reached the server are answered and later ones refused UNAVAILABLE, in-flight
requests finish (up to --shutdown-grace seconds; streams still open then
end with UNAVAILABLE), exit 0; a GPU worker still busy --stall-timeout seconds later is left
behind (exit 1); a second signal exits at once.
"""

from __future__ import annotations

import argparse
import logging
import re
import sys
from pathlib import Path

from istanbul_errors import UserFacingError

from istanbul.shaders.cli import add_device_args

from ..exposure import bind_address, is_loopback
from .config import BatchingConfig, Limits, ServerConfig
from .event_loop import CHOICES as EVENT_LOOPS, resolve as resolve_event_loop
from .sizing import AUTO
from .client_options import add_client_security_arguments

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgKMG]i?[bB]?|[bB])?\s*$")
_UNITS = {"": 1, "b": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30}


def size(text: str) -> int:
    """'4096', '64KiB', '16M', '1G' -> bytes (binary units)."""
    m = _SIZE.match(text)
    if not m:
        raise argparse.ArgumentTypeError(f"{text!r} is not a size (examples: 4096, 64KiB, 16MiB)")
    unit = (m.group(2) or "")[:1].lower()
    return int(float(m.group(1)) * _UNITS[unit])


def auto_or(kind):
    """An argparse type: 'auto' or a value of `kind` (int, float)."""
    def parse(text: str):
        if text == AUTO:
            return AUTO
        try:
            return kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"{text!r} is neither 'auto' nor {'an integer' if kind is int else 'a number'}"
            ) from None
    parse.__name__ = kind.__name__   # argparse names the type in its messages
    return parse


def resolve_auto_layout(args) -> str:
    """Replace `auto` in args.workers, args.gpu_processes and args.gpu_keep_clock by values
    sized to this machine and its adapter; the start-up line that says what runs."""
    from .sizing import resolve_layout, usable_cores
    software = True
    if AUTO in (args.workers, args.gpu_processes, args.gpu_keep_clock):
        from istanbul.shaders.adapters import choose_adapter
        software = choose_adapter(args.adapter)[0].is_software
    cores = usable_cores()
    layout = resolve_layout(workers=args.workers, gpu_processes=args.gpu_processes,
                            keep_clock_s=args.gpu_keep_clock, gpu_process=args.gpu_process,
                            software=software, cores=cores)
    args.workers, args.gpu_processes = layout.workers, layout.gpu_processes
    args.gpu_keep_clock = layout.keep_clock_s
    return layout.describe(software, cores)   # (resolving again changes nothing)


def add_serve_arguments(p: argparse.ArgumentParser) -> None:
    d_limits, d_batch, d_cfg = Limits(), BatchingConfig(), ServerConfig()
    p.add_argument("--vocab", required=True, metavar="V",
                   help="vocabulary: a known name (gpt2, r50k_base, cl100k_base, o200k_base; "
                        "looked up in $ISTANBUL_VOCAB_DIR) or a .tiktoken / tokenizer.json path")
    p.add_argument("--host", default=None,
                   help="address to bind (default: 127.0.0.1; 0.0.0.0 with --listen-public)")
    p.add_argument("--listen-public", action="store_true",
                   help="listen on all interfaces (gRPC and metrics); needed for any --host or "
                        "--metrics-host that is not loopback. Pair it with --auth-token-file")
    p.add_argument("--port", type=int, default=d_cfg.port,
                   help=f"gRPC port (default {d_cfg.port}; 0: any free port, see --port-file)")
    p.add_argument("--port-file", type=Path, metavar="PATH",
                   help="write the bound port to PATH once listening")
    p.add_argument("--workers", type=auto_or(int), default=AUTO, metavar="N|auto",
                   help="server processes sharing the port (SO_REUSEPORT), each with its own "
                        "batcher: request handling on N cores. auto (default): three quarters "
                        "of the cores, at most 12, on a hardware GPU; 1 on software Vulkan "
                        "(tokenizer_svc/service/sizing.py)")
    p.add_argument("--gpu-process", choices=("shared", "per-worker"), default="shared",
                   help="with --workers N > 1: `shared` (default) runs one more process that "
                        "owns the GPU and encodes every worker's batches in common calls "
                        "(tokenizer_svc/service/gpu_process.py); `per-worker` gives each worker "
                        "a device of its own (N contexts time-slice one GPU)")
    p.add_argument("--gpu-processes", type=auto_or(int), default=AUTO, metavar="G|auto",
                   help="with --gpu-process shared: G GPU processes (each its own device on "
                        "the adapter), worker k batching through process k mod G; for large "
                        "requests, where one GPU process's Python thread is what the workers "
                        "wait for (1 <= G <= N). auto (default): 2 with 8 workers or more on "
                        "a hardware GPU, else 1")
    p.add_argument("--gpu-keep-clock", type=auto_or(float), default=AUTO,
                   metavar="SECONDS|auto",
                   help="with the shared GPU process: for this many seconds after a request, "
                        "keep a short kernel running on the GPU whenever there is nothing to "
                        "encode, so the driver keeps its clock up (GPUs idle at a low clock "
                        "and a service's bursty load may never raise it); costs the GPU's "
                        "power while in use; 0: off. auto "
                        "(default): 2 with the shared GPU process on a hardware GPU, else 0 "
                        "(tokenizer_svc/service/clock_keeper.py)")
    add_device_args(p)
    b = p.add_argument_group("dynamic batching")
    b.add_argument("--batch-window-ms", type=float, default=d_batch.window_s * 1e3,
                   help="how long the first request of a batch waits for others "
                        f"(default {d_batch.window_s * 1e3:g})")
    b.add_argument("--batch-max-docs", type=int, default=d_batch.max_items,
                   help=f"documents per GPU call (default {d_batch.max_items})")
    b.add_argument("--batch-max-bytes", type=size, default=d_batch.max_bytes,
                   help=f"input bytes per GPU call (default {d_batch.max_bytes >> 20} MiB)")
    b.add_argument("--batch-always-wait", action="store_true",
                   help="always wait out the window (default: a batch closes early when no "
                        "other request is on its way, so a lone client pays no window)")
    b.add_argument("--no-batching", action="store_true",
                   help="one GPU call per request, no waiting (for comparison)")
    lim = p.add_argument_group("limits (sizes accept KiB/MiB/GiB)")
    lim.add_argument("--max-message-bytes", type=size, default=d_limits.max_message_bytes,
                     help="one request message; larger: RESOURCE_EXHAUSTED "
                          f"(default {d_limits.max_message_bytes >> 20} MiB)")
    lim.add_argument("--max-text-bytes", type=size, default=d_limits.max_text_bytes,
                     help="one document; larger: INVALID_ARGUMENT "
                          f"(default {d_limits.max_text_bytes >> 20} MiB)")
    lim.add_argument("--max-batch-items", type=int, default=d_limits.max_batch_items,
                     help="documents/sequences in one batch request; more: INVALID_ARGUMENT "
                          f"(default {d_limits.max_batch_items})")
    lim.add_argument("--max-decode-ids", type=int, default=d_limits.max_decode_ids,
                     help=f"ids in one detokenize request (default {d_limits.max_decode_ids})")
    lim.add_argument("--max-queued-bytes", type=size, default=d_limits.max_queued_bytes,
                     help="input bytes accepted and not yet answered, server-wide; more: "
                          f"RESOURCE_EXHAUSTED (default {d_limits.max_queued_bytes >> 20} MiB)")
    lim.add_argument("--max-stream-inflight", type=int, default=d_limits.max_stream_inflight,
                     help="requests of one stream in progress at once "
                          f"(default {d_limits.max_stream_inflight})")
    sec = p.add_argument_group("security")
    sec.add_argument("--auth-token-file", type=Path, metavar="PATH",
                     help="require 'authorization: Bearer <token>' with a token from PATH (one "
                          "per line); health checks stay open")
    sec.add_argument("--metrics-auth", action="store_true",
                     help="/metrics also requires a token from --auth-token-file")
    sec.add_argument("--tls-cert", type=Path, metavar="PEM", help="serve TLS with this "
                     "certificate chain (needs --tls-key)")
    sec.add_argument("--tls-key", type=Path, metavar="PEM", help="private key for --tls-cert")
    ops = p.add_argument_group("operations")
    ops.add_argument("--metrics-port", type=int, default=None, metavar="PORT",
                     help="serve Prometheus metrics on http://HOST:PORT/metrics (0: any free "
                          "port; default: off)")
    ops.add_argument("--metrics-host", default=None, metavar="ADDR",
                     help="address of the metrics endpoint (default: 127.0.0.1; 0.0.0.0 with "
                          "--listen-public)")
    ops.add_argument("--shutdown-grace", type=float, default=d_cfg.shutdown_grace_s,
                     help="seconds in-flight requests get to finish on SIGTERM "
                          f"(default {d_cfg.shutdown_grace_s:g})")
    ops.add_argument("--drain-delay", type=float, default=d_cfg.drain_delay_s,
                     help="seconds to report NOT_SERVING before refusing new requests on "
                          "SIGTERM, so load balancers move away first (default 0)")
    ops.add_argument("--stall-timeout", type=float, default=d_cfg.stall_timeout_s,
                     help="seconds a GPU worker may work without progress before health says "
                          "NOT_SERVING; SIGTERM exits at most this long after the grace "
                          f"period (default {d_cfg.stall_timeout_s:g})")
    ops.add_argument("--event-loop", choices=EVENT_LOOPS, default=d_cfg.event_loop,
                     help="each server process's asyncio loop: `auto` (default) takes uvloop "
                          "when installed (less CPU per request: tokenizer_svc/service/"
                          "event_loop.py), else asyncio's own")
    ops.add_argument("--log-format", choices=("json", "text"), default="json",
                     help="log lines as JSON objects (default) or text")


def config_from_args(args) -> ServerConfig:
    """The ServerConfig of parsed `serve` arguments (`auto` values resolved first)."""
    from .auth import load_tokens
    resolve_auto_layout(args)
    if (args.tls_cert is None) != (args.tls_key is None):
        raise UserFacingError("--tls-cert and --tls-key go together; give both")
    tls = {}
    for flag, path in (("--tls-cert", args.tls_cert), ("--tls-key", args.tls_key)):
        if path is not None:
            try:
                tls[flag] = path.read_bytes()
            except OSError as exc:
                raise UserFacingError(f"{flag} {path}: cannot read it ({exc.strerror})") from None
    try:
        limits = Limits(max_message_bytes=args.max_message_bytes,
                        max_text_bytes=args.max_text_bytes,
                        max_batch_items=args.max_batch_items, max_decode_ids=args.max_decode_ids,
                        max_queued_bytes=args.max_queued_bytes,
                        max_stream_inflight=args.max_stream_inflight)
        batching = BatchingConfig(enabled=not args.no_batching,
                                  window_s=args.batch_window_ms / 1e3,
                                  eager=not args.batch_always_wait,
                                  max_items=args.batch_max_docs, max_bytes=args.batch_max_bytes)
    except ValueError as exc:
        raise UserFacingError(str(exc)) from None
    if args.metrics_auth and not args.auth_token_file:
        raise UserFacingError("--metrics-auth needs --auth-token-file (the tokens /metrics "
                              "accepts)")
    if not args.gpu_keep_clock >= 0:
        raise UserFacingError(f"--gpu-keep-clock must be >= 0 seconds, got {args.gpu_keep_clock}")
    from .workers import gpu_processes_problem
    problem = gpu_processes_problem(args.gpu_processes, args.workers, args.gpu_process)
    if problem:
        raise UserFacingError(problem)
    if args.gpu_keep_clock > 0 and (args.workers < 2 or args.gpu_process != "shared"):
        raise UserFacingError("--gpu-keep-clock needs the shared GPU process (--workers N with "
                              "N >= 2 and --gpu-process shared)")
    host = bind_address(args.host, "--host", public=args.listen_public)
    metrics_host = bind_address(args.metrics_host, "--metrics-host", public=args.listen_public)
    if not is_loopback(host) and not args.auth_token_file:
        logging.getLogger("tokenizer_svc.service").warning(
            "listening on %s without --auth-token-file: anyone who reaches the port can use "
            "the service", host)
    return ServerConfig(
        host=host, port=args.port, limits=limits, batching=batching,
        auth_tokens=load_tokens(args.auth_token_file) if args.auth_token_file else (),
        tls_cert=tls.get("--tls-cert"), tls_key=tls.get("--tls-key"),
        metrics_port=args.metrics_port, metrics_host=metrics_host,
        metrics_auth=args.metrics_auth,
        shutdown_grace_s=args.shutdown_grace, drain_delay_s=args.drain_delay,
        stall_timeout_s=args.stall_timeout, gpu_keep_clock_s=args.gpu_keep_clock,
        event_loop=resolve_event_loop(args.event_loop))


def cmd_serve(args) -> int:
    from .logs import setup_logging
    setup_logging(args.log_format, logging.DEBUG if getattr(args, "verbose", False)
                  else logging.INFO)
    layout = resolve_auto_layout(args)
    config = config_from_args(args)
    logging.getLogger("tokenizer_svc.service").info("serving with %s", layout)
    from .child import dump_stacks_on_sigusr1
    dump_stacks_on_sigusr1()   # this process (a server, or the supervisor); members: become_child
    if args.workers < 1:
        raise UserFacingError(f"--workers must be at least 1, got {args.workers}")
    if args.workers > 1:
        from .workers import run_workers
        from .ports import PortUnavailable
        try:
            return run_workers(config, args.vocab, args.adapter, args.port_file, args.workers,
                               args.log_format, getattr(args, "verbose", False),
                               gpu_process=args.gpu_process,
                               gpu_processes=args.gpu_processes)
        except PortUnavailable as exc:
            raise UserFacingError(str(exc)) from None
    from . import event_loop
    from .process import serve
    return event_loop.run(serve(config, args.vocab, args.adapter, args.port_file),
                          config.event_loop)


def register(sub) -> None:
    p = sub.add_parser("serve", help="run the gRPC tokenizer service on this machine's GPU",
                       description="Run the gRPC tokenizer service "
                       "(istanbul.tokenizer.v1.Tokenizer, and Hugging Face TEI's tei.v1.Tokenize "
                       "on the same port) with dynamic GPU batching, health, "
                       "reflection and Prometheus metrics. SIGTERM drains it gracefully.")
    add_serve_arguments(p)
    p.set_defaults(func=cmd_serve)

    h = sub.add_parser("health", help="probe a tokenizer service's gRPC health or a daemon's "
                       "metrics endpoint (container healthchecks): exit 0 if healthy, else 1")
    h.add_argument("target", metavar="HOST:PORT|URL",
                   help="the tokenizer service's gRPC address, or a daemon's metrics URL "
                        "(http://HOST:PORT/metrics: healthy when it answers)")
    h.add_argument("--service", default="",
                   help="service name to check (default: the whole server)")
    h.add_argument("--timeout", type=float, default=5.0, metavar="S", help="seconds")
    add_client_security_arguments(h)   # the token only adds details: health itself is open
    h.set_defaults(func=cmd_health)


def cmd_health(args) -> int:
    """grpc.health.v1 Check: print the status; 0 if SERVING (health needs no auth token).
    When GetInfo answers too (no auth, or --auth-token-file), the adapter is printed with it,
    so a healthcheck log shows a service that fell back to software Vulkan."""
    if args.target.startswith(("http://", "https://")):
        return _http_health(args)
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc
    from .rpc import tokenizer_pb2 as pb
    from .rpc import tokenizer_pb2_grpc as pb_grpc
    if args.tls or args.tls_ca:
        roots = args.tls_ca.read_bytes() if args.tls_ca else None
        channel = grpc.secure_channel(args.target, grpc.ssl_channel_credentials(roots))
    else:
        channel = grpc.insecure_channel(args.target)
    try:
        reply = health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service=args.service), timeout=args.timeout)
        details = ""
        if reply.status == health_pb2.HealthCheckResponse.SERVING:
            metadata = ()
            if args.auth_token_file:
                from .auth import load_tokens
                metadata = (("authorization", f"Bearer {load_tokens(args.auth_token_file)[0]}"),)
            try:
                info = pb_grpc.TokenizerStub(channel).GetInfo(
                    pb.GetInfoRequest(), timeout=args.timeout, metadata=metadata)
                a = info.adapter
                details = (f" (adapter {a.name}, {a.type}"
                           f"{', software Vulkan' if a.software else ''})")
            except grpc.RpcError:
                pass    # no token for GetInfo: the status alone
    except grpc.RpcError as exc:
        print(f"{args.target}: {exc.code().name}: {exc.details()}", file=sys.stderr)
        return 1
    finally:
        channel.close()
    status = health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
    print(f"{args.target}: {status}{details}")
    return 0 if reply.status == health_pb2.HealthCheckResponse.SERVING else 1


def _http_health(args) -> int:
    """A daemon's /metrics answering is its liveness (`istanbul trainer` has no gRPC port);
    the adapter gauge, when present, is printed like the service's."""
    import re
    import ssl
    import urllib.error
    import urllib.request
    request = urllib.request.Request(args.target)
    if args.auth_token_file:
        from .auth import load_tokens
        request.add_header("Authorization", f"Bearer {load_tokens(args.auth_token_file)[0]}")
    context = ssl.create_default_context(cafile=str(args.tls_ca)) if args.tls_ca else None
    try:
        with urllib.request.urlopen(request, timeout=args.timeout, context=context) as reply:
            page = reply.read().decode("utf-8", errors="replace")
    except (urllib.error.URLError, OSError) as exc:
        print(f"{args.target}: DOWN: {getattr(exc, 'reason', exc)}", file=sys.stderr)
        return 1
    found = re.search(r"^istanbul_\w+_adapter\{(.*)\} 1", page, re.M)
    details = ""
    if found:
        labels = dict(re.findall(r'(\w+)="([^"]*)"', found.group(1)))
        details = (f" (adapter {labels.get('adapter')}, {labels.get('type')}"
                   f"{', software Vulkan' if labels.get('software') == 'true' else ''})")
    print(f"{args.target}: UP{details}")
    return 0
