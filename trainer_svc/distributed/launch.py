"""Starting a job's group: one adapter per rank, ranks 1..N-1 as child processes.

    adapters = rank_adapters(4)                      # ["0", "1", "2", "3"]: one GPU each
    group, ranks = launch_group(4, adapters)         # this process is rank 0 (adapters[0])
    ...
    ranks.stop()

Rank processes run `python -m trainer_svc.distributed.worker` with their adapter index; each
opens its own device. Their stdin is a pipe from rank 0: when rank 0 dies (even by SIGKILL)
the pipe closes and they exit, so no orphan keeps a GPU. Their output goes to a log file whose
tail is quoted when a rank fails.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from istanbul_errors import UserFacingError

from ..jobs.failures import JobInputError
from .group import ERROR_KEY, JOIN_TIMEOUT_S, RankFailed, RankGroup

log = logging.getLogger(__name__)

READY_KEY = "istanbul/rank_ready/{rank}"
# A failed collective waits this long for a dead peer's exit status before describing it.
FAILURE_GRACE_S = 3.0


def rank_adapters(world: int, adapters: list[str] | None = None,
                  backend: str | None = None) -> list[str]:
    """One adapter (an index or name, as `--adapter` takes) per rank.

    `adapters` given: its first `world` entries. Else the first `world` hardware GPUs of the
    backend's list (`istanbul devices`); on a machine with no GPU at all every rank gets the
    software adapter (lavapipe: the ranks share the CPU; right for tests, slow for training).
    """
    if world < 1:
        raise UserFacingError(f"--gpus must be at least 1, got {world}")
    if adapters:
        if len(adapters) < world:
            raise UserFacingError(f"--adapters names {len(adapters)} adapter(s) for {world} "
                                  "GPUs; name one per GPU")
        return [str(a) for a in adapters[:world]]
    from istanbul.shaders import backends
    from istanbul.shaders.adapters import enumerate_adapters
    choice = backends.requested(backend)
    if choice == "auto":
        choice = "dawn" if backends.dawn_installed() else "wgpu"
    try:
        infos = [info for info, _ in enumerate_adapters(choice)]
    except Exception:   # noqa: BLE001 - Dawn refusing the driver: wgpu-native's list
        infos = [info for info, _ in enumerate_adapters("wgpu")]
    hardware = [info for info in infos if not info.is_software]
    if len(hardware) >= world:
        return [str(info.index) for info in hardware[:world]]
    if not hardware and infos:
        return [str(infos[0].index)] * world
    raise UserFacingError(
        f"--gpus {world}: this machine has {len(hardware)} GPU(s) "
        f"({'; '.join(i.summary() for i in hardware) or 'none'}); lower --gpus or name the "
        "adapters with --adapters")


class RankProcesses:
    """The child processes of ranks 1..N-1."""

    def __init__(self, procs: list[subprocess.Popen], logs: list[Path], log_dir):
        self.procs, self.logs, self._log_dir = procs, logs, log_dir

    def dead(self) -> list[tuple[int, int]]:
        """(rank, exit code) of each rank process that has exited."""
        return [(r + 1, p.returncode) for r, p in enumerate(self.procs) if p.poll() is not None]

    def describe(self) -> str:
        """What happened to the ranks that exited, with the tail of their log."""
        parts = []
        for rank, code in self.dead():
            how = f"killed by {signal.Signals(-code).name}" if code < 0 else f"exit code {code}"
            tail = _tail(self.logs[rank - 1])
            parts.append(f"rank {rank} process {how}" + (f" (log: {tail})" if tail else ""))
        return "; ".join(parts)

    def describe_failure(self, grace_s: float = FAILURE_GRACE_S) -> str:
        """`describe()` for a failed collective: a killed peer's sockets close before its exit
        status can be read (the kernel closes files first), so wait up to `grace_s` for a
        rank process to be seen exiting before saying what happened."""
        deadline = time.monotonic() + grace_s
        while not self.dead() and time.monotonic() < deadline:
            time.sleep(0.02)
        return self.describe()

    def stop(self, timeout: float = 30.0, told: bool = False) -> None:
        """Reap the ranks: `told` (they got "stop") waits for them to exit on their own;
        then their stdin closes (a rank still waiting for commands exits on EOF); a rank
        still alive at `timeout` is killed."""
        deadline = time.monotonic() + timeout
        if told:
            for p in self.procs:
                try:
                    p.wait(timeout=max(0.1, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    break
        for p in self.procs:
            if p.stdin is not None:
                try:
                    p.stdin.close()
                except OSError:
                    pass
        for p in self.procs:
            try:
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(timeout=10)
        if self._log_dir is not None:
            self._log_dir.cleanup()
            self._log_dir = None


def _tail(path: Path, lines: int = 6) -> str:
    try:
        text = path.read_text(errors="replace").strip().splitlines()
    except OSError:
        return ""
    return " | ".join(text[-lines:])[-1500:]


def launch_group(world: int, adapters: list[str], backend: str | None = None,
                 join_timeout_s: float = JOIN_TIMEOUT_S) -> tuple[RankGroup, RankProcesses]:
    """Start ranks 1..world-1 and join them as rank 0 (this process, adapters[0])."""
    store = RankGroup.host_store(world)
    log_dir = tempfile.TemporaryDirectory(prefix="istanbul-ranks-")
    procs, logs = [], []
    for rank in range(1, world):
        path = Path(log_dir.name) / f"rank{rank}.log"
        cmd = [sys.executable, "-m", "trainer_svc.distributed.worker", "--rank", str(rank),
               "--world", str(world), "--port", str(store.port), "--adapter", adapters[rank]]
        if backend:
            cmd += ["--backend", backend]
        with open(path, "wb") as out:
            procs.append(subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=out,
                                          stderr=subprocess.STDOUT, env=dict(os.environ)))
        logs.append(path)
    ranks = RankProcesses(procs, logs, log_dir)
    try:
        _wait_ready(store, ranks, world, join_timeout_s)
        group = RankGroup.create(0, world, store=store)
    except BaseException:
        ranks.stop(timeout=1.0)
        raise
    group.describe_failure = ranks.describe_failure
    log.info("group of %d ranks up (adapters %s)", world, ", ".join(adapters))
    return group, ranks


def _wait_ready(store, ranks: RankProcesses, world: int, timeout_s: float) -> None:
    """Until every rank has opened its device; a rank that exits first fails the launch
    with its own error (bad input: JobInputError) or its log."""
    keys = [READY_KEY.format(rank=r) for r in range(1, world)]
    deadline = time.monotonic() + timeout_s
    while not store.check(keys):
        for rank, _ in ranks.dead():
            key = ERROR_KEY.format(rank=rank)
            if store.check([key]):
                info = json.loads(store.get(key))
                text = f"rank {rank} could not start: {info['message']}"
                raise JobInputError(text) if info.get("deterministic") else RankFailed(text)
            raise RankFailed(f"rank {rank} could not start: {ranks.describe()}")
        if time.monotonic() > deadline:
            raise RankFailed(f"the rank processes did not start within {timeout_s:.0f} s")
        time.sleep(0.05)
