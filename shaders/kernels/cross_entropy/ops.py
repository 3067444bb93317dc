"""Fused softmax cross-entropy: per-row loss, mean loss and dlogits (07_cross_entropy*.wgsl).

Layouts: logits f32[rows, stride] (rows = B*T; stride = padded vocabulary, e.g. a multiple of
128; only the first `vocab` columns take part, the padding gets dlogits 0); targets
u32[rows]; losses f32[rows]; stats f32[4] = (valid rows, loss sum, mean loss, 0).

    cross_entropy.forward_backward(rec, logits, targets, losses, stats, rows, vocab,
                                   stride=V_padded, grad="inplace")
    # logits now hold dlogits = d(mean loss)/d(logits); stats[2] is the mean loss

Options: ignore_index (u32; default 0xFFFFFFFF, i.e. -1 as int32): those rows get loss 0 and
dlogits 0 and do not count; label_smoothing eps (PyTorch's definition); z_loss z adds
z * lse^2 per row; the gradient is d(sum of row losses)/dx * grad_scale / (valid rows) with
mean_over_valid=True (the mean over non-ignored tokens, counted on the GPU), or
* grad_scale alone with mean_over_valid=False (e.g. grad_scale = 1 / total valid tokens of all
micro-batches, known on the host). grad: "inplace" overwrites the logits, a Buffer receives
dlogits (f32, or f16 for the tensor-core matmuls that consume it: the _h16 kernels), "none"
computes the loss only. A target >= vocab that is not ignore_index makes that
row's loss and dlogits NaN: the grad-stats NaN guard then skips the step.

`rows_chunk` records the row kernel alone for a chunk of rows (row0.., logits of the chunk
only): the chunked LM head (trainer_svc/model/lm_head.py) calls it once per chunk, so the
logits of a whole batch never exist at once.
"""

from __future__ import annotations

from ...tuned_cache import lookup
from ..op_support import F16, F32, U32, check, dummy, positive, row_grid

FILE = "07_cross_entropy.wgsl"
FILE_REDUCE = "07_cross_entropy_reduce.wgsl"
IGNORE = 0xFFFFFFFF
NAN_BITS = 0x7FC00000  # a quiet NaN, handed to the kernel (no NaN constants in WGSL)
WG = 256


def row_workgroup(device, stride: int) -> int:
    """Invocations per row: 1024 for wide rows on GPUs (fewer rows in flight, so the dlogits
    pass re-reads each row from the last-level cache), else 256; a tuned value if cached."""
    limit = int(device.limits.get("max-compute-invocations-per-workgroup", 256))
    tuned = lookup(device, "cross_entropy", "rows", (stride,))
    if tuned is not None and tuned.isdigit() and 32 <= int(tuned) <= limit:
        return int(tuned)
    if device.info.is_software or stride < 16384:
        return min(WG, limit)
    return min(1024, limit)


def _params(dev, rows, vocab, stride, ignore_index, mode, mean_over_valid, label_smoothing,
            z_loss, grad_scale, row0=0):
    return dev.params("IIIIIIfffIII", rows, vocab, stride, int(ignore_index), mode,
                      int(bool(mean_over_valid)), float(label_smoothing), float(z_loss),
                      float(grad_scale), int(row0), NAN_BITS, 0)


def _check_options(op, rows, vocab, stride, ignore_index, label_smoothing) -> int:
    positive(op, rows=rows, vocab=vocab)
    stride = vocab if stride is None else int(stride)
    if stride < vocab:
        raise ValueError(f"{op}: stride {stride} < vocab {vocab}")
    if not 0.0 <= label_smoothing < 1.0:
        raise ValueError(f"{op}: label_smoothing must lie in [0, 1), got {label_smoothing}")
    if not 0 <= int(ignore_index) <= 0xFFFFFFFF:
        raise ValueError(f"{op}: ignore_index must be a u32 (use 0xFFFFFFFF for -1)")
    return stride


def forward_backward(rec, logits, targets, losses, stats, rows: int, vocab: int, *,
                     stride: int | None = None, grad="inplace", ignore_index: int = IGNORE,
                     label_smoothing: float = 0.0, z_loss: float = 0.0,
                     grad_scale: float = 1.0, mean_over_valid: bool = True,
                     workgroup: int | None = None) -> None:
    """Record ce_count, ce_rows and ce_finalize (see the module docstring)."""
    op = "cross_entropy"
    stride = _check_options(op, rows, vocab, stride, ignore_index, label_smoothing)
    check(op, "stats", stats, 4)
    dev = rec.device
    params = _params(dev, rows, vocab, stride, ignore_index, 0, mean_over_valid,
                     label_smoothing, z_loss, grad_scale)
    consts = {"WG": WG}
    check(op, "targets", targets, rows, (U32,))
    rec.dispatch(dev.kernel(FILE_REDUCE, "ce_count", consts), [targets, stats, params], 1,
                 label="ce_count")
    rows_chunk(rec, logits, targets, losses, stats, 0, rows, vocab, stride=stride, grad=grad,
               ignore_index=ignore_index, label_smoothing=label_smoothing, z_loss=z_loss,
               grad_scale=grad_scale, mean_over_valid=mean_over_valid, workgroup=workgroup)
    check(op, "losses", losses, rows)
    rec.dispatch(dev.kernel(FILE_REDUCE, "ce_finalize", consts), [losses, stats, params], 1,
                 label="ce_finalize")


def rows_chunk(rec, logits, targets, losses, stats, row0: int, rows: int, vocab: int, *,
               stride: int | None = None, grad="inplace", ignore_index: int = IGNORE,
               label_smoothing: float = 0.0, z_loss: float = 0.0, grad_scale: float = 1.0,
               mean_over_valid: bool = False, workgroup: int | None = None) -> None:
    """Record ce_rows alone for token rows row0..row0+rows-1, whose logits are the `rows`
    rows of `logits` (one chunk of a batch: the chunked LM head calls this per chunk).

    Losses land in losses[row0:row0+rows]; targets are read at the same rows. With
    mean_over_valid the gradient divides by stats[0], which a ce_count over the whole batch
    must have written earlier in the recording; the model passes the scale from the host
    (mean_over_valid=False) and sums the losses itself.
    """
    op = "cross_entropy"
    stride = _check_options(op, rows, vocab, stride, ignore_index, label_smoothing)
    if row0 < 0:
        raise ValueError(f"{op}: row0 must be >= 0, got {row0}")
    check(op, "logits", logits, rows * stride)
    check(op, "targets", targets, row0 + rows, (U32,))
    check(op, "losses", losses, row0 + rows)
    check(op, "stats", stats, 4)
    dev = rec.device
    if isinstance(grad, str):
        if grad not in ("inplace", "none"):
            raise ValueError(f"{op}: grad must be 'inplace', 'none' or a Buffer, got {grad!r}")
        mode, dlogits = (1 if grad == "inplace" else 0), dummy(dev)
    else:
        mode, dlogits = 2, grad
    h16 = mode == 2 and check(op, "dlogits", grad, rows * stride, (F32, F16)) == F16
    if h16 and not dev.has("shader-f16"):
        raise ValueError(f"{op}: f16 dlogits need the shader-f16 feature, which {dev.name} "
                         "lacks")
    params = _params(dev, rows, vocab, stride, ignore_index, mode, mean_over_valid,
                     label_smoothing, z_loss, grad_scale, row0)
    vec = stride % 4 == 0 and all(getattr(b, "offset", 0) % 16 == 0 for b in (logits, dlogits))
    name = ("ce_rows_vec4" if vec else "ce_rows") + ("_h16" if h16 else "")
    row_consts = {"WG": int(workgroup) if workgroup else row_workgroup(dev, stride)}
    rec.dispatch(dev.kernel(FILE, name, row_consts),
                 [targets, stats, logits, dlogits, losses, params], row_grid(dev, rows),
                 label=name)
