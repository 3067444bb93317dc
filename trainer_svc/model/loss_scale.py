"""Dynamic loss scaling for f16 training: gradients that travel through f16 matmul operands
stay inside f16's range.

The loss is multiplied by `scale` before the backward pass (the cross-entropy's gradient
scale), so every gradient is `scale` times the true one; the optimizer's gradient statistics
divide it out again (`optim.grad_stats(..., unscale=1 / scale)`). A step whose gradients
overflowed (the NaN/Inf flag of the statistics) is skipped and halves the scale; after
`growth_interval` good steps in a row the scale doubles. The policy and its defaults are
PyTorch's `torch.amp.GradScaler`'s, so an f16 run here and an autocast run there skip the
same kind of steps. Scales are powers of two: scaling and unscaling are exact.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

MIN_SCALE = 1.0          # an overflow at scale 1 is not a range problem: the run diverged
MAX_SCALE = 2.0 ** 24


@dataclass
class LossScaler:
    scale: float = 2.0 ** 16
    growth_interval: int = 2000
    good_steps: int = 0      # good steps since the last change of scale

    def __post_init__(self):
        if not (MIN_SCALE <= self.scale <= MAX_SCALE) or self.growth_interval < 1:
            raise ValueError(f"loss scale must lie in [{MIN_SCALE:g}, {MAX_SCALE:g}] and "
                             f"growth_interval be >= 1 (got {self.scale}, "
                             f"{self.growth_interval})")

    def update(self, overflow: bool) -> bool:
        """Account for one step; True when the step's overflow was the scale's fault (the
        scale was above its floor and is now halved), i.e. not a sign of divergence."""
        if overflow:
            backoff = self.scale > MIN_SCALE
            self.scale = max(self.scale / 2.0, MIN_SCALE)
            self.good_steps = 0
            return backoff
        self.good_steps += 1
        if self.good_steps >= self.growth_interval:
            self.scale = min(self.scale * 2.0, MAX_SCALE)
            self.good_steps = 0
        return False

    def state(self) -> dict:
        return asdict(self)

    @classmethod
    def from_state(cls, state: dict) -> "LossScaler":
        return cls(float(state["scale"]), int(state["growth_interval"]),
                   int(state["good_steps"]))
