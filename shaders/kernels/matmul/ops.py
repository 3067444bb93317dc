"""The matmul family (03_linear*.wgsl): every Linear layer's three products.

All matrices are row-major with a leading dimension `ld*` (elements between consecutive rows,
default: the row length, i.e. contiguous). With PyTorch's Linear convention, a weight W is
[N_out, K_in] and

    forward   y[M, N]  = x[M, K] @ W[N, K]^T     matmul_nt(rec, x, W, y, M, N, K)
    dX        dx[M, K] = dy[M, N] @ W[N, K]      matmul_nn(rec, dy, W, dx, M, K, N)
    dW        dW[N, K] += dy[M, N]^T @ x[M, K]   matmul_tn(rec, dy, x, dW, N, K, M, accumulate=True)

where M = B*T tokens. Epilogues: `accumulate=True` adds into `out` (gradient accumulation,
in-place residual adds `x += attn @ Wo^T`), `residual=R` writes `out = R + alpha*A@B`
(out-of-place residual, R laid out like out), `alpha` scales the product.

f16 weights: pass the f16 mirror view as `b` (dtype float16). matmul_nt/matmul_nn then read
it as f16 and compute in f32 (only the weight's f16 rounding is lost). `f16_math=True`
(matmul_nt only) also rounds A to f16 and multiplies in packed vec4<f16> with f32
accumulation of short f16 partial sums (FOLD k each; "-fold32" in a config, default 16):
the mixed-precision forward path, not for gradients (their magnitudes fall below f16's
range); it needs `shader-f16`. The caller decides (the model passes its config's f16_math).

Kernels. The fast path (03_linear_tiled.wgsl) is register-tiled with vec4 loads, two-stage
workgroup tiles and optional split-K (partials in a scratch buffer, summed in a fixed order
by 03_linear_splitk.wgsl: deterministic). It is written once in loop form; the register
block TM x TN and FOLD are template parameters, and shaders/wgsl_expand.py writes the
marked loops out and turns the register arrays into named values when the kernel is made
(NVIDIA's compiler keeps private arrays indexed in loops in local memory, far slower). The
fast path needs every contiguous dimension and leading dimension to be a
multiple of 4 and 16-byte-aligned operands; anything else runs the general kernels of
03_linear.wgsl / 03_linear_h16.wgsl, which take any shape. Every call picks:

    config=MatmulConfig(...) or "128x128x16-8x8-s1"  that tiled configuration (error if the
                                                       operands cannot use the fast path)
    tiles=(BM, BN, BK)                                 the general kernel with those tiles
    neither                                            the fast path with the autotuned config
                                                       (shaders/autotune.py) or a default
                                                       per device class; else the general
                                                       kernel

Tensor cores. `tensor_cores=True` runs 03_linear_sgmat.wgsl where the device has f16 x f16 ->
f32 subgroup matrices (Dawn's chromium-experimental-subgroup-matrix, e.g. NVIDIA GPUs under
`--backend dawn`): both operands rounded to f16 when staged, f32 accumulation, the same
epilogues and split-K. Elsewhere the call runs the kernels above (the caller's numerics then
keep f32 activations). Its configurations are SgmatConfig ("sg2x2-t4x4-k32-p8-s1"). There A
may also be f16 (an operand its producer wrote in f16, e.g. the LM head's dlogits): half the
bytes and no rounding while staging; an f16 A anywhere else is a ValueError.

`plan(...)` tells which kernel and configuration a call would use.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import re
import warnings
from dataclasses import dataclass

import numpy as np

from ..op_support import (F16, F32, ceil_div, check, dummy, grid2d,
                          has_tensor_cores, positive, scratch, workgroup_storage)

FILE = "03_linear.wgsl"
FILE_H16 = "03_linear_h16.wgsl"
MODES = {"store": 0, "accumulate": 1, "residual": 2}


def default_tiles(M: int, N: int, K: int) -> tuple[int, int, int]:
    """(BM, BN, BK) by shape: big tiles for big matrices, small ones so tiny shapes waste less."""
    def side(n):
        return 128 if n >= 1024 else 64 if n >= 64 else 32
    return side(M), side(N), 16


def kernel_name(layout: str, b_dtype, f16_math: bool = False,
                tensor_cores: bool = False) -> tuple[str, str]:
    """(file, kernel) for a layout ("nn", "nt", "tn"), B's dtype and the f16-math flag
    (tensor_cores: the name's stem for the tensor-core kernels, where tn takes an f16 B)."""
    b_dtype = np.dtype(b_dtype)
    if layout not in ("nn", "nt", "tn"):
        raise ValueError(f"matmul layout must be nn, nt or tn, got {layout!r}")
    if f16_math:
        if layout != "nt" or b_dtype != F16:
            raise ValueError("f16_math needs layout nt and an f16 B (the weight mirror)")
        return FILE_H16, "matmul_nt_h16"
    if b_dtype == F16:
        if layout == "tn" and not tensor_cores:
            raise ValueError("matmul_tn has an f16 B (an f16 activation) only on the "
                             "tensor-core kernels (tensor_cores=True)")
        return FILE, f"matmul_{layout}_w16"
    return FILE, f"matmul_{layout}"


def tile_constants(tiles) -> dict:
    """Override constants of the general kernels (03_linear*.wgsl) for tiles (BM, BN, BK)."""
    bm, bn, bk = (int(t) for t in tiles)
    if bm % 8 or bn % 8 or bm < 8 or bn < 8 or bk < 1:
        raise ValueError(f"matmul tiles {tiles}: BM and BN must be multiples of 8, BK >= 1")
    return {"BM": bm, "BN": bn, "BK": bk, "WG": (bm // 8) * (bn // 8)}


# ---- the fast path: register-tiled kernels ---------------------------------------------------

FILE_TILED = "03_linear_tiled.wgsl"   # a template (shaders/wgsl_expand.py)
FILE_SPLITK = "03_linear_splitk.wgsl"
MAX_LOADS = 8          # vec4 loads per invocation per operand and K-slice (8 prefetch registers)
SGMAT_MAX_LOADS = 16   # the same for the tensor-core template (its registers are named per load;
                       # they hold 8 halves per slot, two vec4 loads each)
H16_FOLDS = (16, 32)   # k per f16 partial sum of the packed-f16 kernel (FOLD 8 retired,
                       # dev/compare_trees/README.md)
PREAMBLE_BYTES = 1024  # the preamble's reduction slots may count against workgroup memory
# k-steps per written-out run of the f32 slice loop: 1, the plain loop (longer runs were slower:
# dev/compiler_probes/README.md); a template parameter, so probes can try others.
UNROLL_K = 1

_CONFIG_RE = re.compile(r"^(\d+)x(\d+)x(\d+)-(\d+)x(\d+)-s(\d+)(?:-fold(\d+))?$")


@dataclass(frozen=True)
class MatmulConfig:
    """One configuration of the tiled kernels (the autotuner's unit of choice).

    bm x bn: the workgroup's tile of C; bk: the K-slice staged per step; tm x tn: each
    invocation's register block (4 or 8 each; the workgroup has (bm/tm)*(bn/tn) invocations);
    splits: split-K factor (partials reduced by a second dispatch); fold: k per f16 partial
    sum (f16-math kernels only; 0 = the default, see fold_steps). Written as
    "128x128x16-8x8-s1" (+ "-fold32" for a fold).
    """

    bm: int = 128
    bn: int = 128
    bk: int = 16
    tm: int = 8
    tn: int = 8
    splits: int = 1
    fold: int = 0

    def __str__(self) -> str:
        text = f"{self.bm}x{self.bn}x{self.bk}-{self.tm}x{self.tn}-s{self.splits}"
        return text + (f"-fold{self.fold}" if self.fold else "")

    @property
    def fold_steps(self) -> int:
        """k per f16 partial (every f16 lane sums FOLD products): default min(16, BK);
        one of H16_FOLDS, dividing BK."""
        return self.fold or min(16, self.bk)

    @classmethod
    def parse(cls, text) -> "MatmulConfig":
        if isinstance(text, MatmulConfig):
            return text
        m = _CONFIG_RE.match(str(text).strip())
        if not m:
            raise ValueError(f"matmul config {text!r} is not of the form "
                             "BMxBNxBK-TMxTN-sS[-foldF] (e.g. 128x128x16-8x8-s1, "
                             "128x128x32-8x8-s1-fold32)")
        bm, bn, bk, tm, tn, splits, fold = m.groups()
        return cls(int(bm), int(bn), int(bk), int(tm), int(tn), int(splits),
                   int(fold) if fold else 0)

    def with_splits(self, splits: int) -> "MatmulConfig":
        return dataclasses.replace(self, splits=int(splits))

    @property
    def invocations(self) -> int:
        return (self.bm // self.tm) * (self.bn // self.tn)

    def constants(self, f16_math: bool = False) -> dict:
        """Override constants of the pipeline."""
        return {"BM": self.bm, "BN": self.bn, "BK": self.bk, "WG": self.invocations}

    def template_params(self, f16_math: bool = False) -> dict:
        """Parameters of the 03_linear_tiled.wgsl template (shaders/wgsl_expand.py)."""
        return {"TM": self.tm, "TN": self.tn, "H16": bool(f16_math),
                "ELEM": "f16" if f16_math else "f32",
                "FOLD": self.fold_steps if f16_math else 0, "UNROLL_K": UNROLL_K}

    def workgroup_bytes(self, f16_math: bool = False) -> int:
        return 2 * self.bk * (self.bm + 4 + self.bn + 4) * (2 if f16_math else 4)

    def problems(self, device, f16_math: bool = False) -> list[str]:
        """Why this configuration cannot run on `device` (empty when it can)."""
        out = []
        if self.tm not in (4, 8) or self.tn not in (4, 8):
            out.append("TM and TN must be 4 or 8")
            return out
        if self.bm % self.tm:
            out.append(f"BM {self.bm} is not a multiple of TM {self.tm}")
        if self.bn % self.tn:
            out.append(f"BN {self.bn} is not a multiple of TN {self.tn}")
        if self.bk < 4 or self.bk % 4:
            out.append(f"BK {self.bk} is not a positive multiple of 4")
        elif f16_math and self.fold_steps not in H16_FOLDS:
            out.append(f"FOLD {self.fold_steps} must be one of "
                       f"{', '.join(map(str, H16_FOLDS))} (BK >= 16)")
        elif f16_math and self.bk % self.fold_steps:
            out.append(f"FOLD {self.fold_steps} does not divide BK {self.bk}")
        elif self.fold and not f16_math:
            out.append(f"-fold{self.fold}: a fold applies to the packed-f16 kernel only "
                       "(f16_math=True)")
        if self.splits < 1:
            out.append("splits must be >= 1")
        if out:
            return out
        wg = self.invocations
        max_wg = int(device.limits.get("max-compute-invocations-per-workgroup", 256))
        if wg > max_wg or wg < 1:
            out.append(f"{wg} invocations per workgroup (device allows {max_wg})")
        for side, name in ((self.bm, "A"), (self.bn, "B")):
            if -(-side * self.bk // 4 // max(wg, 1)) > MAX_LOADS:
                out.append(f"{name} slice needs more than {MAX_LOADS} vec4 loads per "
                           "invocation (raise the workgroup size or lower BK)")
        limit = workgroup_storage(device) - PREAMBLE_BYTES
        if self.workgroup_bytes(f16_math) > limit:
            out.append(f"stages {self.workgroup_bytes(f16_math)} bytes of workgroup memory "
                       f"(device allows {limit} next to the preamble)")
        return out


# ---- the tensor-core path: subgroup matrices ---------------------------------------------------

FILE_SGMAT = "03_linear_sgmat.wgsl"   # a template (shaders/wgsl_expand.py)
SGMAT_TILE = 16                       # the f16 -> f32 subgroup-matrix shape used: 16 x 16 x 16
SGMAT_SUBGROUP = 32                   # (op_support.has_tensor_cores checks the device has it)
# Straight stores (SgmatConfig.direct) bind C and R as f32 arrays that 16 x 16 f32 matrices
# are loaded from and stored to: Dawn then asks each of those bindings for at least 1 KiB.
SGMAT_MIN_BINDING = 4 * SGMAT_TILE * SGMAT_TILE
_SGMAT_RE = re.compile(
    r"^sg(\d+)x(\d+)-t(\d+)x(\d+)-k(\d+)-p(\d+)-s(\d+)(-a\d+)?(-d)?(-b1)?(-g\d+)?(-v16)?$")


@dataclass(frozen=True)
class SgmatConfig:
    """One configuration of 03_linear_sgmat.wgsl: sgr x sgc subgroups per workgroup, each with
    ti x tj result tiles of 16 x 16 (the workgroup's tile of C is bm = 16 sgr ti by
    bn = 16 sgc tj); bk: the K slice per step (multiple of 16); pad: halves added to each
    staged row (a multiple of 8: rows are staged in 16-byte slots of 8 halves, the kernel
    gets pad / 8 slots); splits: split-K factor; ahead: slices in flight in registers (1 or 2,
    "-a2"); direct ("-d"): in-bounds tiles stored straight from the accumulators instead of through
    workgroup memory (mostly slower: dev/tensor_core_matmul/README.md); single ("-b1"): one
    stage of workgroup memory instead of two, so twice the K slice fits (the stage is
    rewritten after a second barrier per slice); group ("-g8"): workgroups take C's tiles in
    bands of `group` row blocks, column block by column block, instead of row by row (what
    the workgroups in flight read stays in L2 where an operand does not fit it, e.g. the LM
    head's weight); load16 ("-v16"): an f16 operand is read 8 halves (16 bytes) at a time
    instead of 4 (where its rows and leading dimension are multiples of 8 halves; elsewhere
    the call runs the configuration without it: `plan`).
    Written "sg2x2-t4x4-k32-p8-s1" (+ "-a2", "-d", "-b1", "-g8", "-v16"); without the
    suffixes: two stages, one slice ahead, stores through workgroup memory, row by row,
    8-byte reads of f16 operands."""

    sgr: int = 2
    sgc: int = 2
    ti: int = 4
    tj: int = 4
    bk: int = 32
    pad: int = 8
    splits: int = 1
    ahead: int = 1
    direct: bool = False
    single: bool = False
    group: int = 1
    load16: bool = False

    def __str__(self) -> str:
        return (f"sg{self.sgr}x{self.sgc}-t{self.ti}x{self.tj}-k{self.bk}-p{self.pad}"
                f"-s{self.splits}" + (f"-a{self.ahead}" if self.ahead != 1 else "")
                + ("-d" if self.direct else "") + ("-b1" if self.single else "")
                + (f"-g{self.group}" if self.group != 1 else "")
                + ("-v16" if self.load16 else ""))

    @classmethod
    def parse(cls, text) -> "SgmatConfig":
        if isinstance(text, SgmatConfig):
            return text
        m = _SGMAT_RE.match(str(text).strip())
        if not m:
            raise ValueError(f"tensor-core matmul config {text!r} is not of the form "
                             "sgRxC-tIxJ-kBK-pPAD-sS[-aN][-d][-b1][-gN][-v16] (e.g. "
                             "sg2x2-t4x4-k32-p8-s1)")
        *dims, ahead, direct, single, group, wide = m.groups()
        return cls(*(int(g) for g in dims), ahead=int(ahead[2:]) if ahead else 1,
                   direct=direct is not None, single=single is not None,
                   group=int(group[2:]) if group else 1, load16=wide is not None)

    def with_splits(self, splits: int) -> "SgmatConfig":
        return dataclasses.replace(self, splits=int(splits))

    @property
    def bm(self) -> int:
        return SGMAT_TILE * self.sgr * self.ti

    @property
    def bn(self) -> int:
        return SGMAT_TILE * self.sgc * self.tj

    @property
    def invocations(self) -> int:
        return SGMAT_SUBGROUP * self.sgr * self.sgc

    def loads(self) -> tuple[float, float]:
        """vec4 loads of A and of B per invocation per slice (two per staging slot)."""
        return (self.bm * self.bk / 4 / self.invocations,
                self.bn * self.bk / 4 / self.invocations)

    def workgroup_bytes(self, layout: str) -> int:
        a_rows, a_row = (self.bk, self.bm) if layout == "tn" else (self.bm, self.bk)
        b_rows, b_row = (self.bn, self.bk) if layout == "nt" else (self.bk, self.bn)
        staged = a_rows * (a_row + self.pad) + b_rows * (b_row + self.pad)
        return (1 if self.single else 2) * 2 * staged + 4 * 256 * self.sgr * self.sgc

    def slots(self) -> tuple[int, int]:
        """Staging slots (8 consecutive halves, one 16-byte workgroup store each) of A and of B
        per invocation per slice; where a slice has fewer than a whole number per invocation
        the last round is partial (e.g. 16 subgroups of 2x2 tiles at BK 16: half of them)."""
        return (ceil_div(self.bm * self.bk // 8, self.invocations),
                ceil_div(self.bn * self.bk // 8, self.invocations))

    def template_params(self, layout: str, a16: bool = False, b16: bool = False) -> dict:
        """Parameters of 03_linear_sgmat.wgsl; `a16` / `b16`: for the _a16 / _w16 kernels (A /
        B in f16). PAD is counted in halves in the config ("-p8") and passed as 16-byte slots
        (8 halves each)."""
        la, lb = self.slots()
        return {"SGR": self.sgr, "SGC": self.sgc, "TI": self.ti, "TJ": self.tj, "BK": self.bk,
                "PAD": self.pad // 8, "LA": la, "LB": lb, "A16": bool(a16),
                "CLAMP_A": layout == "nt" and not a16,
                # how the staged tiles are read: A is [m][k] rows except for tn ([k][m]); B is
                # [n][k] rows for nt, [k][n] otherwise
                "A_MAJOR": "col_major" if layout == "tn" else "row_major",
                "B_MAJOR": "col_major" if layout == "nt" else "row_major",
                "AHEAD": self.ahead, "DIRECT": self.direct, "SINGLE": self.single,
                "KSTEPS": self.bk // SGMAT_TILE, "GROUP": self.group,
                "WIDE_A": self.load16 and bool(a16), "WIDE_B": self.load16 and bool(b16)}

    def problems(self, device, layout: str = "nt") -> list[str]:
        out = []
        if not has_tensor_cores(device):
            return [f"{device.name} has no f16 -> f32 16x16x16 subgroup matrices (tensor cores "
                    "need the Dawn backend on a GPU that offers them)"]
        if min(self.sgr, self.sgc, self.ti, self.tj) < 1:
            out.append("subgroups and tiles must be >= 1")
            return out
        if self.bk < 16 or self.bk % 16:
            out.append(f"BK {self.bk} is not a positive multiple of 16")
        if self.pad < 0 or self.pad % 8:
            out.append(f"pad {self.pad} is not a multiple of 8 halves (rows are staged in "
                       "16-byte slots)")
        if self.ahead not in (1, 2):
            out.append(f"ahead {self.ahead}: 1 or 2 slices in flight")
        if self.group < 1:
            out.append(f"group {self.group}: raster bands must have at least 1 row block")
        for name, n in zip("AB", self.loads()):
            if n != int(n) or not 1 <= n <= SGMAT_MAX_LOADS:
                out.append(f"{name} slice is {n:g} vec4 loads per invocation (must be a whole "
                           f"number from 1 to {SGMAT_MAX_LOADS}: change BK or the tiles)")
        if self.splits < 1:
            out.append("splits must be >= 1")
        max_wg = int(device.limits.get("max-compute-invocations-per-workgroup", 256))
        if self.invocations > max_wg:
            out.append(f"{self.invocations} invocations per workgroup (device allows {max_wg})")
        limit = workgroup_storage(device) - PREAMBLE_BYTES
        if self.workgroup_bytes(layout) > limit:
            out.append(f"stages {self.workgroup_bytes(layout)} bytes of workgroup memory "
                       f"(device allows {limit} next to the preamble)")
        return out


def default_sgmat_config(device, layout: str, M: int, N: int, K: int) -> SgmatConfig:
    """The tensor-core configuration used when nothing was tuned (chosen by measurement:
    dev/tensor_core_matmul/README.md, "ops.py's defaults")."""
    # One stage of BK 32 (twice the multiplies between barriers and half the workgroup
    # memory of the two-stage kernels): 16 subgroups of 2x4 tiles (128 x 256), the least time
    # summed over the 124M step's 14 products; where that does not fit the device (512
    # invocations, 47 KiB), 4 subgroups of 4x4 tiles.
    if M < 256 or N < 256:
        prefs = [SgmatConfig(2, 2, 2, 2, 32, 8)]
    else:
        prefs = [SgmatConfig(4, 4, 2, 4, 32, 8, single=True),
                 SgmatConfig(2, 2, 4, 4, 32, 8, single=True), SgmatConfig(2, 2, 2, 2, 32, 8)]
    cfg = next((c for c in prefs if not c.problems(device, layout)), prefs[-1])
    return cfg.with_splits(default_splits(device, cfg, M, N, K))


# Tile arrangements the tuner times for the tensor-core kernel, each with one stage ("-b1") of
# each slice depth in SGMAT_SLICES: the winners of dev/tensor_core_matmul/sgmat_sweep.py (close
# to each other summed over the 124M step, each best somewhere); `wide` adds the others timed
# there. BK 64 (the one arrangement whose 64-deep stage fits 48 KiB, 4 subgroups of 4x4 tiles)
# lost to BK 32 at all 15 products of the 124M step on the H100, by 1.1-2.1x
# (dev/tensor_core_matmul/README.md, session 31); the kernel still takes any multiple of 16.
SGMAT_TILES = ((4, 4, 2, 4), (4, 4, 4, 2), (2, 2, 4, 4), (4, 4, 2, 2))
SGMAT_SLICES = (32,)
WIDE_SGMAT_TILES = SGMAT_TILES + ((2, 4, 4, 4), (4, 2, 4, 4), (2, 2, 2, 4), (2, 2, 2, 2))
SGMAT_KEYS = ("nt_w16_sgmat", "nn_w16_sgmat", "tn_sgmat")   # the trainer's products


def sgmat_candidate_configs(device, layout: str, M: int, N: int, K: int,
                            wide: bool = False) -> list[SgmatConfig]:
    """Tensor-core configurations worth timing at (layout, shape) on this device: each tile
    arrangement that fits it, split K 1, 2, 4 and 8 ways (and the default split; `wide` adds 3
    and 6) while each split keeps at least four slices; each at every slice depth of
    SGMAT_SLICES that the device's workgroup memory and load limits allow."""
    out = []
    for (sgr, sgc, ti, tj), bk in itertools.product(WIDE_SGMAT_TILES if wide else SGMAT_TILES,
                                                    SGMAT_SLICES):
        cfg = SgmatConfig(sgr, sgc, ti, tj, bk, 8, single=True)
        if cfg.bm > 2 * max(M, 16) or cfg.bn > 2 * max(N, 16) or cfg.problems(device, layout):
            continue
        splits = {1, 2, 4, 8, default_splits(device, cfg, M, N, K)} | ({3, 6} if wide else set())
        for sp in sorted(splits):
            if sp == 1 or (K // sp >= 4 * cfg.bk and sp <= max_splits(device, M, N)):
                out.append(cfg.with_splits(sp))
    return out


def choose_sgmat_config(device, layout: str, b_dtype, M: int, N: int, K: int) -> SgmatConfig:
    from ... import tuned_cache
    # tn's f16 B (an activation) stages like its f32 B: the tn configurations serve both
    key = tuning_key(layout, F32 if layout == "tn" else b_dtype, False) + "_sgmat"
    text = tuned_cache.lookup(device, "matmul", key, (M, N, K))
    if text is not None:
        try:
            cfg = SgmatConfig.parse(text)
        except ValueError as exc:
            _warn_once(f"ignoring the tuned entry matmul/{key}/{M}x{N}x{K}: {exc}")
        else:
            if not cfg.problems(device, layout):
                return fit_splits(device, cfg, M, N)
    return default_sgmat_config(device, layout, M, N, K)


def tuning_key(layout: str, b_dtype, f16_math: bool) -> str:
    """The autotune cache's kernel key: nt, nn, tn, nt_w16, nn_w16, nt_h16."""
    if f16_math:
        return f"{layout}_h16"
    return f"{layout}_w16" if np.dtype(b_dtype) == F16 else layout


def tiled_kernel_name(layout: str, b_dtype, f16_math: bool = False) -> tuple[str, str]:
    """(file, kernel) of the fast path for this product."""
    _, name = kernel_name(layout, b_dtype, f16_math)  # validates the combination
    return FILE_TILED, name + "_tiled"


def _resident_slots(device) -> int:
    """Workgroups the device runs at once, as far as a split-K choice cares (a guess: wgpu
    does not report the multiprocessor count; 264 = two 256-invocation workgroups on each
    of 132 SMs)."""
    return 16 if device.info.is_software else 264


def default_splits(device, cfg: MatmulConfig, M: int, N: int, K: int) -> int:
    """Split K when the grid of C tiles fills too few waves of the device (thin dW shapes)."""
    if device.info.is_software:
        return 1
    tiles = ceil_div(M, cfg.bm) * ceil_div(N, cfg.bn)
    slots = _resident_slots(device)
    best, best_cost = 1, math.inf
    for s in (1, 2, 3, 4, 6, 8):
        if s > 1 and K // s < 512:
            break
        cost = math.ceil(tiles * s / slots) / s          # waves per unit of work
        cost *= 1.0 + 0.01 * (s - 1)                      # the partials' round trip
        if cost < best_cost * 0.97:
            best, best_cost = s, cost
    return min(best, max_splits(device, M, N))


def default_config(device, key: str, M: int, N: int, K: int) -> MatmulConfig:
    """The configuration used when nothing was tuned: by device class and shape."""
    h16 = key.endswith("h16")
    if device.info.is_software:
        cfg = MatmulConfig(64, 64, 16, 4, 4)
    else:
        bm = 128 if M >= 128 else 64
        bn = 128 if N >= 128 else 64
        cfg = MatmulConfig(bm, bn, 32 if h16 else 16, 8 if bm == 128 else 4,
                           8 if bn == 128 else 4)
    if cfg.problems(device, h16):
        cfg = MatmulConfig(32, 32, 16 if h16 else 8, 4, 4)
    return cfg.with_splits(default_splits(device, cfg, M, N, K))


# Register-block shapes the tuner tries: (BM, BN, TM, TN). 8x8 blocks with 256 invocations
# are the classic SGEMM shape (64 accumulators, 16 FMAs per workgroup-memory load); 4x4 blocks
# trade reuse for occupancy; 64x64 with 8x8 blocks runs 64 invocations (many workgroups per
# multiprocessor); the 256-wide tiles and 32x32 are for the wide sweep and small matrices.
TILE_SHAPES = ((128, 128, 8, 8), (128, 64, 8, 4), (64, 128, 4, 8), (64, 64, 4, 4),
               (64, 64, 8, 8))
WIDE_TILE_SHAPES = TILE_SHAPES + ((256, 128, 8, 8), (128, 256, 8, 8), (32, 32, 4, 4))


def candidate_configs(device, key: str, M: int, N: int, K: int,
                      wide: bool = False) -> list[MatmulConfig]:
    """Configurations worth timing for (kernel key, shape) on this device.

    Each register-block shape with slice depths 8 and 16 (16 and 32 for the 64-invocation
    shape; 16 and 32 for the f16-math kernel, whose stages are half the bytes) and the default
    split factor for the shape; thin shapes (split by default) also try half and twice that.
    The f16-math key (nt_h16) also tries FOLD 32 at BK 32. `wide` (the sweep) adds bigger and
    smaller tiles, every slice depth and FOLD, and more split factors.
    """
    h16 = key.endswith("h16")
    slots = _resident_slots(device)
    out: list[MatmulConfig] = []
    for bm, bn, tm, tn in (WIDE_TILE_SHAPES if wide else TILE_SHAPES):
        if bm > 2 * max(M, 32) or bn > 2 * max(N, 32):
            continue   # a tile much larger than the matrix only wastes invocations
        if (bm, bn) == (32, 32) and ceil_div(M, 64) * ceil_div(N, 64) >= 2 * slots:
            continue   # small tiles only pay when 64x64 tiles leave the device idle
        wg = (bm // tm) * (bn // tn)
        if wide:
            slices = (8, 16, 32)
        elif h16:
            slices = (16, 32)
        else:
            slices = (16, 32) if wg <= 64 else (8, 16)
        for bk in slices:
            if not h16:
                folds = [0]
            elif wide:
                folds = [f for f in H16_FOLDS if bk % f == 0]
            else:
                folds = [0] + ([32] if bk % 32 == 0 else [])
            for fold in folds:
                cfg = MatmulConfig(bm, bn, bk, tm, tn, 1, fold)
                if cfg.problems(device, h16):
                    continue
                base = default_splits(device, cfg, M, N, K)
                splits = {base}
                if base > 1:
                    splits |= {max(1, base // 2), base * 2}
                if wide:
                    splits |= {1, 2, 4, 8}
                for sp in sorted(splits):
                    if sp > 1 and K // sp < 4 * bk:
                        continue
                    out.append(cfg.with_splits(sp))
    seen, unique = set(), []
    for cfg in out:
        if str(cfg) not in seen:
            seen.add(str(cfg))
            unique.append(cfg)
    return unique


def choose_config(device, layout: str, b_dtype, f16_math: bool, M: int, N: int,
                  K: int) -> MatmulConfig:
    """The tuned configuration of this (kernel, shape) on this adapter, else the default."""
    from ... import tuned_cache
    key = tuning_key(layout, b_dtype, f16_math)
    text = tuned_cache.lookup(device, "matmul", key, (M, N, K))
    if text is not None:
        try:
            cfg = MatmulConfig.parse(text)
        except ValueError as exc:
            _warn_once(f"ignoring the tuned entry matmul/{key}/{M}x{N}x{K}: {exc}")
        else:
            if not cfg.problems(device, f16_math):
                return fit_splits(device, cfg, M, N)
    return default_config(device, key, M, N, K)


_WARNED: set = set()


def _warn_once(message: str) -> None:
    if message not in _WARNED:
        _WARNED.add(message)
        warnings.warn(message, stacklevel=3)


def _vec4_ready(res, cols: int, ld: int) -> bool:
    return cols % 4 == 0 and ld % 4 == 0 and getattr(res, "offset", 0) % 16 == 0


@dataclass(frozen=True)
class Plan:
    """What one matmul call runs: kernel file and name, and its configuration."""

    path: str          # "tiled" or "general"
    file: str
    kernel: str
    config: object     # MatmulConfig (tiled) or (BM, BN, BK) (general)

    def __str__(self) -> str:
        return f"{self.kernel}[{self.config}]"


def plan(device, layout: str, M: int, N: int, K: int, *, b_dtype=F32, f16_math: bool = False,
         lda: int | None = None, ldb: int | None = None, ldc: int | None = None,
         operands=(), config=None, tiles=None, tensor_cores: bool = False,
         a_dtype=F32) -> Plan:
    """The kernel and configuration `matmul` would run for these shapes and operands (an f16
    A only on the tensor-core path: ValueError elsewhere)."""
    a16 = np.dtype(a_dtype) == F16
    sgmat = isinstance(config, SgmatConfig) or (isinstance(config, str)
                                                and config.startswith("sg"))
    a_cols = M if layout == "tn" else K
    b_cols = K if layout == "nt" else N
    lda = a_cols if lda is None else lda
    ldb = b_cols if ldb is None else ldb
    ldc = N if ldc is None else ldc
    if tiles is not None and config is not None:
        raise ValueError(f"matmul_{layout}: pass tiles (general kernel) or config (tiled "
                         "kernel), not both")
    if a16 and (tiles is not None or f16_math or (config is not None and not sgmat)):
        raise ValueError(f"matmul_{layout}: an f16 A runs only on the tensor-core kernels "
                         "(tensor_cores=True, no tiles, f16_math or f32 config)")
    if tiles is not None:
        file, name = kernel_name(layout, b_dtype, f16_math)
        return Plan("general", file, name, tuple(int(t) for t in tiles))
    a, b, out = (list(operands) + [None] * 3)[:3]
    extra = list(operands)[3:]
    ready = (_vec4_ready(a, a_cols, lda) and _vec4_ready(b, b_cols, ldb)
             and _vec4_ready(out, N, ldc) and all(_vec4_ready(r, N, ldc) for r in extra)
             and (not f16_math or device.has("shader-f16")))
    if sgmat or (tensor_cores and config is None and not f16_math and ready
                 and has_tensor_cores(device)):
        if not sgmat:
            cfg = choose_sgmat_config(device, layout, b_dtype, M, N, K)
        else:   # a pinned tensor-core configuration
            cfg = SgmatConfig.parse(config)
            problems = ["f16_math is the packed-f16 kernel's option"] if f16_math else []
            if not ready:
                problems.append("it needs contiguous and leading dimensions that are "
                                "multiples of 4, 16-byte-aligned operands")
            problems += cfg.problems(device, layout)
            if problems:
                raise ValueError(f"matmul_{layout}: config {cfg} cannot run on "
                                 f"{device.name}: " + "; ".join(problems))
        if cfg.direct and min([M * N * 4] + [v.nbytes for v in (out, *extra)
                                             if v is not None]) < SGMAT_MIN_BINDING:
            cfg = dataclasses.replace(cfg, direct=False)   # C (or R) smaller than a matrix
        b16 = np.dtype(b_dtype) == F16
        if cfg.load16 and not ((not a16 or (a_cols % 8 == 0 and lda % 8 == 0))
                             and (not b16 or (b_cols % 8 == 0 and ldb % 8 == 0))):
            cfg = dataclasses.replace(cfg, load16=False)   # an f16 row of 4 mod 8 halves
        _, name = kernel_name(layout, b_dtype, tensor_cores=True)
        if a16:
            name = name.replace(f"matmul_{layout}", f"matmul_{layout}_a16")
        return Plan("tiled", FILE_SGMAT, name + "_sgmat", cfg)
    if a16:
        raise ValueError(f"matmul_{layout}: an f16 A needs the tensor-core kernels, and "
                         f"{device.name} cannot run them here (f16 subgroup matrices, "
                         "tensor_cores=True, vec4-ready operands)")
    if config is not None:
        cfg = MatmulConfig.parse(config)
        if not ready:
            raise ValueError(f"matmul_{layout}: config {config} needs the tiled kernel, which "
                             "needs contiguous dimensions and leading dimensions that are "
                             f"multiples of 4 and 16-byte-aligned operands (shapes M={M} N={N} "
                             f"K={K}, lda={lda} ldb={ldb} ldc={ldc}); pass tiles= for the "
                             "general kernel")
        problems = cfg.problems(device, f16_math)
        if problems:
            raise ValueError(f"matmul_{layout}: config {cfg} cannot run on {device.name}: "
                             + "; ".join(problems))
    elif ready:
        cfg = choose_config(device, layout, b_dtype, f16_math, M, N, K)
    else:
        file, name = kernel_name(layout, b_dtype, f16_math)
        return Plan("general", file, name, default_tiles(M, N, K))
    file, name = tiled_kernel_name(layout, b_dtype, f16_math)
    return Plan("tiled", file, name, cfg)


def matmul(rec, a, b, out, M: int, N: int, K: int, *, layout: str, accumulate: bool = False,
           residual=None, alpha: float = 1.0, lda: int | None = None, ldb: int | None = None,
           ldc: int | None = None, f16_math: bool = False, tiles=None,
           config=None, tensor_cores: bool = False) -> None:
    """Record out[M,N] (=, +=) alpha * op(A) @ op(B) (+ residual); see the module docstring."""
    op = f"matmul_{layout}"
    positive(op, M=M, N=N, K=K)
    if accumulate and residual is not None:
        raise ValueError(f"{op}: accumulate and residual are exclusive (accumulate is out += ...)")
    a_rows, a_cols = (K, M) if layout == "tn" else (M, K)
    b_rows, b_cols = (N, K) if layout == "nt" else (K, N)
    lda = a_cols if lda is None else lda
    ldb = b_cols if ldb is None else ldb
    ldc = N if ldc is None else ldc
    if lda < a_cols or ldb < b_cols or ldc < N:
        raise ValueError(f"{op}: leading dimensions lda={lda} ldb={ldb} ldc={ldc} are shorter "
                         f"than the rows ({a_cols}, {b_cols}, {N})")
    a_dtype = check(op, "a", a, (a_rows - 1) * lda + a_cols, (F32, F16))
    b_dtype = check(op, "b", b, (b_rows - 1) * ldb + b_cols, (F32, F16))
    check(op, "out", out, (M - 1) * ldc + N)
    if residual is not None:
        check(op, "residual", residual, (M - 1) * ldc + N)
    dev = rec.device
    # a clear error for impossible combinations (tn's f16 B: plan refuses it off the tensor cores)
    kernel_name(layout, b_dtype, f16_math, tensor_cores=True)
    mode = MODES["residual"] if residual is not None else MODES["accumulate" if accumulate
                                                              else "store"]
    operands = [a, b, out] + ([residual] if residual is not None else [])
    chosen = plan(dev, layout, M, N, K, b_dtype=b_dtype, f16_math=f16_math, lda=lda, ldb=ldb,
                  ldc=ldc, operands=operands, config=config, tiles=tiles,
                  tensor_cores=tensor_cores, a_dtype=a_dtype)
    res = residual if residual is not None else dummy(dev)
    if chosen.path == "tiled":
        _record_tiled(rec, chosen, a, b, res, out, M, N, K, mode, float(alpha), lda, ldb, ldc,
                      f16_math)
        return
    constants = tile_constants(chosen.config)
    staged = (constants["BM"] + constants["BN"]) * constants["BK"] * (2 if f16_math else 4)
    if staged > workgroup_storage(dev) - 1024:
        raise ValueError(f"{op}: tiles {tuple(chosen.config)} stage {staged} bytes, more than "
                         f"the device's workgroup memory allows ({workgroup_storage(dev)})")
    kern = dev.kernel(chosen.file, chosen.kernel, constants)
    params = dev.params("IIIIfIII", M, N, K, mode, float(alpha), lda, ldb, ldc)
    grid = grid2d(dev, op, ceil_div(N, constants["BN"]), ceil_div(M, constants["BM"]))
    rec.dispatch(kern, [a, b, res, out, params], grid, label=chosen.kernel)


def split_k(cfg: MatmulConfig, K: int) -> tuple[int, int]:
    """(K per split, number of splits): splits of whole BK slices, none of them empty."""
    per = ceil_div(ceil_div(K, max(cfg.splits, 1)), cfg.bk) * cfg.bk
    return per, ceil_div(K, per)


def max_splits(device, M: int, N: int) -> int:
    """The most K-splits whose partial products (splits x M x N f32) one storage binding of
    `device` holds (at least 1)."""
    limit = int(device.limits.get("max-storage-buffer-binding-size", 1 << 27))
    return max(1, limit // max(1, M * N * 4))


def fit_splits(device, cfg, M: int, N: int):
    """`cfg` with at most max_splits: a tuned entry is looked up by the nearest tuned shape,
    which may be smaller (the LM head's 2048-row chunk tuned, 8192 rows run)."""
    fits = max_splits(device, M, N)
    return cfg.with_splits(fits) if cfg.splits > fits else cfg


def _record_tiled(rec, chosen: Plan, a, b, res, out, M, N, K, mode, alpha, lda, ldb, ldc,
                  f16_math) -> None:
    dev = rec.device
    cfg = chosen.config
    op = chosen.kernel
    unused = dummy(dev)
    if isinstance(cfg, SgmatConfig):
        layout = chosen.kernel.split("_")[1]   # matmul_<layout>[_a16][_w16]_sgmat
        kern = dev.kernel(chosen.file, chosen.kernel, {},
                          cfg.template_params(layout, "_a16" in chosen.kernel,
                                              "_w16" in chosen.kernel))
        if cfg.direct:   # R is read as 16 x 16 matrices: its binding must hold one
            unused = dummy(dev, SGMAT_MIN_BINDING)
            if mode != MODES["residual"]:
                res = unused
    else:
        kern = dev.kernel(chosen.file, chosen.kernel, cfg.constants(f16_math),
                          cfg.template_params(f16_math))
    k_split, splits = split_k(cfg, K)
    grid_xy = grid2d(dev, op, ceil_div(N, cfg.bn), ceil_div(M, cfg.bm))
    if splits > dev.max_workgroups_per_dim:
        raise ValueError(f"{op}: {splits} K-splits exceed the device's grid limit")
    if splits > max_splits(dev, M, N):
        limit = int(dev.limits.get("max-storage-buffer-binding-size", 1 << 27))
        raise ValueError(f"{op}: config {cfg} splits K {splits} ways, and {splits} partial "
                         f"products of {M} x {N} take {splits * M * N * 4} bytes, more than one "
                         f"storage binding of {dev.name} holds ({limit}): use fewer splits")
    if splits == 1:
        params = dev.params("IIIIfIIIIIII", M, N, K, mode, alpha, lda, ldb, ldc, k_split, 0, 0, 0)
        rec.dispatch(kern, [a, b, res, out, params], (grid_xy[0], grid_xy[1], 1),
                     label=op)
        return
    partials = scratch(dev, "matmul_splitk", splits * M * N * 4)
    params = dev.params("IIIIfIIIIIII", M, N, K, 0, 1.0, lda, ldb, N, k_split, M * N, 0, 0)
    rec.dispatch(kern, [a, b, unused, partials, params], (grid_xy[0], grid_xy[1], splits),
                 label=op)
    reduce = dev.kernel(FILE_SPLITK, "matmul_splitk_reduce")
    rparams = dev.params("IIIIfIII", M, N, splits, mode, alpha, ldc, M * N, 0)
    rec.dispatch(reduce, [partials, res, out, rparams], ceil_div(M * N // 4, 256),
                 label="matmul_splitk_reduce")


def matmul_nn(rec, a, b, out, M, N, K, **kw) -> None:
    """out[M,N] = alpha * a[M,K] @ b[K,N] (b f32, or f16 read into f32 math)."""
    matmul(rec, a, b, out, M, N, K, layout="nn", **kw)


def matmul_nt(rec, a, b, out, M, N, K, **kw) -> None:
    """out[M,N] = alpha * a[M,K] @ b[N,K]^T (Linear forward with b = W[N_out, K_in])."""
    matmul(rec, a, b, out, M, N, K, layout="nt", **kw)


def matmul_tn(rec, a, b, out, M, N, K, **kw) -> None:
    """out[M,N] = alpha * a[K,M]^T @ b[K,N] (Linear dW: dW[N_out,K_in] += dy^T @ x)."""
    matmul(rec, a, b, out, M, N, K, layout="tn", **kw)


def linear_backward(rec, dy, x, w, dx, dw, tokens: int, d_in: int, d_out: int, *,
                    accumulate_dx: bool = False, accumulate_dw: bool = True) -> None:
    """Backward of y = x @ W^T: dx (=, +=) dy @ W and dW (+=) dy^T @ x.

    dy [tokens, d_out], x [tokens, d_in], w [d_out, d_in] (f32, or the f16 mirror),
    dx [tokens, d_in], dw [d_out, d_in] (f32). Either of dx/dw may be None to skip it.
    """
    if dx is not None:
        matmul_nn(rec, dy, w, dx, tokens, d_in, d_out, accumulate=accumulate_dx)
    if dw is not None:
        matmul_tn(rec, dy, x, dw, d_out, d_in, tokens, accumulate=accumulate_dw)
