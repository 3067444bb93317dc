"""The training loop API: `Trainer(model_config, train_config, device).step(batch)`.

    trainer = Trainer(ModelConfig.preset("tiny", 512), TrainConfig(batch=8, seq=64), device)
    m = trainer.step(batch)        # batch: (B, T+1) or (grad_accum, B, T+1) token ids
    m.loss, m.grad_norm, m.lr, m.tokens_per_s, m.skipped

One optimizer step is recorded as ONE command buffer: for each micro-batch the forward pass,
the LM head with the fused cross-entropy in row chunks (model/lm_head.py) and the backward
pass (gradients accumulate in the f32 gradient buffer), then the global gradient norm, the clip scale and the NaN/Inf flag, then AdamW over
the one parameter buffer (which also rewrites the f16 weight mirror). The only read-back is
after it: the per-token losses and the gradient statistics. A step whose gradients are not
finite leaves weights and moments untouched and comes back with `skipped=True`.

Precision: "auto" (the default: resolved on the device by `resolve_precision`, "f16" where
the device has f16 subgroup matrices, else "fp32"), "mixed" (SPEC §8: the forward and backward matmuls read an f16 mirror of the
weights; master weights, activations, gradients and moments are f32), "fp32", or "f16": the
mirror as in mixed, every matmul on the tensor cores where the device has f16 subgroup
matrices (e.g. Dawn on NVIDIA: both operands rounded to f16, f32 accumulation; elsewhere the
mixed kernels), and dynamic loss scaling (model/loss_scale.py; an overflow skips the step and
halves the scale, reported as `skipped` with `scale_backoff`). With `f16_math` (mixed only)
the forward matmuls also round their activations to f16 and multiply in packed vec4<f16>
(f32 accumulation): about twice the FMA rate, f16-level forward accuracy.
"""

from __future__ import annotations

import collections
import dataclasses
import math
import time
from dataclasses import dataclass

import numpy as np

from ..model.loss_scale import LossScaler
from .precision import PRECISION_CHOICES, resolve_precision
from ..model.config import ModelConfig
from ..model.gpu import GpuModel
from ..model.init import init_parameters
from ..model.layout import ParameterLayout
from .schedule import learning_rate

@dataclass(frozen=True)
class TrainConfig:
    batch: int = 8
    seq: int = 128
    steps: int = 1000
    lr: float = 1e-3
    min_lr: float = 1e-4
    warmup: int = 50
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-8
    grad_clip: float = 1.0          # global-norm clip; 0 switches clipping off
    grad_accum: int = 1
    seed: int = 1234
    precision: str = "auto"         # resolve_precision: what the Trainer's device runs
    label_smoothing: float = 0.0
    z_loss: float = 0.0
    f16_math: bool = False          # mixed only: forward matmuls multiply in packed f16
    head_chunk_rows: int = 0        # rows per LM-head chunk; 0: from the device's limits

    def __post_init__(self):
        problems = []
        for name in ("batch", "seq", "steps", "grad_accum"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                problems.append(f"{name} must be an integer >= 1, got {getattr(self, name)!r}")
        if self.precision not in PRECISION_CHOICES:
            problems.append(f"precision must be one of {PRECISION_CHOICES}, got "
                            f"{self.precision!r}")
        if not (self.lr > 0 and 0 <= self.min_lr <= self.lr):
            problems.append(f"need lr > 0 and 0 <= min_lr <= lr (lr={self.lr}, "
                            f"min_lr={self.min_lr})")
        if self.warmup < 0 or self.weight_decay < 0 or self.grad_clip < 0 or self.eps <= 0:
            problems.append("warmup, weight_decay, grad_clip must be >= 0 and eps > 0")
        if not (0 <= self.beta1 < 1 and 0 <= self.beta2 < 1):
            problems.append("beta1 and beta2 must lie in [0, 1)")
        if self.f16_math and self.precision != "mixed":
            problems.append("f16_math needs precision 'mixed'")
        if not isinstance(self.head_chunk_rows, int) or self.head_chunk_rows < 0:
            problems.append(f"head_chunk_rows must be an integer >= 0 (0: automatic), got "
                            f"{self.head_chunk_rows!r}")
        if not (0 <= self.label_smoothing < 1) or self.z_loss < 0:
            problems.append("label_smoothing must lie in [0, 1) and z_loss >= 0")
        if problems:
            raise ValueError("invalid training config: " + "; ".join(problems))

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "TrainConfig":
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - names)
        if unknown:
            raise ValueError(f"unknown training config field(s): {', '.join(unknown)}")
        return cls(**data)

    def lr_at(self, step: int) -> float:
        return learning_rate(step, lr=self.lr, min_lr=self.min_lr, warmup=self.warmup,
                             steps=self.steps)


@dataclass
class StepMetrics:
    step: int              # optimizer steps done, this one included
    loss: float            # mean over the step's tokens (all micro-batches)
    grad_norm: float       # global L2 norm before clipping
    lr: float
    tokens: int            # tokens in this step
    seconds: float         # wall time of the step, read-back included
    tokens_per_s: float
    skipped: bool          # gradients (or loss) not finite: no update was applied
    loss_scale: float = 1.0      # f16 precision: the scale this step's gradients carried
    scale_backoff: bool = False  # f16: skipped for an overflow of the scale (now halved),
                                 # not for divergence

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


class Trainer:
    """Owns the model's GPU buffers and the optimizer state for one training run."""

    def __init__(self, model_config: ModelConfig, train_config: TrainConfig, device,
                 parameters: np.ndarray | None = None):
        precision = resolve_precision(train_config.precision, device)
        train_config = dataclasses.replace(   # f16_math: mixed only (fp32 without shader-f16)
            train_config, precision=precision, f16_math=train_config.f16_math and
            precision == "mixed")
        self.model_config = model_config
        self.train_config = train_config     # the precision resolved for `device`
        self.device = device
        self.layout = ParameterLayout.for_config(model_config)
        if train_config.seq > model_config.max_seq:
            raise ValueError(f"seq {train_config.seq} exceeds the model's max_seq "
                             f"{model_config.max_seq}")
        if parameters is None:
            parameters = init_parameters(model_config, self.layout, train_config.seed)
        self.model = GpuModel(model_config, self.layout, device,
                              batch=train_config.batch, seq=train_config.seq,
                              precision=train_config.precision,
                              grad_accum=train_config.grad_accum,
                              f16_math=train_config.f16_math,
                              head_chunk_rows=train_config.head_chunk_rows or None)
        self.model.set_parameters(parameters)
        self.step_count = 0
        self.tokens_seen = 0
        self.skipped_steps = 0      # updates skipped for non-finite gradients or loss
        self.scale_backoffs = 0     # f16: updates skipped because the loss scale overflowed
        self.recent_losses: collections.deque = collections.deque(maxlen=100)
        self.rng = np.random.Generator(np.random.PCG64(train_config.seed))

    # ---- lifetime ----------------------------------------------------------------------

    def close(self) -> None:
        """Free the GPU memory now (a daemon runs job after job in one process)."""
        if self.model is not None:
            self.model.release()
            self.model = None

    def __enter__(self) -> "Trainer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _live_model(self):
        if self.model is None:
            raise RuntimeError("this Trainer was closed; load its checkpoint into a new one")
        return self.model

    # ---- training ----------------------------------------------------------------------

    def _micro_batches(self, batch) -> np.ndarray:
        tc = self.train_config
        arr = np.asarray(batch)
        if arr.ndim == 2:
            arr = arr[None]
        if arr.ndim != 3 or arr.shape[1:] != (tc.batch, tc.seq + 1):
            raise ValueError(f"batch shape {np.asarray(batch).shape}: expected "
                             f"({tc.grad_accum}, {tc.batch}, {tc.seq + 1}) or "
                             f"({tc.batch}, {tc.seq + 1})")
        if arr.shape[0] != tc.grad_accum:
            raise ValueError(f"batch holds {arr.shape[0]} micro-batches, grad_accum is "
                             f"{tc.grad_accum}")
        if arr.size and (int(arr.min()) < 0 or int(arr.max()) >= self.model_config.vocab_size):
            raise ValueError(f"token ids outside [0, {self.model_config.vocab_size})")
        return arr.astype(np.uint32)

    def step(self, batch) -> StepMetrics:
        tc = self.train_config
        micro = self._micro_batches(batch)
        start = time.perf_counter()
        lr = tc.lr_at(self.step_count)
        result = self._live_model().train_step(micro, lr=lr, step=self.step_count + 1, tc=tc)
        seconds = time.perf_counter() - start
        tokens = int(micro.shape[0] * micro.shape[1] * tc.seq)
        skipped = bool(result.skipped) or not math.isfinite(result.loss)
        backoff = skipped and bool(result.scale_backoff) and math.isfinite(result.loss)
        if backoff:
            self.scale_backoffs += 1   # f16: the loss scale was too high, now halved
        elif skipped:
            self.skipped_steps += 1
        else:
            self.step_count += 1
            self.tokens_seen += tokens
            self.recent_losses.append(result.loss)
        return StepMetrics(step=self.step_count, loss=result.loss, grad_norm=result.grad_norm,
                           lr=lr, tokens=tokens, seconds=seconds,
                           tokens_per_s=tokens / seconds if seconds > 0 else 0.0,
                           skipped=skipped, loss_scale=result.loss_scale,
                           scale_backoff=backoff)

    def loss_and_gradients(self, batch) -> tuple[float, dict[str, np.ndarray]]:
        """Loss and named f32 gradients of one step's batch, without updating anything."""
        loss, flat = self._live_model().gradients(self._micro_batches(batch), self.train_config)
        return loss, self.layout.unpack(flat)

    def evaluate(self, batch) -> float:
        """Mean loss over a batch (B, T+1) or (n, B, T+1) without touching the weights."""
        arr = np.asarray(batch)
        if arr.ndim == 2:
            arr = arr[None]
        tc = self.train_config
        losses = []
        for micro in arr:
            if micro.shape != (tc.batch, tc.seq + 1):
                raise ValueError(f"evaluate: batch shape {micro.shape}, expected "
                                 f"({tc.batch}, {tc.seq + 1})")
            losses.append(self._live_model().eval_loss(micro.astype(np.uint32), tc))
        return float(np.mean(losses))

    # ---- state -------------------------------------------------------------------------

    def parameters(self) -> np.ndarray:
        """The f32 master weights as one flat array (layout.total elements)."""
        return self._live_model().get_parameters()

    def export_weights(self) -> dict[str, np.ndarray]:
        return self.layout.unpack(self.parameters())

    def optimizer_state(self) -> dict[str, np.ndarray]:
        m, v = self._live_model().get_moments()
        return {"m": m, "v": v}

    def load_optimizer_state(self, m: np.ndarray, v: np.ndarray) -> None:
        self._live_model().set_moments(m, v)

    def loss_scale_state(self) -> dict | None:
        """The dynamic loss scaler's state (f16 precision), else None."""
        scaler = self._live_model().scaler
        return scaler.state() if scaler is not None else None

    def set_loss_scale_state(self, state: dict | None) -> None:
        model = self._live_model()
        if model.scaler is not None and state:
            model.scaler = LossScaler.from_state(state)

    def rng_state(self) -> dict:
        return self.rng.bit_generator.state

    def set_rng_state(self, state: dict) -> None:
        self.rng.bit_generator.state = state
