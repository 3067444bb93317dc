"""Probe: what limits packed-f16 matmul blocks from WGSL on this GPU?

    python dev/compiler_probes/h16_probe.py [--out DIR] [--adapter A]

The f32 register-blocked matmuls run near the f32 FMA ceiling, but the packed-f16 forward
matmul (03_linear_reg_h16.wgsl) is slower than them although vec4<f16> FMAs have twice the
throughput. Each kernel here runs one invocation's inner block for `iters` k-steps with
operands from workgroup memory (as in the matmuls) and no global traffic, and reports
TFLOP/s (2 flops per multiply-add):

    f32_8x8          16 vec4<f32> accumulators (the f32 kernel's block; the reference)
    h16_splat_fold   the h16 kernel's block: fma(vec4<f16>(a.x), b, h) into 16 vec4<f16>
                     partials, added into 16 vec4<f32> accumulators every 16 k-steps
    h16_splat_fold32 / h16_splat_fold64   the fold every 32 / 64 k-steps
    h16_two_level    16-step f16 partials summed into f16 sums, those into f32 every 64
    h16_swizzle_fold h16_splat_fold with the splat written as a .xxxx swizzle
    h16_branch_fold  the fold as `if (k % 16 == 15)` inside a single k loop
    h16_runtime_fold the nested loops with a runtime inner trip count (not unrollable)
    f32_nested       f32_8x8 written with the nested loops of the fold kernels
    f32_unrolled     f32_8x8 with 16 k-steps written out
    h16_splat_only   the same without the f32 fold (pure f16 accumulation: upper bound)
    h16_pair_fold    k-pair form, 8x4 block: per two k-steps fma(vec2 a_row, vec2 b_col)
                     into 32 vec2<f16> partials (no splats), folded into 32 f32 every 16
    h16_splat_regs   h16_splat_only with operands in registers (no workgroup loads)
    h16_unrolled_fold  h16_splat_fold with the 16 k-steps written out (no inner loop)
    h16_unrolled_pressure  h16_unrolled_fold with 8 more vec4<f32> live (prefetch registers)
    h16_half_block   rows 0-3 then 4-7 of the block per 16 k-steps: 8 f16 partials live
    h16_stagger_fold half of the partials folded every 8 k-steps (conversions overlap FMAs)
    h16_fold_8x4     h16_splat_fold with an 8x4 block (half the registers)

Needs shader-f16. Writes DIR/h16_probe.json when --out is given.
"""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from dev.probes.probe_timing import probe_setup, time_entry_points, write_json  # noqa: E402

C = "xyzw"
HEADER = """\
struct Params { iters: u32, _a: u32, _b: u32, _c: u32 }
@group(0) @binding(0) var<storage, read_write> out: array<f32>;
@group(0) @binding(1) var<uniform> p: Params;
var<workgroup> As: array<vec4<f32>, 16u * 33u>;
var<workgroup> Bs: array<vec4<f32>, 16u * 33u>;
var<workgroup> Ah: array<vec4<f16>, 16u * 33u>;
var<workgroup> Bh: array<vec4<f16>, 16u * 33u>;

fn fill_f32(lid: u32) {
    for (var i = lid; i < 16u * 33u; i += 256u) {
        As[i] = vec4<f32>(f32(i) * 1e-3, 0.5, 0.25, 0.125);
        Bs[i] = vec4<f32>(0.999, 1e-4, f32(i) * 1e-4, 0.5);
    }
    workgroupBarrier();
}

fn fill_f16(lid: u32) {
    for (var i = lid; i < 16u * 33u; i += 256u) {
        Ah[i] = vec4<f16>(f16(f32(i % 64u) * 1e-3), 0.5h, 0.25h, 0.125h);
        Bh[i] = vec4<f16>(0.999h, 1e-4h, f16(f32(i % 64u) * 1e-4), 0.5h);
    }
    workgroupBarrier();
}
"""


def _kernel(name: str, fill: str, body: list[str]) -> str:
    lines = ["@compute @workgroup_size(256)",
             f"fn {name}(@builtin(global_invocation_id) gid: vec3<u32>, "
             "@builtin(local_invocation_index) lid: u32) {",
             f"    {fill}(lid);", "    let tx = lid % 16u;", "    let ty = lid / 16u;"]
    lines += ["    " + line for line in body]
    return "\n".join(lines) + "\n}\n"


def _splat_fmas(vec: str, acc: str, swizzle: bool = False) -> list[str]:
    """16 vec4 FMAs of the 8x8 block: rows from a0/a1 (splatted: a constructor, or with
    `swizzle` a .xxxx swizzle), columns b0/b1."""
    out = []
    for g in range(2):
        for r in range(4):
            for h in range(2):
                i = (g * 4 + r) * 2 + h
                a = f"a{g}.{C[r] * 4}" if swizzle else f"{vec}(a{g}.{C[r]})"
                out.append(f"{acc}{i} = fma({a}, b{h}, {acc}{i});")
    return out


def _written_steps(loads: list[str], vec: str, acc: str) -> list[str]:
    """16 k-steps written out (kk a constant in each scope): loads, then the block's FMAs."""
    out = []
    for kk in range(16):
        out += ["    {", f"        let kk = {kk}u;"]
        out += ["        " + s for s in loads + _splat_fmas(vec, acc)] + ["    }"]
    return out


def _sum_out(names: list[str], typ: str) -> list[str]:
    return [f"let s = {' + '.join(names)};",
            "out[gid.x] = f32(s.x) + f32(s.y)" + (" + f32(s.z) + f32(s.w);" if typ == 4
                                                   else ";")]


def kernels() -> str:
    parts = [HEADER]
    loads32 = ["let kk = it % 16u;",
               "let a0 = As[kk * 33u + ty]; let a1 = As[kk * 33u + ty + 16u];",
               "let b0 = Bs[kk * 33u + tx]; let b1 = Bs[kk * 33u + tx + 16u];"]
    body = [f"var c{i} = vec4<f32>();" for i in range(16)]
    body += ["for (var it = 0u; it < p.iters; it++) {"]
    body += ["    " + s for s in loads32 + _splat_fmas("vec4<f32>", "c")] + ["}"]
    body += _sum_out([f"c{i}" for i in range(16)], 4)
    parts.append(_kernel("f32_8x8", "fill_f32", body))

    loads16 = ["let a0 = Ah[kk * 33u + ty]; let a1 = Ah[kk * 33u + ty + 16u];",
               "let b0 = Bh[kk * 33u + tx]; let b1 = Bh[kk * 33u + tx + 16u];"]
    body = [f"var c{i} = vec4<f32>();" for i in range(16)]
    body += ["for (var it = 0u; it < p.iters; it += 16u) {"]
    body += [f"    var h{i} = vec4<f16>();" for i in range(16)]
    body += ["    for (var kk = 0u; kk < 16u; kk++) {"]
    body += ["        " + s for s in loads16 + _splat_fmas("vec4<f16>", "h")] + ["    }"]
    body += [f"    c{i} += vec4<f32>(h{i});" for i in range(16)] + ["}"]
    body += _sum_out([f"c{i}" for i in range(16)], 4)
    parts.append(_kernel("h16_splat_fold", "fill_f16", body))

    for fold in (32, 64):   # fewer conversions, longer f16 partial sums
        body = [f"var c{i} = vec4<f32>();" for i in range(16)]
        body += [f"for (var it = 0u; it < p.iters; it += {fold}u) {{"]
        body += [f"    var h{i} = vec4<f16>();" for i in range(16)]
        body += [f"    for (var k2 = 0u; k2 < {fold}u; k2++) {{", "        let kk = k2 % 16u;"]
        body += ["        " + s for s in loads16 + _splat_fmas("vec4<f16>", "h")] + ["    }"]
        body += [f"    c{i} += vec4<f32>(h{i});" for i in range(16)] + ["}"]
        body += _sum_out([f"c{i}" for i in range(16)], 4)
        parts.append(_kernel(f"h16_splat_fold{fold}", "fill_f16", body))

    # the fold as a branch inside one loop (no nested constant-trip loop to unroll)
    body = [f"var c{i} = vec4<f32>();" for i in range(16)]
    body += [f"var h{i} = vec4<f16>();" for i in range(16)]
    body += ["for (var it = 0u; it < p.iters; it++) {", "    let kk = it % 16u;"]
    body += ["    " + s for s in loads16 + _splat_fmas("vec4<f16>", "h")]
    body += ["    if (kk == 15u) {"]
    body += [f"        c{i} += vec4<f32>(h{i});" for i in range(16)]
    body += [f"        h{i} = vec4<f16>();" for i in range(16)] + ["    }", "}"]
    body += _sum_out([f"c{i}" for i in range(16)], 4)
    parts.append(_kernel("h16_branch_fold", "fill_f16", body))

    # nested loops whose inner trip count is a runtime value (p._a = 16): not unrolled
    body = [f"var c{i} = vec4<f32>();" for i in range(16)]
    body += ["for (var it = 0u; it < p.iters; it += p._a) {"]
    body += [f"    var h{i} = vec4<f16>();" for i in range(16)]
    body += ["    for (var kk = 0u; kk < p._a; kk++) {"]
    body += ["        " + s for s in loads16 + _splat_fmas("vec4<f16>", "h")] + ["    }"]
    body += [f"    c{i} += vec4<f32>(h{i});" for i in range(16)] + ["}"]
    body += _sum_out([f"c{i}" for i in range(16)], 4)
    parts.append(_kernel("h16_runtime_fold", "fill_f16", body))

    # the f32 block in the same nested shape (does nesting alone cost?)
    body = [f"var c{i} = vec4<f32>();" for i in range(16)]
    body += ["for (var it = 0u; it < p.iters; it += 16u) {"]
    body += ["    for (var kk = 0u; kk < 16u; kk++) {"]
    body += ["        " + s for s in loads32[1:] + _splat_fmas("vec4<f32>", "c")] + ["    }", "}"]
    body += _sum_out([f"c{i}" for i in range(16)], 4)
    parts.append(_kernel("f32_nested", "fill_f32", body))

    # the f32 block with 16 k-steps written out (does the f32 matmul gain from it too?)
    body = [f"var c{i} = vec4<f32>();" for i in range(16)]
    body += ["for (var it = 0u; it < p.iters; it += 16u) {"]
    body += _written_steps(loads32[1:], "vec4<f32>", "c")
    body += ["}"]
    body += _sum_out([f"c{i}" for i in range(16)], 4)
    parts.append(_kernel("f32_unrolled", "fill_f32", body))

    # two levels: 16-step f16 partials h added into f16 sums g, g into f32 every 64 steps
    body = [f"var c{i} = vec4<f32>();" for i in range(16)]
    body += ["for (var it = 0u; it < p.iters; it += 64u) {"]
    body += [f"    var g{i} = vec4<f16>();" for i in range(16)]
    body += ["    for (var k1 = 0u; k1 < 64u; k1 += 16u) {"]
    body += [f"        var h{i} = vec4<f16>();" for i in range(16)]
    body += ["        for (var kk = 0u; kk < 16u; kk++) {"]
    body += ["            " + s for s in loads16 + _splat_fmas("vec4<f16>", "h")] + ["        }"]
    body += [f"        g{i} += h{i};" for i in range(16)] + ["    }"]
    body += [f"    c{i} += vec4<f32>(g{i});" for i in range(16)] + ["}"]
    body += _sum_out([f"c{i}" for i in range(16)], 4)
    parts.append(_kernel("h16_two_level", "fill_f16", body))

    body = [f"var c{i} = vec4<f32>();" for i in range(16)]
    body += ["for (var it = 0u; it < p.iters; it += 16u) {"]
    body += [f"    var h{i} = vec4<f16>();" for i in range(16)]
    body += ["    for (var kk = 0u; kk < 16u; kk++) {"]
    body += ["        " + s for s in loads16 + _splat_fmas("vec4<f16>", "h", True)] + ["    }"]
    body += [f"    c{i} += vec4<f32>(h{i});" for i in range(16)] + ["}"]
    body += _sum_out([f"c{i}" for i in range(16)], 4)
    parts.append(_kernel("h16_swizzle_fold", "fill_f16", body))

    body = [f"var h{i} = vec4<f16>();" for i in range(16)]
    body += ["for (var it = 0u; it < p.iters; it++) {", "    let kk = it % 16u;"]
    body += ["    " + s for s in loads16 + _splat_fmas("vec4<f16>", "h")] + ["}"]
    body += _sum_out([f"vec4<f32>(h{i})" for i in range(16)], 4)
    parts.append(_kernel("h16_splat_only", "fill_f16", body))

    # k-pair: Ah[kp][i] holds rows (2i, 2i+1) x k-pair kp as (r0k0, r0k1, r1k0, r1k1); an
    # 8x4 block needs four row-pair loads (8 rows) and two column-pair loads (4 columns).
    body = [f"var c{r}{c} = vec2<f32>();" for r in range(8) for c in range(4)]
    body += ["for (var it = 0u; it < p.iters; it += 16u) {"]
    body += [f"    var h{r}{c} = vec2<f16>();" for r in range(8) for c in range(4)]
    body += ["    for (var kk = 0u; kk < 16u; kk += 2u) {"]
    body += [f"        let ra{g} = Ah[kk * 33u + ty + {4 * g}u];" for g in range(4)]
    body += [f"        let cb{g} = Bh[kk * 33u + tx + {8 * g}u];" for g in range(2)]
    for r in range(8):
        a = f"ra{r // 2}.{'xy' if r % 2 == 0 else 'zw'}"
        for c in range(4):
            b = f"cb{c // 2}.{'xy' if c % 2 == 0 else 'zw'}"
            body.append(f"        h{r}{c} = fma({a}, {b}, h{r}{c});")
    body += ["    }"]
    body += [f"    c{r}{c} += vec2<f32>(h{r}{c});" for r in range(8) for c in range(4)] + ["}"]
    body += _sum_out([f"c{r}{c}" for r in range(8) for c in range(4)], 2)
    parts.append(_kernel("h16_pair_fold", "fill_f16", body))

    # the 16 k-steps of a fold written out (constant kk, no inner loop for the compiler)
    body = [f"var c{i} = vec4<f32>();" for i in range(16)]
    body += ["for (var it = 0u; it < p.iters; it += 16u) {"]
    body += [f"    var h{i} = vec4<f16>();" for i in range(16)]
    body += _written_steps(loads16, "vec4<f16>", "h")
    body += [f"    c{i} += vec4<f32>(h{i});" for i in range(16)] + ["}"]
    body += _sum_out([f"c{i}" for i in range(16)], 4)
    parts.append(_kernel("h16_unrolled_fold", "fill_f16", body))

    # the unrolled fold with 8 more vec4<f32> live across the loop (the real kernel's
    # prefetch registers): does register pressure alone undo the unrolling's gain?
    body = [f"var c{i} = vec4<f32>();" for i in range(16)]
    body += [f"var x{i} = vec4<f32>(f32(lid + {i}u));" for i in range(8)]
    body += ["for (var it = 0u; it < p.iters; it += 16u) {"]
    body += [f"    var h{i} = vec4<f16>();" for i in range(16)]
    body += _written_steps(loads16, "vec4<f16>", "h")
    body += [f"    c{i} += vec4<f32>(h{i});" for i in range(16)]
    body += [f"    x{i} = x{i} * 0.999 + c{i};" for i in range(8)] + ["}"]
    body += _sum_out([f"c{i}" for i in range(16)] + [f"x{i}" for i in range(8)], 4)
    parts.append(_kernel("h16_unrolled_pressure", "fill_f16", body))

    # half-block order: rows 0-3 of the block for 16 k-steps, folded, then rows 4-7: only
    # 8 f16 partials live (b0, b1 loaded twice per k-step)
    body = [f"var c{i} = vec4<f32>();" for i in range(16)]
    body += ["for (var it = 0u; it < p.iters; it += 16u) {"]
    for g in range(2):
        body += ["    {"] + [f"        var h{i} = vec4<f16>();" for i in range(8)]
        for kk in range(16):
            row = f"{kk}u * 33u"
            body += ["        {", f"            let a = Ah[{row} + ty{' + 16u' if g else ''}];",
                     f"            let b0 = Bh[{row} + tx]; let b1 = Bh[{row} + tx + 16u];"]
            body += [f"            h{r * 2 + h} = fma(vec4<f16>(a.{C[r]}), b{h}, h{r * 2 + h});"
                     for r in range(4) for h in range(2)]
            body += ["        }"]
        body += [f"        c{g * 8 + i} += vec4<f32>(h{i});" for i in range(8)] + ["    }"]
    body += ["}"]
    body += _sum_out([f"c{i}" for i in range(16)], 4)
    parts.append(_kernel("h16_half_block", "fill_f16", body))

    # staggered fold: half of the partials folded (and restarted) every 8 k-steps, so the
    # conversions of one half overlap the other half's FMAs
    body = [f"var c{i} = vec4<f32>();" for i in range(16)]
    body += [f"var h{i} = vec4<f16>();" for i in range(16)]
    body += ["for (var it = 0u; it < p.iters; it += 16u) {"]
    for half in range(2):
        body += ["    for (var k8 = 0u; k8 < 8u; k8++) {", f"        let kk = k8 + {8 * half}u;"]
        body += ["        " + s for s in loads16 + _splat_fmas("vec4<f16>", "h")] + ["    }"]
        part = range(8) if half == 0 else range(8, 16)
        body += [f"    c{i} += vec4<f32>(h{i}); h{i} = vec4<f16>();" for i in part]
    body += ["}"]
    body += _sum_out([f"c{i}" for i in range(16)], 4)
    parts.append(_kernel("h16_stagger_fold", "fill_f16", body))

    # 8x4 block (8 vec4 partials, 8 vec4 f32 accumulators: half the registers)
    body = [f"var c{i} = vec4<f32>();" for i in range(8)]
    body += ["for (var it = 0u; it < p.iters; it += 16u) {"]
    body += [f"    var h{i} = vec4<f16>();" for i in range(8)]
    body += ["    for (var kk = 0u; kk < 16u; kk++) {",
             "        let a0 = Ah[kk * 33u + ty]; let a1 = Ah[kk * 33u + ty + 16u];",
             "        let b0 = Bh[kk * 33u + tx];"]
    body += [f"        h{g * 4 + r} = fma(vec4<f16>(a{g}.{C[r]}), b0, h{g * 4 + r});"
             for g in range(2) for r in range(4)] + ["    }"]
    body += [f"    c{i} += vec4<f32>(h{i});" for i in range(8)] + ["}"]
    body += _sum_out([f"c{i}" for i in range(8)], 4)
    parts.append(_kernel("h16_fold_8x4", "fill_f16", body))

    body = [f"var h{i} = vec4<f16>();" for i in range(16)]
    body += ["var a0 = Ah[ty]; var a1 = Ah[ty + 16u]; var b0 = Bh[tx]; var b1 = Bh[tx + 16u];",
             "for (var it = 0u; it < p.iters; it++) {"]
    body += ["    " + s for s in _splat_fmas("vec4<f16>", "h")]
    body += ["    a0 = a0.yzwx; b1 = b1.wxyz;", "}"]
    body += _sum_out([f"vec4<f32>(h{i})" for i in range(16)], 4)
    parts.append(_kernel("h16_splat_regs", "fill_f16", body))
    return "\n".join(parts)


# multiply-adds per invocation and k-step
MACS = {"f32_8x8": 64, "f32_nested": 64, "f32_unrolled": 64, "h16_splat_fold": 64,
        "h16_splat_fold32": 64, "h16_splat_fold64": 64, "h16_branch_fold": 64,
        "h16_runtime_fold": 64, "h16_unrolled_fold": 64, "h16_unrolled_pressure": 64,
        "h16_half_block": 64,
        "h16_stagger_fold": 64,
        "h16_fold_8x4": 32, "h16_two_level": 64, "h16_swizzle_fold": 64,
        "h16_splat_only": 64, "h16_pair_fold": 32, "h16_splat_regs": 64}


def main(argv=None) -> int:
    args, dev = probe_setup(__doc__, argv)
    if not dev.has("shader-f16"):
        print(f"{dev.info.name} lacks shader-f16: nothing to probe")
        return 0
    groups, iters = (8, 256) if dev.info.is_software else (132 * 16, 8192)
    out = dev.empty(groups * 256)
    params = dev.uniform("IIII", iters, 16, 0, 0)
    print(f"# {dev.info.summary()}: {groups} workgroups x 256 invocations x {iters} k-steps")
    rows = time_entry_points(dev, "enable f16;\n" + kernels(), [
        (name, [out, params], groups, groups * 256 * iters * macs * 2, {})
        for name, macs in MACS.items()], "h16 probe")
    write_json(args.out, "h16_probe.json",
               {"adapter": dev.info.name, "iters": iters, "groups": groups, "rows": rows})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
