"""Timing shared by the FMA-block probes (dev/compiler_probes/: matmul, h16, slice probes).

Each probe writes one WGSL module with several entry points (variants of one register block);
`time_entry_points` compiles each entry point, times one dispatch of it with GPU timestamps
(median of 5 after the engine's warm-up), prints a row of microseconds and TFLOP/s, and
returns {name: {"us", "tflops", ...}} for the probe's JSON.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from istanbul.shaders.engine import Device, Kernel


def probe_setup(doc: str, argv=None):
    """(args, device) from a probe's command line: --out DIR (for its JSON), --adapter A."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--out", type=Path, help="write the probe's JSON into this folder")
    ap.add_argument("--adapter", help="GPU adapter: index or name substring")
    args = ap.parse_args(argv)
    return args, Device(args.adapter)


def time_entry_points(dev, code: str, entries, label: str = "probe") -> dict:
    """`entries`: (name, resources, workgroups, flops, extra fields for the row) per entry
    point of the module `code`, timed in that order."""
    module = dev.raw.create_shader_module(label=label, code=code)
    rows = {}
    for name, resources, groups, flops, extra in entries:
        pipe = dev.raw.create_compute_pipeline(layout="auto",
                                               compute={"module": module, "entry_point": name})
        kern = Kernel(dev, label, name, {}, pipe)
        seconds = dev.time_gpu(lambda rec: rec.dispatch(kern, resources, groups),
                               repeats=5, warmup=1)
        rows[name] = {"us": seconds * 1e6, "tflops": flops / seconds / 1e12, **extra}
        print(f"{name:<22} {seconds * 1e6:10.1f} us {rows[name]['tflops']:8.2f} TFLOP/s",
              flush=True)
    return rows


def write_json(out_dir: Path | None, name: str, payload: dict) -> None:
    if out_dir:
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / name).write_text(json.dumps(payload, indent=2) + "\n")
