"""Datasets, jobs and the daemon from the command line.

    istanbul prepare FILES... --tokenizer HOST:PORT --dataset NAME     # corpus -> shards in Redis
    istanbul datasets
    istanbul submit --dataset NAME --model tiny --steps 1000 [...]    # or --spec job.toml
    istanbul jobs | status JOB [--json] | watch JOB | cancel JOB
    istanbul trainer --checkpoints ROOT [--adapter A]                 # the daemon

Every command takes --redis URL (else $REDIS_URL, else the embedded server in --data-dir).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
import tomllib
from pathlib import Path

from istanbul_errors import UserFacingError
from istanbul.shaders.cli import add_device_args
from tokenizer_svc.service.client_options import add_tokenizer_arguments

log = logging.getLogger(__name__)

FINAL = ("done", "failed", "cancelled")


def add_redis_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--redis", metavar="URL", default=None,
                   help="Redis URL, e.g. redis://:PASSWORD@host:6379/0 or rediss://... for TLS "
                        "(default: $REDIS_URL, else an embedded Redis server in --data-dir)")
    p.add_argument("--data-dir", metavar="DIR", type=Path, default=None,
                   help="the embedded Redis server's data directory (default: $ISTANBUL_DATA/"
                        "redis, else $XDG_DATA_HOME/istanbul/redis, else "
                        "~/.local/share/istanbul/redis)")


def _connect(args):
    from .jobs.redis_conn import connect
    return connect(args.redis, data_dir=args.data_dir)


def add_metrics_args(p: argparse.ArgumentParser, what: str) -> None:
    """--metrics-port/--metrics-host/--metrics-auth, --auth-token-file and --listen-public:
    the same names and rules as `istanbul serve` (loopback unless --listen-public)."""
    p.add_argument("--metrics-port", type=int, default=None, metavar="PORT",
                   help=f"serve {what}'s Prometheus metrics on http://HOST:PORT/metrics (0: any "
                        "free port; default: off)")
    p.add_argument("--metrics-host", default=None, metavar="ADDR",
                   help="address of the metrics endpoint (default: 127.0.0.1; 0.0.0.0 with "
                        "--listen-public)")
    p.add_argument("--listen-public", action="store_true",
                   help="listen on all interfaces; needed for any address that is not "
                        "loopback")
    p.add_argument("--metrics-auth", action="store_true",
                   help="/metrics also requires a bearer token from --auth-token-file")
    p.add_argument("--auth-token-file", type=Path, metavar="PATH",
                   help="bearer tokens, one per line, that /metrics accepts with --metrics-auth")


def add_trainer_args(p: argparse.ArgumentParser) -> None:
    """The daemon's options (shared by `istanbul trainer` and `python -m trainer_svc`)."""
    p.add_argument("--checkpoints", required=True, type=Path, metavar="ROOT",
                   help="checkpoint root: job JOB writes ROOT/JOB/step_XXXXXXXX/")
    add_redis_args(p)
    add_device_args(p)
    p.add_argument("--gpus", type=int, default=1, metavar="N",
                   help="GPUs this trainer drives: it runs jobs that ask for up to N (`submit "
                        "--gpus`), one rank process per GPU; a job asking for more is "
                        "re-queued for a bigger trainer (default 1)")
    p.add_argument("--adapters", metavar="A,B,...", default=None,
                   help="with --gpus: the adapter of each rank, comma-separated indexes or "
                        "names (default: the first N GPUs of `istanbul devices`; on a machine "
                        "without a GPU every rank uses software Vulkan)")
    p.add_argument("--lease-ttl", type=float, default=30.0, metavar="S",
                   help="seconds a job's lease lives without renewal; a dead worker's job is "
                        "taken over after this long (renewed every S/3)")
    p.add_argument("--max-failures", type=int, default=3, metavar="N",
                   help="a job that fails N times in a row without progress goes to the "
                        "dead-letter stream; bad input fails it at once, and a crash or "
                        "error after progress is not counted")
    add_metrics_args(p, "the daemon")
    p.add_argument("--publish-every", type=float, default=0.0, metavar="S",
                   help="write progress to Redis at most every S seconds (default 0: every "
                        "step)")
    p.add_argument("--exit-when-idle", action="store_true",
                   help="exit once no job is queued or running (scripts, the demo)")
    p.add_argument("--max-jobs", type=int, default=None, metavar="N",
                   help="exit after running N jobs")
    p.add_argument("--tensorboard", type=Path, default=None, metavar="DIR",
                   help="also write each job's scalars (loss, eval loss, lr, grad norm, "
                        "tokens/s, loss scale) as TensorBoard event files in DIR/JOB, on this "
                        "daemon's disk (`tensorboard --logdir DIR`; pip install "
                        "'istanbul[tensorboard]')")


def register(sub) -> None:
    from .jobs.queue import JobSpec
    fields = JobSpec.model_fields      # submit's defaults come from the spec, as train's do
    p = sub.add_parser("prepare", help="tokenize a corpus into a dataset: shards in Redis "
                                       "(--dataset) or shard files in a folder (--out)",
                       description="Tokenize a corpus (text files, each one a document; JSON "
                                   "Lines, JSON, Parquet, Arrow files and `datasets` folders, a "
                                   "document per record; any of them .gz/.zst/.xz/.bz2) through "
                                   "the gRPC tokenizer service (--tokenizer) or, without it, "
                                   "with the same GPU encoder in this process (--vocab), into a "
                                   "dataset of shards in Redis (--dataset NAME) or shard files "
                                   "that `istanbul train --data DIR` reads (--out DIR).")
    p.add_argument("files", nargs="+", metavar="FILES",
                   help="input files, directories (searched recursively), quoted glob patterns "
                        "('data/*.parquet', 'web/**/*.jsonl.zst') or - for stdin; a text file "
                        "is one document, .jsonl/.json/.parquet/.arrow files and datasets "
                        "folders (save_to_disk) one per record (see --format)")
    from tokenizer_svc.corpus_files import add_corpus_arguments
    add_corpus_arguments(p)
    add_tokenizer_arguments(p, help="the gRPC tokenizer service (`istanbul serve`); default: "
                                    "tokenize in this process with --vocab")
    dest = p.add_mutually_exclusive_group(required=True)
    dest.add_argument("--dataset", metavar="NAME", help="dataset name in Redis")
    dest.add_argument("--out", type=Path, metavar="DIR",
                      help="write shard files (and dataset.json, the vocabulary) into DIR "
                           "instead of Redis: no server needed")
    p.add_argument("--include", action="append", metavar="GLOB",
                   help="only files under directories that match GLOB, e.g. '*.py' "
                        "(repeatable; default: all files)")
    p.add_argument("--shard-tokens", type=int, default=1 << 20, metavar="N",
                   help="tokens per shard (default 1048576)")
    p.add_argument("--replace", action="store_true",
                   help="overwrite an existing dataset (or the shard files in --out)")
    p.add_argument("--vocab", metavar="V",
                   help="the vocabulary (path or known name): the tokenizer without "
                        "--tokenizer; with it, must be the service's. Stored with the dataset, "
                        "so checkpoints carry it (with --tokenizer and no --vocab: the "
                        "service's, when it is a known vocabulary found here; else none, "
                        "with a warning)")
    p.add_argument("--eot", metavar="TOKEN",
                   help="special token that separates documents (default <|endoftext|>)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    add_device_args(p)             # for tokenizing in this process (no --tokenizer)
    add_redis_args(p)
    p.set_defaults(func=cmd_prepare)

    p = sub.add_parser("datasets", help="list the datasets in Redis")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    add_redis_args(p)
    p.set_defaults(func=cmd_datasets)

    p = sub.add_parser("submit", help="queue a training job; prints its id",
                       description="Queue a training job. Give the spec as flags or as a TOML "
                                   "file (--spec; its keys are the flag names with '_', e.g. "
                                   "checkpoint_every, and a [model_overrides] table); flags "
                                   "override the file.")
    p.add_argument("--spec", type=Path, metavar="FILE.toml", help="job spec file")
    p.add_argument("--id", dest="job_id", metavar="JOB",
                   help="job id (default: generated; letters, digits, '_', '.', '-')")
    p.add_argument("--dataset", metavar="NAME")
    p.add_argument("--model", metavar="PRESET",
                   help=f"tiny, small or 124m (default: {fields['model'].default})")
    p.add_argument("--model-set", action="append", metavar="FIELD=VALUE",
                   help="override a model config field, e.g. d_model=128 (repeatable)")
    p.add_argument("--steps", type=int, metavar="N", help="optimizer steps")
    for flag, typ, text in (
            ("--batch", int, "sequences per micro-batch"),
            ("--seq", int, "tokens per sequence (default: the model's max_seq)"),
            ("--grad-accum", int, "micro-batches per step"),
            ("--gpus", int, "GPUs that train the job together (data parallel: each trains "
                            "batch/gpus rows; needs a trainer with --gpus >= N)"),
            ("--lr", float, "peak learning rate"),
            ("--min-lr", float, "final learning rate of the cosine (default: lr/10)"),
            ("--warmup", int, "linear warmup steps, as in `istanbul train`"),
            ("--weight-decay", float, "AdamW weight decay"),
            ("--grad-clip", float, "global gradient-norm clip; 0 is off"),
            ("--seed", int, "initialisation seed"),
            ("--checkpoint-every", int, "steps between checkpoints"),
            ("--keep-last", int, "newest checkpoints kept"),
            ("--keep-every", int, "also keep every multiple of this step; 0 is off"),
            ("--eval-every", int, "steps between held-out evaluations; 0 is off"),
            ("--eval-batches", int, "batches per evaluation"),
            ("--eval-fraction", float, "documents held out for evaluation"),
            ("--shuffle-seed", int, "seed of the training data order (default: --seed)"),
            ("--max-failures", int, "dead-letter after N failures (default: the daemon's)")):
        default = fields[flag[2:].replace("-", "_")].default
        if "default" not in text and default is not None:
            text += f" (default: {default})"
        p.add_argument(flag, type=typ, metavar="N" if typ is int else "X", help=text)
    p.add_argument("--precision", choices=("auto", "mixed", "fp32", "f16"),
                   help="auto: f16 where the daemon's device has f16 tensor cores, else "
                        f"fp32 (default: {fields['precision'].default})")
    p.add_argument("--eval-dataset", metavar="NAME",
                   help="evaluate on this dataset instead of held-out documents")
    p.add_argument("--shuffle", action=argparse.BooleanOptionalAction, default=None,
                   help="seeded random order of the training windows, new every epoch "
                        "(default on; --no-shuffle reads the shards front to back)")
    add_redis_args(p)
    p.set_defaults(func=cmd_submit)

    p = sub.add_parser("jobs", help="list jobs, newest first")
    p.add_argument("--state", choices=("queued", "running", "done", "failed", "cancelled"))
    p.add_argument("--limit", type=int, default=50)
    p.add_argument("--dead-letter", action="store_true", help="list the dead-letter stream")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    add_redis_args(p)
    p.set_defaults(func=cmd_jobs)

    p = sub.add_parser("status", help="a job's state, progress, checkpoints and error")
    p.add_argument("job", metavar="JOB")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--events", type=int, default=0, metavar="N",
                   help="also show the last N events")
    add_redis_args(p)
    p.set_defaults(func=cmd_status)

    p = sub.add_parser("watch", help="live progress bar of a job (step, loss, tokens/s, ETA); "
                                     "exits 0 when it is done, 1 when it failed or was "
                                     "cancelled")
    p.add_argument("job", metavar="JOB")
    p.add_argument("--log-every", type=float, default=10.0, metavar="S",
                   help="without a terminal: a progress line at most every S seconds")
    add_redis_args(p)
    p.set_defaults(func=cmd_watch)

    p = sub.add_parser("cancel", help="cancel a job (a running one stops at its next step "
                                      "after a checkpoint)")
    p.add_argument("job", metavar="JOB")
    p.add_argument("--wait", action="store_true", help="wait until the job has stopped")
    add_redis_args(p)
    p.set_defaults(func=cmd_cancel)

    p = sub.add_parser("trainer", help="run a training daemon: take jobs from Redis, train "
                                       "them on the GPU, write checkpoints",
                       description="Run a training daemon until SIGTERM/SIGINT (checkpoint, "
                                   "re-queue the job, exit 0). Exits 3 when its own disk or GPU "
                                   "fails a self-check after a job error, leaving the jobs to "
                                   "other workers.")
    add_trainer_args(p)
    p.set_defaults(func=cmd_trainer)


# ---- prepare / datasets ---------------------------------------------------------------------

def _service_source(args):
    from tokenizer_svc.service.client_options import client_from_args
    from .data.prepare import service_source
    client = client_from_args(args)             # waits while the service loads its vocabulary
    try:
        return service_source(client), client
    except BaseException:
        client.close()
        raise


def _service_vocabulary_files(source) -> dict[str, bytes] | None:
    """Without --vocab: the service's vocabulary when it is a known one this machine has (its
    hash checked), so the dataset stores it as --vocab would; else None, with a warning that
    checkpoints trained on the dataset will carry no vocabulary (no `generate` of text, no
    tokenizer in `export`)."""
    from tokenizer_svc.patterns import KNOWN_VOCABULARIES
    from .data.prepare import vocabulary_files_for
    if source.vocab_name in KNOWN_VOCABULARIES:
        try:
            return vocabulary_files_for(source.vocab_name, source.vocab_hash)
        except UserFacingError:
            pass
    print(f"warning: the dataset stores no vocabulary: the service's {source.vocab_name!r} is "
          "not a known vocabulary found on this machine. Checkpoints trained on it cannot "
          "`istanbul generate` text or export a tokenizer; pass --vocab with the service's "
          "vocabulary file to store it.", file=sys.stderr)
    return None


def cmd_prepare(args) -> int:
    from tokenizer_svc.service.client import ServiceError
    from tokenizer_svc.corpus_files import TEXT_FIELD, CorpusReader
    from .data.files import DataFilesError, ShardFileWriter
    from .data.datasets import DatasetError, DatasetWriter
    from .data.prepare import local_source, prepare_dataset, vocabulary_files_for

    corpus = CorpusReader(args.files, include=args.include, format=args.format,
                          text_field=args.text_field or TEXT_FIELD, skip_bad=args.skip_bad)
    if not args.tokenizer and not args.vocab:
        raise UserFacingError("give --tokenizer HOST:PORT (the service) or --vocab V (tokenize "
                              "in this process)")
    client = None
    try:
        if args.tokenizer:
            source, client = _service_source(args)
        else:
            from istanbul.shaders.engine import default_device
            source = local_source(args.vocab, default_device(args.adapter))
        vocab_files = vocabulary_files_for(args.vocab, source.vocab_hash) if args.vocab \
            else _service_vocabulary_files(source)
        if args.out is not None:
            open_writer = lambda **ident: ShardFileWriter(  # noqa: E731
                args.out, shard_tokens=args.shard_tokens, replace=args.replace, **ident)
        else:
            handle = _connect(args)
            open_writer = lambda **ident: DatasetWriter(  # noqa: E731
                handle, args.dataset, shard_tokens=args.shard_tokens, replace=args.replace,
                **ident)
        name = args.dataset or str(args.out)
        result = prepare_dataset(source, corpus, open_writer, vocab_files=vocab_files,
                                 eot=args.eot, name=name, progress=not args.no_progress)
    except (DatasetError, DataFilesError, ServiceError) as exc:
        raise UserFacingError(str(exc)) from None
    finally:
        if client is not None:
            client.close()
    src = result.source
    where = f"dataset {name}" if args.dataset else f"shard files in {args.out}"
    print(f"{where}: {result.tokens:,} tokens in {result.shards} shard(s) from "
          f"{result.documents:,} document(s) ({result.bytes:,} bytes); vocabulary "
          f"{src.vocab_name} ({src.n_vocab} ids, hash {src.vocab_hash[:16]}), tokenized "
          f"{'by ' + src.target if args.tokenizer else 'in-process'}")
    print(f"  {result.documents:,} documents, {result.bytes / 1e6:,.1f} MB of text in from "
          f"{result.files:,} input(s), {result.tokens:,} tokens out, in {result.seconds:.1f} s "
          f"({result.mb_per_s:,.1f} MB/s)")
    if result.empty_files:
        kind = "file" if corpus.all_plain else "document"
        print(f"  skipped {result.empty_files} empty {kind}(s)")
    if result.skipped:
        stats = corpus.stats
        print(f"  skipped {result.skipped:,} bad record(s) (--skip-bad); the first: "
              + "; ".join(stats.bad_examples[:3]))
    if result.unsafe_cuts:
        print(f"  warning: {result.unsafe_cuts} cut(s) inside long lines may tokenize "
              "differently from whole files")
    return 0


def cmd_datasets(args) -> int:
    from .data.datasets import list_datasets
    found = list_datasets(_connect(args))
    if args.json:
        print(json.dumps([d.to_dict() for d in found], indent=2))
        return 0
    if not found:
        print("no datasets (create one with `istanbul prepare`)")
    for d in found:
        print(f"{d.name:<24} {d.state:<9} {d.tokens:>14,} tokens {d.shards:>5} shards  "
              f"vocab {d.vocab_name or '?'} ({d.n_vocab}, {d.vocab_hash[:12]})")
    return 0


# ---- submit ---------------------------------------------------------------------------------

def _parse_scalar(text: str):
    lowered = text.lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    for convert in (int, float):
        try:
            return convert(text)
        except ValueError:
            pass
    return text


SPEC_FLAGS = ("dataset", "model", "steps", "batch", "seq", "grad_accum", "gpus", "lr", "min_lr",
              "warmup", "weight_decay", "grad_clip", "seed", "precision", "checkpoint_every",
              "keep_last", "keep_every", "eval_every", "eval_batches", "max_failures",
              "eval_fraction", "eval_dataset", "shuffle", "shuffle_seed")


def build_spec_dict(args) -> dict:
    data: dict = {}
    if args.spec:
        try:
            data = tomllib.loads(args.spec.read_text(encoding="utf-8"))
        except OSError as exc:
            raise UserFacingError(f"--spec {args.spec}: {exc.strerror}") from None
        except tomllib.TOMLDecodeError as exc:
            raise UserFacingError(f"--spec {args.spec}: not valid TOML: {exc}") from None
    for name in SPEC_FLAGS:
        value = getattr(args, name, None)
        if value is not None:
            data[name] = value
    for item in args.model_set or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise UserFacingError(f"--model-set {item!r}: expected FIELD=VALUE")
        data.setdefault("model_overrides", {})[key.strip()] = _parse_scalar(value.strip())
    return data


def cmd_submit(args) -> int:
    from .jobs.bridge import check_spec
    from .data.datasets import DatasetError, get_dataset
    from .jobs.queue import JobInputError, JobQueue, JobSpec

    origin = f"--spec {args.spec}" if args.spec else "job spec"
    data = build_spec_dict(args)
    try:
        spec = JobSpec.parse(data, origin=origin)
    except JobInputError as exc:
        raise UserFacingError(str(exc)) from None
    handle = _connect(args)
    try:
        info = get_dataset(handle, spec.dataset)
    except DatasetError as exc:
        raise UserFacingError(str(exc)) from None
    if spec.vocab_hash and not info.vocab_hash.startswith(spec.vocab_hash):
        raise UserFacingError(f"dataset {info.name!r} was tokenized with vocabulary "
                              f"{info.vocab_hash[:16]}, the spec expects {spec.vocab_hash[:16]}")
    try:
        check_spec(spec, info.n_vocab)
    except JobInputError as exc:
        raise UserFacingError(f"{origin}: {exc}") from None
    seq = spec.seq or _model_max_seq(spec, info.n_vocab)
    longest = min(info.shard_tokens, info.tokens) if info.shards > 1 else info.tokens
    if longest < seq + 1:
        raise UserFacingError(f"dataset {info.name!r} has no shard of seq+1 = {seq + 1} tokens "
                              f"(largest {longest}); use a smaller --seq or more data")
    try:
        job_id = JobQueue(handle).submit(spec, args.job_id, dataset_info=info)
    except JobInputError as exc:
        raise UserFacingError(str(exc)) from None
    print(job_id)
    return 0


def _model_max_seq(spec, n_vocab: int) -> int:
    from .jobs.bridge import model_config_for
    return model_config_for(spec, n_vocab).max_seq


# ---- jobs / status / watch / cancel -----------------------------------------------------------

def _fmt_duration(seconds) -> str:
    if seconds is None:
        return "?"
    seconds = int(seconds)
    if seconds >= 3600:
        return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    if seconds >= 60:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds}s"


def _get_job(queue, job_id: str):
    record = queue.get(job_id)
    if record is None:
        raise UserFacingError(f"no job {job_id!r} (list them with `istanbul jobs`)")
    return record


def cmd_jobs(args) -> int:
    from .jobs.queue import JobQueue
    queue = JobQueue(_connect(args))
    if args.dead_letter:
        dead = queue.dead_letters(args.limit)
        if args.json:
            print(json.dumps(dead, indent=2))
        elif not dead:
            print("the dead-letter stream is empty")
        for entry in dead:
            print(f"{entry.get('job', '?'):<28} {entry.get('reason', ''):<18} "
                  f"failures={entry.get('failures', '?')}  {entry.get('error', '')}")
        return 0
    records = queue.list_jobs(args.limit, args.state)
    if args.json:
        print(json.dumps([r.to_dict() for r in records], indent=2))
        return 0
    if not records:
        print("no jobs" + (f" in state {args.state}" if args.state else ""))
        return 0
    print(f"{'JOB':<28} {'STATE':<10} {'STEP':>13} {'LOSS':>8}  {'DATASET':<14} {'MODEL':<6} "
          "OWNER")
    for r in records:
        loss = r.get_float("loss")
        print(f"{r.id:<28} {r.state:<10} {r.get_int('step'):>6}/{r.get_int('total_steps'):<6} "
              f"{(f'{loss:.4f}' if loss is not None else '-'):>8}  {r.raw.get('dataset', ''):<14} "
              f"{r.raw.get('model', ''):<6} {r.raw.get('owner', '') or '-'}")
    return 0


def cmd_status(args) -> int:
    from .jobs.queue import JobQueue
    queue = JobQueue(_connect(args))
    record = _get_job(queue, args.job)
    data = record.to_dict()
    if args.events:
        data["events"] = [{"id": i, "type": t, **d}
                          for i, t, d in queue.events(args.job)[-args.events:]]
    if args.json:
        print(json.dumps(data, indent=2))
        return 0
    step, total = data["step"], data["total_steps"] or 1
    line = f"job {data['id']}: {data['state']}  step {step}/{total} ({100 * step / total:.1f}%)"
    if data["loss"] is not None:
        line += f"  loss {data['loss']:.4f}"
    if data["state"] == "running":
        line += f"  {data['tokens_per_s'] or 0:,.0f} tok/s  ETA {_fmt_duration(data['eta_s'])}"
    print(line)
    print(f"  dataset {data['dataset']}  model {data['model']}  tokens {data['tokens']:,}  "
          f"attempts {data['attempts']}  failures {data['failures']}"
          + (f"  owner {data['owner']}" if data["owner"] else ""))
    gpus = data["spec"].get("gpus", 1) if isinstance(data.get("spec"), dict) else 1
    if data.get("adapter"):
        print(f"  adapter {data['adapter']}" + (f" (rank 0 of {gpus} GPUs)" if gpus > 1 else ""))
    elif gpus > 1:
        print(f"  needs {gpus} GPUs (a trainer started with --gpus {gpus} or more)")
    if data["eval_loss"] is not None:
        print(f"  eval loss {data['eval_loss']:.4f}")
    if data["checkpoints"]:
        print(f"  checkpoints ({len(data['checkpoints'])}): latest {data['checkpoint']}")
    if data["cancel_requested"] and data["state"] == "running":
        print("  cancel requested")
    if data["error"]:
        print(f"  error: {data['error']}")
    elif data["last_error"]:
        print(f"  last error: {data['last_error']}")
    for event in data.get("events", []):
        print(f"  event {event['type']}: " + json.dumps(
            {k: v for k, v in event.items() if k not in ("id", "type")}, default=str))
    return 0


def cmd_watch(args) -> int:
    from tqdm import tqdm
    from .jobs import keys
    from .jobs.queue import JobQueue
    from .jobs.redis_conn import REDIS_DOWN, Backoff
    queue = JobQueue(_connect(args))
    last = queue.r.xrevrange(keys.job_events(args.job), count=1)
    after = last[0][0] if last else "0-0"
    record = _get_job(queue, args.job)
    bar = tqdm(total=record.get_int("total_steps") or None, initial=record.get_int("step"),
               unit="step", desc=args.job, dynamic_ncols=True,
               disable=None)    # None: no bar without a terminal; plain lines instead
    state = record.state
    backoff = Backoff()
    printed = [0.0]

    def postfix(loss, tps, st):
        parts = {"state": st}
        if loss is not None:
            parts["loss"] = f"{loss:.4f}"
        if tps:
            parts["tok/s"] = f"{tps:,.0f}"
        bar.set_postfix(parts, refresh=True)
        if bar.disable and time.monotonic() - printed[0] >= args.log_every:
            printed[0] = time.monotonic()
            print(f"job {args.job}: step {bar.n}/{bar.total or '?'} "
                  + " ".join(f"{k}={v}" for k, v in parts.items()), flush=True)

    postfix(record.get_float("loss"), record.get_float("tokens_per_s"), state)
    try:
        while state not in FINAL:
            try:
                events = queue.events(args.job, after=after, block_ms=1000)
                backoff.reset()
            except REDIS_DOWN:
                bar.set_postfix({"state": "Redis unreachable, retrying"}, refresh=True)
                backoff.sleep()
                continue
            for event_id, kind, data in events:
                after = event_id
                if kind == "progress":
                    bar.n = int(data.get("step", bar.n))
                    postfix(data.get("loss"), data.get("tokens_per_s"), "running")
                elif kind in ("resumed",):
                    bar.n = int(data.get("step", bar.n))
                    bar.refresh()
                elif kind in FINAL:
                    state = kind
                elif kind in ("requeued", "takeover", "started"):
                    postfix(None, None, kind)
            if not events:
                state = (queue.get(args.job) or record).state
        record = queue.get(args.job) or record
        bar.n = record.get_int("step")
        postfix(record.get_float("loss"), None, record.state)
    finally:
        bar.close()
    if record.state == "done":
        print(f"job {args.job} done: {record.get_int('step')} steps, loss "
              f"{record.get_float('loss') or float('nan'):.4f}, checkpoint "
              f"{record.raw.get('checkpoint', '-')}")
        return 0
    print(f"job {args.job} {record.state}" +
          (f": {record.raw['error']}" if record.raw.get("error") else ""), file=sys.stderr)
    return 1


def cmd_cancel(args) -> int:
    from .jobs.queue import JobQueue
    queue = JobQueue(_connect(args))
    try:
        result = queue.cancel(args.job)
    except KeyError:
        raise UserFacingError(f"no job {args.job!r} (list them with `istanbul jobs`)") from None
    if result == "cancel_requested":
        print(f"job {args.job}: cancel requested; its daemon stops it after the current step")
        if args.wait:
            while (rec := queue.get(args.job)) is not None and rec.state not in FINAL:
                time.sleep(0.5)
            print(f"job {args.job}: {rec.state if rec else 'gone'}")
    elif result == "cancelled":
        print(f"job {args.job}: cancelled")
    else:
        print(f"job {args.job} had already finished ({result})")
    return 0


# ---- the daemon -----------------------------------------------------------------------------

def run_trainer(args) -> int:
    """Connect, open the GPU, serve metrics, run the daemon until SIGTERM."""
    from istanbul.shaders.engine import Device
    from tokenizer_svc.exposure import bind_address, is_loopback
    from tokenizer_svc.service.auth import load_tokens
    from .jobs.daemon import Daemon, DaemonConfig
    from .jobs.queue import JobQueue
    from .jobs.metrics import DaemonMetrics

    if args.max_failures < 1:
        raise UserFacingError("--max-failures must be at least 1")
    if args.lease_ttl <= 0.3:
        raise UserFacingError("--lease-ttl must be more than 0.3 seconds")
    if args.tensorboard is not None:
        from .training.tensorboard_log import require_writer
        require_writer()              # a missing extra is an error at start, not per job
    try:
        args.checkpoints.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UserFacingError(f"--checkpoints {args.checkpoints}: {exc.strerror}") from None
    if args.metrics_auth and not args.auth_token_file:
        raise UserFacingError("--metrics-auth needs --auth-token-file (the tokens /metrics "
                              "accepts)")
    metrics_host = bind_address(args.metrics_host, "--metrics-host", public=args.listen_public)
    tokens = load_tokens(args.auth_token_file) if args.metrics_auth else ()
    if args.metrics_port is not None and not is_loopback(metrics_host) and not tokens:
        log.warning("metrics on %s without --metrics-auth: anyone who reaches the port can "
                    "read them", metrics_host)
    adapters = _rank_adapters(args)
    handle = _connect(args)
    device = Device(adapters[0] if adapters else args.adapter, robustness=False)
    log.info("GPU: %s%s", device.info.summary(),
             " -- software Vulkan, not a GPU" if device.info.is_software else "")
    config = DaemonConfig(checkpoint_root=args.checkpoints, lease_ttl_s=args.lease_ttl,
                          max_failures=args.max_failures, publish_every_s=args.publish_every,
                          exit_when_idle=args.exit_when_idle, max_jobs=args.max_jobs,
                          gpus=args.gpus, rank_adapters=tuple(adapters),
                          tensorboard_dir=args.tensorboard)
    metrics = DaemonMetrics(JobQueue(handle))
    if args.metrics_port is not None:
        metrics.adapter(device.info.name, device.info.adapter_type, device.info.is_software)
        port = metrics.serve(args.metrics_port, metrics_host, tokens)
        log.info("metrics on http://%s:%d/metrics%s", metrics_host, port,
                 " (bearer token required)" if tokens else "")
    daemon = Daemon(handle, config, device=device, metrics=metrics)
    daemon.install_signal_handlers()
    return daemon.run()


def _rank_adapters(args) -> list[str]:
    """With --gpus N > 1: one adapter per rank (rank 0's is this process's device)."""
    if args.gpus < 1:
        raise UserFacingError(f"--gpus must be at least 1, got {args.gpus}")
    listed = [a.strip() for a in args.adapters.split(",") if a.strip()] if args.adapters \
        else None
    if args.gpus == 1:
        if listed:
            raise UserFacingError("--adapters is for --gpus N > 1; with one GPU use --adapter")
        return []
    if args.adapter is not None and not listed:
        raise UserFacingError(f"--gpus {args.gpus} takes one adapter per GPU: use --adapters "
                              f"A,B,... instead of --adapter")
    from .distributed.group import torch_distributed
    from .distributed.launch import rank_adapters
    torch_distributed()          # a missing extra is an error at start, not at the first job
    adapters = rank_adapters(args.gpus, listed, getattr(args, "backend", None))
    log.info("--gpus %d: rank adapters %s", args.gpus, ", ".join(adapters))
    return adapters


def cmd_trainer(args) -> int:
    return run_trainer(args)
