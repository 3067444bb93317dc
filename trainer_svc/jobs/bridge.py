"""The one place where the daemon meets the training core (model, Trainer, TokenStream,
checkpoints). Everything here is about one job's run; nothing here knows about Redis.

    run = open_run(spec, job_id, shards, job_dir, device, n_vocab=..., vocab_hash=...)
    while run.step_count < spec.steps:
        metrics = run.train_step()          # next batch from the stored data position
        if run.step_count % spec.checkpoint_every == 0:
            run.save()                      # weights, optimizer, data position, RNG

`open_run` resumes from the newest valid checkpoint in the job's directory (older ones are the
fallback), or initialises from the spec's seed. Because the checkpoint holds the data position
and the RNG state, the steps after it are recomputed exactly as the first time.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..training.checkpoint import CheckpointManager
from ..data.stream import DataError, TokenStream, split_documents
from .queue import JobInputError, JobSpec
from ..model.config import ModelConfig
from ..training.precision import resolve_precision
from ..training.trainer import StepMetrics, TrainConfig, Trainer

log = logging.getLogger(__name__)

# Spec fields that do not change what is computed: a checkpoint written under one value
# resumes under another. (`steps` sets the learning-rate schedule; whether eval is on decides
# which documents are held out; shuffle and its seed the data order: all matter.)
RESUMABLE_FIELDS = {"checkpoint_every", "keep_last", "keep_every", "eval_every",
                    "eval_batches", "max_failures", "gpus"}
# (`gpus` splits the same batch over more ranks: the same computation up to fp32 rounding.)


def model_config_for(spec: JobSpec, n_vocab: int) -> ModelConfig:
    try:
        return ModelConfig.preset(spec.model, n_vocab, **spec.model_overrides)
    except (ValueError, TypeError) as exc:
        raise JobInputError(f"model {spec.model!r} with overrides {spec.model_overrides}: "
                            f"{exc}") from None


def train_config_for(spec: JobSpec, model: ModelConfig) -> TrainConfig:
    seq = spec.seq or model.max_seq
    if seq > model.max_seq:
        raise JobInputError(f"seq {seq} exceeds the model's max_seq {model.max_seq}; lower "
                            "--seq or raise model_overrides.max_seq")
    try:
        return TrainConfig(batch=spec.batch, seq=seq, steps=spec.steps, lr=spec.lr,
                           min_lr=spec.lr / 10 if spec.min_lr is None else spec.min_lr,
                           warmup=spec.warmup, weight_decay=spec.weight_decay,
                           beta1=spec.beta1, beta2=spec.beta2, grad_clip=spec.grad_clip,
                           grad_accum=spec.grad_accum, seed=spec.seed, precision=spec.precision,
                           label_smoothing=spec.label_smoothing, z_loss=spec.z_loss)
    except ValueError as exc:
        raise JobInputError(str(exc)) from None


def check_spec(spec: JobSpec, n_vocab: int) -> None:
    """Everything about a spec that can be checked before the job runs (used by submit)."""
    train_config_for(spec, model_config_for(spec, n_vocab))


def spec_fingerprint(spec: JobSpec) -> str:
    """Identifies what a spec computes, so a checkpoint is never resumed under another one."""
    fields = {k: v for k, v in json.loads(spec.to_json()).items() if k not in RESUMABLE_FIELDS}
    fields["eval_split"] = spec.eval_every > 0
    return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:16]


def split_for_eval(spec: JobSpec, shards: list[np.ndarray], seq: int, eot: int | None,
                   eval_shards: list[np.ndarray] | None
                   ) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """(train shards, eval shards): with eval_every, the spec's eval dataset when given, else
    a seeded eval_fraction of the documents held out (never trained on)."""
    if not spec.eval_every:
        return shards, []
    if eval_shards is not None:
        return shards, eval_shards
    try:
        return split_documents(shards, eot, spec.eval_fraction, spec.seed, seq)
    except DataError as exc:
        raise JobInputError(f"dataset {spec.dataset!r}: {exc}") from None


@dataclass
class TrainingRun:
    """One job's Trainer, data stream and checkpoint directory."""
    spec: JobSpec
    job_id: str
    trainer: Trainer
    stream: TokenStream
    manager: CheckpointManager
    vocab_hash: str
    vocab_file: Path | None
    eval_batches: np.ndarray | None
    resumed_from: Path | None

    @property
    def step_count(self) -> int:
        return self.trainer.step_count

    @property
    def tokens_seen(self) -> int:
        return self.trainer.tokens_seen

    @property
    def position(self) -> dict:
        return self.stream.position

    def train_step(self) -> StepMetrics:
        """The next optimizer step on the next batch (all micro-batches of it)."""
        batch = self.stream.next_accumulated(self.trainer.train_config.grad_accum)
        return self.trainer.step(batch)

    def evaluate(self, should_stop=None) -> float | None:
        """Mean held-out loss; None without an eval split, or when `should_stop()` turned
        true between two batches (a cancel must not wait for a long evaluation)."""
        if self.eval_batches is None:
            return None
        if should_stop is None:
            return self.trainer.evaluate(self.eval_batches)
        losses = []
        for batch in self.eval_batches:
            if should_stop():
                return None
            losses.append(self.trainer.evaluate(batch))
        return float(np.mean(losses))

    def save(self) -> Path:
        if hasattr(self.trainer, "rank_hashes"):
            self.trainer.rank_hashes()      # data parallel: every rank holds the same state
        state = {"data_position": self.stream.position, "job_id": self.job_id,
                 "vocab_hash": self.vocab_hash, "spec_fingerprint": spec_fingerprint(self.spec),
                 "spec": json.loads(self.spec.to_json())}
        return self.manager.save(self.trainer, state, vocab_file=self.vocab_file)

    def checkpoint_paths(self) -> list[str]:
        return [str(path) for _, path in self.manager.checkpoints()]

    def close(self) -> None:
        """Free the GPU memory; a data-parallel run also stops its rank processes."""
        self.trainer.close()


def open_run(spec: JobSpec, job_id: str, shards: list[np.ndarray], job_dir: Path, device, *,
             n_vocab: int, vocab_hash: str, vocab_file: Path | None = None,
             eot: int | None = None, eval_shards: list[np.ndarray] | None = None,
             launch_ranks=None) -> TrainingRun:
    """Resume the job from its newest valid checkpoint, or start it. `eot`: the dataset's
    end-of-text id (documents for the held-out split); `eval_shards`: a separate eval
    dataset's shards (spec.eval_dataset); `launch_ranks(world)`: (group, rank processes)
    for a job with gpus > 1 (this process is rank 0, on `device`)."""
    model = model_config_for(spec, n_vocab)
    # "auto" resolved once, on rank 0's device, so every rank of a group runs the same
    train_config = train_config_for(spec, model)
    train_config = dataclasses.replace(
        train_config, precision=resolve_precision(train_config.precision, device))
    train_shards, eval_shards = split_for_eval(spec, shards, train_config.seq, eot,
                                               eval_shards)
    manager = CheckpointManager(job_dir, keep_last=spec.keep_last, keep_every=spec.keep_every)
    if spec.gpus == 1:
        return _open_on(spec, job_id, device, model, train_config, train_config, manager,
                        train_shards, eval_shards, vocab_hash, vocab_file, job_dir, None)
    if launch_ranks is None:
        raise JobInputError(f"job {job_id} asks for {spec.gpus} GPUs; run it with a trainer "
                            f"started with --gpus {spec.gpus} (or more)")
    from ..distributed.data_parallel import rank_train_config
    group, ranks = launch_ranks(spec.gpus)
    try:
        return _open_on(spec, job_id, device, model, train_config,
                        rank_train_config(train_config, spec.gpus), manager, train_shards,
                        eval_shards, vocab_hash, vocab_file, job_dir, (group, ranks))
    except BaseException:
        group.close()
        ranks.stop(timeout=1.0)
        raise


def _open_on(spec, job_id, device, model, train_config, local_config, manager, train_shards,
             eval_shards, vocab_hash, vocab_file, job_dir, ranks) -> TrainingRun:
    """open_run on this process's device: `local_config` is its share of the batch; with
    `ranks` (group, processes) the trainer drives the group (DataParallelTrainer)."""
    loaded = manager.load_newest(device, train_config=local_config)
    latest = None
    position = None
    if loaded is not None:
        trainer, state, latest = loaded
        if state.get("job_id") != job_id or state.get("vocab_hash") != vocab_hash or \
                state.get("spec_fingerprint") != spec_fingerprint(spec):
            raise JobInputError(
                f"checkpoint {latest} was written by another job, vocabulary or spec "
                f"(job {state.get('job_id')!r}, vocabulary {str(state.get('vocab_hash'))[:16]}); "
                f"move it out of {job_dir} or submit under another job id")
        if trainer.model_config != model:
            raise JobInputError(f"checkpoint {latest} holds model {trainer.model_config}, the "
                                f"spec asks for {model}")
        position = state.get("data_position")
        log.info("job %s: resuming from %s (step %d)", job_id, latest, trainer.step_count)
    else:
        trainer = Trainer(model, local_config, device)
    if ranks is not None:
        from ..distributed.data_parallel import DataParallelTrainer
        group, processes = ranks
        try:
            trainer = DataParallelTrainer(trainer, group, train_config, on_close=processes.stop)
        except BaseException:
            trainer.close()
            raise
    try:
        seed = spec.seed if spec.shuffle_seed is None else spec.shuffle_seed
        stream = TokenStream(train_shards, train_config.batch, train_config.seq,
                             position=position, shuffle=spec.shuffle, seed=seed)
        eval_batches = None
        if eval_shards:
            evals = TokenStream(eval_shards, train_config.batch, train_config.seq)
            eval_batches = np.stack([evals.next_batch() for _ in range(spec.eval_batches)])
    except DataError as exc:
        trainer.close()
        raise JobInputError(f"dataset: {exc}") from None
    return TrainingRun(spec, job_id, trainer, stream, manager, vocab_hash, vocab_file,
                       eval_batches, latest)
