"""The LM head and the cross-entropy, in row chunks: the logits of a batch never exist at once.

    head = ChunkedHead(device, rows=B*T, d=d_model, vocab=V, chunk_rows=plan.head_rows)
    head.record(rec, h, W, targets, losses, grad_scale=1/n, dh=dh, dw=dW)   # training
    head.record(rec, h, W, targets, losses, grad_scale=1/n)                 # loss only

For each chunk of rows r0..r0+c-1 (one buffer of c x V logits, reused by every chunk):
    logits  = h[r0:r0+c] · Wᵀ                                   (matmul NT)
    losses[r0:r0+c], dlogits = fused softmax + loss + dlogits   (in place of the logits)
    dW     += dlogitsᵀ · h[r0:r0+c]                             (matmul TN, accumulate)
    dh[r0:r0+c] = dlogits · W                                   (matmul NN)
With one chunk (every row fits the budget) this is exactly the unchunked computation; with
several, dW sums the chunks' products in chunk order (the same sum, rounded differently).
On the tensor cores (`f16_dlogits`, which GpuModel passes there) the cross-entropy writes
dlogits in f16 into a buffer of their own instead of over the logits: the two backward
matmuls read them as their A, which they round to f16 anyway (the same numbers; half the
bytes of the largest operands a step has: 8192 x 50304 for the 124M model).

The rows per chunk are the plan's (plan.py: `plan_chunk_rows`, from the device's binding
limits and the memory the rest of the step leaves free); a chunk's row views must start on
the device's storage offset alignment, which the plan's chunk respects.
"""

from __future__ import annotations

import numpy as np

from istanbul.shaders.kernels.cross_entropy import ops as cross_entropy
from istanbul.shaders.kernels.matmul import ops as linear


def _row_view(res, r0: int, count: int, cols: int):
    """Rows r0..r0+count-1 of a [rows, cols] f32 Buffer or view."""
    if hasattr(res, "elements"):
        return res.elements(r0 * cols, count * cols, (count, cols))
    return res.buffer.view(res.offset + r0 * cols * 4, count * cols * 4, res.dtype,
                           (count, cols))


class ChunkedHead:
    """The head + cross-entropy for `rows` rows of width d over a vocabulary of `vocab`."""

    def __init__(self, device, rows: int, d: int, vocab: int, *, chunk_rows: int,
                 f16_dlogits: bool = False):
        """`chunk_rows`: rows per chunk, as planned (plan.plan_chunk_rows: a multiple of the
        offset alignment's rows unless it covers every row). `f16_dlogits`: the cross-entropy
        writes dlogits in f16 into a buffer of their own, which the backward's tensor-core
        matmuls read as their A (they would round it to f16 while staging anyway: the same
        numbers, half the bytes)."""
        self.rows, self.d, self.vocab = rows, d, vocab
        self.chunk = min(int(chunk_rows), rows)
        self.logits = device.empty((self.chunk, vocab), np.float32, label="logits chunk")
        self.dlogits16 = device.empty((self.chunk, vocab), np.float16,
                                      label="dlogits chunk f16") if f16_dlogits else None
        self.stats = device.empty(4, np.float32, label="cross-entropy stats")  # unused: the
        # model scales by 1/tokens from the host and sums the per-token losses itself

    @property
    def chunks(self) -> int:
        return -(-self.rows // self.chunk)

    def buffers(self) -> list:
        return [b for b in (self.logits, self.stats, self.dlogits16) if b is not None]

    def record(self, rec, h, w, targets, losses, *, grad_scale: float, dh=None, dw=None,
               label_smoothing: float = 0.0, z_loss: float = 0.0,
               ignore_index: int = cross_entropy.IGNORE, f16_math: bool = False,
               tensor_cores: bool = False) -> None:
        """Per-token losses into `losses`; with dh and dw also the gradients (dh written,
        dw accumulated) of grad_scale * sum of the losses. h [rows, d], w [vocab, d]."""
        if (dh is None) != (dw is None):
            raise ValueError("ChunkedHead.record: give both dh and dw (training) or neither")
        d, V = self.d, self.vocab
        for r0 in range(0, self.rows, self.chunk):
            c = min(self.chunk, self.rows - r0)
            x = _row_view(h, r0, c, d)
            logits = self.logits.elements(0, c * V, (c, V))
            linear.matmul_nt(rec, x, w, logits, c, V, d, f16_math=f16_math,
                             tensor_cores=tensor_cores)
            grad = "inplace" if dh is not None else "none"
            if dh is not None and tensor_cores and self.dlogits16 is not None:
                grad = self.dlogits16.elements(0, c * V, (c, V))
            cross_entropy.rows_chunk(
                rec, logits, targets, losses, self.stats, r0, c, V, grad=grad,
                ignore_index=ignore_index, label_smoothing=label_smoothing, z_loss=z_loss,
                grad_scale=grad_scale)
            if dh is None:
                continue
            dlogits = logits if isinstance(grad, str) else grad
            linear.matmul_tn(rec, dlogits, x, dw, V, d, c, accumulate=True,
                             tensor_cores=tensor_cores)
            linear.matmul_nn(rec, dlogits, w, _row_view(dh, r0, c, d), c, d, V,
                             tensor_cores=tensor_cores)
