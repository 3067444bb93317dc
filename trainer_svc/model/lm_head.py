"""The LM head and the cross-entropy, in row chunks: the logits of a batch never exist at once.

    head = ChunkedHead(device, rows=B*T, d=d_model, vocab=V)      # chunk rows from the limits
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
dlogits in f16 into a buffer of their own instead of over the logits: the two backward matmuls read them as their A, which
they round to f16 anyway (the same numbers; half the bytes of the largest operands a step
has: 8192 x 50304 for the 124M model).

Chunk rows come from the device: the logits chunk must fit one storage binding and one
buffer (lavapipe: 128 MiB; the H200: 2 GiB / 4 GiB) and a memory budget (LOGITS_BUDGET, or
less when the device's memory minus everything else the model allocates is smaller: GpuModel);
chunks are balanced (e.g. 8192 rows in 4 x 2048, not 3 x 2684 + 140) and rounded to 64 rows
for the matmul tiles. A chunk's row views must start on the device's storage offset alignment
(256 bytes), so a chunk is a multiple of 256 / gcd(256, 4 d) rows: 1 row when d % 64 == 0.
"""

from __future__ import annotations

import math

import numpy as np

from istanbul.shaders.kernels.cross_entropy import ops as cross_entropy
from istanbul.shaders.kernels.matmul import ops as linear

from .fit import ConfigDoesNotFitError

# Bytes of one logits chunk (the device limits may cap it lower): 2 GiB keeps 124m/gpt2 at
# 8 x 1024 in one chunk on the H200 (1.6 GB, the step measured before chunking) and puts
# o200k_base's 6.5 GB in 4 chunks of 2048 rows.
LOGITS_BUDGET = 2 << 30


def chunk_quantum(device, d: int) -> int:
    """Rows between chunk starts so that a view at row r0 of a [rows, d] f32 buffer binds."""
    align = int(device.limits.get("min-storage-buffer-offset-alignment", 256)) // 4
    return align // math.gcd(align, d)


def logits_limit(device, budget: int = LOGITS_BUDGET) -> int:
    """Bytes one logits chunk may take on this device."""
    return min(int(device.limits.get("max-storage-buffer-binding-size", 1 << 27)),
               int(device.limits.get("max-buffer-size", 1 << 28)), int(budget))


def plan_chunk_rows(device, rows: int, d: int, vocab: int, *, budget: int = LOGITS_BUDGET,
                    chunk_rows: int | None = None) -> int:
    """Rows per chunk (see the module docstring); `chunk_rows` forces a value (tests)."""
    limit = logits_limit(device, budget)
    quantum = chunk_quantum(device, d)
    per_row = vocab * 4
    cap = limit // per_row
    if chunk_rows:
        c = int(chunk_rows)
        if c < 1 or (c < rows and c % quantum):
            raise ValueError(f"head chunk of {c} rows: must be a multiple of {quantum} rows "
                             f"(d_model {d} and the device's offset alignment)")
        if min(c, rows) * per_row > limit:
            raise ConfigDoesNotFitError(
                f"a head chunk of {c} rows x vocab {vocab} needs {c * per_row / 2**20:.0f} MiB, "
                f"more than {limit / 2**20:.0f} MiB on {device.name}: use fewer chunk rows")
        return min(c, rows)
    if cap >= rows:
        return rows
    if cap < quantum:
        raise ConfigDoesNotFitError(
            f"one row of logits over a vocabulary of {vocab} ids takes "
            f"{quantum * per_row / 2**20:.1f} MiB per chunk of {quantum} rows, more than "
            f"{device.name} allows in one binding ({limit / 2**20:.0f} MiB): use a smaller "
            "vocabulary, or a d_model that is a multiple of 64")
    step = quantum * 64 // math.gcd(quantum, 64)   # tile-friendly when the cap allows it
    if cap < step:
        step = quantum
    chunks = -(-rows // cap)
    c = -(-(-(-rows // chunks)) // step) * step   # balanced, rounded up to `step`
    if c > cap:
        c = cap // step * step
    return c


def _row_view(res, r0: int, count: int, cols: int):
    """Rows r0..r0+count-1 of a [rows, cols] f32 Buffer or view."""
    if hasattr(res, "elements"):
        return res.elements(r0 * cols, count * cols, (count, cols))
    return res.buffer.view(res.offset + r0 * cols * 4, count * cols * 4, res.dtype,
                           (count, cols))


class ChunkedHead:
    """The head + cross-entropy for `rows` rows of width d over a vocabulary of `vocab`."""

    def __init__(self, device, rows: int, d: int, vocab: int, *, chunk_rows: int | None = None,
                 budget: int = LOGITS_BUDGET, f16_dlogits: bool = False):
        """`f16_dlogits`: the cross-entropy writes dlogits in f16 into a buffer of their own,
        which the backward's tensor-core matmuls read as their A (they would round it to f16
        while staging anyway: the same numbers, half the bytes)."""
        self.rows, self.d, self.vocab = rows, d, vocab
        self.chunk = plan_chunk_rows(device, rows, d, vocab, budget=budget,
                                     chunk_rows=chunk_rows)
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
