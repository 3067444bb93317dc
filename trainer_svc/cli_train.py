"""`istanbul train`, `istanbul generate`, `istanbul export`: local training, sampling, export.

    istanbul train --text a.py b.py --vocab gpt2 --model tiny --steps 200 --checkpoints ck/run
    istanbul train --data web.shard --vocab my.tiktoken --model small --steps 5000 --resume ...
    istanbul generate --checkpoint ck/run/latest --prompt "def main(" --max-tokens 64
    istanbul export ck/run/latest --hf out/hf
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

import numpy as np

from istanbul_errors import UserFacingError

log = logging.getLogger("istanbul.train")


def register(sub) -> None:
    from istanbul.shaders.cli import add_device_args
    from .model.config import PRESETS
    from .training.precision import PRECISION_CHOICES

    t = sub.add_parser("train", help="train a model locally on shards or text files",
                       description="Train a model on the GPU (every kernel WGSL). Prints a "
                                   "progress bar and one line per logging interval with "
                                   "loss=<value>.")
    src = t.add_mutually_exclusive_group(required=True)
    src.add_argument("--data", nargs="+", metavar="SHARDS",
                     help="token shard files (istanbul shard format), or folders of them "
                          "written by `istanbul prepare --out DIR`")
    src.add_argument("--text", nargs="+", metavar="FILE",
                     help="text files, tokenized with --vocab (documents end with <|endoftext|>)")
    t.add_argument("--vocab", metavar="V",
                   help="vocabulary: a .tiktoken/tokenizer.json path or a known name (gpt2, "
                        "cl100k_base, o200k_base); required with --text, checks shards with "
                        "--data and goes into every checkpoint")
    t.add_argument("--model", default=_spec_default("model"), choices=sorted(PRESETS),
                   help="model preset")
    t.add_argument("--steps", type=int, required=True, help="total optimizer steps")
    t.add_argument("--batch", type=int, default=_spec_default("batch"), metavar="N",
                   help="sequences per micro-batch")
    t.add_argument("--seq", type=int, default=128, metavar="N", help="tokens per sequence")
    t.add_argument("--grad-accum", type=int, default=_spec_default("grad_accum"), metavar="N",
                   help="micro-batches per step")
    t.add_argument("--lr", type=float, default=_spec_default("lr"), metavar="X",
                   help="peak learning rate")
    t.add_argument("--min-lr", type=float, default=None, metavar="X",
                   help="final learning rate (default: lr/10)")
    t.add_argument("--warmup", type=int, default=_spec_default("warmup"), metavar="N",
                   help="linear warmup steps, as in `istanbul submit`")
    t.add_argument("--weight-decay", type=float, default=_spec_default("weight_decay"),
                   metavar="X", help="AdamW weight decay")
    t.add_argument("--precision", choices=PRECISION_CHOICES,
                   default=_spec_default("precision"),
                   help="auto: f16 where the device has f16 tensor cores (Dawn backend on a "
                        "GPU with f16 subgroup matrices), else fp32; printed at start-up. "
                        "f16: every matmul on the tensor cores with f16 operands, dynamic "
                        "loss scaling; mixed: f16 weight mirror in the matmuls, f32 master "
                        "weights and gradients; fp32: f32 throughout")
    t.add_argument("--f16-math", action="store_true",
                   help="mixed only: forward matmuls multiply in packed f16 (f16-level forward "
                        "accuracy; not faster than f32 math on the GPUs measured so far)")
    t.add_argument("--seed", type=int, default=_spec_default("seed"),
                   help="initialisation, data order and held-out split seed")
    t.add_argument("--shuffle", action=argparse.BooleanOptionalAction,
                   default=_spec_default("shuffle"),
                   help="read the training windows in a seeded random order, a new one each "
                        "epoch (--no-shuffle: front to back)")
    t.add_argument("--eval-every", type=int, default=_spec_default("eval_every"), metavar="N",
                   help="held-out loss every N steps (0: off); the held-out data is "
                        "--eval-fraction of the documents, never trained on")
    t.add_argument("--eval-fraction", type=float, default=_spec_default("eval_fraction"),
                   metavar="X", help="documents held out with --eval-every")
    t.add_argument("--eval-batches", type=int, default=_spec_default("eval_batches"),
                   metavar="N", help="batches per evaluation")
    t.add_argument("--log-every", type=int, default=10, metavar="N",
                   help="print a line every N steps")
    t.add_argument("--checkpoints", metavar="DIR", help="run directory for checkpoints")
    t.add_argument("--checkpoint-every", type=int, default=0, metavar="N",
                   help="save every N steps (0: only at the end)")
    t.add_argument("--keep-last", type=int, default=_spec_default("keep_last"), metavar="N",
                   help="checkpoints kept (newest)")
    t.add_argument("--resume", action="store_true",
                   help="continue from the newest valid checkpoint in --checkpoints")
    t.add_argument("--tensorboard", type=Path, default=None, metavar="DIR",
                   help="also write the scalars (loss, eval loss, lr, grad norm, tokens/s, "
                        "loss scale) as TensorBoard event files in DIR (`tensorboard --logdir "
                        "DIR`; pip install 'istanbul[tensorboard]')")
    add_device_args(t)
    t.set_defaults(func=cmd_train)

    g = sub.add_parser("generate", help="generate text from a checkpoint (KV-cache decoding)",
                       description="Continue PROMPT with the checkpoint's model on the GPU (a "
                       "KV cache, one token per step) and print the text; the checkpoint "
                       "carries its vocabulary (`istanbul prepare --vocab`).")
    g.add_argument("--checkpoint", required=True, metavar="C",
                   help="checkpoint directory, its run directory, or the run's latest link")
    g.add_argument("--prompt", required=True, help="prompt text")
    g.add_argument("--max-tokens", type=int, default=64, metavar="N",
                   help="tokens to generate at most (stops early at end-of-text)")
    g.add_argument("--temperature", type=float, default=0.8, metavar="T", help="0 = greedy")
    g.add_argument("--top-k", type=int, default=0, metavar="K", help="0 = off")
    g.add_argument("--top-p", type=float, default=1.0, metavar="P",
                   help="nucleus sampling mass (1.0 = off)")
    g.add_argument("--seed", type=int, default=0, help="sampling seed (same seed, same text)")
    g.add_argument("--ids", action="store_true", help="print token ids instead of text")
    add_device_args(g)
    g.set_defaults(func=cmd_generate)

    e = sub.add_parser("export", help="export a checkpoint (Hugging Face Llama folder)",
                       description="Write CHECKPOINT as a Hugging Face Llama folder (config, "
                       "safetensors weights, and the tokenizer when the checkpoint carries its "
                       "vocabulary) that `transformers` loads with from_pretrained.")
    e.add_argument("checkpoint", metavar="CHECKPOINT",
                   help="checkpoint directory, its run directory, or the run's latest link")
    e.add_argument("--hf", required=True, metavar="DIR", help="output folder")
    e.set_defaults(func=cmd_export)


def _spec_default(field: str):
    """The job spec's default, so `train` and `submit` train the same way by default."""
    from .jobs.queue import JobSpec
    return JobSpec.model_fields[field].default


# ---- train -------------------------------------------------------------------------------------

def _load_codec(spec):
    from tokenizer_svc.vocab import VocabularyError
    from .data.text import load_codec
    try:
        return load_codec(spec)
    except (VocabularyError, OSError) as exc:
        raise UserFacingError(f"--vocab {spec}: {exc}") from None


def _load_shards(args, codec):
    from .data.files import DataFilesError, shard_paths
    from .data.shards import ShardError, decode_shard, read_header
    shards = []
    if args.data:
        try:
            names = [str(p) for arg in args.data for p in shard_paths(arg)]
        except DataFilesError as exc:
            raise UserFacingError(f"--data: {exc}") from None
        for name in names:
            try:
                blob = Path(name).read_bytes()
                header = read_header(blob, name)
                n_vocab = codec.n_vocab if codec else (1 << (8 * header.itemsize))
                shards.append(decode_shard(blob, n_vocab=n_vocab, name=name,
                                           vocab_hash=codec.content_hash if codec else None))
            except (OSError, ShardError) as exc:
                raise UserFacingError(f"--data {name}: {exc}") from None
        return shards
    eot = codec.eot_token
    for name in args.text:
        try:
            text = Path(name).read_text(encoding="utf-8", errors="replace")
        except OSError as exc:
            raise UserFacingError(f"--text {name}: {exc}") from None
        ids = codec.encode(text) + ([eot] if eot is not None else [])
        shards.append(np.asarray(ids, np.uint32))
    return [np.concatenate(shards)] if shards else shards


def _precision_label(args, trainer) -> str:
    """The precision the trainer runs, and with --precision auto why: 'f16 (--precision
    auto: f16 tensor cores)'."""
    ran = trainer.train_config.precision
    if args.precision != "auto":
        return ran
    why = "f16 tensor cores" if ran == "f16" else "no f16 tensor cores on this device"
    return f"{ran} (--precision auto: {why})"


def cmd_train(args) -> int:
    from tqdm import tqdm
    from istanbul.shaders.engine import default_device
    from .training.checkpoint import CheckpointError, CheckpointManager, load_checkpoint
    from .data.stream import DataError, TokenStream, split_documents
    from .model.config import ModelConfig
    from .training.trainer import TrainConfig, Trainer

    if args.text and not args.vocab:
        raise UserFacingError("--text needs --vocab (the vocabulary to tokenize with)")
    if args.resume and not args.checkpoints:
        raise UserFacingError("--resume needs --checkpoints DIR")
    if args.eval_every < 0 or args.eval_batches < 1:
        raise UserFacingError("--eval-every must be >= 0 and --eval-batches >= 1")
    if args.tensorboard is not None:
        from .training.tensorboard_log import require_writer
        require_writer()
    codec = _load_codec(args.vocab) if args.vocab else None
    shards = _load_shards(args, codec)
    n_vocab = codec.n_vocab if codec else int(max(int(s.max()) for s in shards if s.size)) + 1
    try:
        tc = TrainConfig(batch=args.batch, seq=args.seq, steps=args.steps, lr=args.lr,
                         min_lr=args.min_lr if args.min_lr is not None else args.lr / 10,
                         warmup=args.warmup,
                         weight_decay=args.weight_decay, grad_accum=args.grad_accum,
                         seed=args.seed, precision=args.precision, f16_math=args.f16_math)
        cfg = ModelConfig.preset(args.model, n_vocab)
    except ValueError as exc:
        raise UserFacingError(str(exc)) from None
    device = default_device(args.adapter, robustness=False)   # the project's kernels only
    if args.precision in ("mixed", "f16") and not device.has("shader-f16"):
        log.warning("%s lacks shader-f16: training in fp32", device.name)

    manager = CheckpointManager(args.checkpoints, keep_last=args.keep_last) \
        if args.checkpoints else None
    position = None
    trainer = None
    if args.resume:
        found = manager.latest_valid()
        if found is None and manager.checkpoints():
            raise UserFacingError(
                f"--resume: no checkpoint in {args.checkpoints} passes verification (see the "
                "warnings above); move the run directory aside to start from scratch")
        if found is None:
            log.info("no checkpoint in %s yet: starting from scratch", args.checkpoints)
        else:
            try:
                trainer, state = load_checkpoint(
                    found, device, train_config=tc,
                    expected_vocab_hash=codec.content_hash if codec else None)
            except CheckpointError as exc:
                raise UserFacingError(str(exc)) from None
            position = state.get("data_position")
            if trainer.model_config != cfg:
                log.warning("resuming the checkpoint's model config, not --model %s",
                            args.model)
            print(f"resumed from {found} at step {trainer.step_count}", flush=True)
    if trainer is None:
        try:
            trainer = Trainer(cfg, tc, device)
        except ValueError as exc:
            raise UserFacingError(str(exc)) from None
    try:
        evals = None
        if args.eval_every:
            eot = codec.eot_token if codec else None
            shards, held = split_documents(shards, eot, args.eval_fraction, args.seed, tc.seq)
            held_stream = TokenStream(held, tc.batch, tc.seq)
            evals = np.stack([held_stream.next_batch() for _ in range(args.eval_batches)])
        stream = TokenStream(shards, tc.batch, tc.seq, position=position,
                             vocab_size=trainer.model_config.vocab_size,
                             shuffle=args.shuffle, seed=args.seed)
    except DataError as exc:
        raise UserFacingError(str(exc)) from None

    vocab_file = codec.path if codec and codec.path and codec.path.is_file() else None

    def save():
        path = manager.save(trainer, {"data_position": stream.position}, vocab_file=vocab_file)
        tqdm.write(f"checkpoint {path}")

    print(f"model {args.model}: {trainer.model_config.n_params() / 1e6:.2f}M parameters, "
          f"{tc.batch}x{tc.seq} tokens x {tc.grad_accum}, {_precision_label(args, trainer)}, "
          f"on {device.name}",
          flush=True)
    bar = tqdm(total=tc.steps, initial=trainer.step_count, unit="step", file=sys.stderr,
               dynamic_ncols=True, disable=None)   # None: no bar without a terminal
    scalars = None      # (on an error tensorboardX flushes what it has when the process exits)
    if args.tensorboard is not None:
        from .training.tensorboard_log import ScalarLog
        try:
            scalars = ScalarLog(args.tensorboard, purge_step=trainer.step_count + 1)
        except OSError as exc:
            raise UserFacingError(f"--tensorboard {args.tensorboard}: {exc}") from None
    last_saved = trainer.step_count
    while trainer.step_count < tc.steps:
        m = trainer.step(stream.next_accumulated(tc.grad_accum))
        bar.update(0 if m.skipped else 1)
        bar.set_postfix(loss=f"{m.loss:.4f}", tok_s=f"{m.tokens_per_s:,.0f}")
        if m.skipped and m.scale_backoff:
            tqdm.write(f"step {m.step + 1}: f16 gradients overflowed at loss scale "
                       f"{m.loss_scale:g}: update skipped, scale halved")
            if scalars is not None:
                scalars.loss_scale_backoff(m.step + 1, m.loss_scale / 2)
            continue
        if m.skipped:
            tqdm.write(f"step {m.step + 1}: non-finite gradients (loss={m.loss}), update "
                       "skipped")
            if trainer.skipped_steps >= 10:
                raise UserFacingError("10 steps with non-finite gradients: stopping (lower "
                                      "--lr?)")
            continue
        if scalars is not None:
            scalars.step(m)
        if m.step % args.log_every == 0 or m.step == tc.steps:
            tqdm.write(f"step {m.step}/{tc.steps} loss={m.loss:.4f} "
                       f"grad_norm={m.grad_norm:.3f} lr={m.lr:.2e} "
                       f"tok/s={m.tokens_per_s:,.0f}")
        if evals is not None and m.step % args.eval_every == 0:
            eval_loss = trainer.evaluate(evals)
            tqdm.write(f"step {m.step}/{tc.steps} eval_loss={eval_loss:.4f}")
            if scalars is not None:
                scalars.eval(m.step, eval_loss)
        if manager and args.checkpoint_every and m.step % args.checkpoint_every == 0:
            save()
            last_saved = m.step
    bar.close()
    if scalars is not None:
        scalars.close()
    if manager and last_saved != trainer.step_count:
        save()
    return 0


# ---- generate and export -----------------------------------------------------------------------

def cmd_generate(args) -> int:
    from istanbul.shaders.engine import default_device
    from .training.checkpoint import CheckpointError, read_checkpoint
    from .model.generate import GenerationError, Generator
    try:
        ck = read_checkpoint(args.checkpoint)
    except CheckpointError as exc:
        raise UserFacingError(str(exc)) from None
    if ck["vocab_file"] is None:
        raise UserFacingError(f"{ck['path']}: the checkpoint carries no vocabulary, so the "
                              "prompt cannot be tokenized")
    codec = _load_codec(ck["vocab_file"])
    prompt = codec.encode(args.prompt)
    device = default_device(args.adapter)
    gen = Generator(ck["config"], ck["params"], device, valid_vocab=codec.n_vocab)
    stop = [codec.eot_token] if codec.eot_token is not None else []
    out = codec.stream_decoder()
    try:
        sys.stdout.write(args.prompt if not args.ids else " ".join(map(str, prompt)))
        for token in gen.generate(prompt, max_tokens=args.max_tokens,
                                  temperature=args.temperature, top_k=args.top_k,
                                  top_p=args.top_p, seed=args.seed, stop=stop):
            if token in stop:
                break
            sys.stdout.write(f" {token}" if args.ids else out(token))
            sys.stdout.flush()
    except GenerationError as exc:
        raise UserFacingError(str(exc)) from None
    sys.stdout.write("\n")
    return 0


def cmd_export(args) -> int:
    from .training.checkpoint import CheckpointError
    from .training.export_hf import export_hf
    try:
        out = export_hf(args.checkpoint, args.hf)
    except CheckpointError as exc:
        raise UserFacingError(str(exc)) from None
    print(f"exported {args.checkpoint} -> {out} (Hugging Face Llama)")
    return 0
