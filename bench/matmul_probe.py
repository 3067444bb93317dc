"""Probe: loops over private arrays vs fully unrolled register blocks (bench/probes/).

    python bench/matmul_probe.py [--out DIR]

Times the three kernels of bench/probes/matmul_probe.wgsl with GPU timestamps and prints
TFLOP/s: whether the tiled matmuls' plateau comes from how the inner block is written
(private arrays indexed in loops the driver may keep in local memory) rather than from
memory traffic.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from shaders.engine import Device, Kernel  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path)
    ap.add_argument("--adapter")
    args = ap.parse_args()
    dev = Device(args.adapter)
    code = (REPO / "bench" / "probes" / "matmul_probe.wgsl").read_text()
    module = dev.raw.create_shader_module(code=code)
    software = dev.info.is_software
    groups, iters = (16, 256) if software else (132 * 16, 8192)
    out = dev.empty(groups * 256)
    params = dev.uniform("IIII", iters, 0, 0, 0)
    rows = {}
    for name in ("probe_loops", "probe_unrolled", "probe_regs"):
        pipe = dev.raw.create_compute_pipeline(layout="auto",
                                               compute={"module": module, "entry_point": name})
        kern = Kernel(dev, "probe", name, {}, pipe)
        seconds = dev.time_gpu(lambda rec: rec.dispatch(kern, [out, params], groups), repeats=5)
        flops = groups * 256 * iters * 64 * 2
        rows[name] = {"us": seconds * 1e6, "tflops": flops / seconds / 1e12}
        print(f"{name:<16} {seconds * 1e6:10.1f} us {flops / seconds / 1e12:8.2f} TFLOP/s", flush=True)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "matmul_probe.json").write_text(json.dumps(
            {"adapter": dev.info.name, "rows": rows}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
