"""Training throughput: istanbul (WGSL) next to PyTorch as its users write it, same GPU, same run.

    python bench/train.py [--out DIR] [--models 124m] [--batch 8,16]
                          [--steps 10] [--precision f16] [--torch user] [--adapter A]
                          [--vocab gpt2|cl100k_base|o200k_base|N]

For each preset (vocabulary: GPT-2's 50257 ids by default, padded to a multiple of 128) and
each batch B at the preset's max_seq (or --seq), in one process:
- istanbul's full training step (forward, backward, global-norm clip, AdamW; one submit and
  one read-back per step) in each --precision mode (f16: tensor-core matmuls with f16
  operands and loss scaling where the device has f16 subgroup matrices; mixed; mixed+f16;
  fp32): median step time, tokens/s, model TFLOP/s and MFU (model FLOPs over the GPU's dense
  f16/bf16 tensor peak), peak GPU memory (the engine's allocation tracker), the host's
  recording time per step, then one step with GPU timestamps around every dispatch, summed
  by kernel: each kernel's share of the step;
- `--torch user` (default): the same model written as a PyTorch user writes it
  (bench/torch_user_model.py: fused QKV and gate-up, nn.RMSNorm, flash attention, fused
  AdamW, bf16 autocast), eager and under torch.compile, from istanbul's initial weights;
- `--torch reference` adds tests/torch_reference.py (the parity reference written for
  gradient checks) in fp32, tf32, bf16 and fp16, labelled as such: not a speed anchor.
Rows of both engines alternate over --rounds rounds (the medians of the rounds are reported).
Writes OUT/train.json and OUT/train.md and prints the table.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.results_dir import default_dir  # noqa: E402
from istanbul.shaders.engine import default_device  # noqa: E402
from trainer_svc.model.config import ModelConfig  # noqa: E402
from trainer_svc.training.trainer import TrainConfig, Trainer  # noqa: E402

# Dense f16/bf16 tensor-core peaks (TFLOP/s, no sparsity) for MFU, by adapter name.
DENSE_F16_PEAK_TFLOPS = {"H100": 989.4, "H200": 989.4, "A100": 312.0, "L40S": 362.0}


def dense_peak(adapter_name: str) -> float | None:
    return next((v for k, v in DENSE_F16_PEAK_TFLOPS.items() if k in adapter_name), None)


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


def _torch_device(args):
    """(torch, None) or (None, a row saying why PyTorch cannot run here)."""
    try:
        import torch
    except ImportError:
        return None, {"engine": "pytorch", "skipped": "torch is not installed"}
    if args.torch_device == "cuda" and not torch.cuda.is_available():
        return None, {"engine": "pytorch", "skipped": f"torch {torch.__version__} has no CUDA "
                                                      "device here (CPU build or no GPU)"}
    return torch, None


def torch_user_runs(cfg, trainer_params: dict, args) -> list[dict]:
    """The model as a PyTorch user writes it (bench/torch_user_model.py), bf16 autocast,
    eager and under torch.compile, from istanbul's initial weights."""
    torch, skipped = _torch_device(args)
    if skipped:
        return [skipped]
    from bench.torch_user_model import UserModel, make_step
    device = args.torch_device
    seq = args.seq or cfg.max_seq
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    out = []
    for mode in args.torch_user_modes.split(","):
        if device == "cuda":
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
        model = UserModel(cfg).to(device)
        model.load_layout(trainer_params)
        step = make_step(model, lr=3e-4, compile=mode == "compile")
        rng = np.random.default_rng(0)
        batches = [torch.as_tensor(rng.integers(0, args.n_vocab, size=(args.batch, seq + 1)),
                                   device=device) for _ in range(4)]
        started = time.perf_counter()
        for i in range(args.warmup + (2 if mode == "compile" else 0)):
            step(batches[i % 4])
        warm_s = time.perf_counter() - started
        times, losses = [], []
        for i in range(args.steps):
            start = time.perf_counter()
            losses.append(step(batches[i % 4]))     # the loss read-back ends the step
            times.append(time.perf_counter() - start)
        step_s = statistics.median(times)
        tokens = args.batch * seq
        peak = torch.cuda.max_memory_allocated() if device == "cuda" else None
        out.append({"engine": "pytorch-user", "mode": f"bf16 {mode}", "batch": args.batch,
                    "seq": seq, "vocab": cfg.vocab_size, "peak_gpu_bytes": peak,
                    "peak_gpu_bytes_per_row": peak / tokens if peak else None,
                    "step_ms": step_s * 1e3, "tokens_per_s": tokens / step_s,
                    "tflops": cfg.flops_per_token(seq) * tokens / step_s / 1e12,
                    "step_ms_each": [t * 1e3 for t in times], "warmup_s": warm_s,
                    "final_loss": losses[-1], "torch": torch.__version__,
                    "device": torch.cuda.get_device_name() if device == "cuda" else "cpu"})
        del model, step
    return out


def torch_runs(cfg, trainer_params: dict, args) -> list[dict]:
    """The parity reference (tests/torch_reference.py) in fp32, tf32, bf16, fp16."""
    torch, skipped = _torch_device(args)
    if skipped:
        return [skipped]
    device = args.torch_device
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
        out.append({"engine": "pytorch-reference (parity, not a speed anchor)", "mode": mode,
                    "batch": args.batch, "seq": seq,
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


def _mfu(row: dict, peak: float | None) -> str:
    return f"{100 * row['tflops'] / peak:.1f}%" if peak and "tflops" in row else "-"


def markdown(results: dict) -> str:
    peak = results["device"].get("dense_f16_peak_tflops")
    lines = [f"# Training throughput ({results['device']['adapter']})", "",
             f"Commit {results.get('commit', '?')}. "
             f"Host: {results['host']['cpus']} cores; backend {results['device']['backend']}; "
             f"MFU: model FLOPs (6 N + attention) over the dense f16/bf16 tensor peak "
             f"({peak or '?'} TFLOP/s); medians of {results['args']['steps']} steps"
             f"{', the median over ' + str(results['args']['rounds']) + ' alternating rounds' if results['args']['rounds'] > 1 else ''}.",
             "",
             "| model | engine | mode | B x T | step ms | tokens/s | TFLOP/s | MFU "
             "| peak GPU MiB | head chunks |",
             "|---|---|---|---|---:|---:|---:|---:|---:|---:|"]
    for model, rows in results["models"].items():
        for r in rows:
            if "skipped" in r:
                lines.append(f"| {model} | {r['engine']} | {r.get('mode', '-')} | - | - | - | "
                             f"- | - | - | {r['skipped']} |")
                continue
            mem = f"{r['peak_gpu_bytes'] / 2**20:,.0f}" if r.get("peak_gpu_bytes") else "-"
            chunks = f"{r['head_chunks']} x {r['head_chunk_rows']}" if "head_chunks" in r \
                else "-"
            mode = r["mode"] + (" (tensor cores)" if r.get("tensor_cores") else "")
            lines.append(f"| {model} | {r['engine']} | {mode} | {r['batch']} x {r['seq']} "
                         f"| {r['step_ms']:.1f} | {r['tokens_per_s']:,.0f} | {r['tflops']:.1f} "
                         f"| {_mfu(r, peak)} | {mem} | {chunks} |")
    ratios = []
    for model, rows in results["models"].items():
        for r in rows:
            if r.get("engine") != "istanbul" or "skipped" in r:
                continue
            for other in rows:
                if other.get("engine") == "pytorch-user" and "skipped" not in other \
                        and other["batch"] == r["batch"]:
                    ratios.append(f"| {model} | {r['mode']} | {r['batch']} | {other['mode']} | "
                                  f"{r['tokens_per_s'] / other['tokens_per_s']:.2f}x |")
    if ratios:
        lines += ["", "istanbul / PyTorch as a user writes it (same run, same batch):", "",
                  "| model | istanbul mode | B | PyTorch | ratio |", "|---|---|---:|---|---:|",
                  *ratios]
    for model, rows in results["models"].items():
        for r in rows:
            ks = r.get("kernel_shares", {}).get("kernels")
            if not ks:
                continue
            lines += ["", f"## {model}, istanbul {r['mode']}, B {r['batch']}: share of the step "
                      f"by kernel (GPU timestamps, {r['kernel_shares']['gpu_ms_total']:.1f} ms; "
                      f"host recording {r.get('record_ms_median') or 0:.2f} ms a step)", "",
                      "| kernel | dispatches | ms | share |", "|---|---:|---:|---:|"]
            for name, k in ks.items():
                lines.append(f"| {name} | {k['dispatches']} | {k['ms']:.2f} | "
                             f"{100 * k['share']:.1f}% |")
    return "\n".join(lines) + "\n"


def _median_rows(rounds: list[list[dict]]) -> list[dict]:
    """One row per (engine, mode, batch): the round whose tokens/s is the median."""
    groups = collections.defaultdict(list)
    order = []
    for rows in rounds:
        for r in rows:
            key = (r.get("engine"), r.get("mode"), r.get("batch"))
            if key not in groups:
                order.append(key)
            groups[key].append(r)
    out = []
    for key in order:
        rows = groups[key]
        timed = sorted((r for r in rows if "tokens_per_s" in r), key=lambda r: r["tokens_per_s"])
        row = dict(timed[(len(timed) - 1) // 2]) if timed else rows[0]
        if len(timed) > 1:
            row["tokens_per_s_rounds"] = [r["tokens_per_s"] for r in timed]
        out.append(row)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=None,
                    help="output directory for train.json / train.md "
                         "(default bench/results/<machine>/)")
    ap.add_argument("--commit", default=None,
                    help="the tree's commit for the report, where the copy has no .git (the GPU "
                         "machine); default: git rev-parse HEAD")
    ap.add_argument("--models", default="124m")
    ap.add_argument("--batch", default="8,16", help="comma-separated batch sizes")
    ap.add_argument("--seq", type=int, default=0, help="0: each preset's max_seq")
    ap.add_argument("--steps", type=int, default=10, help="timed steps")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=1,
                    help="alternate istanbul's and PyTorch's rows this many times; report the "
                         "median round")
    ap.add_argument("--precision", default="f16",
                    help="istanbul modes, comma-separated: f16 (tensor-core matmuls, loss "
                         "scaling), mixed (f16 weights), mixed+f16 (packed-f16 forward "
                         "matmuls), fp32")
    ap.add_argument("--torch", default="user",
                    help="PyTorch rows, comma-separated: user (bench/torch_user_model.py, "
                         "the speed anchor), reference (tests/torch_reference.py, the parity "
                         "reference), none")
    ap.add_argument("--torch-user-modes", default="eager,compile",
                    help="the user model's modes: eager, compile (torch.compile)")
    ap.add_argument("--vocab", default="gpt2",
                    help="vocabulary size: gpt2 (50257, default), cl100k_base, o200k_base "
                         "(200019) or a number of ids; token ids are random in [0, size)")
    ap.add_argument("--adapter", default=None)
    ap.add_argument("--torch-device", default="cuda",
                    help="where PyTorch runs: cuda (the comparison) or cpu (a smoke test)")
    args = ap.parse_args(argv)
    args.n_vocab = vocab_size(args.vocab)
    batches = [int(b) for b in args.batch.split(",")]
    torch_kinds = {k for k in args.torch.split(",") if k and k != "none"}
    if torch_kinds - {"user", "reference"}:
        ap.error(f"--torch {args.torch!r}: use user, reference or none")
    out = Path(args.out) if args.out else default_dir(args.adapter)
    out.mkdir(parents=True, exist_ok=True)
    device = default_device(args.adapter, robustness=False)   # as the trainer's (engine.Device)
    results = {"device": {"adapter": device.info.name, "backend": device.info.backend,
                          "features": sorted(device.features),
                          "webgpu": device.backend.name, "robustness": device.robustness,
                          "dense_f16_peak_tflops": dense_peak(device.info.name)},
               "host": {"python": platform.python_version(), "cpus": os.cpu_count()},
               "commit": args.commit or subprocess.run(
                   ["git", "rev-parse", "--short", "HEAD"], cwd=Path(__file__).resolve().parents[1],
                   capture_output=True, text=True).stdout.strip() or "?",
               "args": {k: v for k, v in vars(args).items()}, "models": {}}
    for name in args.models.split(","):
        cfg = ModelConfig.preset(name, args.n_vocab)
        from trainer_svc.model.init import init_parameters
        from trainer_svc.model.layout import ParameterLayout
        layout = ParameterLayout.for_config(cfg)
        params = layout.unpack(init_parameters(cfg, layout, 0))
        rounds = []
        for round_ in range(args.rounds):
            rows = []
            for batch in batches:
                args.batch = batch
                for precision in args.precision.split(","):
                    if precision != "fp32" and not device.has("shader-f16"):
                        rows.append({"engine": "istanbul", "mode": precision, "batch": batch,
                                     "skipped": "no shader-f16"})
                        continue
                    print(f"{name} B {batch} round {round_ + 1}: istanbul {precision} ...",
                          flush=True)
                    try:
                        r = istanbul_run(device, cfg, args, precision)
                    except Exception as exc:  # record, keep going with the other rows
                        r = {"engine": "istanbul", "mode": precision, "batch": batch,
                             "skipped": f"{type(exc).__name__}: {str(exc)[:300]}"}
                    rows.append(r)
                    print(f"  {r.get('tokens_per_s', r.get('skipped'))}", flush=True)
                if "user" in torch_kinds:
                    print(f"{name} B {batch} round {round_ + 1}: pytorch (user) ...",
                          flush=True)
                    rows += torch_user_runs(cfg, params, args)
                    print("  " + ", ".join(f"{r.get('mode')}: {r.get('tokens_per_s', r.get('skipped'))}"
                                           for r in rows if r["engine"] == "pytorch-user"
                                           and r.get("batch", batch) == batch), flush=True)
                if "reference" in torch_kinds:
                    rows += torch_runs(cfg, params, args)
            rounds.append(rows)
        results["models"][name] = _median_rows(rounds)
        (out / "train.json").write_text(json.dumps(results, indent=2) + "\n")
    results["args"]["batch"] = batches
    (out / "train.json").write_text(json.dumps(results, indent=2) + "\n")
    md = markdown(results)
    (out / "train.md").write_text(md)
    print(md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
