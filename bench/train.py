"""Training throughput: istanbul (WGSL) next to PyTorch eager on the same GPU, same run.

    python bench/train.py --out bench/results/train [--models tiny,small,124m] [--batch 8]
                          [--steps 10] [--precision mixed,fp32] [--adapter A] [--no-torch]
                          [--vocab gpt2|cl100k_base|o200k_base|N]

For each preset (vocabulary: GPT-2's 50257 ids by default, padded to a multiple of 128; --vocab
o200k_base gives 200,019 ids) at batch B x the preset's max_seq (tiny 256, small 512, 124m
1024, or --seq): the peak GPU memory of the training step (the engine's allocation tracker:
every buffer alive, the LM head's logits chunk and split-K scratch included) in total and
per row (per token of the micro-batch), the LM head's chunking, the median step time and tokens/s of
istanbul's full training step (forward, backward, global-norm clip, AdamW; one submit and one
read-back per step), then one step recorded with GPU timestamps around every dispatch, summed
by kernel: each kernel's share of the step. PyTorch eager runs the same model
(tests/torch_reference.py: same architecture, same weights) with torch.optim.AdamW in fp32
with TF32 off, with TF32 on, under bf16 autocast and under fp16 autocast with GradScaler, when
CUDA torch is present (otherwise the rows say why they are missing). istanbul runs in fp32,
in mixed precision (f16 weight mirror, f32 arithmetic), in mixed precision with packed-f16
forward matmuls, and in f16 precision (tensor-core matmuls with f16 operands where the
device has subgroup matrices, dynamic loss scaling). Writes OUT/train.json and OUT/train.md
and prints the table.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from istanbul.shaders.engine import default_device  # noqa: E402
from trainer_svc.model.config import ModelConfig  # noqa: E402
from trainer_svc.training import TrainConfig, Trainer  # noqa: E402

VOCAB_SIZES = {"gpt2": 50257, "r50k_base": 50257, "cl100k_base": 100277,
               "o200k_base": 200019}


def vocab_size(text: str) -> int:
    """A known vocabulary's size (token ids incl. specials) or a number."""
    if text in VOCAB_SIZES:
        return VOCAB_SIZES[text]
    try:
        return int(text)
    except ValueError:
        raise SystemExit(f"--vocab {text!r}: give {', '.join(VOCAB_SIZES)} or a number of "
                         "ids") from None


def istanbul_run(device, cfg, args, mode: str) -> dict:
    """mode: "fp32", "mixed" (f16 weights, f32 math), "mixed+f16" (packed-f16 forward) or
    "f16" (tensor cores, loss scaling)."""
    precision = {"fp32": "fp32", "f16": "f16"}.get(mode, "mixed")
    tc = TrainConfig(batch=args.batch, seq=args.seq or cfg.max_seq, steps=10_000, lr=3e-4,
                     min_lr=3e-5, warmup=10, precision=precision,
                     f16_math=mode == "mixed+f16", seed=0)
    import gc
    gc.collect()
    base = device.memory.allocated
    device.memory.reset_peak()
    trainer = Trainer(cfg, tc, device)
    rng = np.random.default_rng(0)
    batches = [rng.integers(0, args.n_vocab, size=(tc.batch, tc.seq + 1), dtype=np.uint32)
               for _ in range(4)]
    for i in range(args.warmup):
        trainer.step(batches[i % 4])
    # the host's recording of each next step (it overlaps the GPU's work on this one: a step
    # whose wall time exceeds its GPU time may be waiting for it)
    model, record_s = trainer.model, []
    record = model._record_step_commands

    def timed_record(*a, **k):
        start = time.perf_counter()
        try:
            return record(*a, **k)
        finally:
            record_s.append(time.perf_counter() - start)
    model._record_step_commands = timed_record
    times, losses = [], []
    for i in range(args.steps):
        m = trainer.step(batches[i % 4])
        times.append(m.seconds)
        losses.append(m.loss)
    model._record_step_commands = record
    step_s = statistics.median(times)
    tokens = tc.batch * tc.seq
    peak = device.memory.peak - base     # before the profiled step's timestamp buffers
    head = trainer.model.head
    shares = kernel_shares(trainer, batches[0])
    tensor_cores = trainer.model.tensor_cores
    trainer.close()
    return {"engine": "istanbul", "mode": mode, "batch": tc.batch, "seq": tc.seq,
            "tensor_cores": tensor_cores,
            "vocab": cfg.vocab_size, "step_ms": step_s * 1e3, "tokens_per_s": tokens / step_s,
            "tflops": cfg.flops_per_token(tc.seq) * tokens / step_s / 1e12,
            "final_loss": losses[-1], "peak_gpu_bytes": peak,
            "step_ms_each": [s * 1e3 for s in times],
            "record_ms_median": statistics.median(record_s) * 1e3 if record_s else None,
            "peak_gpu_bytes_per_row": peak / tokens,
            "head_chunks": head.chunks, "head_chunk_rows": head.chunk,
            "kernel_shares": shares}


def kernel_shares(trainer, batch) -> dict:
    """GPU seconds per kernel name over one step, each dispatch timed on its own."""
    if not trainer.device.has("timestamp-query"):
        return {"note": "device has no timestamp queries"}
    gpu_times = trainer.model.profile_step(np.asarray(batch)[None], lr=1e-4, step=1,
                                           tc=trainer.train_config)
    by_kernel = collections.defaultdict(float)
    counts = collections.Counter()
    for label, seconds in gpu_times:
        by_kernel[label] += seconds
        counts[label] += 1
    total = sum(by_kernel.values()) or 1.0
    return {"gpu_ms_total": total * 1e3,
            "kernels": {k: {"ms": v * 1e3, "share": v / total, "dispatches": counts[k]}
                        for k, v in sorted(by_kernel.items(), key=lambda kv: -kv[1])}}


def torch_runs(cfg, trainer_params: dict, args) -> list[dict]:
    try:
        import torch
    except ImportError:
        return [{"engine": "pytorch", "skipped": "torch is not installed"}]
    device = args.torch_device
    if device == "cuda" and not torch.cuda.is_available():
        return [{"engine": "pytorch", "skipped": f"torch {torch.__version__} has no CUDA "
                                                 "device here (CPU build or no GPU)"}]
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    from tests.torch_reference import TorchReference
    seq = args.seq or cfg.max_seq
    out = []
    for mode in ("fp32", "tf32", "bf16", "fp16"):
        if device == "cuda":
            torch.cuda.reset_peak_memory_stats()
        torch.backends.cuda.matmul.allow_tf32 = mode != "fp32"
        torch.backends.cudnn.allow_tf32 = mode != "fp32"
        ref = TorchReference(cfg, trainer_params, device=device)
        opt = torch.optim.AdamW(list(ref.params.values()), lr=3e-4, betas=(0.9, 0.95),
                                weight_decay=0.1)
        rng = np.random.default_rng(0)
        batch = torch.as_tensor(rng.integers(0, args.n_vocab, size=(args.batch, seq + 1)),
                                device=device)
        autocast = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(mode)
        scaler = torch.amp.GradScaler(device, enabled=mode == "fp16")

        def step(ref=ref, opt=opt, batch=batch, autocast=autocast, scaler=scaler):
            opt.zero_grad(set_to_none=True)
            loss = ref.loss(batch, autocast_dtype=autocast)
            scaler.scale(loss).backward()
            scaler.unscale_(opt)
            torch.nn.utils.clip_grad_norm_(list(ref.params.values()), 1.0)
            scaler.step(opt)
            scaler.update()
            return loss

        for _ in range(args.warmup):
            step()
        sync()
        times = []
        for _ in range(args.steps):
            start = time.perf_counter()
            loss = step()
            float(loss)  # the same one read-back per step as istanbul
            times.append(time.perf_counter() - start)
        step_s = statistics.median(times)
        tokens = args.batch * seq
        peak = torch.cuda.max_memory_allocated() if device == "cuda" else None
        out.append({"engine": "pytorch", "mode": mode, "batch": args.batch, "seq": seq,
                    "vocab": cfg.vocab_size, "peak_gpu_bytes": peak,
                    "peak_gpu_bytes_per_row": peak / tokens if peak else None,
                    "step_ms": step_s * 1e3, "tokens_per_s": tokens / step_s,
                    "tflops": cfg.flops_per_token(seq) * tokens / step_s / 1e12,
                    "final_loss": float(loss),
                    "device": torch.cuda.get_device_name() if device == "cuda" else "cpu"})
        del ref, opt
        if device == "cuda":
            torch.cuda.empty_cache()
    return out


def markdown(results: dict) -> str:
    lines = [f"# Training throughput ({results['device']['adapter']})", "",
             "| model | engine | mode | B x T | vocab | step ms | tokens/s | TFLOP/s "
             "| peak GPU MiB | KiB per row | head chunks |",
             "|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for model, rows in results["models"].items():
        for r in rows:
            if "skipped" in r:
                lines.append(f"| {model} | {r['engine']} | - | - | - | - | - | - | - | - | "
                             f"{r['skipped']} |")
                continue
            peak = r.get("peak_gpu_bytes")
            mem = f"{peak / 2**20:,.0f} | {r['peak_gpu_bytes_per_row'] / 1024:,.1f}" if peak \
                else "- | -"
            chunks = f"{r['head_chunks']} x {r['head_chunk_rows']}" if "head_chunks" in r \
                else "-"
            mode = r["mode"] + (" (tensor cores)" if r.get("tensor_cores") else "")
            lines.append(f"| {model} | {r['engine']} | {mode} | {r['batch']} x {r['seq']} "
                         f"| {r.get('vocab', '-')} | {r['step_ms']:.1f} "
                         f"| {r['tokens_per_s']:,.0f} | {r['tflops']:.2f} | {mem} | {chunks} |")
    for model, rows in results["models"].items():
        for r in rows:
            ks = r.get("kernel_shares", {}).get("kernels")
            if not ks:
                continue
            lines += ["", f"## {model}, istanbul {r['mode']}: share of the step by kernel "
                      f"(GPU timestamps, {r['kernel_shares']['gpu_ms_total']:.1f} ms)", "",
                      "| kernel | dispatches | ms | share |", "|---|---:|---:|---:|"]
            for name, k in ks.items():
                lines.append(f"| {name} | {k['dispatches']} | {k['ms']:.2f} | "
                             f"{100 * k['share']:.1f}% |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, help="output directory for train.json / train.md")
    ap.add_argument("--models", default="tiny,small,124m")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=0, help="0: each preset's max_seq")
    ap.add_argument("--steps", type=int, default=10, help="timed steps")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--precision", default="fp32,mixed,mixed+f16,f16",
                    help="istanbul modes: fp32, mixed (f16 weights), mixed+f16 (packed-f16 "
                         "forward matmuls), f16 (tensor-core matmuls, loss scaling)")
    ap.add_argument("--vocab", default="gpt2",
                    help="vocabulary size: gpt2 (50257, default), cl100k_base, o200k_base "
                         "(200019) or a number of ids; token ids are random in [0, size)")
    ap.add_argument("--adapter", default=None)
    ap.add_argument("--no-torch", action="store_true")
    ap.add_argument("--torch-device", default="cuda",
                    help="where PyTorch runs: cuda (the comparison) or cpu (a smoke test)")
    args = ap.parse_args(argv)
    args.n_vocab = vocab_size(args.vocab)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    device = default_device(args.adapter, robustness=False)   # as the trainer's (engine.Device)
    results = {"device": {"adapter": device.info.name, "backend": device.info.backend,
                          "features": sorted(device.features),
                          "webgpu": device.backend.name, "robustness": device.robustness},
               "host": {"python": platform.python_version(), "cpus": os.cpu_count()},
               "args": vars(args), "models": {}}
    for name in args.models.split(","):
        cfg = ModelConfig.preset(name, args.n_vocab)
        rows = []
        params = None
        for precision in args.precision.split(","):
            if precision != "fp32" and not device.has("shader-f16"):
                rows.append({"engine": "istanbul", "skipped": "no shader-f16 for mixed"})
                continue
            print(f"{name}: istanbul {precision} ...", flush=True)
            try:
                r = istanbul_run(device, cfg, args, precision)
            except Exception as exc:  # record, keep going with the other rows
                r = {"engine": "istanbul", "mode": precision,
                     "skipped": f"{type(exc).__name__}: {str(exc)[:300]}"}
            rows.append(r)
            print(f"  {json.dumps({k: v for k, v in r.items() if k != 'kernel_shares'})}",
                  flush=True)
        if not args.no_torch:
            from trainer_svc.model.init import init_parameters
            from trainer_svc.model.layout import ParameterLayout
            layout = ParameterLayout.for_config(cfg)
            params = layout.unpack(init_parameters(cfg, layout, 0))
            print(f"{name}: pytorch ...", flush=True)
            rows += torch_runs(cfg, params, args)
        results["models"][name] = rows
        (out / "train.json").write_text(json.dumps(results, indent=2) + "\n")
    md = markdown(results)
    (out / "train.md").write_text(md)
    print(md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
