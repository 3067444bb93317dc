"""Learning-rate schedule: linear warmup, then cosine decay to min_lr at the last step.

    lr(s) = lr * (s + 1) / warmup                                   for s < warmup
    lr(s) = min_lr + (lr - min_lr) * (1 + cos(pi * p)) / 2,  p = (s - warmup) / (steps - warmup)

`s` counts optimizer steps from 0; p is clamped to [0, 1] so training past `steps` keeps min_lr.
"""

from __future__ import annotations

import math


def learning_rate(step: int, *, lr: float, min_lr: float, warmup: int, steps: int) -> float:
    if warmup > 0 and step < warmup:
        return lr * (step + 1) / warmup
    span = max(steps - warmup, 1)
    progress = min(max((step - warmup) / span, 0.0), 1.0)
    return min_lr + (lr - min_lr) * 0.5 * (1.0 + math.cos(math.pi * progress))
