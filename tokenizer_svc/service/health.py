"""grpc.health.v1 health checking whose Watch streams end when the server drains.

grpc's reference servicer keeps every Watch stream open until the server's shutdown grace
period runs out, so one load-balancer watch would hold a SIGTERM for the whole grace. Here a
watch sees NOT_SERVING and then ends, and shutdown waits only for real work.
"""

from __future__ import annotations

import asyncio

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

Status = health_pb2.HealthCheckResponse


class HealthServicer(health_pb2_grpc.HealthServicer):
    def __init__(self):
        self._status: dict = {"": Status.NOT_SERVING}
        self._changed: asyncio.Condition | None = None  # created on the server's loop
        self.draining = False

    def _condition(self) -> asyncio.Condition:
        if self._changed is None:
            self._changed = asyncio.Condition()
        return self._changed

    async def set(self, service: str, status) -> None:
        if self.draining:
            return
        async with self._condition():
            self._status[service] = status
            self._condition().notify_all()

    async def enter_graceful_shutdown(self) -> None:
        """Every service NOT_SERVING for good; open watches report it and end."""
        async with self._condition():
            self.draining = True
            for service in self._status:
                self._status[service] = Status.NOT_SERVING
            self._condition().notify_all()

    async def Check(self, request, context):
        status = self._status.get(request.service)
        if status is None:
            await context.abort(grpc.StatusCode.NOT_FOUND,
                                f"unknown service {request.service!r}")
        return Status(status=status)

    async def Watch(self, request, context):
        last = None
        while True:
            async with self._condition():
                status = self._status.get(request.service, Status.SERVICE_UNKNOWN)
                if status == last and not self.draining:
                    await self._condition().wait()
                    continue
            if status != last:
                await context.write(Status(status=status))
                last = status
            if self.draining:
                return
