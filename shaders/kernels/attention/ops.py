"""Causal multi-head attention with GQA, forward and backward (05_attention.wgsl).

Layouts (f32, row-major; B batch, T sequence, H query heads, Hkv kv heads, D head dim):

    q, dq   [B, T, H, D]    element (b,t,h,d) at (b*T + t)*q_stride + h*D + d  (q_stride = H*D)
    k, v    [B, T, Hkv, D]  ... at (b*T + t)*kv_stride + h*D + d              (kv_stride = Hkv*D)
    dk, dv  like k, v (same kv_stride)
    o, do   [B, T, H, D]    token stride o_stride (default H*D): o feeds the Wo matmul as
                            [B*T, H*D]
    lse     [B, H, T]       natural-log log-sum-exp of each query's scaled scores

Each of q_stride, kv_stride, o_stride may instead be a `Strides(token, head, batch)`: element
(b,t,h,d) at b*batch + t*token + h*head + d, e.g. `head_major(T, H, D)` for [B, H, T, D]
rows, each head's rows contiguous. The tensor-core kernels load tiles of 64 rows of one
head: from head-major q/k/v those are one contiguous block instead of rows a fused row
apart (why the trainer uses them: trainer_svc/model/forward.py).

Query head h uses kv head h // (H // Hkv) (Hugging Face's repeat_kv grouping). With a fused
qkv projection output [B*T, (H + 2*Hkv)*D] bind q, k and v as views starting at their part
and pass q_stride = kv_stride = (H + 2*Hkv)*D; dq/dk/dv may likewise be views into one
fused gradient buffer (then feed it to the fused projection's backward).

    attention.forward(rec, q, k, v, o, lse, B, T, H, Hkv, D)
    attention.backward(rec, q, k, v, o, do, lse, dq, dk, dv, B, T, H, Hkv, D)

scale defaults to 1/sqrt(D). The backward writes (never accumulates) dq, dk, dv; it runs a
prep dispatch (dvec = rowsum(do * o) into a scratch buffer), the dQ kernel and the dK/dV
kernel (which sums the H/Hkv query heads of each kv head itself: deterministic, no atomics).
When dk and dv are overlapping views of one buffer (the fused layout), the dK/dV kernel
writes dv to a scratch buffer and `copy_kv` (basic.copy_heads) moves it into place: WebGPU
forbids two writable bindings with overlapping ranges. (The trainer binds head-major q, k, v
and separate gradient buffers, so it never needs that copy.)

Kernels. The fast path (05_attention_tiled.wgsl: 4 x 4 score blocks per invocation, vec4
workgroup tiles, the next tile's global loads prefetched into registers during this tile's
math) needs D and the token strides to be multiples of 4 and 16-byte-aligned views;
otherwise, or when no tile fits the device, the general kernels of 05_attention.wgsl run.
The fast kernels are written once in loop form and expanded when made (shaders/wgsl_expand.py:
marked loops written out, register arrays turned into named values). `config="BQxBKV"`
(forward), `config_dq`, `config_dkv` pin the fast path's tiles (rows x columns: queries x
keys; for dK/dV keys x queries), e.g. "64x32" (a malformed config, or one that does not fit
the device, raises ValueError). `tiles=...` (the general kernels' shapes, see `choose_tiles`)
pins the general kernels. Otherwise the tiles come from the autotune cache (op "attention",
keys forward/dq/dkv, shape T x D) or the largest default that fits the device's workgroup
memory.

Tensor cores (`tensor_cores=...`, devices with f16 subgroup matrices, D a multiple of 16 up
to 64, vec4-ready layouts, nothing pinned; q, k, v, do, p, ds rounded to f16 in the
products, f32 accumulation and softmax statistics). `sgmat_plan` says which kernels run:

    tensor_cores   forward                                     dQ, dK/dV
    True           05_attention_sgmat.wgsl ("staged") without  05_attention_sgmat2.wgsl
                   robustness, the f32 kernels with it
    "staged"       the f32 kernels                             05_attention_sgmat.wgsl

f16 operands: q, k and v may be f16 buffers (all three, same layouts) where the tensor-core
kernels run (takes_f16_operands: the forward and the backward both on tensor cores; the
f32 kernels refuse them). The kernels then load half the bytes per tile, and the backward's
prep writes do as f16 beside dvec (scratch) for dQ and dK/dV to load; do, o and the
gradients stay f32. Numerics as before except q: stored f16, then pre-scaled in f32 and
rounded again (k, v and do are the values the f32 path rounds to). The trainer keeps its
head-major q, k, v in f16 this way (trainer_svc/model/forward.py).

The sgmat2 backward's kernels come in two widths: "base", 64 rows (queries for dQ, keys for
dK/dV) a workgroup, and the wide attention_backward_dq_sgmat2w /
attention_backward_dkv_sgmat2w with 128 ("w8": 8 subgroups x 16 rows, "w4x2": 4 x 32),
which stage each tile of the other operand once for twice the rows; their outputs are the
base kernels' bit for bit. backward() runs, per kernel: sgmat_tiles {"dq": ..., "dkv": ...}
if given, else the tuned width (`istanbul kernels tune`, keys dq_sgmat / dkv_sgmat), else
"w8" where it fits (chosen_widths).

With robustness on, True runs the f32 forward (the staged one is slower there). The sgmat2
forward is retired (it was wrong). Measurements behind these choices:
dev/tensor_core_attention/README.md, "ops.py's defaults".
"""

from __future__ import annotations

import math
import re
import warnings
from typing import NamedTuple

import numpy as np

from ..elementwise import ops as basic
from ..op_support import (F16, F32, ceil_div, check, dtype_of, grid2d, grid3d,
                          has_tensor_cores, positive, scratch, workgroup_storage)
from ...engine import views_overlap

FILE = "05_attention.wgsl"
FILE_TILED = "05_attention_tiled.wgsl"   # a template (shaders/wgsl_expand.py)
FILE_SGMAT = "05_attention_sgmat.wgsl"   # tensor cores; a template of the head dim
SGMAT_KERNELS = {"forward": "attention_forward_sgmat", "dq": "attention_backward_dq_sgmat",
                 "dkv": "attention_backward_dkv_sgmat"}
SGMAT_ROWS = 64                           # rows (queries; keys for dK/dV) per workgroup
# The second tensor-core version of the backward, 05_attention_sgmat2.wgsl (bank-spread score
# reads, fewer barriers): its dQ and dK/dV kernels are checked right in every variant and are
# faster than the staged ones, so tensor_cores=True runs them (dev/tensor_core_attention/README.md).
FILE_SGMAT2 = "05_attention_sgmat2.wgsl"   # a template of the head dim and tiles
SGMAT2_KERNELS = {"dq": "attention_backward_dq_sgmat2", "dkv": "attention_backward_dkv_sgmat2"}
# key tile of dQ (BK), query tile of dK/dV (BQ2)
SGMAT2_TILES = {"BK": 32, "BQ2": 32}
# Experiment knobs of the sgmat2 kernels (issue 21): `pad`,
# words added to the f32 score/result tiles' rows (4: rows of 4 mod 32 words, the default; 0:
# the first kernels' 64/32-float rows), and `order`, the lanes' score-read order ("spread":
# the default bank-spread order; "contig": each lane a contiguous half row, as
# 05_attention_sgmat.wgsl; "swizzle": the spread order with row r rotated by 2r columns,
# conflict-free at pad 0).
SGMAT2_PAD = 4
SGMAT2_ORDER = "spread"
SGMAT2_ORDERS = ("spread", "contig", "swizzle")
# `qorder` (dK/dV only): the order a key tile's workgroup visits its query tiles: "up" (from
# the diagonal, measured) or "down" (from the last: every key tile of a head starts at the
# same rows, so q and do are read from L2 by all of them at about the same time; checked
# right, not timed)
SGMAT2_QORDER = "up"
SGMAT2_QORDERS = ("up", "down")
SGMAT2_WORKGROUP_BYTES = 49152   # 48 KiB of workgroup memory: every variant must fit it
# `dq` and `dkv` (the backward): which kernel and how many rows (queries for dQ, keys for
# dK/dV) a workgroup owns. "base": the 64-row attention_backward_dq_sgmat2 /
# attention_backward_dkv_sgmat2 (4 subgroups x 16 rows); the wide kernels
# attention_backward_dq_sgmat2w / attention_backward_dkv_sgmat2w with (subgroups, 16-row blocks
# per subgroup): "w8" (8, 1) and "w4x2" (4, 2), 128 rows a workgroup, so each staged tile of
# the other operand serves twice the rows; "w4" (4, 1) is their 64-row form (what one f32
# score array costs by itself). sgmat2_params makes "base" unless told otherwise.
# What backward() runs where nothing is pinned or tuned (chosen_widths) and it fits: "w8"
# (the fastest measured: dev/tensor_core_attention/README.md, "ops.py's defaults").
SGMAT2_WIDE_DEFAULT = "w8"
SGMAT2_WIDE_SHAPES = {"base": (4, 1), "w4": (4, 1), "w8": (8, 1), "w4x2": (4, 2)}
SGMAT2_WIDE = {"dq": "attention_backward_dq_sgmat2w", "dkv": "attention_backward_dkv_sgmat2w"}


def input_params(f16_inputs: bool) -> dict:
    """Template parameters of the q, k, v, do bindings (both tensor-core files): vec4<f32>
    rows, or f16 rows read as their bits (vec2<u32>, op_support.F16_READ_PARAMS)."""
    if not f16_inputs:
        return {"IN4": "vec4<f32>", "F16_BITS": False}
    return {"IN4": "vec2<u32>", "F16_BITS": True}


def sgmat_params(D: int, f16_inputs: bool = False) -> dict:
    """Template parameters of 05_attention_sgmat.wgsl for head dim D (f16_inputs: q, k, v
    and do stored as f16)."""
    return {"HD": D, "DT": D // 16, **input_params(f16_inputs)}


def sgmat2_bytes(kernel: str, params: dict) -> int:
    """Workgroup bytes of an sgmat2 kernel ("dq", "dkv") with template `params`
    (sgmat2_params; the arrays as 05_attention_sgmat2.wgsl declares them)."""
    HD, pad = params["HD"], params["SPAD"]
    SH = HD + 8
    if kernel == "dq":
        BK = params["BK"]
        if params.get("DQ", "base") != "base":   # the wide kernel: one score array
            QW = 16 * params["QNSG"] * params["QKR"]
            return 2 * QW * (max(HD, BK) + 8) + 2 * 2 * BK * SH + 4 * QW * (BK + pad)
        return 2 * 64 * (max(HD, BK) + 8) + 2 * 2 * BK * SH + 2 * 4 * 64 * (BK + pad)
    BQ2 = params["BQ2"]
    SPK = BQ2 + 8
    if params.get("DKV", "base") != "base":   # the wide kernel: one score array, p^T/ds^T in PD
        KW = 16 * params["NSG"] * params["KR"]
        return 2 * (max(KW * SH, 2 * KW * SPK) + 2 * BQ2 * SH) + 4 * (KW * (BQ2 + pad) + 2 * BQ2)
    f16 = (max(64 * SH, 2 * 64 * SPK) if params.get("KV_IN_P") else 64 * SH + 2 * 64 * SPK)
    return 2 * (f16 + 2 * BQ2 * SH) + 4 * (2 * 64 * (BQ2 + pad) + 2 * BQ2)


def sgmat2_backward_kernel(kernel: str, params: dict) -> tuple[str, int]:
    """(kernel name, rows a workgroup owns) of the "dq" or "dkv" kernel sgmat2 `params`
    make (the wide one where their DQ / DKV knob says)."""
    if params.get(kernel.upper(), "base") == "base":
        return SGMAT2_KERNELS[kernel], SGMAT_ROWS
    nsg, kr = (params["QNSG"], params["QKR"]) if kernel == "dq" else (params["NSG"], params["KR"])
    return SGMAT2_WIDE[kernel], 16 * nsg * kr


SGMAT2_WIDE_KEYS = {"dq": "dq_sgmat", "dkv": "dkv_sgmat"}   # their tuned-cache keys


def _wide_fits(device, D: int, kernel: str, width: str, knobs: dict) -> bool:
    """Whether `kernel` ("dq", "dkv") at `width` can run here with the other `knobs`
    (sgmat_tiles): they allow it and it fits the device's workgroup memory."""
    try:
        params = sgmat2_params(D, **{**knobs, kernel: width})
    except ValueError:
        return False
    return sgmat2_bytes(kernel, params) <= workgroup_storage(device)


def wide_candidates(device, D: int, kernel: str, knobs: dict | None = None) -> list[str]:
    """The widths of the sgmat2 backward kernel `kernel` ("dq", "dkv") the tuner times at
    head dim D: those that fit the device's workgroup memory (at today's tiles, or `knobs`)."""
    return [w for w in ("base", "w8", "w4x2") if _wide_fits(device, D, kernel, w, knobs or {})]


def chosen_widths(device, T: int, D: int, sgmat_tiles: dict | None) -> dict:
    """sgmat_tiles with "dq" and "dkv" filled in where they do not say: the tuned cache's
    width for (T, D) (op "attention", keys dq_sgmat / dkv_sgmat), else SGMAT2_WIDE_DEFAULT,
    each only where it fits the device and the other knobs allow it; else the kernels' own
    default (sgmat2_params)."""
    out = dict(sgmat_tiles or {})
    from ... import tuned_cache
    for kernel, key in SGMAT2_WIDE_KEYS.items():
        if kernel in out:
            continue
        tuned = tuned_cache.lookup(device, "attention", key, (T, D))
        for width in (tuned, SGMAT2_WIDE_DEFAULT):
            if width in SGMAT2_WIDE_SHAPES and _wide_fits(device, D, kernel, width, out):
                out[kernel] = width
                break
    return out


def default_wide(kernel: str) -> str:
    """The width sgmat2_params makes for `kernel` ("dq", "dkv") when not told: "base"
    (backward() fills the widths in first: chosen_widths)."""
    if kernel not in SGMAT2_WIDE:
        raise ValueError(f"sgmat2 attention: kernel {kernel!r}; use dq or dkv")
    return "base"


def sgmat2_params(D: int, pad: int | None = None, order: str | None = None,
                  qorder: str | None = None, dq: str | None = None, dkv: str | None = None,
                  f16_inputs: bool = False, **tiles) -> dict:
    """Template parameters of 05_attention_sgmat2.wgsl for head dim D: tiles BK, BQ2
    overriding SGMAT2_TILES; `pad`, `order` and `qorder` the experiment knobs (SGMAT2_PAD,
    SGMAT2_ORDER, SGMAT2_QORDER); `dq` and `dkv` the backward's kernels
    (SGMAT2_WIDE_SHAPES; default_wide()); f16_inputs: q, k, v and do stored as f16.
    dK/dV stages k and v in its p/ds array (KV_IN_P) only where separate arrays would not fit
    SGMAT2_WORKGROUP_BYTES (pads of 8 and 16 at head dim 64)."""
    unknown = set(tiles) - set(SGMAT2_TILES)
    if unknown:
        raise ValueError(f"sgmat2 attention: unknown knobs {sorted(unknown)} (tiles "
                         f"{sorted(SGMAT2_TILES)}, pad, order, qorder, dq, dkv)")
    pad = SGMAT2_PAD if pad is None else int(pad)
    order = SGMAT2_ORDER if order is None else str(order)
    qorder = SGMAT2_QORDER if qorder is None else str(qorder)
    if qorder not in SGMAT2_QORDERS:
        raise ValueError(f"sgmat2 attention: qorder {qorder!r}; use one of {SGMAT2_QORDERS}")
    if pad < 0 or pad % 4:
        raise ValueError(f"sgmat2 attention: pad {pad} must be a multiple of 4 words (16-byte "
                         "subgroup-matrix strides)")
    if order not in SGMAT2_ORDERS:
        raise ValueError(f"sgmat2 attention: order {order!r}; use one of {SGMAT2_ORDERS}")
    dq = default_wide("dq") if dq is None else str(dq)
    dkv = default_wide("dkv") if dkv is None else str(dkv)
    for name, value in (("dq", dq), ("dkv", dkv)):
        if value not in SGMAT2_WIDE_SHAPES:
            raise ValueError(f"sgmat2 attention: {name} {value!r}; use one of "
                             f"{sorted(SGMAT2_WIDE_SHAPES)}")
        if value != "base" and order != "spread":
            raise ValueError(f"sgmat2 attention: {name} {value!r} reads scores in the spread "
                             "order only")
    if dkv != "base" and qorder != "up":
        raise ValueError(f"sgmat2 attention: dkv {dkv!r} visits query tiles up only (qorder)")
    out = {"HD": D, "DT": D // 16, **SGMAT2_TILES, **tiles, "SPAD": pad,
           "SPREAD": order != "contig", "SWIZZLE": order == "swizzle", "KV_IN_P": False,
           "Q_DESC": qorder == "down", "DQ": dq,
           "QNSG": SGMAT2_WIDE_SHAPES[dq][0], "QKR": SGMAT2_WIDE_SHAPES[dq][1], "DKV": dkv,
           "NSG": SGMAT2_WIDE_SHAPES[dkv][0], "KR": SGMAT2_WIDE_SHAPES[dkv][1],
           **input_params(f16_inputs)}
    out["KV_IN_P"] = sgmat2_bytes("dkv", out) > SGMAT2_WORKGROUP_BYTES
    return out


def _sgmat2_kernel(dev, kernel: str, D: int, tiles=None, f16_inputs: bool = False):
    """The sgmat2 backward kernel `kernel` ("dq", "dkv") that sgmat_tiles `tiles` make."""
    params = sgmat2_params(D, f16_inputs=f16_inputs, **(tiles or {}))
    return dev.kernel(FILE_SGMAT2, sgmat2_backward_kernel(kernel, params)[0], {}, params)


SGMAT_VERSIONS = ("staged", "sgmat2-backward")


def sgmat_version(tensor_cores) -> str | None:
    """Which tensor-core attention `tensor_cores` asks for: None (off), "staged" (the first
    version, 05_attention_sgmat.wgsl's backward) or "sgmat2-backward" (05_attention_sgmat2.wgsl's
    backward: what True means)."""
    if not tensor_cores:
        return None
    if tensor_cores in SGMAT_VERSIONS:
        return tensor_cores
    if tensor_cores is True:
        return "sgmat2-backward"
    retired = (" (the sgmat2 forward is retired: it was wrong on the H100 and the H200; True "
               "runs the sgmat2 backward after a verified forward)"
               if tensor_cores == "sgmat2" else "")
    raise ValueError(f"tensor_cores={tensor_cores!r}: expected a bool or one of "
                     f"{SGMAT_VERSIONS}{retired}")


def sgmat_plan(tensor_cores, robustness: bool) -> dict:
    """{"forward": f, "backward": b}: the tensor-core attention `tensor_cores` runs on a
    device with (robustness=True) or without Dawn's robustness, where tensor cores can run
    (uses_tensor_cores) and nothing is pinned; None: the f32 kernels (tiled where the layout
    allows), "staged": 05_attention_sgmat.wgsl, "sgmat2": 05_attention_sgmat2.wgsl's
    backward. Pure (no device), so tests can check the choice; the module docstring has the
    table."""
    version = sgmat_version(tensor_cores)
    if version is None:
        return {"forward": None, "backward": None}
    if version == "staged":
        return {"forward": None, "backward": "staged"}
    # the staged forward beats the f32 tiled one only without robustness (module docstring)
    return {"forward": None if robustness else "staged", "backward": "sgmat2"}


def sgmat_kernel_names(tensor_cores, robustness: bool) -> dict:
    """{"forward", "dq", "dkv"}: the kernel names sgmat_plan picks (None: the f32 kernels)."""
    plan = sgmat_plan(tensor_cores, robustness)
    names = {"staged": SGMAT_KERNELS, "sgmat2": SGMAT2_KERNELS}
    return {k: names[plan[part]][k] if plan[part] else None
            for k, part in (("forward", "forward"), ("dq", "backward"), ("dkv", "backward"))}


def uses_tensor_cores(device, D: int, strides, *views) -> bool:
    """Whether tensor-core attention can run here: f16 subgroup matrices,
    head dim a multiple of 16 up to 64, vec4-ready layouts."""
    return (has_tensor_cores(device) and D % 16 == 0 and D <= 64
            and _vec4_ready(D, strides, *views))


def takes_f16_operands(device, tensor_cores, D: int, strides) -> bool:
    """Whether forward(..., tensor_cores=tensor_cores) and backward(...) run on the tensor
    cores for q, k, v laid out by `strides` (q, kv, o Strides), so q, k and v may be given
    as f16 buffers (the trainer's head-major copies: half the bytes of every tile load)."""
    plan = sgmat_plan(tensor_cores, getattr(device, "robustness", True))
    return (plan["forward"] is not None and plan["backward"] is not None
            and uses_tensor_cores(device, D, strides))


def _f16_operands(op: str, q, k, v) -> bool:
    """Whether q, k and v are f16 (all three, on a device with shader-f16), not f32."""
    kinds = {name: dtype_of(buf) for name, buf in (("q", q), ("k", k), ("v", v))}
    if len(set(kinds.values())) > 1:
        raise ValueError(f"{op}: q, k and v must share one dtype, got "
                         + ", ".join(f"{n} {d}" for n, d in kinds.items()))
    return kinds["q"] == F16
MAX_COLS, MAX_ROWS = 32, 16
MAX_DV = 4                 # output vec4s per row and invocation in the tiled kernels
PREAMBLE_BYTES = 1024      # the preamble's reduction slots may count against the limit
TILED_KERNELS = {"forward": "attention_forward_tiled", "dq": "attention_backward_dq_tiled",
                 "dkv": "attention_backward_dkv_tiled"}
# Preference order of (rows, columns) per tiled kernel when nothing was tuned: the largest
# score blocks that fit (more reuse of each staged row), then smaller ones.
TILED_DEFAULTS = {
    "forward": ((64, 32), (32, 32), (64, 16), (32, 16), (16, 32), (16, 16), (8, 32), (16, 8),
                (8, 8), (8, 4), (4, 4)),
    "dq": ((32, 32), (32, 16), (16, 32), (16, 16), (8, 32), (16, 8), (8, 8), (8, 4), (4, 4)),
    "dkv": ((32, 32), (32, 16), (16, 32), (16, 16), (8, 32), (16, 8), (8, 8), (8, 4), (4, 4)),
}
PREFETCH_REGS = (16, 32)   # prefetch registers per staged operand (PF of the template):
                           # 16 where they suffice (every tuned shape), 32 for bigger tiles;
                           # tiles needing more run without prefetch
MAX_SL = 4                 # prefetch registers per statistic (dK/dV's lse, dvec)
# Iterations per written-out run of the loops over head-dim vec4s (d4) and over a tile's
# keys/queries (n): 4, faster than plain loops (dev/compiler_probes/README.md); template
# parameters, so probes can try others.
UNROLL_D = 4
UNROLL_N = 4
_TILE_RE = re.compile(r"^(\d+)x(\d+)$")


def prefetch_loads(rows: int, cols: int, D: int) -> int:
    """vec4s of each staged operand one invocation loads per tile."""
    return -(-cols * (D // 4) // ((rows // 4) * (cols // 4)))


def template_params(rows: int = 16, cols: int = 16, D: int = 16) -> dict:
    """Parameters of the 05_attention_tiled.wgsl template (shaders/wgsl_expand.py) for
    rows x cols tiles at head dim D: prefetch when PREFETCH_REGS suffice, else none."""
    loads = prefetch_loads(rows, cols, D)
    pf = next((n for n in PREFETCH_REGS if loads <= n), 0)
    return {"PREFETCH": pf > 0, "PF": pf, "UNROLL_D": UNROLL_D, "UNROLL_N": UNROLL_N}


def _threads_per_row(D: int) -> int:
    for tpr in (8, 4, 2, 1):
        if D % tpr == 0 and D // tpr <= MAX_COLS:
            return tpr
    raise ValueError(f"attention: head dim {D} is too large (at most {8 * MAX_COLS})")


def _floats(kernel: str, rows: int, other: int, D: int) -> int:
    """Workgroup floats of a kernel; rows = BQ (forward, dq) or BKV (dkv), other the tile."""
    pad = D + 1
    if kernel == "forward":
        return rows * pad + 2 * other * pad + rows * (other + 1)
    if kernel == "dq":
        return 2 * rows * pad + 2 * other * pad + rows * (other + 1)
    return 2 * rows * pad + 2 * other * pad + 2 * rows * (other + 1) + 2 * other


def choose_tiles(device, D: int, kernel: str, tiles=None) -> dict:
    """Override constants {HD, BQ, BKV, WG} for kernel "forward", "dq" or "dkv".

    `tiles=(rows, other)` forces a shape (rows: BQ for forward/dq, BKV for dkv); otherwise the
    largest tiles that fit the device's workgroup memory (1 KiB kept for the preamble).
    """
    tpr = _threads_per_row(D)
    budget = (workgroup_storage(device) - 1024) // 4
    max_wg = min(256, int(device.limits.get("max-compute-invocations-per-workgroup", 256)))
    if tiles is not None:
        shapes = [tuple(int(t) for t in tiles)]
    else:
        shapes = [(r, o) for r in (32, 16, 8, 4) for o in (32, 16, 8, 4)]
    for rows, other in shapes:
        ok = (rows * tpr <= max_wg and other % tpr == 0 and other // tpr <= MAX_ROWS
              and _floats(kernel, rows, other, D) <= budget)
        if ok:
            bq, bkv = (rows, other) if kernel != "dkv" else (other, rows)
            return {"HD": D, "BQ": bq, "BKV": bkv, "WG": rows * tpr}
        if tiles is not None:
            raise ValueError(f"attention {kernel}: tiles {tiles} do not fit head dim {D} "
                             f"(threads per row {tpr}, workgroup memory {budget * 4} bytes)")
    raise ValueError(f"attention {kernel}: no tile fits head dim {D} in "
                     f"{budget * 4} bytes of workgroup memory")


def tiled_bytes(kernel: str, rows: int, cols: int, D: int) -> int:
    """Workgroup bytes of a tiled kernel with `rows` x `cols` tiles (see the WGSL)."""
    rs, h4 = D // 4 + 1, D // 4
    if kernel == "forward":
        return 16 * (rows * rs + cols * rs + cols * h4 + cols * (rows // 4)
                     + 2 * (rows // 4) * (cols // 4))
    if kernel == "dq":
        return 16 * (2 * rows * rs + 2 * cols * rs + cols * (rows // 4))
    return 16 * (2 * rows * rs + 2 * cols * rs + 2 * cols * (rows // 4)) + 8 * cols


def tiled_problems(device, kernel: str, rows: int, cols: int, D: int) -> list[str]:
    """Why (rows x cols) tiles of a tiled kernel cannot run for head dim D (empty if they can).

    rows: queries (forward, dq) or keys (dkv) per workgroup; cols: keys (forward, dq) or
    queries (dkv) per tile. The output block of an invocation covers D / cols vec4s per row.
    """
    out = []
    if D % 4:
        out.append(f"head dim {D} is not a multiple of 4")
    if rows < 4 or cols < 4 or rows % 4 or cols % 4:
        out.append(f"tiles {rows}x{cols} must be multiples of 4")
    if out:
        return out
    if D % cols or D // cols > MAX_DV:
        out.append(f"head dim {D} needs a column tile dividing it and >= D/{MAX_DV}, "
                   f"got {cols}")
    wg = (rows // 4) * (cols // 4)
    max_wg = int(device.limits.get("max-compute-invocations-per-workgroup", 256))
    if wg > min(max_wg, 1024):
        out.append(f"{wg} invocations per workgroup (device allows {max_wg})")
    if kernel == "dkv" and -(-cols // wg) > MAX_SL:
        out.append(f"{-(-cols // wg)} statistics prefetch registers (the kernel has {MAX_SL})")
    need = tiled_bytes(kernel, rows, cols, D)
    limit = workgroup_storage(device) - PREAMBLE_BYTES
    if need > limit:
        out.append(f"{need} bytes of workgroup memory (device allows {limit})")
    return out


def tiled_constants(kernel: str, rows: int, cols: int, D: int) -> dict:
    bq, bkv = (cols, rows) if kernel == "dkv" else (rows, cols)
    return {"HD": D, "BQ": bq, "BKV": bkv}


def parse_config(text) -> tuple[int, int]:
    """(rows, cols) of "ROWSxCOLS" (or a (rows, cols) pair)."""
    if isinstance(text, (tuple, list)):
        return int(text[0]), int(text[1])
    m = _TILE_RE.match(str(text).strip())
    if not m:
        raise ValueError(f"attention config {text!r} is not of the form ROWSxCOLS (e.g. 64x32)")
    return int(m.group(1)), int(m.group(2))


parse_tiles = parse_config


def format_config(rows: int, cols: int) -> str:
    return f"{rows}x{cols}"


_WARNED: set = set()


def choose_config(device, kernel: str, T: int, D: int, config=None):
    """(rows, cols) of the tiled kernel: pinned, tuned, or the default; None if none fits.
    A pinned config that is malformed or does not fit raises ValueError; a tuned one is
    skipped then (with a warning for a retired kernel's entry)."""
    if config is not None:
        rows, cols = parse_config(config)
        problems = tiled_problems(device, kernel, rows, cols, D)
        if problems:
            raise ValueError(f"attention {kernel}: config {format_config(rows, cols)}: "
                             + "; ".join(problems))
        return rows, cols
    from ... import tuned_cache
    tuned = tuned_cache.lookup(device, "attention", kernel, (T, D))
    if tuned is not None:
        try:
            rows, cols = parse_config(tuned)
        except ValueError as exc:
            message = f"ignoring the tuned entry attention/{kernel}/{T}x{D}: {exc}"
            if message not in _WARNED:
                _WARNED.add(message)
                warnings.warn(message, stacklevel=2)
        else:
            if not tiled_problems(device, kernel, rows, cols, D):
                return rows, cols
    for rows, cols in TILED_DEFAULTS[kernel]:
        if not tiled_problems(device, kernel, rows, cols, D):
            return rows, cols
    return None


choose_tiled = choose_config


def candidate_tiles(device, kernel: str, D: int) -> list[tuple[int, int]]:
    """Every (rows, cols) the tuner tries for this kernel and head dim."""
    out = []
    for rows in (128, 64, 32, 16, 8):
        for cols in (64, 32, 16, 8, 4):
            if not tiled_problems(device, kernel, rows, cols, D):
                out.append((rows, cols))
    return out


def candidate_configs(device, kernel: str, D: int) -> list[str]:
    """Every config string the tuner times ("64x32", ...)."""
    return [format_config(r, c) for r, c in candidate_tiles(device, kernel, D)]


class Strides(NamedTuple):
    """Element strides of one tensor group: element (b, t, h, d) at
    b*batch + t*token + h*head + d (d contiguous)."""
    token: int
    head: int
    batch: int


def token_rows(T: int, D: int, token_stride: int) -> Strides:
    """[B, T, heads, D] rows `token_stride` apart (a fused buffer's part, or contiguous)."""
    return Strides(int(token_stride), D, T * int(token_stride))


def head_major(T: int, H: int, D: int) -> Strides:
    """[B, H, T, D]: each head's T rows contiguous."""
    return Strides(D, T * D, H * T * D)


def _strides(op, name, value, B, T, heads, D) -> tuple[Strides, int]:
    """(Strides, elements spanned) of q_stride/kv_stride/o_stride `value` (None, a token
    stride or Strides); ValueError when two (b, t, h) rows would overlap."""
    if value is None:
        s = token_rows(T, D, heads * D)
    elif isinstance(value, Strides):
        s = Strides(*(int(x) for x in value))
    else:
        s = token_rows(T, D, value)
        if s.token < heads * D:
            raise ValueError(f"{op}: {name} {s.token} is shorter than the row ({heads * D})")
    # rows of D never overlap when, in order of stride, each dimension steps past the
    # whole extent of the smaller ones
    span = D
    for stride, count in sorted(((s.head, heads), (s.token, T), (s.batch, B))):
        if count > 1 and stride < span:
            raise ValueError(f"{op}: {name} {tuple(s)} (token, head, batch) makes rows of "
                             f"[{B}, {T}, {heads}, {D}] overlap")
        span = max(span, (count - 1) * stride + span)
    return s, (B - 1) * s.batch + (T - 1) * s.token + (heads - 1) * s.head + D


def _vec4_ready(D, strides, *views) -> bool:
    return (D % 4 == 0 and all(x % 4 == 0 for s in strides for x in s)
            and all(getattr(v, "offset", 0) % 16 == 0 for v in views))


def _layout(op, B, T, H, Hkv, D, q_stride, kv_stride, o_stride):
    """(q, kv, o Strides, then the elements q, k, o span)."""
    positive(op, B=B, T=T, H=H, Hkv=Hkv, D=D)
    if H % Hkv:
        raise ValueError(f"{op}: H={H} is not a multiple of Hkv={Hkv}")
    (sq, nq), (skv, nkv), (so, no) = (
        _strides(op, name, value, B, T, heads, D)
        for name, value, heads in (("q_stride", q_stride, H), ("kv_stride", kv_stride, Hkv),
                                   ("o_stride", o_stride, H)))
    return sq, skv, so, nq, nkv, no


def _params(dev, B, T, H, Hkv, strides, scale):
    q, kv, o = strides
    return dev.params("IIIIIIIIfIIIIIII", B, T, H, Hkv, q.token, kv.token, o.token, 0,
                      float(scale), q.head, kv.head, o.head, q.batch, kv.batch, o.batch, 0)


def copy_kv(rec, src, dst, B: int, T: int, Hkv: int, D: int, strides: Strides) -> None:
    """dst = src, both of layout `strides` (dv from its scratch buffer into place)."""
    basic.copy_heads(rec, src, dst, B, T, Hkv, D, tuple(strides), tuple(strides))


def forward(rec, q, k, v, o, lse, B: int, T: int, H: int, Hkv: int, D: int, *,
            scale: float | None = None, q_stride: int | None = None,
            kv_stride: int | None = None, o_stride: int | None = None, tiles=None,
            config=None, tensor_cores: bool | str = False) -> None:
    """o = causal softmax(q k^T * scale) v per head; lse saved for the backward.

    `tensor_cores` (True, "staged"; sgmat_plan and the module docstring): where the device has
    f16 subgroup matrices (D a multiple of 16 up to 64, vec4-ready layouts) and nothing is
    pinned, True runs the staged tensor-core forward (05_attention_sgmat.wgsl) on a device
    without Dawn's robustness and the f32 kernels on one with it; "staged" the f32 kernels.
    `config="sgmat"` pins the staged tensor-core forward."""
    op = "attention.forward"
    *strides, nq, nkv, no = _layout(op, B, T, H, Hkv, D, q_stride, kv_stride, o_stride)
    f16_in = _f16_operands(op, q, k, v)
    check(op, "q", q, nq, (F32, F16))
    check(op, "k", k, nkv, (F32, F16))
    check(op, "v", v, nkv, (F32, F16))
    check(op, "o", o, no)
    check(op, "lse", lse, B * H * T)
    dev = rec.device
    scale = 1 / math.sqrt(D) if scale is None else scale
    tc = sgmat_plan(tensor_cores, getattr(dev, "robustness", True))["forward"]
    if tc and config is None and tiles is None \
            and uses_tensor_cores(dev, D, strides, q, k, v, o):
        config = "sgmat"   # the staged forward, below
    params = _params(dev, B, T, H, Hkv, strides, scale)
    if config == "sgmat":
        if not uses_tensor_cores(dev, D, strides, q, k, v, o):
            raise ValueError(f"{op}: config sgmat needs f16 subgroup matrices, D a multiple of "
                             "16 up to 64 and vec4-ready layouts")
        name = SGMAT_KERNELS["forward"]
        rec.dispatch(dev.kernel(FILE_SGMAT, name, {}, sgmat_params(D, f16_in)),
                     [q, k, v, o, lse, params],
                     grid2d(dev, op, B * H, ceil_div(T, SGMAT_ROWS)), label=name)
        return
    if f16_in:
        raise ValueError(f"{op}: f16 q, k, v need the tensor-core forward (tensor_cores=True "
                         "on a device with f16 subgroup matrices and without Dawn's "
                         "robustness, or config='sgmat'; D a multiple of 16 up to 64, "
                         "vec4-ready layouts: takes_f16_operands); give f32 buffers here")
    tiled = None
    if tiles is None:
        if config is not None and not _vec4_ready(D, strides, q, k, v, o):
            raise ValueError(f"{op}: config {config} needs the tiled kernel, which needs D and "
                             "the token strides to be multiples of 4 and 16-byte-aligned views")
        if _vec4_ready(D, strides, q, k, v, o):
            tiled = choose_config(dev, "forward", T, D, config)
    if tiled is not None:
        rows, cols = tiled
        name = TILED_KERNELS["forward"]
        kern = dev.kernel(FILE_TILED, name, tiled_constants("forward", rows, cols, D),
                          template_params(rows, cols, D))
        rec.dispatch(kern, [q, k, v, o, lse, params],
                     _query_tile_grid(dev, op, B * H, T, rows), label=name)
        return
    consts = choose_tiles(dev, D, "forward", tiles)
    kern = dev.kernel(FILE, "attention_forward", consts)
    rec.dispatch(kern, [q, k, v, o, lse, params],
                 grid2d(dev, op, ceil_div(T, consts["BQ"]), B * H), label="attention_forward")


def _query_tile_grid(dev, op: str, heads: int, T: int, rows: int) -> tuple[int, int, int]:
    """The tiled forward/dq grid: (head, query tile). Workgroups start in x-fastest order and
    the kernels take their heaviest causal tiles at y = 0, so all heads' long tiles start
    before any short one instead of the last head's long tiles starting last (dK/dV:
    _dkv_grid; 05_attention_tiled.wgsl)."""
    return grid2d(dev, op, heads, ceil_div(T, rows))


DKV_HEAD_CHUNK = 16   # heads per chunk of the tiled dK/dV grid


def _dkv_grid(dev, op: str, heads: int, T: int, rows: int) -> tuple[int, int, int]:
    """The tiled dK/dV grid: (head in chunk, key tile, chunk of DKV_HEAD_CHUNK heads), so a
    chunk's heavy (first) key tiles start together and its heads' q/do stay in L2."""
    chunk = min(DKV_HEAD_CHUNK, heads)
    return grid3d(dev, op, chunk, ceil_div(T, rows), ceil_div(heads, chunk))


def prep_lanes(D: int) -> int:
    """Invocations per (b, t, h) row of the vec4 backward preps (PREP_LANES in
    05_attention.wgsl): the largest power of two <= min(D / 4, 32)."""
    return 1 << (min(D // 4, 32).bit_length() - 1)


def backward(rec, q, k, v, o, do, lse, dq, dk, dv, B: int, T: int, H: int, Hkv: int, D: int,
             *, scale: float | None = None, q_stride: int | None = None,
             kv_stride: int | None = None, o_stride: int | None = None,
             tiles_dq=None, tiles_dkv=None, config_dq=None, config_dkv=None,
             tensor_cores: bool | str = False, sgmat_tiles: dict | None = None) -> None:
    """dq, dk, dv (written, not accumulated) from do and the forward's q, k, v, o, lse.
    `tensor_cores`: where the device has f16 subgroup matrices (D a multiple of 16 up to 64,
    vec4-ready layouts) and nothing is pinned, dQ and dK/dV run on the tensor cores (q, k, v,
    do, p and ds rounded to f16 in the products, f32 accumulation): 05_attention_sgmat2.wgsl
    for True ("sgmat2-backward", the faster), 05_attention_sgmat.wgsl for "staged"
    (sgmat_plan). `sgmat_tiles`
    ({"BK": 16, "BQ2": 16}): the sgmat2 kernels' tiles (and the experiment knobs "pad",
    "order" and "qorder", see sgmat2_params; "dq" and "dkv" pick the kernels, chosen_widths)."""
    op = "attention.backward"
    *strides, nq, nkv, no = _layout(op, B, T, H, Hkv, D, q_stride, kv_stride, o_stride)
    f16_in = _f16_operands(op, q, k, v)
    for name, buf, count in (("q", q, nq), ("k", k, nkv), ("v", v, nkv), ("o", o, no),
                             ("do", do, no), ("lse", lse, B * H * T), ("dq", dq, nq),
                             ("dk", dk, nkv), ("dv", dv, nkv)):
        check(op, name, buf, count, (F32, F16) if name in ("q", "k", "v") else (F32,))
    dev = rec.device
    scale = 1 / math.sqrt(D) if scale is None else scale
    params = _params(dev, B, T, H, Hkv, strides, scale)
    ready = _vec4_ready(D, strides, q, k, v, o, do, dq, dk, dv)
    tc = sgmat_plan(tensor_cores, getattr(dev, "robustness", True))["backward"]
    if not (tc and not any(x is not None for x in (tiles_dq, tiles_dkv, config_dq, config_dkv))
            and uses_tensor_cores(dev, D, strides, q, k, v, o, do, dq, dk, dv)):
        tc = None
    if f16_in and tc is None:
        raise ValueError(f"{op}: f16 q, k, v need the tensor-core backward (tensor_cores on a "
                         "device with f16 subgroup matrices, nothing pinned, D a multiple of "
                         "16 up to 64, vec4-ready layouts: takes_f16_operands); give f32 "
                         "buffers here")
    dvec = scratch(dev, "attention_dvec", B * H * T * 4)
    if f16_in:   # the prep also writes do as f16 for the tensor-core kernels to load
        do_in = scratch(dev, "attention_do16", no * 2, np.float16)
        prep_name, prep_res = "attention_backward_prep_vec4_f16", [o, do, dvec, do_in, params]
    else:
        do_in = do
        prep_name = "attention_backward_prep" + ("_vec4" if _vec4_ready(D, strides[2:], o, do)
                                                 else "")
        prep_res = [o, do, dvec, params]
    consts, rows = {"HD": D}, 256   # rows per workgroup
    if prep_name != "attention_backward_prep":   # the vec4 preps: PREP_LANES lanes per row
        consts["PREP_LANES"] = prep_lanes(D)
        rows //= consts["PREP_LANES"]
    rec.dispatch(dev.kernel(FILE, prep_name, consts), prep_res, ceil_div(B * T * H, rows),
                 label=prep_name)
    if tc:
        dv_out = scratch(dev, "attention_dv", nkv * 4) if views_overlap(dk, dv) else dv
        if tc == "sgmat2":
            sgmat_tiles = chosen_widths(dev, T, D, sgmat_tiles)
            knobs = sgmat2_params(D, **sgmat_tiles)
            for kernel, res, heads in (("dq", [q, k, v, do_in, lse, dvec, dq, params], B * H),
                                       ("dkv", [q, k, v, do_in, lse, dvec, dk, dv_out, params],
                                        B * Hkv)):
                name, rows = sgmat2_backward_kernel(kernel, knobs)
                rec.dispatch(_sgmat2_kernel(dev, kernel, D, tiles=sgmat_tiles,
                                            f16_inputs=f16_in), res,
                             grid2d(dev, op, heads, ceil_div(T, rows)), label=name)
            if dv_out is not dv:
                copy_kv(rec, dv_out, dv, B, T, Hkv, D, strides[1])
            return
        name = SGMAT_KERNELS["dq"]
        rec.dispatch(dev.kernel(FILE_SGMAT, name, {}, sgmat_params(D, f16_in)),
                     [q, k, v, do_in, lse, dvec, dq, params],
                     grid2d(dev, op, B * H, ceil_div(T, SGMAT_ROWS)), label=name)
        name = SGMAT_KERNELS["dkv"]
        rec.dispatch(dev.kernel(FILE_SGMAT, name, {}, sgmat_params(D, f16_in)),
                     [q, k, v, do_in, lse, dvec, dk, dv_out, params],
                     grid2d(dev, op, B * Hkv, ceil_div(T, SGMAT_ROWS)), label=name)
        if dv_out is not dv:
            copy_kv(rec, dv_out, dv, B, T, Hkv, D, strides[1])
        return
    for name, pinned in (("dq", config_dq), ("dkv", config_dkv)):
        if pinned is not None and not ready:
            raise ValueError(f"{op}: config_{name} {pinned} needs the tiled kernel, which needs "
                             "D and the token strides to be multiples of 4 and 16-byte-aligned "
                             "views")
    t_dq = choose_config(dev, "dq", T, D, config_dq) if ready and tiles_dq is None else None
    if t_dq is not None:
        rows, cols = t_dq
        name = TILED_KERNELS["dq"]
        rec.dispatch(dev.kernel(FILE_TILED, name, tiled_constants("dq", rows, cols, D),
                                template_params(rows, cols, D)),
                     [q, k, v, do, lse, dvec, dq, params],
                     _query_tile_grid(dev, op, B * H, T, rows), label=name)
    else:
        c_dq = choose_tiles(dev, D, "dq", tiles_dq)
        rec.dispatch(dev.kernel(FILE, "attention_backward_dq", c_dq),
                     [q, k, v, do, lse, dvec, dq, params],
                     grid2d(dev, op, ceil_div(T, c_dq["BQ"]), B * H),
                     label="attention_backward_dq")
    # WebGPU forbids overlapping writable bindings: dk and dv interleaved in one fused
    # gradient buffer get dv through a scratch buffer of the same layout, then copy_kv.
    dv_out = scratch(dev, "attention_dv", nkv * 4) if views_overlap(dk, dv) else dv
    t_kv = choose_config(dev, "dkv", T, D, config_dkv) if ready and tiles_dkv is None else None
    if t_kv is not None:
        rows, cols = t_kv
        name = TILED_KERNELS["dkv"]
        rec.dispatch(dev.kernel(FILE_TILED, name, tiled_constants("dkv", rows, cols, D),
                                template_params(rows, cols, D)),
                     [q, k, v, do, lse, dvec, dk, dv_out, params],
                     _dkv_grid(dev, op, B * Hkv, T, rows), label=name)
    else:
        c_kv = choose_tiles(dev, D, "dkv", tiles_dkv)
        rec.dispatch(dev.kernel(FILE, "attention_backward_dkv", c_kv),
                     [q, k, v, do, lse, dvec, dk, dv_out, params],
                     grid2d(dev, op, ceil_div(T, c_kv["BKV"]), B * Hkv),
                     label="attention_backward_dkv")
    if dv_out is not dv:
        copy_kv(rec, dv_out, dv, B, T, Hkv, D, strides[1])
