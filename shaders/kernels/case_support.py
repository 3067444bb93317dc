"""Helpers for ladder cases: float64 references, autograd references, gradient checks.

A backward kernel's grad rung makes two independent checks:

1. autograd: the GPU gradients against torch.autograd (float64, CPU) of the *forward*
   reference, i.e. a derivation that shares nothing with the hand-written backward;
2. consistency: a central finite difference of the GPU *forward* kernel along a random
   direction v, L(x + hv) - L(x - hv) with L = sum(dy * f(x)) in float64, against
   <grad, (x + hv) - (x - hv)> from the GPU *backward* kernel. This catches a backward that
   disagrees with the forward it belongs to (layouts, conventions), in f32.
"""

from __future__ import annotations

import numpy as np

from .. import metrics as M


def f64(x) -> np.ndarray:
    return np.asarray(x, dtype=np.float64)


def torch_grads(forward, inputs: dict, upstream, wrt) -> dict:
    """float64 autograd gradients of sum(upstream * forward(**tensors)) for the names in wrt.

    `forward` takes torch tensors by keyword and returns a tensor (or a tuple whose first
    element gets `upstream`; the others get zero).
    """
    import torch
    tensors = {k: torch.tensor(f64(v), requires_grad=k in wrt) if isinstance(v, np.ndarray)
               and np.issubdtype(v.dtype, np.floating) else v for k, v in inputs.items()}
    out = forward(**tensors)
    if isinstance(out, tuple):
        out = out[0]
    loss = (out * torch.tensor(f64(upstream))).sum()
    loss.backward()
    return {k: tensors[k].grad.numpy() for k in wrt}


def compare_all(pairs: dict, precision: str, overrides: dict | None = None) -> tuple[bool, str, dict]:
    """Compare {name: (gpu, reference)}; (ok, detail, worst metrics)."""
    ok, notes, worst = True, [], {}
    for name, (out, ref) in pairs.items():
        m = M.compare(np.asarray(out), np.asarray(ref))
        good, why = M.passes(m, precision, overrides)
        if not good:
            ok = False
            notes.append(f"{name}: {why}")
        if not worst or m.get("psnr", np.inf) < worst.get("psnr", np.inf):
            worst = m
    return ok, "; ".join(notes), worst


def fd_consistency(loss, params: dict, grads: dict, rng, rel_step: float = 1e-2) -> float:
    """Relative gap between a central difference of `loss` and <grads, perturbation>.

    loss(params) -> float64 scalar from the GPU forward; params and grads are float arrays by
    name. The perturbation is rounded to each parameter's dtype and the linear prediction uses
    the rounded perturbation, so input rounding does not count as error.
    """
    plus, minus, predicted = {}, {}, 0.0
    for name, value in params.items():
        v = rng.standard_normal(value.shape)
        scale = float(np.sqrt(np.mean(f64(value) ** 2))) or 1.0
        h = rel_step * scale
        plus[name] = (f64(value) + h * v).astype(value.dtype)
        minus[name] = (f64(value) - h * v).astype(value.dtype)
        predicted += float(np.sum(f64(grads[name]) * (f64(plus[name]) - f64(minus[name]))))
    merged_p = dict(params, **plus)
    merged_m = dict(params, **minus)
    measured = loss(merged_p) - loss(merged_m)
    return abs(measured - predicted) / max(abs(predicted), abs(measured), 1e-30)


def grad_report(autograd_pairs: dict, precision: str, fd_gap: float | None = None,
                fd_tol: float = 2e-3, overrides: dict | None = None) -> dict:
    """The grad rung's result dict from the autograd comparison and the FD consistency gap."""
    ok, notes, worst = compare_all(autograd_pairs, precision, overrides)
    parts = [f"autograd[{precision}] {M.format_metrics(worst)}"]
    if notes:
        parts.append(notes)
    if fd_gap is not None:
        fd_ok = fd_gap <= fd_tol
        ok = ok and fd_ok
        parts.append(f"fd-consistency gap={fd_gap:.2e}{'' if fd_ok else f' > {fd_tol:.0e}'}")
    out = {"ok": ok, "detail": " ".join(parts)}
    out.update({k: v for k, v in worst.items() if isinstance(v, (int, float))})
    if fd_gap is not None:
        out["fd_gap"] = fd_gap
    return out


def run_launch(device, launch) -> dict:
    """Record one launch, submit, and read its outputs."""
    with device.record() as rec:
        launch.encode(rec)
    return launch.read()
