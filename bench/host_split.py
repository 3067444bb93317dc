"""Where the host's time goes in one tokenizer call: wall and the calling thread's own CPU per
step, and how many wgpu calls the call made.

    with HostSplit() as split:
        enc.encode_batch_flat(docs)
    print(split.table())          # markdown: step | calls | wall ms | own CPU ms
    split.as_dict()               # the same numbers, for JSON

It wraps (for the `with` block only, in every thread) the wgpu-native methods a call makes —
buffer and bind-group creation, queue writes, submits, the map wait, mapped reads — and the
steps of the encoder and decoder (istanbul.shaders.kernels.bpe: encode, decode; encoding's
packing).
Each wrapper adds wall seconds (time.perf_counter) and the calling thread's CPU seconds
(time.thread_time): lavapipe runs the "GPU" in driver threads, so wall minus own CPU of a
step is time the caller spent waiting. Steps nest (a chunk's dispatch includes its submit);
`table()` lists them inclusive, in the order given below. The wrappers cost ~1 us per call,
so the counts are exact and the times slightly high for steps made of many small calls.
"""

from __future__ import annotations

import functools
import threading
import time
from dataclasses import dataclass

# (module, class or None, attribute, step name). Module paths are imported lazily.
WGPU = "wgpu.backends.wgpu_native._api"
ENCODE = "istanbul.shaders.kernels.bpe.encode"
DECODE = "istanbul.shaders.kernels.bpe.decode"
STEPS = [
    ("tokenizer_svc.encoding", None, "_pack_utf8", "prep: pack documents (join + encode)"),
    (ENCODE, "GpuEncoder", "_split_oversize", "prep: split oversize docs"),
    (ENCODE, "_Chunk", "__init__", "chunk: upload (host writes)"),
    (ENCODE, "_Chunk", "dispatch", "chunk: record + submit"),
    (ENCODE, "_Chunk", "wait", "chunk: map + wait (+ slow path)"),
    (ENCODE, "GpuEncoder", "_finish_slow", "chunk: slow path"),
    (ENCODE, "GpuEncoder", "_collect_start", "chunk: copy ids out (start)"),
    (ENCODE, "GpuEncoder", "_collect_finish", "chunk: copy ids out (wait)"),
    ("tokenizer_svc.encoding", "Encoding", "decode_bytes_batch", "decode: decode_bytes_batch"),
    ("tokenizer_svc.encoding", "Encoding", "decode_bytes_batch_flat",
     "decode: decode_bytes_batch_flat"),
    (DECODE, "GpuDecoder", "decode_docs", "decode: GpuDecoder.decode_docs"),
    (DECODE, "GpuDecoder", "_call", "decode: one device call"),
    (DECODE, "GpuDecoder", "_mapped_upload", "decode: ids upload (mapped)"),
    (DECODE, None, "_document_bytes", "decode: bytes out per document"),
    (WGPU, "GPUDevice", "create_buffer", "wgpu: create_buffer"),
    (WGPU, "GPUDevice", "create_bind_group", "wgpu: create_bind_group"),
    (WGPU, "GPUDevice", "create_command_encoder", "wgpu: create_command_encoder"),
    (WGPU, "GPUComputePassEncoder", "dispatch_workgroups", "wgpu: dispatch_workgroups"),
    (WGPU, "GPUCommandEncoder", "copy_buffer_to_buffer", "wgpu: copy_buffer_to_buffer"),
    (WGPU, "GPUQueue", "write_buffer", "wgpu: queue.write_buffer"),
    (WGPU, "GPUQueue", "submit", "wgpu: queue.submit"),
    (WGPU, "GPUQueue", "read_buffer", "wgpu: queue.read_buffer (submit + map + copy)"),
    (WGPU, "GPUPromise", "sync_wait", "wgpu: promise.sync_wait (map wait)"),
    (WGPU, "GPUBuffer", "read_mapped", "wgpu: buffer.read_mapped"),
    (WGPU, "GPUBuffer", "unmap", "wgpu: buffer.unmap"),
]


@dataclass
class Step:
    calls: int = 0
    wall_s: float = 0.0
    cpu_s: float = 0.0


class HostSplit:
    """Context manager: per-step counts, wall and own-CPU seconds of the calls in its block."""

    def __init__(self, steps=STEPS):
        self.steps = steps
        self.stats = {name: Step() for *_, name in steps}
        self.wall_s = self.cpu_s = 0.0
        self._saved: list = []
        self._lock = threading.Lock()

    def __enter__(self) -> "HostSplit":
        import importlib
        for module, cls, attr, name in self.steps:
            owner = importlib.import_module(module)
            if cls is not None:
                owner = getattr(owner, cls)
            own = attr in vars(owner)   # else inherited: wrap here, delete on exit
            original = getattr(owner, attr)
            self._saved.append((owner, attr, original if own else None))
            setattr(owner, attr, self._wrap(original, self.stats[name]))
        self._t0, self._c0 = time.perf_counter(), time.thread_time()
        return self

    def __exit__(self, *exc) -> None:
        self.wall_s = time.perf_counter() - self._t0
        self.cpu_s = time.thread_time() - self._c0
        for owner, attr, original in reversed(self._saved):
            if original is None:
                delattr(owner, attr)
            else:
                setattr(owner, attr, original)
        self._saved.clear()

    def _wrap(self, fn, step: Step):
        lock = self._lock

        @functools.wraps(fn)
        def timed(*args, **kwargs):
            t0, c0 = time.perf_counter(), time.thread_time()
            try:
                return fn(*args, **kwargs)
            finally:
                wall, cpu = time.perf_counter() - t0, time.thread_time() - c0
                with lock:
                    step.calls += 1
                    step.wall_s += wall
                    step.cpu_s += cpu
        return timed

    def as_dict(self) -> dict:
        return {"wall_s": self.wall_s, "own_cpu_s": self.cpu_s,
                "steps": {name: {"calls": s.calls, "wall_s": s.wall_s, "own_cpu_s": s.cpu_s}
                          for name, s in self.stats.items() if s.calls}}

    def table(self, per_call: int = 1) -> str:
        """Markdown table; `per_call` divides the numbers (the block ran that many calls)."""
        d = per_call
        lines = ["| step (inclusive) | calls | wall ms | own CPU ms |", "|---|---:|---:|---:|",
                 f"| whole block | {d} | {self.wall_s / d * 1e3:.3f} | "
                 f"{self.cpu_s / d * 1e3:.3f} |"]
        for name, s in self.stats.items():
            if s.calls:
                lines.append(f"| {name} | {s.calls / d:g} | {s.wall_s / d * 1e3:.3f} | "
                             f"{s.cpu_s / d * 1e3:.3f} |")
        return "\n".join(lines)
