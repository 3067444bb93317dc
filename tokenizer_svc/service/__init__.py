"""The gRPC tokenizer service (istanbul.tokenizer.v1.Tokenizer, and tei.v1.Tokenize) on the
server's own GPU device, and its Python client.

A Tokenize call, top-down (one concept per module):

- `servicer`: the RPCs (protobuf in, jobs to the batcher, protobuf out); `tei`: tei.v1.Tokenize
  on the same batcher;
- `batcher`: the dynamic batcher (coalesces concurrent requests into one GPU call);
- `work`: what one batch does with the Encoding (`BatchRunner`), in this process or through
  the GPU process;
- `gpu_worker`: a worker's side of the hop to the group's GPU process (`RemoteEncoding`:
  sends a batch's call, waits for its answer);
- `gpu_wire`: the messages and their framing between the two processes;
- `gpu_process`: the GPU process: its loop (`GpuHost`) that answers every worker's calls with
  one Encoding, and its main;
- `long_lane`: expensive documents, one at a time, on a device of their own.

Around it:

- `config`: every setting (`ServerConfig`, `Limits`, `BatchingConfig`) with its default;
- `errors`: `RequestRejected`, the one way a request fails with a status and a reason;
- `limits`: the per-request limit checks;
- `auth`, `metrics`, `logs`, `health`: bearer tokens, Prometheus, JSON logs, grpc.health.v1;
- `app`: `TokenizerServer`, the lifecycle (bind, load, health, drain, stop);
- `door`: what a drain does before grpc's stop(), so that no call ends CANCELLED;
- `ports`: one-line errors for a port that cannot be bound;
- `process`: one server process (signals, port file, start-up errors);
- `workers`: `serve --workers N`, N processes on one port under a supervisor;
- `child`: what each process the supervisor spawns does first;
- `clock_keeper`, `event_loop`, `sizing`: GPU clocks between bursts, the asyncio loop, what
  `auto` means for `istanbul serve`'s process layout on this machine;
- `background`: a server on a thread of its own, for tests and embedded use;
- `cli`: `istanbul serve` and `istanbul health`;
- `client`: `TokenizerClient`, the Python client shaped like `tiktoken.Encoding`;
  `client_options`: the `--tokenizer HOST:PORT` options of the commands that use it;
- `rpc/`: the generated gRPC code (from proto/).

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
