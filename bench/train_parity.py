"""Loss curves of istanbul's training next to PyTorch's on the same data, from the same weights.

    python bench/train_parity.py [--out DIR] [--model 124m] [--steps 100]
                                 [--precisions f16,fp32] [--vocab-file gpt2.tiktoken]

Real text (Python standard-library sources, sorted, tokenized with the given vocabulary, a
tiktoken file; default: ../shared/vocab/gpt2.tiktoken) is cut into B x T batches in order;
each engine starts from the same initial weights and takes the same batches with the same
learning-rate schedule, AdamW (tests/torch_reference.py's TorchAdamW: the trainer's exact
update) and global-norm clipping. PyTorch runs fp32 (TF32 off) and fp16 autocast with the
same dynamic loss scaling policy as istanbul's f16 precision (trainer_svc/model/loss_scale.py).
Writes OUT/parity.json and OUT/parity.md: losses at chosen steps, and the largest and mean
absolute difference of each istanbul curve from each PyTorch curve.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import sysconfig
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from bench.results_dir import default_dir  # noqa: E402  (bench/results/<machine>/)

from istanbul.shaders.engine import default_device  # noqa: E402
from trainer_svc.data.stream import TokenStream  # noqa: E402
from trainer_svc.model.loss_scale import LossScaler  # noqa: E402
from trainer_svc.model.config import ModelConfig  # noqa: E402
from trainer_svc.data.text import load_codec  # noqa: E402
from trainer_svc.training.trainer import TrainConfig, Trainer  # noqa: E402


def stdlib_tokens(codec, n_tokens: int) -> np.ndarray:
    root = Path(sysconfig.get_paths()["stdlib"])
    out, have = [], 0
    for path in sorted(root.glob("*.py")):
        ids = codec.encode(path.read_text(encoding="utf-8", errors="replace"))
        out.append(np.asarray(ids, np.uint32))
        have += len(ids)
        if have >= n_tokens:
            break
    return np.concatenate(out)


def istanbul_curve(device, cfg, tc, batches):
    trainer = Trainer(cfg, tc, device)
    losses, skipped, start = [], 0, time.perf_counter()
    for batch in batches:
        while True:
            m = trainer.step(batch)
            if not m.skipped:
                break
            skipped += 1      # a skipped step (f16 overflow) retries the same batch, as torch
            if skipped > 50:
                raise RuntimeError("istanbul: more than 50 skipped steps")
        losses.append(m.loss)
    seconds = time.perf_counter() - start
    weights = trainer.export_weights()
    trainer.close()
    return losses, skipped, seconds, weights


def torch_curve(cfg, tc, weights, batches, mode, device):
    import torch
    from tests.torch_reference import TorchAdamW, TorchReference
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    ref = TorchReference(cfg, {k: np.array(v, copy=True) for k, v in weights.items()},
                         device=device)   # its tensors may share the arrays: a copy per run
    from trainer_svc.model.layout import ParameterLayout
    opt = TorchAdamW(ref, ParameterLayout.for_config(cfg), tc)
    scaler = LossScaler() if mode == "fp16" else None
    losses, skipped, step, start = [], 0, 0, time.perf_counter()
    for batch in batches:
        while True:
            loss = ref.loss(torch.as_tensor(batch.astype(np.int64)),
                            autocast_dtype=torch.float16 if mode == "fp16" else None)
            for p in ref.params.values():
                p.grad = None
            scale = scaler.scale if scaler else 1.0
            (loss * scale).backward()
            grads = {n: p.grad / scale for n, p in ref.params.items()}
            norm = opt.step(grads, tc.lr_at(step))
            overflow = not math.isfinite(norm)
            if scaler:
                scaler.update(overflow)
            if not overflow:
                break
            skipped += 1
            if skipped > 50:
                raise RuntimeError(f"torch {mode}: more than 50 skipped steps")
        losses.append(float(loss.detach()))
        step += 1
    if device == "cuda":
        torch.cuda.synchronize()
    return losses, skipped, time.perf_counter() - start


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=None,
                    help="output directory for parity.json / parity.md "
                         "(default bench/results/<machine>/)")
    ap.add_argument("--model", default="124m")
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--lr", type=float, default=6e-4)
    ap.add_argument("--precisions", default="f16,fp32")
    ap.add_argument("--torch-modes", default="fp16,fp32")
    ap.add_argument("--torch-device", default="cuda")
    ap.add_argument("--vocab-file", default=os.path.join(
        os.environ.get("ISTANBUL_SHARED_VOCAB", str(REPO.parent / "shared" / "vocab")),
        "gpt2.tiktoken"))
    args = ap.parse_args(argv)
    out = Path(args.out) if args.out else default_dir()
    out.mkdir(parents=True, exist_ok=True)
    codec = load_codec(args.vocab_file)
    cfg = ModelConfig.preset(args.model, codec.n_vocab)
    tokens = stdlib_tokens(codec, args.steps * args.batch * (args.seq + 1))
    stream = TokenStream([tokens], args.batch, args.seq)
    batches = [stream.next_batch() for _ in range(args.steps)]
    device = default_device()
    result = {"device": device.info.summary(), "model": args.model, "vocab": cfg.vocab_size,
              "tokens_in_corpus": int(tokens.size), "batch": args.batch, "seq": args.seq,
              "steps": args.steps, "curves": {}}
    weights0 = None
    for precision in [p for p in args.precisions.split(",") if p]:
        tc = TrainConfig(batch=args.batch, seq=args.seq, steps=args.steps, lr=args.lr,
                         min_lr=args.lr / 10, warmup=10, weight_decay=0.1, grad_clip=1.0,
                         precision=precision, seed=0)
        trainer = Trainer(cfg, tc, device)
        weights0 = weights0 or trainer.export_weights()
        trainer.close()
        print(f"istanbul {precision} ...", flush=True)
        losses, skipped, seconds, _ = istanbul_curve(device, cfg, tc, batches)
        result["curves"][f"istanbul {precision}"] = {"losses": losses, "skipped": skipped,
                                                     "seconds": seconds}
    tc = TrainConfig(batch=args.batch, seq=args.seq, steps=args.steps, lr=args.lr,
                     min_lr=args.lr / 10, warmup=10, weight_decay=0.1, grad_clip=1.0,
                     precision="fp32", seed=0)
    for mode in [m for m in args.torch_modes.split(",") if m]:
        print(f"pytorch {mode} ...", flush=True)
        try:
            losses, skipped, seconds = torch_curve(cfg, tc, weights0, batches, mode,
                                                   args.torch_device)
        except Exception as exc:   # no CUDA torch here: say so, keep the istanbul curves
            result["curves"][f"pytorch {mode}"] = {"error": f"{type(exc).__name__}: {exc}"}
            continue
        result["curves"][f"pytorch {mode}"] = {"losses": losses, "skipped": skipped,
                                               "seconds": seconds}
    good = {k: np.array(v["losses"]) for k, v in result["curves"].items() if "losses" in v}
    result["differences"] = {
        f"{a} vs {b}": {"max_abs": float(np.abs(good[a] - good[b]).max()),
                        "mean_abs": float(np.abs(good[a] - good[b]).mean()),
                        "mean_abs_last_20": float(np.abs(good[a] - good[b])[-20:].mean())}
        for a in good if a.startswith("istanbul") for b in good if b.startswith("pytorch")}
    (out / "parity.json").write_text(json.dumps(result, indent=1) + "\n")
    marks = sorted({0, 9, 24, 49, 74, args.steps - 1} & set(range(args.steps)))
    lines = [f"# Loss curves: istanbul vs PyTorch, same data and weights ({result['device']})",
             "", f"{args.model}, vocab {cfg.vocab_size}, {args.batch} x {args.seq} tokens per "
             f"step, {args.steps} steps of Python standard-library sources "
             f"({tokens.size:,} tokens), lr {args.lr} (warmup 10, cosine to lr/10), AdamW "
             "wd 0.1, clip 1.0.", "",
             "| curve | " + " | ".join(f"step {i + 1}" for i in marks) + " | skipped | s |",
             "|---|" + "---:|" * (len(marks) + 2)]
    for name, c in result["curves"].items():
        if "losses" not in c:
            lines.append(f"| {name} | {c['error'][:120]} |")
            continue
        lines.append(f"| {name} | " + " | ".join(f"{c['losses'][i]:.4f}" for i in marks)
                     + f" | {c['skipped']} | {c['seconds']:.1f} |")
    lines += ["", "| pair | max abs diff | mean abs diff | mean abs diff, last 20 |",
              "|---|---:|---:|---:|"]
    for pair, d in result["differences"].items():
        lines.append(f"| {pair} | {d['max_abs']:.4f} | {d['mean_abs']:.4f} | "
                     f"{d['mean_abs_last_20']:.4f} |")
    (out / "parity.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
