"""Probe: loops over private arrays vs fully unrolled register blocks (dev/compiler_probes/).

    python dev/compiler_probes/matmul_probe.py [--out DIR]

Times the three kernels of dev/compiler_probes/matmul_probe.wgsl with GPU timestamps and prints
TFLOP/s: whether the tiled matmuls' plateau comes from how the inner block is written
(private arrays indexed in loops the driver may keep in local memory) rather than from
memory traffic.
"""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from dev.probes.probe_timing import probe_setup, time_entry_points, write_json  # noqa: E402


def main(argv=None) -> int:
    args, dev = probe_setup(__doc__, argv)
    code = (REPO / "dev" / "probes" / "matmul_probe.wgsl").read_text()
    groups, iters = (16, 256) if dev.info.is_software else (132 * 16, 8192)
    out = dev.empty(groups * 256)
    params = dev.uniform("IIII", iters, 0, 0, 0)
    flops = groups * 256 * iters * 64 * 2
    rows = time_entry_points(dev, code, [(name, [out, params], groups, flops, {})
                                         for name in ("probe_loops", "probe_unrolled",
                                                      "probe_regs")], "matmul probe")
    write_json(args.out, "matmul_probe.json", {"adapter": dev.info.name, "rows": rows})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
