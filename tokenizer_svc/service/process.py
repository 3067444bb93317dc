"""One server process: `istanbul serve` without --workers, and each worker of a group.

Loads the vocabulary on the GPU (after the port is bound, health NOT_SERVING meanwhile),
drains on SIGTERM/SIGINT (a second signal exits at once), writes the port file, tells a
supervisor (workers.py) when it listens and when it serves, and turns every way of failing
to start into one `UserFacingError` line.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
from pathlib import Path

from istanbul_errors import UserFacingError

from .app import TokenizerServer
from .config import ServerConfig
from .ports import PortUnavailable


GPU_HOST_CONNECT_S = 600.0   # a worker waits this long for the GPU process to load and listen


async def serve(config: ServerConfig, vocab: str, adapter, port_file: Path | None,
                 on_listening=None, gpu_host: tuple | None = None) -> int:
    """Serve until drained; `gpu_host` (address, key): the batches run in the group's GPU
    process (gpu_process.py), this process's own device serves the long lane."""
    def load():
        from istanbul.shaders.engine import Device
        from ..encoding import get_encoding
        from ..gpu_backend import ROBUSTNESS
        device = Device(adapter, robustness=ROBUSTNESS)
        encoding = get_encoding(vocab, device=device)
        if gpu_host is not None:
            from .gpu_worker import RemoteEncoding
            encoding = RemoteEncoding(encoding, *gpu_host)
            encoding.connect(GPU_HOST_CONNECT_S)
        return encoding, device

    server = TokenizerServer(config, load=load)
    loop = asyncio.get_running_loop()
    draining = []

    def on_signal(signum):
        log = logging.getLogger("tokenizer_svc.service")
        log.info("signal", extra={"data": {"signal": signal.Signals(signum).name}})
        if not draining:
            draining.append(loop.create_task(server.drain()))
        else:  # a second signal while draining: stop now, in-flight requests or not
            log.warning("second signal: exiting without finishing in-flight requests")
            os._exit(1)

    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, on_signal, signum)
    try:
        port = await server.start()
    except PortUnavailable as exc:
        raise UserFacingError(str(exc)) from None
    except OSError as exc:
        raise UserFacingError(f"cannot listen on {config.address}: {exc}") from None
    if port_file is not None:
        tmp = port_file.with_name(port_file.name + ".tmp")
        tmp.write_text(f"{port}\n")
        tmp.replace(port_file)
    if on_listening is not None:   # a worker tells its supervisor (workers.py)
        on_listening("listening", port, server.metrics_port)

        async def tell_ready():
            await server.ready.wait()
            on_listening("ready", port, server.metrics_port)
        notify = loop.create_task(tell_ready())
    await server.wait_stopped()
    if on_listening is not None:
        notify.cancel()
    if draining:
        await draining[0]
    if server.stuck_workers:   # a GPU call that never returns: do not wait for it at exit
        logging.getLogger("tokenizer_svc.service").error(
            "exiting with GPU workers still busy", extra={"data": {
                "workers": server.stuck_workers}})
        logging.shutdown()
        os._exit(1)
    if server.load_error is not None:
        await server.drain(grace_s=0)
        raise UserFacingError(f"could not load vocabulary {vocab!r} on the GPU: "
                              f"{server.load_error}")
    return 0
