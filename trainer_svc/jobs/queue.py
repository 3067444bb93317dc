"""Training jobs: the spec, the queue (a Redis stream + consumer group), state and events.

A job's life:

    submit ──► queued ──► running ──► done
                 ▲           │ ├────► cancelled          (istanbul cancel)
                 │           │ └────► failed ──► dead-letter stream
                 └───────────┘  requeued: SIGTERM, or a failure below max_failures

`submit` writes the job hash, indexes it and adds `{job: ID}` to the jobs stream in one Lua
script. Daemons read the stream as members of the `trainers` group. An entry is acknowledged
only when its job reaches a final state, or in the same atomic step that re-adds the job as a
new entry; an entry whose worker died stays pending and is taken over (XAUTOCLAIM) once the
job's lease has expired. Every write a worker makes to a job goes through `FENCED_LUA`, which
first checks that the worker still holds the job's lease: a worker that lost its lease can
never overwrite the state written by the one that took over.
"""

from __future__ import annotations

import json
import re
import time
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from . import keys
from .keys import DATASET_RE, JOB_ID_RE
from .failures import JobInputError  # noqa: F401  (re-exported: raise it for bad input)
from ..training.precision import PRECISION_CHOICES

if TYPE_CHECKING:   # (redis itself loads with the first queue, not with the spec)
    from .redis_conn import RedisHandle

STATES = ("queued", "running", "done", "failed", "cancelled")
FINAL_STATES = frozenset({"done", "failed", "cancelled"})
EVENTS_MAXLEN = 200_000

# Bounds on what a spec may make the daemon allocate (host memory for token ids, GPU memory
# for activations and parameters); a job past one fails at submit, or at once in the daemon,
# naming the field. Generous for the 124M preset (8 x 1024 x grad_accum 64).
MAX_MICRO_BATCH_TOKENS = 1 << 20     # batch x seq: one micro-batch's activations
MAX_STEP_TOKENS = 1 << 24            # grad_accum x batch x seq: ids held for one step
MAX_EVAL_TOKENS = 1 << 24            # eval_batches x batch x seq: the held-out ids kept
MAX_PARAMETERS = 1 << 30             # f32 master weights in one buffer (4 GiB)
MAX_VOCAB = 1 << 20                  # ids of a dataset's vocabulary (embedding rows)
MAX_GPUS = 64                        # ranks of one data-parallel job
MODEL_FIELD_MAX = {"d_model": 16384, "n_layers": 256, "n_heads": 256, "n_kv_heads": 256,
                   "ffn_hidden": 65536, "max_seq": 1 << 20}


class JobSpecError(JobInputError, ValueError):
    """A job spec that does not validate; the message lists every problem."""


class JobSpec(BaseModel):
    """What to train. Unknown fields are refused, so a typo never silently becomes a default."""

    model_config = ConfigDict(extra="forbid", frozen=True, protected_namespaces=(),
                              allow_inf_nan=False)

    dataset: str = Field(description="dataset name given to `istanbul prepare`")
    model: str = Field("tiny", description="model preset (tiny, small, 124m)")
    model_overrides: dict[str, int | float | bool | str] = Field(
        default_factory=dict, description="ModelConfig fields that replace the preset's")
    steps: int = Field(gt=0, le=10**9, description="optimizer steps")
    batch: int = Field(8, gt=0, le=65536, description="sequences per micro-batch")
    seq: int | None = Field(None, gt=0, le=1 << 20,
                            description="tokens per sequence (default: the model's max_seq)")
    grad_accum: int = Field(1, gt=0, le=4096, description="micro-batches per optimizer step")
    gpus: int = Field(1, gt=0, le=MAX_GPUS, description=(
        "GPUs that train the job together, data parallel (one rank each, batch / gpus rows "
        "per rank); batch must be a multiple; needs a trainer started with --gpus >= this"))
    lr: float = Field(1e-3, gt=0, description="peak learning rate (warmup, then cosine)")
    min_lr: float | None = Field(None, ge=0, description="final learning rate (default lr/10)")
    warmup: int = Field(0, ge=0, le=10**9, description="linear warmup steps")
    weight_decay: float = Field(0.1, ge=0)
    beta1: float = Field(0.9, ge=0, lt=1)
    beta2: float = Field(0.95, ge=0, lt=1)
    grad_clip: float = Field(1.0, ge=0, description="global-norm clip; 0 disables it")
    label_smoothing: float = Field(0.0, ge=0, lt=1)
    z_loss: float = Field(0.0, ge=0)
    precision: Literal[PRECISION_CHOICES] = Field(
        "auto", description="auto: f16 on a device with f16 tensor cores, else fp32 (resolved "
                            "by the daemon that runs the job)")
    seed: int = Field(1234, ge=0, lt=2**63)
    checkpoint_every: int = Field(100, gt=0, le=10**9, description="steps between checkpoints")
    keep_last: int = Field(3, ge=1, le=1000, description="newest checkpoints kept")
    keep_every: int = Field(0, ge=0, le=10**9,
                            description="also keep each multiple of this step; 0 off")
    eval_every: int = Field(0, ge=0, le=10**9,
                            description="steps between held-out evaluations; 0 off")
    eval_batches: int = Field(4, gt=0, le=65536, description="batches per evaluation")
    eval_fraction: float = Field(0.05, gt=0, lt=0.5, description=(
        "with eval_every: the fraction of the dataset's documents held out (never trained "
        "on), chosen with the seed; ignored when eval_dataset is given"))
    eval_dataset: str | None = Field(None, description=(
        "with eval_every: evaluate on this dataset (same vocabulary) instead of held-out "
        "documents"))
    shuffle: bool = Field(True, description=(
        "read the training windows in a seeded random order, a new one every epoch (false: "
        "front to back through the shards); the order resumes exactly from a checkpoint"))
    shuffle_seed: int | None = Field(None, ge=0, lt=2**63,
                                     description="seed of the data order (default: seed)")
    max_failures: int | None = Field(None, gt=0, le=1000,
                                     description="default: the daemon's --max-failures")
    vocab_hash: str | None = Field(None, description="expected vocabulary hash (sha256 hex)")

    @field_validator("dataset", "eval_dataset")
    @classmethod
    def _dataset_name(cls, value: str | None) -> str | None:
        if value is not None and not DATASET_RE.match(value):
            raise ValueError(f"dataset name {value!r} must match {DATASET_RE.pattern}")
        return value

    @field_validator("model")
    @classmethod
    def _preset(cls, value: str) -> str:
        from ..model.config import PRESETS
        if value not in PRESETS:
            raise ValueError(f"unknown model preset {value!r}; choose one of {', '.join(PRESETS)}")
        return value

    @field_validator("model_overrides")
    @classmethod
    def _overrides(cls, value: dict) -> dict:
        import dataclasses
        from ..model.config import ModelConfig
        allowed = {f.name for f in dataclasses.fields(ModelConfig)} - {"vocab_size"}
        unknown = sorted(set(value) - allowed)
        if unknown:
            raise ValueError(f"unknown model field(s) {', '.join(unknown)}; allowed: "
                             f"{', '.join(sorted(allowed))}")
        for name, limit in MODEL_FIELD_MAX.items():
            size = value.get(name)
            if isinstance(size, int) and not isinstance(size, bool) and size > limit:
                raise ValueError(f"{name} {size} is above the limit {limit}")
        return value

    @field_validator("vocab_hash")
    @classmethod
    def _hex(cls, value):
        if value is not None and not re.fullmatch(r"[0-9a-f]{16,64}", value):
            raise ValueError("must be the vocabulary's sha256 in hex (16 to 64 digits)")
        return value

    @model_validator(mode="after")
    def _consistent(self):
        if self.min_lr is not None and self.min_lr > self.lr:
            raise ValueError(f"min_lr {self.min_lr} is above lr {self.lr}")
        if self.warmup > self.steps:
            raise ValueError(f"warmup {self.warmup} exceeds steps {self.steps}")
        if self.batch % self.gpus:
            raise ValueError(f"batch {self.batch} does not divide by gpus {self.gpus}: every "
                             "GPU trains batch / gpus rows; use a multiple of gpus")
        self._check_sizes()
        return self

    def _check_sizes(self) -> None:
        """What the spec makes the daemon allocate stays under the MAX_* bounds."""
        from ..model.config import PRESETS
        model = {**PRESETS[self.model], **self.model_overrides}
        seq = self.seq or model["max_seq"]
        micro = self.batch * seq
        if micro > MAX_MICRO_BATCH_TOKENS:
            raise ValueError(f"batch x seq = {self.batch} x {seq} = {micro} tokens per "
                             f"micro-batch is above the limit {MAX_MICRO_BATCH_TOKENS}; lower "
                             "batch or seq (grad_accum keeps the tokens per step)")
        if micro * self.grad_accum > MAX_STEP_TOKENS:
            raise ValueError(f"grad_accum x batch x seq = {self.grad_accum} x {micro} tokens per "
                             f"step is above the limit {MAX_STEP_TOKENS}; lower grad_accum")
        if self.eval_every and micro * self.eval_batches > MAX_EVAL_TOKENS:
            raise ValueError(f"eval_batches x batch x seq = {self.eval_batches} x {micro} held-out "
                             f"tokens is above the limit {MAX_EVAL_TOKENS}; lower eval_batches "
                             f"(at most {MAX_EVAL_TOKENS // micro} at this batch and seq)")
        params = _parameters_without_vocabulary(model)
        if params is not None and params > MAX_PARAMETERS:
            raise ValueError(f"the model has {params:,} parameters even with a tiny vocabulary, "
                             f"above the limit {MAX_PARAMETERS:,}; lower d_model, n_layers or "
                             "ffn_hidden")

    @classmethod
    def parse(cls, data: dict | str, origin: str = "job spec") -> "JobSpec":
        """Validate a dict (or a JSON string); JobSpecError lists every problem found."""
        try:
            if isinstance(data, str):
                data = json.loads(data)
            if not isinstance(data, dict):
                raise JobSpecError(f"{origin}: expected an object, got {type(data).__name__}")
            return cls.model_validate(data)
        except json.JSONDecodeError as exc:
            raise JobSpecError(f"{origin}: not valid JSON: {exc}") from None
        except ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(map(str, e['loc'])) or 'spec'}: {e['msg']}" for e in exc.errors())
            raise JobSpecError(f"{origin} is invalid: {problems}") from None

    def to_json(self) -> str:
        return self.model_dump_json()


def _parameters_without_vocabulary(fields: dict) -> int | None:
    """Parameter count of a model config (a 128-id vocabulary unless `fields` names one; None:
    not a valid config, which the daemon reports with the model's own message)."""
    from ..model.config import ModelConfig
    from ..model.layout import ParameterLayout
    try:
        return ParameterLayout.for_config(ModelConfig(**{"vocab_size": 128, **fields})).total
    except (TypeError, ValueError):
        return None


def check_vocab_size(spec: "JobSpec", n_vocab: int) -> None:
    """The dataset's vocabulary size within 1..MAX_VOCAB, and the whole model (embeddings and
    head included) within MAX_PARAMETERS."""
    if not isinstance(n_vocab, int) or not 1 <= n_vocab <= MAX_VOCAB:
        raise JobInputError(f"dataset {spec.dataset!r} declares a vocabulary of {n_vocab} ids; "
                            f"the limit is 1 to {MAX_VOCAB}. Prepare it again with a real "
                            "vocabulary")
    from ..model.config import PRESETS, pad_vocab
    fields = {**PRESETS[spec.model], **spec.model_overrides}
    params = _parameters_without_vocabulary({**fields, "vocab_size": pad_vocab(n_vocab)})
    if params is not None and params > MAX_PARAMETERS:
        raise JobInputError(f"model {spec.model!r} with a vocabulary of {n_vocab} ids has "
                            f"{params:,} parameters, above the limit {MAX_PARAMETERS:,}; "
                            "use a smaller model or vocabulary")


def new_job_id() -> str:
    """Sortable and path-safe: submit time plus randomness."""
    return time.strftime("%Y%m%d-%H%M%S") + "-" + uuid.uuid4().hex[:6]


def check_job_id(job_id: str) -> str:
    if not isinstance(job_id, str) or not JOB_ID_RE.match(job_id):
        raise JobSpecError(f"job id {job_id!r} is not allowed: it must match {JOB_ID_RE.pattern} "
                           "(letters, digits, '_', '.', '-'; no '/', no leading '.')")
    return job_id


@dataclass
class JobRecord:
    """A job hash as read back from Redis (all values optional except id and state)."""
    raw: dict

    @property
    def id(self) -> str:
        return self.raw.get("id", "")

    @property
    def state(self) -> str:
        return self.raw.get("state", "unknown")

    @property
    def final(self) -> bool:
        return self.state in FINAL_STATES

    def get_int(self, name: str, default: int = 0) -> int:
        try:
            return int(self.raw.get(name, default))
        except (TypeError, ValueError):
            return default

    def get_float(self, name: str) -> float | None:
        try:
            return float(self.raw[name])
        except (KeyError, TypeError, ValueError):
            return None

    @property
    def spec_json(self) -> str:
        return self.raw.get("spec", "")

    @property
    def checkpoints(self) -> list[str]:
        try:
            return list(json.loads(self.raw.get("checkpoints", "[]")))
        except ValueError:
            return []

    def to_dict(self) -> dict:
        """The job for `status --json`: typed numbers, parsed spec."""
        out: dict = {"id": self.id, "state": self.state}
        for name in ("step", "total_steps", "tokens", "attempts", "failures"):
            out[name] = self.get_int(name)
        for name in ("loss", "tokens_per_s", "step_seconds", "eta_s", "lr", "grad_norm",
                     "eval_loss", "created_at", "started_at", "updated_at", "finished_at"):
            out[name] = self.get_float(name)
        for name in ("owner", "adapter", "error", "last_error", "dataset", "model",
                     "vocab_hash", "checkpoint", "entry"):
            out[name] = self.raw.get(name) or None
        out["cancel_requested"] = self.raw.get("cancel_requested") == "1"
        out["checkpoints"] = self.checkpoints
        try:
            out["spec"] = json.loads(self.spec_json)
        except ValueError:
            out["spec"] = self.spec_json
        return out


SUBMIT_LUA = """
-- KEYS: job hash, events, index, stream
-- ARGV: job id, created, fields json, event json, events maxlen
if redis.call('EXISTS', KEYS[1]) == 1 then return false end
local fields = cjson.decode(ARGV[3])
local flat = {}
for k, v in pairs(fields) do flat[#flat + 1] = k; flat[#flat + 1] = v end
redis.call('HSET', KEYS[1], unpack(flat))
redis.call('ZADD', KEYS[3], ARGV[2], ARGV[1])
local entry = redis.call('XADD', KEYS[4], '*', 'job', ARGV[1])
redis.call('HSET', KEYS[1], 'entry', entry)
redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[5], '*', 'type', 'submitted', 'data', ARGV[4])
return entry
"""

CANCEL_LUA = """
-- KEYS: job hash, events ; ARGV: now, event json for a queued job, maxlen
local state = redis.call('HGET', KEYS[1], 'state')
if not state then return false end
if state == 'done' or state == 'failed' or state == 'cancelled' then return state end
redis.call('HSET', KEYS[1], 'cancel_requested', '1', 'updated_at', ARGV[1])
if state == 'queued' then
  redis.call('HSET', KEYS[1], 'state', 'cancelled', 'finished_at', ARGV[1])
  redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[3], '*', 'type', 'cancelled', 'data', ARGV[2])
  return 'cancelled'
end
return 'cancel_requested'
"""

# Every write a worker makes to a job, applied only while it holds the job's lease.
FENCED_LUA = """
-- KEYS: lease, job hash, events, curve, jobs stream, dead-letter stream
-- ARGV: owner token, ops json, group, job id, events maxlen
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
local ops = cjson.decode(ARGV[2])
if ops.hset then
  local flat = {}
  for k, v in pairs(ops.hset) do flat[#flat + 1] = k; flat[#flat + 1] = v end
  if #flat > 0 then redis.call('HSET', KEYS[2], unpack(flat)) end
end
if ops.hincr then
  for k, v in pairs(ops.hincr) do redis.call('HINCRBY', KEYS[2], k, v) end
end
if ops.curve then
  for i = 1, #ops.curve, 2 do redis.call('HSET', KEYS[4], ops.curve[i], ops.curve[i + 1]) end
end
if ops.events then
  for _, ev in ipairs(ops.events) do
    redis.call('XADD', KEYS[3], 'MAXLEN', '~', ARGV[5], '*', 'type', ev[1], 'data', ev[2])
  end
end
if ops.ack then redis.call('XACK', KEYS[5], ARGV[3], ops.ack) end
if ops.requeue then
  local entry = redis.call('XADD', KEYS[5], '*', 'job', ARGV[4])
  redis.call('HSET', KEYS[2], 'entry', entry)
end
if ops.dead then
  local flat = {}
  for k, v in pairs(ops.dead) do flat[#flat + 1] = k; flat[#flat + 1] = v end
  redis.call('XADD', KEYS[6], '*', unpack(flat))
end
if ops.release then redis.call('DEL', KEYS[1]) end
if redis.call('HGET', KEYS[2], 'cancel_requested') == '1' then return 2 end
return 1
"""


def _redis_value(value) -> str:
    """A hash field value: floats keep full precision, lists and dicts become JSON."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, (list, dict)):
        return json.dumps(value)
    if isinstance(value, float):
        return repr(value)
    return str(value)


def _event(kind: str, **data) -> list:
    data.setdefault("ts", time.time())
    return [kind, json.dumps(data, default=str)]


class JobQueue:
    """All job operations on Redis: the CLI's (submit, list, cancel, watch) and the daemon's."""

    def __init__(self, handle: RedisHandle, events_maxlen: int = EVENTS_MAXLEN):
        self.handle = handle
        self.events_maxlen = events_maxlen

    @property
    def r(self):
        return self.handle.text

    # ---- submitting and reading --------------------------------------------------------------

    def ensure_group(self) -> None:
        """Create the consumer group (and the stream) unless they exist; after a restart that
        lost data this recreates them."""
        try:
            self.r.xgroup_create(keys.JOBS_STREAM, keys.JOBS_GROUP, id="0", mkstream=True)
        except Exception as exc:  # BUSYGROUP: it exists
            if "BUSYGROUP" not in str(exc):
                raise

    def submit(self, spec: JobSpec, job_id: str | None = None, *, dataset_info=None,
               total_steps: int | None = None) -> str:
        """Queue a job; returns its id. `dataset_info` (datasets.DatasetInfo) pins the
        vocabulary hash the job will accept from its shards."""
        job_id = new_job_id() if job_id is None else check_job_id(job_id)
        self.ensure_group()
        now = time.time()
        vocab_hash = dataset_info.vocab_hash if dataset_info else (spec.vocab_hash or "")
        fields = {"id": job_id, "spec": spec.to_json(), "state": "queued", "dataset": spec.dataset,
                  "model": spec.model, "total_steps": str(total_steps or spec.steps),
                  "step": "0", "tokens": "0", "attempts": "0", "failures": "0",
                  "vocab_hash": vocab_hash, "created_at": repr(now), "updated_at": repr(now),
                  "checkpoints": "[]"}
        entry = self.handle.script(SUBMIT_LUA)(
            keys=[keys.job(job_id), keys.job_events(job_id), keys.JOBS_INDEX, keys.JOBS_STREAM],
            args=[job_id, repr(now), json.dumps(fields),
                  _event("submitted", spec=json.loads(spec.to_json()))[1], self.events_maxlen])
        if entry is None:
            raise JobSpecError(f"a job with id {job_id!r} already exists; choose another --id")
        return job_id

    def submit_raw(self, job_id: str, fields: dict) -> str:
        """Queue a job hash exactly as given, bypassing validation (the daemon must cope with
        whatever other clients put on the stream; tests use this)."""
        self.ensure_group()
        now = time.time()
        fields = {"id": job_id, "state": "queued", "created_at": repr(now), **fields}
        entry = self.handle.script(SUBMIT_LUA)(
            keys=[keys.job(job_id), keys.job_events(job_id), keys.JOBS_INDEX, keys.JOBS_STREAM],
            args=[job_id, repr(now), json.dumps({k: str(v) for k, v in fields.items()}),
                  _event("submitted")[1], self.events_maxlen])
        if entry is None:
            raise JobSpecError(f"a job with id {job_id!r} already exists")
        return job_id

    def get(self, job_id: str) -> JobRecord | None:
        raw = self.r.hgetall(keys.job(job_id))
        return JobRecord(raw) if raw else None

    def list_jobs(self, limit: int = 50, state: str | None = None) -> list[JobRecord]:
        """Newest first."""
        ids = self.r.zrevrange(keys.JOBS_INDEX, 0, -1 if state else limit - 1)
        pipe = self.r.pipeline(transaction=False)
        for job_id in ids:
            pipe.hgetall(keys.job(job_id))
        records = [JobRecord(raw) for raw in pipe.execute() if raw]
        if state:
            records = [rec for rec in records if rec.state == state][:limit]
        return records

    def counts_by_state(self) -> dict[str, int]:
        counts = dict.fromkeys(STATES, 0)
        ids = self.r.zrange(keys.JOBS_INDEX, 0, -1)
        pipe = self.r.pipeline(transaction=False)
        for job_id in ids:
            pipe.hget(keys.job(job_id), "state")
        for state in pipe.execute():
            if state:
                counts[state] = counts.get(state, 0) + 1
        return counts

    def events(self, job_id: str, after: str = "0-0", count: int | None = None,
               block_ms: int | None = None) -> list[tuple[str, str, dict]]:
        """(event id, type, data) after `after`, oldest first."""
        if block_ms is None:
            items = self.r.xrange(keys.job_events(job_id), min=f"({after}" if after != "0-0"
                                  else "-", count=count)
        else:
            reply = self.r.xread({keys.job_events(job_id): after}, count=count, block=block_ms)
            items = reply[0][1] if reply else []
        out = []
        for event_id, fields in items:
            try:
                data = json.loads(fields.get("data", "{}"))
            except ValueError:
                data = {}
            out.append((event_id, fields.get("type", ""), data))
        return out

    def loss_curve(self, job_id: str) -> dict[int, float]:
        """Training loss per step (the curve hash's plain step fields)."""
        return {int(k): float(v) for k, v in self.r.hgetall(keys.job_curve(job_id)).items()
                if k.isdigit()}

    def eval_curve(self, job_id: str) -> dict[int, float]:
        """Held-out loss per evaluated step (the curve hash's `eval:STEP` fields)."""
        return {int(k[5:]): float(v) for k, v in self.r.hgetall(keys.job_curve(job_id)).items()
                if k.startswith("eval:")}

    def dead_letters(self, count: int = 100) -> list[dict]:
        return [dict(fields, entry=entry_id)
                for entry_id, fields in self.r.xrevrange(keys.DEAD_LETTER, count=count)]

    def cancel(self, job_id: str) -> str:
        """'cancelled' (was queued), 'cancel_requested' (running: its daemon stops it at the
        next step), or the final state it already had. KeyError when there is no such job."""
        result = self.handle.script(CANCEL_LUA)(
            keys=[keys.job(job_id), keys.job_events(job_id)],
            args=[repr(time.time()), _event("cancelled", reason="cancelled while queued")[1],
                  self.events_maxlen])
        if result is None:
            raise KeyError(job_id)
        return result

    def cancel_requested(self, job_id: str) -> bool:
        return self.r.hget(keys.job(job_id), "cancel_requested") == "1"

    def queue_depth(self) -> int:
        """Jobs waiting for a daemon."""
        return self.counts_by_state().get("queued", 0)

    # ---- the daemon's side -------------------------------------------------------------------

    def read_new(self, consumer: str, block_ms: int) -> list[tuple[str, str | None]]:
        """Entries never delivered before: [(entry id, job id or None if malformed)]."""
        reply = self.r.xreadgroup(keys.JOBS_GROUP, consumer, {keys.JOBS_STREAM: ">"},
                                  count=1, block=block_ms)
        return [(entry_id, fields.get("job")) for _, items in (reply or [])
                for entry_id, fields in items]

    def autoclaim(self, consumer: str, min_idle_ms: int, count: int = 10
                  ) -> list[tuple[str, str | None]]:
        """Pending entries nobody has touched for `min_idle_ms` (their worker stopped beating)."""
        reply = self.r.xautoclaim(keys.JOBS_STREAM, keys.JOBS_GROUP, consumer, min_idle_ms,
                                  start_id="0-0", count=count)
        items = reply[1]
        return [(entry_id, (fields or {}).get("job")) for entry_id, fields in items
                if entry_id is not None]

    def touch(self, consumer: str, entry_id: str) -> None:
        """Reset the idle time of our pending entry, so XAUTOCLAIM leaves it alone."""
        self.r.xclaim(keys.JOBS_STREAM, keys.JOBS_GROUP, consumer, 0, [entry_id], justid=True)

    def ack(self, entry_id: str) -> None:
        self.r.xack(keys.JOBS_STREAM, keys.JOBS_GROUP, entry_id)

    def fenced(self, job_id: str, owner: str, *, hset: dict | None = None,
               hincr: dict | None = None, events: list | None = None,
               curve: list | None = None, ack: str | None = None, requeue: bool = False,
               dead: dict | None = None, release: bool = False) -> int:
        """Apply writes to a job atomically, only if `owner` still holds its lease.

        Returns 0 when the lease is not ours (nothing written), 1 when written, 2 when
        written and a cancel has been requested for the job."""
        ops: dict = {}
        if hset:
            ops["hset"] = {k: _redis_value(v) for k, v in hset.items()}
        if hincr:
            ops["hincr"] = hincr
        if events:
            ops["events"] = events
        if curve:
            ops["curve"] = [str(x) if isinstance(x, (int, str)) else repr(x) for x in curve]
        if ack:
            ops["ack"] = ack
        if requeue:
            ops["requeue"] = True
        if dead:
            ops["dead"] = {k: str(v) for k, v in dead.items()}
        if release:
            ops["release"] = True
        ok = self.handle.script(FENCED_LUA)(
            keys=[keys.lease(job_id), keys.job(job_id), keys.job_events(job_id),
                  keys.job_curve(job_id), keys.JOBS_STREAM, keys.DEAD_LETTER],
            args=[owner, json.dumps(ops), keys.JOBS_GROUP, job_id, self.events_maxlen])
        return int(ok)


event = _event
