"""The gRPC tokenizer service (istanbul.tokenizer.v1.Tokenizer, and tei.v1.Tokenize) on the
server's own GPU device.

One concept per module:

- `config`: every setting (`ServerConfig`, `Limits`, `BatchingConfig`) with its default;
- `errors`: `RequestRejected`, the one way a request fails with a status and a reason;
- `limits`: the per-request limit checks;
- `batcher`: the dynamic batcher (coalesces concurrent requests into one GPU call);
- `work`: what one batch does with the Encoding (`BatchRunner`);
- `servicer`: the RPCs (protobuf in, jobs to the batcher, protobuf out);
- `tei`: tei.v1.Tokenize (text-embeddings-inference's tokenizer API) on the same batcher;
- `long_lane`: expensive documents, one at a time, on a device of their own;
- `auth`, `metrics`, `logs`, `health`: bearer tokens, Prometheus, JSON logs, grpc.health.v1;
- `app`: `TokenizerServer`, the lifecycle (bind, load, health, drain, stop);
- `door`: what a drain does before grpc's stop(), so that no call ends CANCELLED;
- `ports`: one-line errors for a port that cannot be bound;
- `process`: one server process (signals, port file, start-up errors);
- `workers`: `serve --workers N`, N processes on one port under a supervisor;
- `gpu_host`: the group's GPU process, which runs every worker's batches (`RemoteEncoding`);
- `child`: what each process the supervisor spawns does first;
- `background`: a server on a thread of its own, for tests and embedded use;
- `sizing`: what `auto` means for `istanbul serve`'s process layout on this machine.

The names below load on first use, so that a command which only reads the settings (the CLI
building its parser) does not import gRPC.
"""

import importlib

_EXPORTS = {"TokenizerServer": "app", "BackgroundServer": "background",
            "BatchingConfig": "config", "Limits": "config", "ServerConfig": "config"}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
