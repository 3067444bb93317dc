"""The ranks' process group: a `torch.distributed` Gloo group on loopback, collectives on numpy.

    group = RankGroup.create(rank=0, world=2, port=store_port)   # every rank, same port
    group.all_reduce_sum(array)           # in place, float32 / float64
    obj = group.broadcast_object(obj)     # rank 0's object on every rank
    group.close()

Rank 0 hosts the rendezvous (a TCPStore on 127.0.0.1: ranks of one job share a host, one
process per GPU); the store also carries a rank's last words (`report_error`), so a rank that
failed on bad input (a model that does not fit its GPU) fails the job at once instead of being
retried. Any collective that fails (a peer died: its sockets close; or nothing arrived within
`timeout_s`) raises `RankFailed`, a transient job error: the daemon re-queues the job, and the
next attempt starts a fresh group from the last checkpoint.
"""

from __future__ import annotations

import datetime
import json

import numpy as np

from istanbul_errors import UserFacingError

from .. import settings
from ..jobs.failures import JobInputError, TransientJobError

COLLECTIVE_TIMEOUT_S = 600.0   # a rank silent this long (a hung GPU) fails the step
JOIN_TIMEOUT_S = 180.0         # rank processes import torch and open a device first
ERROR_KEY = "istanbul/rank_error/{rank}"


class DistributedUnavailable(UserFacingError):
    """PyTorch (the process groups) is not installed."""


class RankFailed(TransientJobError):
    """A collective did not complete: a rank died, hung or lost its connection."""


def torch_distributed():
    """`torch.distributed`, or a clear error naming the extra to install."""
    try:
        import torch
        import torch.distributed as dist
    except ImportError:
        raise DistributedUnavailable(
            "training one job on several GPUs (gpus > 1, --gpus) needs PyTorch for its process "
            "groups: pip install 'istanbul[ddp]' (the CPU build is enough: only Gloo is used)"
        ) from None
    if not dist.is_available() or not dist.is_gloo_available():
        raise DistributedUnavailable(f"this PyTorch build ({torch.__version__}) has no Gloo "
                                     "backend; install the standard wheel: pip install "
                                     "'istanbul[ddp]'")
    return torch, dist


class RankGroup:
    """This process's membership in one job's group of `world` ranks."""

    def __init__(self, rank: int, world: int, store, torch, dist):
        self.rank, self.world, self.store = rank, world, store
        self._torch, self._dist = torch, dist
        self.describe_failure = lambda: ""   # rank 0: what the launcher knows (exit codes)

    @classmethod
    def host_store(cls, world: int):
        """Rank 0: the rendezvous store on a free loopback port (`store.port`)."""
        _, dist = torch_distributed()
        return dist.TCPStore("127.0.0.1", 0, world, True, wait_for_workers=False,
                             timeout=datetime.timedelta(seconds=JOIN_TIMEOUT_S))

    @classmethod
    def create(cls, rank: int, world: int, port: int | None = None, store=None,
               timeout_s: float = COLLECTIVE_TIMEOUT_S) -> "RankGroup":
        """Join the group (blocks until all `world` ranks have joined)."""
        torch, dist = torch_distributed()
        if dist.is_initialized():
            raise RuntimeError("this process already belongs to a process group; close it "
                               "first (one job at a time per process)")
        if store is None:
            store = dist.TCPStore("127.0.0.1", int(port), world, False,
                                  timeout=datetime.timedelta(seconds=JOIN_TIMEOUT_S))
        # ranks of a job share a host: Gloo's own sockets on loopback too (unless chosen)
        settings.write("GLOO_SOCKET_IFNAME", settings.read("GLOO_SOCKET_IFNAME"))
        dist.init_process_group("gloo", store=store, rank=rank, world_size=world,
                                timeout=datetime.timedelta(seconds=timeout_s))
        return cls(rank, world, store, torch, dist)

    def close(self) -> None:
        if self._dist.is_initialized():
            self._dist.destroy_process_group()

    # ---- collectives (each raises RankFailed when a peer is gone) ----------------------

    def _run(self, what: str, fn, *args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except RuntimeError as exc:   # DistBackendError, DistNetworkError: peers gone or late
            raise self.failure(f"{what} failed on rank {self.rank}: "
                               f"{str(exc).splitlines()[0][:300]}") from exc

    def failure(self, message: str) -> Exception:
        """The error for a failed collective: a rank's reported error when one was left in
        the store (its own classification: bad input fails the job), else RankFailed."""
        reported = self.reported_errors()
        for rank, info in sorted(reported.items()):
            text = f"rank {rank} failed: {info['message']}"
            if info.get("deterministic"):
                return JobInputError(text)
            message += f"; {text}"
        extra = self.describe_failure()
        return RankFailed(message + (f"; {extra}" if extra else ""))

    def broadcast_object(self, obj=None):
        """Rank 0's (small, picklable) `obj` on every rank."""
        box = [obj]
        self._run("broadcast", self._dist.broadcast_object_list, box, src=0)
        return box[0]

    def broadcast_array(self, array: np.ndarray) -> None:
        """Rank 0's contents into `array` on every rank (in place; contiguous)."""
        self._run("broadcast", self._dist.broadcast, self._torch.from_numpy(array), src=0)

    def all_reduce_sum(self, array: np.ndarray, async_op: bool = False):
        """Element-wise sum over the ranks, in place; with async_op a handle to `.wait()`."""
        work = self._run("all-reduce", self._dist.all_reduce, self._torch.from_numpy(array),
                         async_op=async_op)
        return _Pending(self, work) if async_op else None

    def all_gather_object(self, obj) -> list:
        out = [None] * self.world
        self._run("all-gather", self._dist.all_gather_object, out, obj)
        return out

    # ---- a rank's last words -----------------------------------------------------------

    def report_error(self, exc: BaseException) -> None:
        report_error(self.store, self.rank, exc)

    def reported_errors(self) -> dict[int, dict]:
        found = {}
        for rank in range(self.world):
            key = ERROR_KEY.format(rank=rank)
            try:
                if self.store.check([key]):
                    found[rank] = json.loads(self.store.get(key))
            except Exception:   # noqa: BLE001 - store unreachable: nothing to add
                break
        return found


def report_error(store, rank: int, exc: BaseException) -> None:
    """Leave a rank's error for rank 0 (best effort: the store may be gone with rank 0)."""
    from ..jobs.failures import is_deterministic
    info = {"message": f"{type(exc).__name__}: {exc}"[:2000],
            "deterministic": is_deterministic(exc)}
    try:
        store.set(ERROR_KEY.format(rank=rank), json.dumps(info))
    except Exception:   # noqa: BLE001 - the group is going down anyway
        pass


class _Pending:
    """An asynchronous collective; `wait()` raises RankFailed like the blocking ones."""

    def __init__(self, group: RankGroup, work):
        self.group, self.work = group, work

    def wait(self) -> None:
        self.group._run("all-reduce", self.work.wait)
