"""Probe: what in a matmul's K-slice loop costs the written-out f32 block its speed?

    python dev/compiler_probes/slice_probe.py [--out DIR] [--adapter A]

dev/compiler_probes/h16_probe.py measured the f32 8x8 register block with 16 k-steps written out at ~49.5
TFLOP/s on the H200 (37.4 as a plain loop) with operands from workgroup memory and nothing
else; the generated matmuls, which add a slice loop with barriers, workgroup stores and global
prefetch loads around the same block, lost speed when written out (dev/compiler_probes/unroll_probe.py).
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

import sys
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

import numpy as np  # noqa: E402

from dev.probes.probe_timing import probe_setup, time_entry_points, write_json  # noqa: E402

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


@dataclass(frozen=True)
class Variant:
    """One probe kernel: what its slice loop holds, and how it is dispatched."""

    steps: int                   # S, k-steps per slice (one workgroup stage)
    written: object = True       # True: written out; False: a loop indexing base + kk * 33;
    #                              "ptr": a loop over running indices (the generated kernels')
    barrier: bool = True         # a workgroup barrier per slice
    stash: bool = True           # two vec4s stored into the other stage per slice
    global_loads: bool = True    # two global vec4 loads per slice, before the math
    real_fetch: bool = False     # ... with the matmul's bounds-checked index arithmetic
    real_store: bool = False     # the matmul's epilogue instead of one scalar store
    transposed: bool = False     # the stash of k-contiguous operands (four scalar stores)
    lm_head: bool = False        # the LM head's operand traffic, beyond L2
    iters: int | None = None     # k-steps per workgroup (None: the default)
    more: int = 1                # workgroups per default workgroup


def _kernel(name: str, v: Variant) -> str:
    """The WGSL of one probe kernel (entry point `name`)."""
    steps, written = v.steps, v.written
    body = [f"var c{i} = vec4<f32>();" for i in range(16)]
    body += ["var pa = vec4<f32>(); var pb = vec4<f32>();"]
    body += [f"for (var it = 0u; it < p.iters; it += {steps}u) {{",
             f"    let stage = (it / {steps}u) % 2u;",
             "    let base = stage * 16u * 33u;"]
    if v.lm_head:        # the LM head's operands: A rows of the m tile, B rows of the n tile
        body += ["    {",
                 "        let m = (wg / 393u) * 128u + lid / 2u;",
                 "        let n = (wg % 393u) * 128u + lid / 2u;",
                 "        let k = it + 4u * (lid % 2u);",
                 f"        pa = src[(m * 192u + k / 4u) & {SRC_VEC4S - 1}u];",
                 f"        pb = src_b[(n * 192u + k / 4u) & {BIG_VEC4S - 1}u];",
                 "    }"]
    elif v.real_fetch:     # 03_linear_reg.wgsl's fetch_a/fetch_b for a 128-row tile, BK = steps
        body += ["    {",
                 f"        let m = (wg % 64u) * 128u + lid / {steps // 4}u;",
                 f"        let k = it + 4u * (lid % {steps // 4}u);",
                 "        pa = vec4<f32>(); pb = vec4<f32>();",
                 "        if (m < p.m && k < p.k) {",
                 f"            let g = (m * (768u / 4u) + k / 4u) & {SRC_VEC4S - 1}u;",
                 "            pa = src[g]; pb = src[g ^ 256u];",
                 "        }",
                 "    }"]
    elif v.global_loads:   # prefetch: issued before the math, consumed after it
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
    if v.stash:
        value_a = "pa" if v.global_loads else "vec4<f32>(f32(it))"
        value_b = "pb" if v.global_loads else "vec4<f32>(f32(it) * 0.5)"
        body += ["    let other = (1u - stage) * 16u * 33u;"]
        if v.transposed:
            body += ["    " + line for line in _transposed_stash("As", value_a, steps)
                     + _transposed_stash("Bs", value_b, steps)]
        else:
            body += [f"    As[other + (lid / 32u) * 33u + lid % 32u] = {value_a};",
                     f"    Bs[other + (lid / 32u) * 33u + lid % 32u] = {value_b};"]
    if v.barrier:
        body += ["    workgroupBarrier();"]
    body += ["}"]
    if v.real_store:     # 03_linear_reg.wgsl's store_c4 for the 16 vec4s of an 8x8 block
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
            "    fill(lid);\n    let wg = wgid.x;\n"
            "    let tx = lid % 16u;\n    let ty = lid / 16u;\n"
            + "".join(f"    {line}\n" for line in body) + "}\n")


LM_HEAD = {"iters": 768, "more": 12}   # 96 slices of 8 per workgroup, 12x the workgroups
VARIANTS = {
    "written": Variant(16, barrier=False, stash=False, global_loads=False),
    "written_bar": Variant(16, stash=False, global_loads=False),
    "written_stash": Variant(16, global_loads=False),
    "written_global": Variant(16),
    "loop_global": Variant(16, written=False),
    "written_global8": Variant(8),
    "loop_global8": Variant(8, written=False),
    "short8": Variant(8, **LM_HEAD),
    "fetch8": Variant(8, real_fetch=True),
    "store8": Variant(8, real_store=True, **LM_HEAD),
    "all8": Variant(8, real_fetch=True, real_store=True, **LM_HEAD),
    "all8_loop": Variant(8, written=False, real_fetch=True, real_store=True, **LM_HEAD),
    "tstash8": Variant(8, real_fetch=True, real_store=True, transposed=True, **LM_HEAD),
    "lmhead8": Variant(8, real_store=True, lm_head=True, **LM_HEAD),
    "real8": Variant(8, real_store=True, transposed=True, lm_head=True, **LM_HEAD),
    "real8_loop": Variant(8, written=False, real_store=True, transposed=True, lm_head=True,
                          **LM_HEAD),
    "real8_ptr": Variant(8, written="ptr", real_store=True, transposed=True, lm_head=True,
                         **LM_HEAD),
}


def main(argv=None) -> int:
    args, dev = probe_setup(__doc__, argv)
    code = HEADER + "\n".join(_kernel(n, v) for n, v in VARIANTS.items())
    base_groups, base_iters = (8, 256) if dev.info.is_software else (132 * 16, 8192)
    out = dev.empty(OUT_VEC4S * 4)
    src = dev.upload(np.full(SRC_VEC4S * 4, 1e-3, np.float32))
    src_b = dev.zeros(BIG_VEC4S * 4, np.float32)
    print(f"# {dev.info.summary()}: {base_groups} workgroups x 256 invocations x "
          f"{base_iters} k-steps unless a row says otherwise")
    entries = []
    for name, v in VARIANTS.items():
        iters = min(v.iters or base_iters, base_iters)
        groups = base_groups * v.more
        # m: every row in bounds (64 row tiles of 128), k: every k-step, mode 0 (store)
        params = dev.uniform("IIII", iters, 64 * 128, iters, 0)
        resources = ([out, params, src, src_b] if v.lm_head else
                     [out, params, src] if v.global_loads else [out, params])
        entries.append((name, resources, groups, groups * 256 * iters * 64 * 2,
                        {"groups": groups, "iters": iters}))
    rows = time_entry_points(dev, code, entries, "slice probe")
    write_json(args.out, "slice_probe.json", {"adapter": dev.info.name, "rows": rows})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
