"""A training run's scalars as TensorBoard event files (`--tensorboard DIR` on `istanbul train`
and `istanbul trainer`).

    log = ScalarLog(Path("tb/run1"), purge_step=trainer.step_count + 1)
    log.step(metrics)                 # a StepMetrics of an applied step
    log.eval(step, loss)              # a held-out loss
    log.loss_scale_backoff(step, scale)
    log.close()
    # then: tensorboard --logdir tb

Tags (the step is the optimizer step, counted as `StepMetrics.step`):
    train/loss, train/lr, train/grad_norm, train/tokens_per_s, train/loss_scale   every step
    eval/loss                                                                    every evaluation
A non-finite value is left out (TensorBoard would draw it as a spike to infinity).

`purge_step`: a run resumed from a checkpoint at step S recomputes the steps after S; events of
an earlier attempt at steps > S are then hidden by TensorBoard (a SessionLog START at S + 1),
so each step keeps one value. The writer is tensorboardX's (an 87 KB package, the
`tensorboard` extra); the `tensorboard` package itself is only needed to look at the logs.
"""

from __future__ import annotations

import math
import time
from pathlib import Path

from istanbul_errors import require_extra

EXTRA = "tensorboard"
TRAIN_TAGS = {"loss": "train/loss", "lr": "train/lr", "grad_norm": "train/grad_norm",
              "tokens_per_s": "train/tokens_per_s", "loss_scale": "train/loss_scale"}
EVAL_LOSS = "eval/loss"


def require_writer() -> None:
    """Raise a UserFacingError naming the extra when tensorboardX is not installed (call it at
    start-up, before any work)."""
    require_extra("tensorboardX", EXTRA, "--tensorboard (TensorBoard event files)")


class ScalarLog:
    """One run's event files in `logdir` (created). Not thread-safe; close it when done."""

    def __init__(self, logdir: Path, purge_step: int | None = None, flush_secs: float = 10):
        require_writer()
        from tensorboardX import SummaryWriter
        self.logdir = Path(logdir)
        self.logdir.mkdir(parents=True, exist_ok=True)
        # A file of its own, named to sort after an earlier attempt's even within the same
        # second (the name is events.out.tfevents.SECONDS.HOST + suffix; TensorBoard reads a
        # run's files in name order, so the purge applies to the older ones)
        self._writer = SummaryWriter(logdir=str(self.logdir), purge_step=purge_step,
                                     flush_secs=flush_secs,
                                     filename_suffix=f".{time.time_ns():020d}")

    def _add(self, tag: str, value, step: int) -> None:
        if value is None:
            return
        value = float(value)
        if math.isfinite(value):
            self._writer.add_scalar(tag, value, int(step))

    def step(self, metrics, step: int | None = None) -> None:
        """The scalars of one applied optimizer step (a trainer's StepMetrics)."""
        step = metrics.step if step is None else step
        for name, tag in TRAIN_TAGS.items():
            self._add(tag, getattr(metrics, name), step)

    def eval(self, step: int, loss: float) -> None:
        self._add(EVAL_LOSS, loss, step)

    def loss_scale_backoff(self, step: int, new_scale: float) -> None:
        """f16: the step overflowed and the loss scale was halved to `new_scale`."""
        self._add(TRAIN_TAGS["loss_scale"], new_scale, step)

    def flush(self) -> None:
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()
