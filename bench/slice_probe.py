"""Probe: what in a matmul's K-slice loop costs the written-out f32 block its speed?

    python bench/slice_probe.py [--out DIR] [--adapter A]

bench/h16_probe.py measured the f32 8x8 register block with 16 k-steps written out at ~49.5
TFLOP/s on the H200 (37.4 as a plain loop) with operands from workgroup memory and nothing
else; the generated matmuls, which add a slice loop with barriers, workgroup stores and global
prefetch loads around the same block, lost speed when written out (bench/unroll_probe.py).
Each kernel here adds one of those parts to the probe's block (256 invocations, 16 x 16, an
8x8 block each, two workgroup stages of S k-rows x 33 vec4s per operand):

    written         S = 16 k-steps written out per slice, nothing else
    written_bar     + a workgroup barrier per slice
    written_stash   + two vec4 stores into the other stage per slice, then the barrier
    written_global  + two global vec4 loads per slice issued before the math (prefetch
                    registers), stored into the other stage after it, then the barrier:
                    the generated matmul's slice loop
    loop_global     written_global with the S k-steps as a plain loop
    written_global8 / loop_global8   the same with S = 8 (the tuned BK on the H200)
    short8          written_global8 with the LM head's workgroup lifetime: 96 slices (K 768)
                    per workgroup and 12x the workgroups
    fetch8          written_global8 with the matmul's bounds-checked fetch (row/column
                    index arithmetic, uniform bounds, a leading dimension)
    store8          short8 with the matmul's epilogue: 16 bounds-checked vec4 stores with the
                    mode switch, instead of one scalar
    all8 / all8_loop   all of these together, with the S k-steps written out / as a loop
    tstash8         all8 with the matmul's transposing stash of k-contiguous operands (nt's A
                    and B: four scalar stores per vec4)
    lmhead8         all8 with the LM head's operand traffic: A rows of the m tile, B rows of
                    the n tile from a 128 MiB buffer (beyond L2), n tiles fastest
    real8 / real8_loop   both: the generated nt matmul's slice loop as closely as the probe
                    gets (compare with the real kernel: 34.9 TFLOP/s as a loop, 32.0 written
                    out at the LM head)
    real8_ptr       real8 with the generated kernels' loop form (`As[ai]; ... ai += SA;`)

Writes DIR/slice_probe.json when --out is given.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import numpy as np  # noqa: E402

from bench.probe_timing import time_entry_points, write_json  # noqa: E402
from shaders.engine import Device  # noqa: E402

C = "xyzw"
SRC_VEC4S = 1 << 20      # 16 MiB of global operands (stays in L2 like a matmul's tiles)
OUT_VEC4S = 1 << 20      # results wrap around a 16 MiB buffer (only the timing matters)
BIG_VEC4S = 1 << 23      # 128 MiB standing in for the LM head's 154 MB weight (beyond L2)
HEADER = """\
struct Params { iters: u32, m: u32, k: u32, mode: u32 }
@group(0) @binding(0) var<storage, read_write> out: array<vec4<f32>>;
@group(0) @binding(1) var<uniform> p: Params;
@group(0) @binding(2) var<storage, read> src: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read> src_b: array<vec4<f32>>;
var<workgroup> As: array<vec4<f32>, 2u * 16u * 33u>;
var<workgroup> Bs: array<vec4<f32>, 2u * 16u * 33u>;

fn fill(lid: u32) {
    for (var i = lid; i < 2u * 16u * 33u; i += 256u) {
        As[i] = vec4<f32>(f32(i % 64u) * 1e-3, 0.5, 0.25, 0.125);
        Bs[i] = vec4<f32>(0.999, 1e-4, f32(i % 64u) * 1e-4, 0.5);
    }
    workgroupBarrier();
}
"""


def _step(k) -> list[str]:
    """One k-step (k: an int for a written-out step, "kk" in a loop, "ptr" in a loop over
    running indices) of the 8x8 block from stage `base`: two row vec4s and two column vec4s,
    16 vec4 FMAs."""
    if k == "ptr":     # the generated kernels' form: running indices ai / bi
        out = ["let a0 = As[ai]; let a1 = As[ai + 16u];",
               "let b0 = Bs[bi]; let b1 = Bs[bi + 16u];"]
    else:
        row = f"base + {k}u * 33u" if isinstance(k, int) else "base + kk * 33u"
        out = [f"let a0 = As[{row} + ty]; let a1 = As[{row} + ty + 16u];",
               f"let b0 = Bs[{row} + tx]; let b1 = Bs[{row} + tx + 16u];"]
    for g in range(2):
        for r in range(4):
            for h in range(2):
                i = (g * 4 + r) * 2 + h
                out.append(f"c{i} = fma(vec4<f32>(a{g}.{C[r]}), b{h}, c{i});")
    return out


def _transposed_stash(array: str, value: str, steps: int) -> list[str]:
    """03_linear_reg.wgsl's stash of a k-contiguous operand (nt's A and B): the vec4 of four
    consecutive k of one row goes into four k-rows of the stage as scalars."""
    return ["{",
            f"    let m = lid / {steps // 4}u;",
            f"    let row = other + 4u * (lid % {steps // 4}u) * 33u + m / 4u;",
            "    let c = m % 4u;",
            f"    {array}[row][c] = {value}.x;",
            f"    {array}[row + 33u][c] = {value}.y;",
            f"    {array}[row + 66u][c] = {value}.z;",
            f"    {array}[row + 99u][c] = {value}.w;",
            "}"]


def _kernel(name: str, steps: int, written, barrier: bool, stash: bool,
            global_loads: bool, real_fetch: bool = False, real_store: bool = False,
            transposed: bool = False, lm_head: bool = False) -> str:
    """One probe kernel; `written`: True (the S k-steps written out), False (a loop indexing
    `base + kk * 33`) or "ptr" (a loop over running indices, as the generated kernels)."""
    body = [f"var c{i} = vec4<f32>();" for i in range(16)]
    body += ["var pa = vec4<f32>(); var pb = vec4<f32>();"]
    body += [f"for (var it = 0u; it < p.iters; it += {steps}u) {{",
             f"    let stage = (it / {steps}u) % 2u;",
             "    let base = stage * 16u * 33u;"]
    if lm_head:        # the LM head's operands: A rows of the m tile, B rows of the n tile
        body += ["    {",
                 "        let m = (wg / 393u) * 128u + lid / 2u;",
                 "        let n = (wg % 393u) * 128u + lid / 2u;",
                 "        let k = it + 4u * (lid % 2u);",
                 f"        pa = src[(m * 192u + k / 4u) & {SRC_VEC4S - 1}u];",
                 f"        pb = src_b[(n * 192u + k / 4u) & {BIG_VEC4S - 1}u];",
                 "    }"]
    elif real_fetch:     # 03_linear_reg.wgsl's fetch_a/fetch_b for a 128-row tile, BK = steps
        body += ["    {",
                 f"        let m = (wg % 64u) * 128u + lid / {steps // 4}u;",
                 f"        let k = it + 4u * (lid % {steps // 4}u);",
                 "        pa = vec4<f32>(); pb = vec4<f32>();",
                 "        if (m < p.m && k < p.k) {",
                 f"            let g = (m * (768u / 4u) + k / 4u) & {SRC_VEC4S - 1}u;",
                 "            pa = src[g]; pb = src[g ^ 256u];",
                 "        }",
                 "    }"]
    elif global_loads:   # prefetch: issued before the math, consumed after it
        body += ["    let g = ((wg * 7919u + it) * 512u + lid) & " f"{SRC_VEC4S - 1}u;",
                 "    pa = src[g]; pb = src[g ^ 256u];"]
    if written == "ptr":
        body += ["    var ai = base + ty;", "    var bi = base + tx;",
                 f"    for (var kk = 0u; kk < {steps}u; kk++) {{"]
        body += ["        " + s for s in _step("ptr") + ["ai += 33u;", "bi += 33u;"]] + ["    }"]
    elif written:
        for k in range(steps):
            body += ["    {"] + ["        " + s for s in _step(k)] + ["    }"]
    else:
        body += [f"    for (var kk = 0u; kk < {steps}u; kk++) {{"]
        body += ["        " + s for s in _step("kk")] + ["    }"]
    if stash:
        value_a = "pa" if global_loads else "vec4<f32>(f32(it))"
        value_b = "pb" if global_loads else "vec4<f32>(f32(it) * 0.5)"
        body += ["    let other = (1u - stage) * 16u * 33u;"]
        if transposed:
            body += ["    " + line for line in _transposed_stash("As", value_a, steps)
                     + _transposed_stash("Bs", value_b, steps)]
        else:
            body += [f"    As[other + (lid / 32u) * 33u + lid % 32u] = {value_a};",
                     f"    Bs[other + (lid / 32u) * 33u + lid % 32u] = {value_b};"]
    if barrier:
        body += ["    workgroupBarrier();"]
    body += ["}"]
    if real_store:     # 03_linear_reg.wgsl's store_c4 for the 16 vec4s of an 8x8 block
        for g in range(2):
            for r in range(4):
                for h in range(2):
                    i = (g * 4 + r) * 2 + h
                    body += ["{",
                             f"    let row = (wg % 64u) * 128u + 4u * ty + {64 * g + r}u;",
                             f"    let col = 4u * tx + {64 * h}u;",
                             "    if (row < p.m && col < 768u) {",
                             f"        let o = (row * 192u + col / 4u) & {OUT_VEC4S - 1}u;",
                             "        if (p.mode == 1u) {",
                             f"            out[o] = out[o] + c{i};",
                             "        } else {",
                             f"            out[o] = c{i};",
                             "        }",
                             "    }",
                             "}"]
    else:
        body += ["let s = " + " + ".join(f"c{i}" for i in range(16)) + ";",
                 f"out[gid.x & {OUT_VEC4S - 1}u] = s;"]
    return ("@compute @workgroup_size(256)\n"
            f"fn {name}(@builtin(global_invocation_id) gid: vec3<u32>,\n"
            "        @builtin(workgroup_id) wgid: vec3<u32>,\n"
            "        @builtin(local_invocation_index) lid: u32) {\n"
            "    fill(lid);\n    let wg = wgid.x;\n    let tx = lid % 16u;\n    let ty = lid / 16u;\n"
            + "".join(f"    {line}\n" for line in body) + "}\n")


# name: (steps per slice, written out, barrier, stash, global loads, matmul fetch, matmul
# epilogue), k-steps per workgroup (None: the default), workgroups per default workgroup
VARIANTS = {
    "written": ((16, True, False, False, False), None, 1),
    "written_bar": ((16, True, True, False, False), None, 1),
    "written_stash": ((16, True, True, True, False), None, 1),
    "written_global": ((16, True, True, True, True), None, 1),
    "loop_global": ((16, False, True, True, True), None, 1),
    "written_global8": ((8, True, True, True, True), None, 1),
    "loop_global8": ((8, False, True, True, True), None, 1),
    "short8": ((8, True, True, True, True), 768, 12),
    "fetch8": ((8, True, True, True, True, True), None, 1),
    "store8": ((8, True, True, True, True, False, True), 768, 12),
    "all8": ((8, True, True, True, True, True, True), 768, 12),
    "all8_loop": ((8, False, True, True, True, True, True), 768, 12),
    "tstash8": ((8, True, True, True, True, True, True, True), 768, 12),
    "lmhead8": ((8, True, True, True, True, False, True, False, True), 768, 12),
    "real8": ((8, True, True, True, True, False, True, True, True), 768, 12),
    "real8_loop": ((8, False, True, True, True, False, True, True, True), 768, 12),
    "real8_ptr": ((8, "ptr", True, True, True, False, True, True, True), 768, 12),
}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path)
    ap.add_argument("--adapter")
    args = ap.parse_args(argv)
    dev = Device(args.adapter)
    code = HEADER + "\n".join(_kernel(n, *v[0]) for n, v in VARIANTS.items())
    base_groups, base_iters = (8, 256) if dev.info.is_software else (132 * 16, 8192)
    out = dev.empty(OUT_VEC4S * 4)
    src = dev.upload(np.full(SRC_VEC4S * 4, 1e-3, np.float32))
    src_b = dev.zeros(BIG_VEC4S * 4, np.float32)
    print(f"# {dev.info.summary()}: {base_groups} workgroups x 256 invocations x "
          f"{base_iters} k-steps unless a row says otherwise")
    entries = []
    for name, (variant, iters, more) in VARIANTS.items():
        iters = min(iters or base_iters, base_iters)
        groups = base_groups * more
        # m: every row in bounds (64 row tiles of 128), k: every k-step, mode 0 (store)
        params = dev.uniform("IIII", iters, 64 * 128, iters, 0)
        lm_head = len(variant) > 8 and variant[8]
        resources = ([out, params, src, src_b] if lm_head else
                     [out, params, src] if variant[4] else [out, params])
        entries.append((name, resources, groups, groups * 256 * iters * 64 * 2,
                        {"groups": groups, "iters": iters}))
    rows = time_entry_points(dev, code, entries, "slice probe")
    write_json(args.out, "slice_probe.json", {"adapter": dev.info.name, "rows": rows})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
