"""Data parallel training: rank 0's `DataParallelTrainer` and every other rank's `serve_rank`.

    trainer = DataParallelTrainer(local_trainer, group, global_train_config)   # rank 0
    trainer.step(batch)         # what Trainer.step does, for the whole (A, B, T+1) batch
    serve_rank(group, device)   # ranks 1..N-1: follow rank 0's commands until "stop"

Both sides of one protocol live here. Rank 0 broadcasts each command (a small pickled tuple)
and every rank, rank 0 included, then runs the same function for it:

    ("init", state)      model and per-rank train config; then parameters, AdamW moments
                         (broadcast as arrays): every rank starts from rank 0's state
    ("step", micro)      rank r trains rows [r*b, (r+1)*b) of every micro-batch (b = B/N);
                         the gradient hook averages the gradients; the update is replicated
    ("eval", batches)    each rank evaluates its rows; the mean of the ranks' means
    ("hashes",)          sha256 of every rank's weights and moments (identical, or an error)
    ("stop",)            the ranks exit

Equal shards make the mean of the ranks' mean losses (and gradients) the mean over the whole
batch, so N ranks compute what one rank computes on the full batch, up to fp32 rounding: each
rank sums b x T tokens instead of B x T and the sums meet in a different order.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import hashlib
import logging
import time

import numpy as np

from ..model.config import ModelConfig
from ..model.layout import ParameterLayout
from ..training.trainer import StepMetrics, TrainConfig, Trainer
from .grad_sync import DEFAULT_BUCKET_BYTES, GradientAllReduce
from .group import RankFailed, RankGroup

log = logging.getLogger(__name__)


def rank_train_config(tc: TrainConfig, world: int) -> TrainConfig:
    """Each rank's config: the batch divided by the ranks, everything else the same."""
    if tc.batch % world:
        raise ValueError(f"batch {tc.batch} does not divide by {world} GPUs; use a batch that "
                         f"is a multiple of the number of GPUs")
    return dataclasses.replace(tc, batch=tc.batch // world)


def rank_rows(micro: np.ndarray, rank: int, world: int) -> np.ndarray:
    """Rank `rank`'s rows of every micro-batch of (A, B, T+1)."""
    b = micro.shape[1] // world
    return np.ascontiguousarray(micro[:, rank * b:(rank + 1) * b])


def state_hash(trainer: Trainer) -> str:
    """sha256 of a rank's f32 weights and AdamW moments."""
    digest = hashlib.sha256(trainer.parameters().tobytes())
    for moment in trainer.optimizer_state().values():
        digest.update(np.ascontiguousarray(moment).tobytes())
    return digest.hexdigest()


# ---- what every rank does for a command -----------------------------------------------------

def _receive_state(local: Trainer, group: RankGroup, info: dict) -> None:
    """Rank 0's weights, moments and counters into `local` (rank 0 sends them)."""
    total = local.layout.total
    params = local.parameters() if group.rank == 0 else np.zeros(total, np.float32)
    m, v = (local.optimizer_state()[k] for k in ("m", "v")) if group.rank == 0 else \
        (np.zeros(total, np.float32), np.zeros(total, np.float32))
    params, m, v = (np.ascontiguousarray(a, np.float32) for a in (params, m, v))
    for array in (params, m, v):
        group.broadcast_array(array)
    if group.rank != 0:
        local._live_model().set_parameters(params)
        local.load_optimizer_state(m, v)
        local.step_count, local.skipped_steps = info["step"], info["skipped_steps"]
        local.set_loss_scale_state(info.get("loss_scale"))   # f16: every rank's scale agrees


def _rank_step(local: Trainer, group: RankGroup, micro: np.ndarray) -> StepMetrics:
    """This rank's part of one step; the loss is the mean over all ranks."""
    metrics = local.step(rank_rows(micro, group.rank, group.world))
    totals = np.array([metrics.loss, float(metrics.skipped)], np.float64)
    group.all_reduce_sum(totals)
    if totals[1] not in (0.0, float(group.world)):
        # the skip decision comes from the reduced gradients, so ranks can only disagree when
        # one rank's own loss was not finite: their weights would part ways
        raise RankFailed(f"the ranks disagree whether step {local.step_count + 1} was "
                         f"skipped ({int(totals[1])} of {group.world} skipped it)")
    return dataclasses.replace(metrics, loss=float(totals[0] / group.world),
                               tokens=metrics.tokens * group.world)


def _rank_eval(local: Trainer, group: RankGroup, batches: np.ndarray) -> float:
    arr = np.asarray(batches)
    arr = arr[None] if arr.ndim == 2 else arr
    b = arr.shape[1] // group.world
    mine = np.ascontiguousarray(arr[:, group.rank * b:(group.rank + 1) * b])
    total = np.array([local.evaluate(mine)], np.float64)
    group.all_reduce_sum(total)
    return float(total[0] / group.world)


def _check_hashes(group: RankGroup, hashes: list[str]) -> list[str]:
    if len(set(hashes)) != 1:
        raise RankFailed("the ranks' weights differ (sha256 per rank: " +
                         ", ".join(f"{r}: {h[:12]}" for r, h in enumerate(hashes)) + ")")
    return hashes


# ---- rank 0 ---------------------------------------------------------------------------------

class DataParallelTrainer:
    """Trainer's interface (step, evaluate, state for checkpoints) over a group of ranks.

    `local` is rank 0's own Trainer, built with `rank_train_config(train_config, world)`;
    `train_config` is the job's (the whole batch). Its checkpoint state is rank 0's: every
    rank holds the same, and a checkpoint resumes on any number of GPUs that divides the
    batch. `on_close(told=...)` reaps the rank processes (launch.RankProcesses.stop).
    """

    def __init__(self, local: Trainer, group: RankGroup, train_config: TrainConfig,
                 on_close=None, bucket_bytes: int = DEFAULT_BUCKET_BYTES):
        if local.train_config != rank_train_config(train_config, group.world):
            raise ValueError("the local trainer must use rank_train_config(train_config, "
                             f"{group.world})")
        self.local, self.group, self.train_config = local, group, train_config
        self.model_config: ModelConfig = local.model_config
        self.layout, self.device = local.layout, local.device
        self.world = group.world
        self.tokens_seen = local.tokens_seen
        self.recent_losses = collections.deque(local.recent_losses, maxlen=100)
        self._on_close = on_close
        self._broken = False
        self.sync = GradientAllReduce(group, bucket_bytes)
        local._live_model().gradient_hook = self.sync
        info = {"model": local.model_config.to_json(), "train": local.train_config.to_dict(),
                "step": local.step_count, "skipped_steps": local.skipped_steps,
                "loss_scale": local.loss_scale_state(),
                "bucket_bytes": bucket_bytes}   # every rank's all-reduces must pair up
        group.broadcast_object(("init", info))
        _receive_state(local, group, info)

    # counters the checkpoint reads: the local trainer's (identical on every rank)
    @property
    def step_count(self) -> int:
        return self.local.step_count

    @property
    def skipped_steps(self) -> int:
        return self.local.skipped_steps

    @property
    def rng(self):
        return self.local.rng

    def step(self, batch) -> StepMetrics:
        tc = self.train_config
        micro = np.asarray(batch)
        micro = micro[None] if micro.ndim == 2 else micro
        if micro.shape != (tc.grad_accum, tc.batch, tc.seq + 1):
            raise ValueError(f"batch shape {np.asarray(batch).shape}: expected "
                             f"({tc.grad_accum}, {tc.batch}, {tc.seq + 1})")
        start = time.perf_counter()
        micro = micro.astype(np.uint32)
        with self._collective():
            self.group.broadcast_object(("step", micro))
            metrics = _rank_step(self.local, self.group, micro)
        seconds = time.perf_counter() - start
        if not metrics.skipped:
            self.tokens_seen += metrics.tokens
            self.recent_losses.append(metrics.loss)
        return dataclasses.replace(metrics, seconds=seconds,
                                   tokens_per_s=metrics.tokens / seconds if seconds else 0.0)

    def evaluate(self, batch) -> float:
        arr = np.asarray(batch)
        tc = self.train_config
        if arr.shape[-2:] != (tc.batch, tc.seq + 1):
            raise ValueError(f"evaluate: batch shape {arr.shape}, expected (..., {tc.batch}, "
                             f"{tc.seq + 1})")
        with self._collective():
            self.group.broadcast_object(("eval", arr.astype(np.uint32)))
            return _rank_eval(self.local, self.group, arr)

    def rank_hashes(self) -> list[str]:
        """sha256 of every rank's weights and moments; RankFailed when they differ."""
        with self._collective():
            self.group.broadcast_object(("hashes",))
            return _check_hashes(self.group,
                                 self.group.all_gather_object(state_hash(self.local)))

    @contextlib.contextmanager
    def _collective(self):
        """A command's collectives; after a failure the group is broken (no more commands:
        `close` then only reaps the processes)."""
        if self.group is None or self._broken:
            raise RankFailed("the group of ranks is closed or broken; start a new one")
        try:
            yield
        except BaseException:
            self._broken = True
            raise

    # state for checkpoints: rank 0's copy
    def parameters(self) -> np.ndarray:
        return self.local.parameters()

    def export_weights(self) -> dict[str, np.ndarray]:
        return self.local.export_weights()

    def optimizer_state(self) -> dict[str, np.ndarray]:
        return self.local.optimizer_state()

    def rng_state(self) -> dict:
        return self.local.rng_state()

    def loss_scale_state(self) -> dict | None:
        return self.local.loss_scale_state()

    def close(self) -> None:
        """Stop the ranks (best effort: some may be dead already) and free the GPU."""
        told = False
        try:
            if self.group is not None and not self._broken:
                self.group.broadcast_object(("stop",))
                told = True
        except Exception as exc:  # noqa: BLE001 - a dead rank: the launcher reaps it
            log.debug("stopping the ranks: %s", exc)
        finally:
            if self.group is not None:
                self.group.close()
                self.group = None
            if self._on_close is not None:
                self._on_close(told=told)
                self._on_close = None
            self.local.close()

    def __enter__(self) -> "DataParallelTrainer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


# ---- ranks 1..N-1 ---------------------------------------------------------------------------

def serve_rank(group: RankGroup, device) -> None:
    """Follow rank 0's commands until "stop"; raises RankFailed when rank 0 goes away."""
    command, info = group.broadcast_object()
    if command != "init":
        raise RuntimeError(f"rank {group.rank}: expected init, got {command!r}")
    model = ModelConfig.from_json(info["model"])
    placeholder = np.zeros(ParameterLayout.for_config(model).total, np.float32)  # rank 0's next
    local = Trainer(model, TrainConfig.from_dict(info["train"]), device, parameters=placeholder)
    try:
        local._live_model().gradient_hook = GradientAllReduce(group, info["bucket_bytes"])
        _receive_state(local, group, info)
        while True:
            message = group.broadcast_object()
            command = message[0]
            if command == "step":
                _rank_step(local, group, message[1])
            elif command == "eval":
                _rank_eval(local, group, message[1])
            elif command == "hashes":
                _check_hashes(group, group.all_gather_object(state_hash(local)))
            elif command == "stop":
                return
            else:
                raise RuntimeError(f"rank {group.rank}: unknown command {command!r}")
    finally:
        local.close()
