"""Error metrics of a kernel's output against its reference, and the pass thresholds.

Metrics (seed 004): max absolute error, max relative error, RMSE, PSNR (peak = max |ref|),
cosine similarity. Positions where the reference is NaN/Inf must hold the same value in the
output; the metrics are computed over the remaining positions.
"""

from __future__ import annotations

import math

import numpy as np

# Thresholds per precision. "f32": fp32 arithmetic with reassociated sums (long dot products
# lose a few ulps). "f16": f16 storage or packed-f16 math with f32 accumulation.
# "exact": integer or bit-exact results (tokenizer ids, copies, casts).
# "zero_ref_max_abs": where the reference is exactly zero everywhere (e.g. attention's dQ with
# a single key), PSNR and cosine are undefined; the output passes if it is that close to zero
# (rounding noise of a GPU that does not cancel exactly, as NVIDIA's fused arithmetic).
THRESHOLDS = {
    "exact": {"max_abs": 0.0},
    "f32": {"min_psnr": 100.0, "min_cos": 0.999_999, "zero_ref_max_abs": 1e-5},
    "f32-loose": {"min_psnr": 80.0, "min_cos": 0.999_99, "zero_ref_max_abs": 1e-4},
    "f16": {"min_psnr": 50.0, "min_cos": 0.999_5, "zero_ref_max_abs": 1e-2},
}


def compare(out, ref) -> dict:
    """Error metrics of `out` against `ref` (any shapes that hold the same count)."""
    out = np.asarray(out)
    ref = np.asarray(ref)
    if out.shape != ref.shape:
        raise ValueError(f"shape {out.shape} != reference shape {ref.shape}")
    if out.size == 0:
        return {"max_abs": 0.0, "max_rel": 0.0, "rmse": 0.0, "psnr": math.inf, "cos": 1.0,
                "nonfinite_mismatch": 0}
    if not (np.issubdtype(ref.dtype, np.floating) or np.issubdtype(out.dtype, np.floating)):
        diff = np.abs(out.astype(np.int64) - ref.astype(np.int64))
        mismatches = int(np.count_nonzero(diff))
        return {"max_abs": float(diff.max()), "mismatches": mismatches,
                "first_mismatch": int(np.flatnonzero(diff)[0]) if mismatches else -1}
    o = out.astype(np.float64).ravel()
    r = ref.astype(np.float64).ravel()
    special = ~np.isfinite(r)
    same_special = (np.isnan(o) & np.isnan(r)) | (o == r)
    nonfinite_mismatch = int(np.count_nonzero(special & ~same_special)
                             + np.count_nonzero(~special & ~np.isfinite(o)))
    keep = ~special & np.isfinite(o)
    o, r = o[keep], r[keep]
    if o.size == 0:
        return {"max_abs": 0.0, "max_rel": 0.0, "rmse": 0.0, "psnr": math.inf, "cos": 1.0,
                "nonfinite_mismatch": nonfinite_mismatch}
    d = np.abs(o - r)
    peak = float(np.abs(r).max())
    if peak == 0.0:
        return {"max_abs": float(d.max()), "max_rel": 0.0 if not d.any() else math.inf,
                "rmse": float(np.sqrt(np.mean(d * d))), "psnr": math.inf if not d.any() else
                -math.inf, "cos": 1.0 if not d.any() else 0.0, "zero_reference": True,
                "nonfinite_mismatch": nonfinite_mismatch}
    floor = max(peak * 1e-6, 1e-30)  # relative error is meaningless on values near zero
    rmse = float(np.sqrt(np.mean(d * d)))
    if rmse == 0.0:
        psnr = math.inf
    elif peak == 0.0:
        psnr = -math.inf
    else:
        psnr = 20.0 * math.log10(peak / rmse)
    no, nr = float(np.linalg.norm(o)), float(np.linalg.norm(r))
    if no == 0.0 and nr == 0.0:
        cos = 1.0
    elif no == 0.0 or nr == 0.0:
        cos = 0.0
    else:
        cos = float(np.dot(o, r) / (no * nr))
    return {"max_abs": float(d.max()), "max_rel": float((d / np.maximum(np.abs(r), floor)).max()),
            "rmse": rmse, "psnr": psnr, "cos": cos, "nonfinite_mismatch": nonfinite_mismatch}


def passes(metrics: dict, precision: str, overrides: dict | None = None) -> tuple[bool, str]:
    """(ok, reason) for metrics against the thresholds of `precision` (plus overrides)."""
    limits = dict(THRESHOLDS[precision])
    limits.update(overrides or {})
    if metrics.get("nonfinite_mismatch", 0):
        return False, f"{metrics['nonfinite_mismatch']} NaN/Inf positions differ"
    if metrics.get("zero_reference") and "zero_ref_max_abs" in limits:
        if metrics["max_abs"] > limits["zero_ref_max_abs"]:
            return False, (f"reference is all zero; max_abs {metrics['max_abs']:.3g} > "
                           f"{limits['zero_ref_max_abs']:.3g}")
        return True, ""
    if "mismatches" in metrics and metrics["mismatches"]:
        return False, f"{metrics['mismatches']} elements differ (first at {metrics['first_mismatch']})"
    if "max_abs" in limits and metrics["max_abs"] > limits["max_abs"]:
        return False, f"max_abs {metrics['max_abs']:.3g} > {limits['max_abs']:.3g}"
    if "max_rel" in limits and metrics.get("max_rel", 0) > limits["max_rel"]:
        return False, f"max_rel {metrics['max_rel']:.3g} > {limits['max_rel']:.3g}"
    if "min_psnr" in limits and metrics.get("psnr", math.inf) < limits["min_psnr"]:
        return False, f"psnr {metrics['psnr']:.1f} dB < {limits['min_psnr']} dB"
    if "min_cos" in limits and metrics.get("cos", 1.0) < limits["min_cos"]:
        return False, f"cos {metrics['cos']:.8f} < {limits['min_cos']}"
    return True, ""


def format_metrics(metrics: dict) -> str:
    parts = []
    for key in ("max_abs", "max_rel", "rmse", "psnr", "cos", "mismatches"):
        if key in metrics:
            value = metrics[key]
            if key == "psnr":
                parts.append(f"psnr={value:.1f}dB" if math.isfinite(value) else f"psnr={value}")
            elif key == "cos":
                parts.append(f"cos={value:.8f}")
            elif key == "mismatches":
                parts.append(f"mismatches={value}")
            else:
                parts.append(f"{key}={value:.3g}")
    return " ".join(parts)
