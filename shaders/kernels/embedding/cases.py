"""Ladder entries for the embedding (ops.py, reference.py, 01_embedding.wgsl)."""

from __future__ import annotations

import numpy as np

from ...ladder import KernelCase, Launch, register
from ..case_support import f64, fd_consistency, grad_report, run_launch, torch_grads
from . import ops as embedding
from .reference import backward_reference, forward_reference

# (tokens, vocab, dim); "oob" has ids >= vocab, "hot" repeats one id everywhere.
SHAPES = {"random": (74, 50, 24), "odd": (1, 7, 3), "dim1": (33, 5, 1), "oob": (40, 16, 8),
          "hot": (300, 3, 12), "bench": (8192, 50304, 768), "bench_small": (8192, 8192, 768)}
VARIANTS = ("random", "odd", "dim1", "oob", "hot")


def make_inputs(rng, variant):
    tokens, vocab, dim = SHAPES[variant]
    if variant == "oob":
        ids = rng.integers(0, vocab + 5, tokens)
    elif variant == "hot":
        ids = np.full(tokens, 1)
    else:
        ids = rng.integers(0, vocab, tokens)
    return {"ids": ids.astype(np.uint32), "vocab": vocab, "dim": dim,
            "table": rng.standard_normal((vocab, dim)).astype(np.float32),
            "dout": rng.standard_normal((tokens, dim)).astype(np.float32),
            "dtable0": rng.standard_normal((vocab, dim)).astype(np.float32)}


def forward_launch(dev, inp):
    ids, table = dev.upload(inp["ids"]), dev.upload(inp["table"])
    out = dev.empty((ids.shape[0], inp["dim"]))
    return Launch(lambda rec: embedding.forward(rec, ids, table, out, inp["ids"].size,
                                                inp["dim"], inp["vocab"]),
                  lambda: {"out": dev.download(out)})


def backward_launch(dev, inp):
    tokens = inp["ids"].size
    plan = dev.upload(embedding.backward_plan(inp["ids"]))
    ids, dout, dtable = dev.upload(inp["ids"]), dev.upload(inp["dout"]), dev.upload(inp["dtable0"])
    return Launch(lambda rec: embedding.backward(rec, plan, ids, dout, dtable, tokens,
                                                 inp["dim"], inp["vocab"]),
                  lambda: {"dtable": dev.download(dtable)})


def backward_grad(dev, rng):
    inp = make_inputs(rng, "random")
    inp["dtable0"][:] = 0.0
    got = run_launch(dev, backward_launch(dev, inp))["dtable"]
    import torch
    ids = torch.tensor(inp["ids"].astype(np.int64))
    ref = torch_grads(lambda table: torch.nn.functional.embedding(ids, table),
                      {"table": inp["table"]}, inp["dout"], ("table",))["table"]

    def loss(params):
        out = run_launch(dev, forward_launch(dev, dict(inp, table=params["table"])))["out"]
        return float(np.sum(f64(out) * f64(inp["dout"])))

    gap = fd_consistency(loss, {"table": inp["table"]}, {"table": got}, rng)
    return grad_report({"dtable": (got, ref)}, "f32", gap)


def _bytes_fwd(inp):
    return inp["ids"].nbytes + 2 * inp["ids"].size * inp["dim"] * 4


register(KernelCase(
    name="embedding_forward", family="embedding", precision="exact",
    kernels=[(embedding.FILE, "embedding_forward"), (embedding.FILE, "embedding_forward_vec4")],
    inputs=make_inputs, launch=forward_launch, reference=forward_reference,
    variants=VARIANTS, bench_variant_software="bench_small", bytes=_bytes_fwd, description="out[t] = table[ids[t]]"))

register(KernelCase(
    name="embedding_backward", family="embedding", precision="f32",
    kernels=[(embedding.FILE, "embedding_backward"),
             (embedding.FILE, "embedding_backward_vec4")],
    inputs=make_inputs, launch=backward_launch, reference=backward_reference,
    variants=VARIANTS, bench_variant_software="bench_small", grad=backward_grad,
    flops=lambda inp: float(inp["ids"].size * inp["dim"]),
    bytes=lambda inp: (inp["ids"].nbytes * 3 + inp["dout"].nbytes
                       + 2 * 4 * inp["dim"] * np.unique(inp["ids"]).size),
    description="dtable[id] += sum of dout rows with that id (host-sorted plan)"))
