"""`istanbul serve`'s process layout sized to the machine: what `auto` means for `--workers`,
`--gpu-processes` and `--gpu-keep-clock`.

    layout = resolve_layout(workers="auto", gpu_processes="auto", keep_clock_s="auto",
                            gpu_process="shared", software=False, cores=16)
    layout.workers, layout.gpu_processes, layout.keep_clock_s    # 12, 2, 2.0

On software Vulkan the "GPU" is the CPU the workers would run on: one process serves best.
On a hardware GPU request handling (gRPC, protobuf, batching) is what runs out of CPU first,
so the workers take three quarters of the cores (at most 12: more measured no faster,
dev/service_throughput/README.md), two shared GPU processes feed the GPU when there are 8
workers or more
(one GPU process's Python thread is what large requests wait for), and the clock keeper
holds the GPU's clock up for 2 s after a request (GPUs idle at a low clock that a
tokenizer's load alone never raises). The measurements behind these numbers are in
bench/results/<machine>/service.md.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

AUTO = "auto"
MAX_AUTO_WORKERS = 12
TWO_GPU_PROCESSES_FROM = 8      # workers from which `auto` runs two GPU processes
KEEP_CLOCK_S = 2.0


@dataclass(frozen=True)
class Layout:
    workers: int
    gpu_processes: int
    keep_clock_s: float
    chosen: tuple[str, ...]      # the flags `auto` decided, e.g. ("--workers 12", ...)

    def describe(self, software: bool, cores: int) -> str:
        """One start-up line: the layout and, for what `auto` picked, why."""
        text = (f"--workers {self.workers} --gpu-processes {self.gpu_processes} "
                f"--gpu-keep-clock {self.keep_clock_s:g}")
        if self.chosen:
            where = "software Vulkan" if software else "a hardware GPU"
            text += f" ({', '.join(self.chosen)} chosen by auto: {where}, {cores} cores)"
        return text


def usable_cores() -> int:
    """CPU cores this process may run on (its affinity mask, e.g. a container's cpuset)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def auto_workers(software: bool, cores: int) -> int:
    if software:
        return 1
    return max(1, min(MAX_AUTO_WORKERS, cores * 3 // 4))


def resolve_layout(*, workers, gpu_processes, keep_clock_s, gpu_process: str,
                   software: bool, cores: int) -> Layout:
    """Each of `workers`, `gpu_processes`, `keep_clock_s` is a value or AUTO; AUTO is sized
    to the machine as the module says. Explicit values are returned as given (the CLI checks
    them together)."""
    chosen = []
    if workers == AUTO:
        workers = auto_workers(software, cores)
        chosen.append(f"--workers {workers}")
    shared = workers >= 2 and gpu_process == "shared"
    if gpu_processes == AUTO:
        gpu_processes = 2 if shared and not software and workers >= TWO_GPU_PROCESSES_FROM else 1
        chosen.append(f"--gpu-processes {gpu_processes}")
    if keep_clock_s == AUTO:
        keep_clock_s = KEEP_CLOCK_S if shared and not software else 0.0
        chosen.append(f"--gpu-keep-clock {keep_clock_s:g}")
    return Layout(int(workers), int(gpu_processes), float(keep_clock_s), tuple(chosen))
