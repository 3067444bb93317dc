"""Subgroup-matrix kernels as plain WGSL, for the local compilers (tests).

Neither lavapipe nor naga has subgroup matrices. CI runs the ladder's tensor-core rungs with
them emulated (shaders/sgmat_emulation.py: exact, slow, under Tint, the configurations that fit
lavapipe's workgroup memory); this stub is the fast compile check of every configuration on
both compilers: `stub_subgroup_matrices` turns each matrix into a scalar of its element type
(a load reads one element of its footprint, a store writes one, a product is an fma), and what
remains is the kernel's own WGSL, which naga and Tint then check like any other module.
"""

from __future__ import annotations

import re

from istanbul.shaders.sgmat_emulation import _array_element, call_args


def stub_subgroup_matrices(code: str) -> str:
    """The kernel with subgroup matrices as scalars: a load reads the last element of its
    16 x 16 footprint (offset + 15 * stride + 15), a store writes it, a product is an fma.
    What remains is the kernel's own WGSL, for the local compiler to check."""
    code = code.replace("subgroup_matrix_result<f32, 16, 16>", "f32")
    code = re.sub(r"subgroup_matrix_(left|right)<f16, 16, 16>", "f16", code)
    call = re.compile(r"subgroupMatrix(Load<(f16|f32)(?:,\s*(row_major|col_major))?>|Store"
                      r"|MultiplyAccumulate)\(")
    out, i = [], 0
    while (m := call.search(code, i)) is not None:
        out.append(code[i:m.start()])
        a, i = call_args(code, m.end() - 1)
        if m.group(1) == "MultiplyAccumulate":
            out.append(f"fma(f32({a[0]}), f32({a[1]}), {a[2]})")
        elif m.group(1) == "Store":
            out.append(f"{a[0].lstrip('&')}[({a[1]}) + 15u * ({a[4]}) + 15u] = "
                       f"{a[2]} + f32(select(0, 1, {a[3]}))")
        elif m.group(3):   # the template form (&p, offset, stride)
            target = a[0].lstrip("&")
            if _array_element(code, target) == "vec4<u32>":   # 8 halves an element: the
                # footprint's last half is the .w word's high half of element 15 stride + 1
                out.append(f"{m.group(2)}(unpack2x16float({target}[({a[1]}) + 15u * ({a[2]}) "
                           "+ 1u].w).y)")
            else:
                out.append(f"{target}[({a[1]}) + 15u * ({a[2]}) + 15u]")
        else:   # a load of the matrix's element type (f16 operands, f32 results)
            out.append(f"{a[0].lstrip('&')}[({a[1]}) + 15u * ({a[3]}) + 15u] * "
                       f"{m.group(2)}(select(0, 1, {a[2]}))")
    out.append(code[i:])
    # the extension's enable line too (a device that has subgroup matrices, the H200, gets it
    # from source.compose): the stubbed module uses none
    stubbed = "".join(out).replace("enable chromium_experimental_subgroup_matrix;", "")
    body = "\n".join(line.split("//")[0] for line in stubbed.split("\n"))
    assert "subgroupMatrix" not in body and "subgroup_matrix" not in body
    return stubbed


# 03_linear_sgmat.wgsl's f16 -> bits helper; naga cannot bitcast f16 vectors ("Unable to cast"),
# so its compile check swaps the body for pack2x16float (the same bits for the f16 values it
# is given; the kernels themselves only ever compile under Tint)
HALF_BITS = "fn half_bits(v: vec4<f16>) -> vec2<u32> { return bitcast<vec2<u32>>(v); }"
HALF_BITS_NAGA = ("fn half_bits(v: vec4<f16>) -> vec2<u32> { return vec2<u32>("
                  "pack2x16float(vec2<f32>(v.xy)), pack2x16float(vec2<f32>(v.zw))); }")


def for_compiler(code: str, compiler: str) -> str:
    """`code` as the compile check gives it to `compiler` (naga: half_bits swapped)."""
    if compiler != "naga" or HALF_BITS not in code:
        return code
    return code.replace(HALF_BITS, HALF_BITS_NAGA)
