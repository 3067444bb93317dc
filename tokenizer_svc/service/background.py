"""A TokenizerServer on a thread with its own event loop: for tests and embedded use.

    with BackgroundServer(ServerConfig(host="127.0.0.1", port=0), encoding=enc) as server:
        client = TokenizerClient(server.target)
"""

from __future__ import annotations

import asyncio
import threading

from .app import TokenizerServer
from .config import ServerConfig
from .event_loop import new_loop


class BackgroundServer:
    def __init__(self, config: ServerConfig, **server_kwargs):
        self.config = config
        self._server_kwargs = server_kwargs
        self.server: TokenizerServer | None = None
        self.loop = new_loop(config.event_loop)
        self._thread = threading.Thread(target=self.loop.run_forever, name="tokenizer-server",
                                        daemon=True)

    def start(self, wait_ready: bool = True, timeout: float = 300.0) -> "BackgroundServer":
        self._thread.start()

        async def start():
            self.server = TokenizerServer(self.config, **self._server_kwargs)
            await self.server.start()

        self.run(start(), timeout)
        if wait_ready:
            self.wait_ready(timeout)
        return self

    def run(self, coro, timeout: float | None = None):
        """Run a coroutine on the server's loop and return its result."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def wait_ready(self, timeout: float = 300.0) -> None:
        async def ready():
            done = asyncio.ensure_future(self.server.ready.wait())
            stopped = asyncio.ensure_future(self.server.wait_stopped())
            await asyncio.wait({done, stopped}, return_when=asyncio.FIRST_COMPLETED)
            done.cancel()
            stopped.cancel()
            if self.server.load_error is not None:
                raise RuntimeError(f"the tokenizer server failed to load: "
                                   f"{self.server.load_error}") from self.server.load_error
        self.run(ready(), timeout)

    @property
    def port(self) -> int:
        return self.server.port

    @property
    def target(self) -> str:
        host = self.config.host
        if host in ("0.0.0.0", "::", "[::]"):
            host = "127.0.0.1"
        return f"{host}:{self.port}"

    def stop(self, grace_s: float | None = 5.0) -> None:
        if not self._thread.is_alive():
            return
        try:
            if self.server is not None:
                self.run(self.server.drain(grace_s), timeout=(grace_s or 0) + 60)
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(timeout=30)
            if not self._thread.is_alive():
                self.loop.close()

    def __enter__(self) -> "BackgroundServer":
        return self if self._thread.is_alive() else self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
