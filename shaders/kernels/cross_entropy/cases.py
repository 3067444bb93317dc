"""Ladder entries for the fused cross-entropy (ops.py, reference.py, 07_cross_entropy*.wgsl)."""

from __future__ import annotations

import numpy as np

from ...ladder import KernelCase, Launch, register
from ..case_support import fd_consistency, grad_report, run_launch, torch_grads
from . import ops as ce
from .reference import forward_backward_reference, loss_only_reference

IGNORE = ce.IGNORE
# (rows, vocab, stride, logit scale, label smoothing, z-loss, fraction of ignored rows)
SHAPES = {
    "random": (37, 50, 50, 3.0, 0.0, 0.0, 0.0),
    "vec": (20, 128, 128, 3.0, 0.0, 0.0, 0.0),
    "padded": (9, 101, 128, 3.0, 0.0, 0.0, 0.0),
    "huge": (16, 300, 300, 1e4, 0.0, 0.0, 0.0),
    "ignored": (30, 64, 64, 2.0, 0.0, 0.0, 0.4),
    "all_ignored": (5, 16, 16, 2.0, 0.0, 0.0, 1.0),
    "one": (1, 1, 4, 1.0, 0.0, 0.0, 0.0),
    "smooth_z": (25, 77, 80, 4.0, 0.1, 1e-3, 0.2),
    "wide": (6, 5000, 5004, 3.0, 0.1, 1e-3, 0.2),     # the unrolled first pass, vec4
    "wide_odd": (4, 4999, 5001, 3.0, 0.0, 0.0, 0.0),  # the unrolled first pass, scalar
    "bench": (8192, 50304, 50304, 3.0, 0.0, 0.0, 0.0),
    "bench_small": (512, 50304, 50304, 3.0, 0.0, 0.0, 0.0),
}
VARIANTS = ("random", "vec", "padded", "huge", "ignored", "all_ignored", "one", "smooth_z",
            "wide", "wide_odd")


def make_inputs(rng, variant):
    rows, vocab, stride, scale, eps, z, frac = SHAPES[variant]
    logits = (rng.standard_normal((rows, stride)) * scale).astype(np.float32)
    logits[:, vocab:] = 1e6  # padding columns: huge, so taking part in the softmax shows
    targets = rng.integers(0, vocab, rows).astype(np.uint32)
    targets[rng.random(rows) < frac] = IGNORE
    if frac == 1.0:
        targets[:] = IGNORE
    return {"logits": logits, "targets": targets, "vocab": vocab, "eps": eps, "z": z}


def make_launch(dev, inp, grad="inplace", workgroup=None):
    rows, stride = inp["logits"].shape
    logits, targets = dev.upload(inp["logits"]), dev.upload(inp["targets"])
    losses, stats = dev.empty(rows), dev.empty(4)
    to_buffer = grad in ("buffer", "buffer16")
    out = dev.empty((rows, stride), np.float16 if grad == "buffer16" else np.float32) \
        if to_buffer else None

    def encode(rec):
        ce.forward_backward(rec, logits, targets, losses, stats, rows, inp["vocab"],
                            stride=stride, grad=out if to_buffer else grad,
                            label_smoothing=inp["eps"], z_loss=inp["z"], workgroup=workgroup)

    def read():
        got = {"losses": dev.download(losses), "stats": dev.download(stats)}
        if grad != "none":
            got["dlogits"] = dev.download(out if to_buffer else logits).astype(np.float32)
        return got
    return Launch(encode, read)


def grad_check(dev, rng):
    inp = make_inputs(rng, "smooth_z")
    got = run_launch(dev, make_launch(dev, inp))["dlogits"]
    import torch
    vocab, eps, z = inp["vocab"], inp["eps"], inp["z"]
    t = torch.tensor(inp["targets"].astype(np.int64))
    t[t == IGNORE] = -100
    valid = (t != -100)

    def mean_loss(logits):
        x = logits[:, :vocab]
        lse = torch.logsumexp(x, 1)
        main = torch.nn.functional.cross_entropy(x, t, ignore_index=-100, label_smoothing=eps,
                                                 reduction="sum")
        return (main + z * (lse[valid] ** 2).sum()) / valid.sum()

    ref = torch_grads(mean_loss, {"logits": inp["logits"]}, np.array(1.0), ("logits",))["logits"]

    def loss(params):
        out = run_launch(dev, make_launch(dev, dict(inp, logits=params["logits"]), "none"))
        return float(out["stats"][2])

    logits = inp["logits"].copy()
    logits[:, vocab:] = 0.0  # padding takes no part: keep the FD step scale honest
    gap = fd_consistency(loss, {"logits": logits}, {"logits": got}, rng, rel_step=1e-2)
    return grad_report({"dlogits": (got, ref)}, "f32", gap, fd_tol=5e-3)


def _bytes(inp, passes):
    return inp["logits"].nbytes * passes + inp["targets"].nbytes * 2 + inp["logits"].shape[0] * 8


for name, grad, passes, description in (
        ("cross_entropy", "inplace", 3, "softmax + loss + dlogits in place of the logits"),
        ("cross_entropy_to_buffer", "buffer", 3, "dlogits into their own buffer"),
        ("cross_entropy_loss_only", "none", 1, "loss only (evaluation)")):
    register(KernelCase(
        name=name, family="cross_entropy", precision="f32",
        kernels=[(ce.FILE_REDUCE, "ce_count", {"WG": ce.WG}),
                 (ce.FILE, "ce_rows", {"WG": ce.WG}), (ce.FILE, "ce_rows_vec4", {"WG": ce.WG}),
                 (ce.FILE_REDUCE, "ce_finalize", {"WG": ce.WG})],
        inputs=make_inputs, launch=lambda dev, inp, g=grad: make_launch(dev, inp, g),
        reference=loss_only_reference if grad == "none" else forward_backward_reference,
        variants=VARIANTS, bench_variant_software="bench_small",
        grad=grad_check if grad == "inplace" else None,
        flops=lambda inp, n=passes: 4.0 * n * inp["logits"].size,
        bytes=lambda inp, n=passes: _bytes(inp, n), description=description))


register(KernelCase(
    name="cross_entropy_to_buffer_f16", family="cross_entropy", precision="f16",
    kernels=[(ce.FILE, "ce_rows_h16", {"WG": ce.WG}), (ce.FILE, "ce_rows_vec4_h16", {"WG": ce.WG})],
    inputs=make_inputs, launch=lambda dev, inp: make_launch(dev, inp, "buffer16"),
    reference=forward_backward_reference, variants=VARIANTS,
    bench_variant_software="bench_small", requires=("shader-f16",),
    flops=lambda inp: 12.0 * inp["logits"].size, bytes=lambda inp: _bytes(inp, 2.5),
    description="dlogits into an f16 buffer (the tensor-core LM head's backward reads it)"))

register(KernelCase(
    name="cross_entropy_wg1024", family="cross_entropy", precision="f32",
    kernels=[(ce.FILE, "ce_rows_vec4", {"WG": 1024})],
    inputs=make_inputs, launch=lambda dev, inp: make_launch(dev, inp, "inplace", 1024),
    reference=forward_backward_reference, variants=VARIANTS,
    bench_variant_software="bench_small",
    flops=lambda inp: 12.0 * inp["logits"].size, bytes=lambda inp: _bytes(inp, 3),
    description="cross-entropy with 1024 invocations per row"))


CHUNK_ROWS = 7   # not a divisor of any variant's row count: a ragged last chunk


def make_chunked_launch(dev, inp):
    """rows_chunk over chunks of CHUNK_ROWS rows (each chunk's logits in its own buffer, as
    the chunked LM head has them), the gradient scaled by 1 / valid rows from the host."""
    rows, stride = inp["logits"].shape
    targets, losses = dev.upload(inp["targets"]), dev.empty(rows)
    stats = dev.empty(4)
    valid = int((inp["targets"] != IGNORE).sum())
    chunks = [dev.upload(inp["logits"][r0:r0 + CHUNK_ROWS])
              for r0 in range(0, rows, CHUNK_ROWS)]

    def encode(rec):
        for k, chunk in enumerate(chunks):
            r0 = k * CHUNK_ROWS
            ce.rows_chunk(rec, chunk, targets, losses, stats, r0, min(CHUNK_ROWS, rows - r0),
                          inp["vocab"], stride=stride, label_smoothing=inp["eps"],
                          z_loss=inp["z"], grad_scale=1.0 / max(valid, 1))

    def read():
        return {"losses": dev.download(losses),
                "dlogits": np.concatenate([dev.download(c) for c in chunks])}
    return Launch(encode, read)


def _chunked_reference(inp):
    ref = forward_backward_reference(inp)
    del ref["stats"]
    return ref


register(KernelCase(
    name="cross_entropy_chunked", family="cross_entropy", precision="f32",
    kernels=[(ce.FILE, "ce_rows", {"WG": ce.WG}), (ce.FILE, "ce_rows_vec4", {"WG": ce.WG})],
    inputs=make_inputs, launch=make_chunked_launch, reference=_chunked_reference,
    variants=VARIANTS, bench_variant_software="bench_small",
    flops=lambda inp: 12.0 * inp["logits"].size, bytes=lambda inp: _bytes(inp, 3),
    description="cross-entropy per row chunk at row0 (the chunked LM head's calls)"))
