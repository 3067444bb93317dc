"""Data-parallel training throughput: istanbul over N GPUs next to PyTorch DDP (NCCL), same run.

    python bench/train_ddp.py [--out DIR] [--model 124m] [--batch 8]
                              [--gpus 1,2,4,8] [--steps 10] [--precision mixed] [--no-torch]

Weak scaling: every GPU trains `--batch` rows x the preset's max_seq (124m: 8 x 1024 per GPU),
so N GPUs train N times the tokens per step. For each N in --gpus that this machine has (the
hardware wgpu adapters, and `torch.cuda.device_count()` for the PyTorch rows; the rest are
listed as not available):

- istanbul: this process is rank 0, N-1 rank processes (trainer_svc/distributed), Gloo on
  loopback for the gradient all-reduce (device -> host -> Gloo -> device, bucketed); median
  step time, tokens/s, the gradient sync's share of the step, scaling efficiency
  tokens/s(N) / (N x tokens/s(1));
- istanbul N=1 once more through the all-reduce path (a group of one: the gradients still
  go to the host and back), so the cost of the host round trip is visible on one GPU;
- PyTorch DDP (NCCL, torch.nn.parallel.DistributedDataParallel) on the same GPUs, the same
  model (tests/torch_reference.py, the same weights) in fp32 (TF32 off) and bf16 autocast,
  one process per GPU, with its own scaling efficiency.

Writes OUT/train_ddp.json and OUT/train_ddp.md and prints the table. On one H200 (the only
kind lent so far): about 2 minutes, N=1 rows only.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import statistics
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from bench.results_dir import default_dir  # noqa: E402  (bench/results/<machine>/)

from trainer_svc.model.config import ModelConfig  # noqa: E402
from trainer_svc.training.trainer import TrainConfig, Trainer  # noqa: E402


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def train_config(args, cfg: ModelConfig, batch: int) -> TrainConfig:
    return TrainConfig(batch=batch, seq=args.seq or cfg.max_seq, steps=10_000, lr=3e-4,
                       min_lr=3e-5, warmup=10, precision=args.precision, seed=0)


def batches(args, cfg, tc: TrainConfig, n: int = 4) -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    return [rng.integers(0, args.n_vocab, size=(tc.batch, tc.seq + 1), dtype=np.uint32)
            for _ in range(n)]


def time_steps(trainer, data, args, sync=None) -> dict:
    for i in range(args.warmup):
        trainer.step(data[i % len(data)])
    times, syncs, loss = [], [], None
    for i in range(args.steps):
        m = trainer.step(data[i % len(data)])
        times.append(m.seconds)
        loss = m.loss
        if sync is not None:
            syncs.append(sync.last_seconds)
    step_s = statistics.median(times)
    out = {"step_ms": step_s * 1e3, "final_loss": loss}
    if syncs:
        out["sync_ms"] = statistics.median(syncs) * 1e3
    return out


def istanbul_rows(args, cfg, adapters: list[str]) -> tuple[list[dict], str]:
    """The istanbul rows, and rank 0's adapter."""
    from istanbul.shaders.engine import Device
    from trainer_svc.distributed.data_parallel import DataParallelTrainer, rank_train_config
    from trainer_svc.distributed.launch import launch_group
    device = Device(adapters[0])
    rows = []
    one_tc = train_config(args, cfg, args.batch)
    trainer = Trainer(cfg, one_tc, device)
    row = time_steps(trainer, batches(args, cfg, one_tc), args)
    trainer.close()
    rows.append({"engine": "istanbul", "gpus": 1, "path": "one GPU (no all-reduce)", **row})
    for n in [1] + [n for n in args.gpus if n > 1 and n <= len(adapters)]:
        tc = train_config(args, cfg, args.batch * n)
        group, ranks = launch_group(n, adapters[:n])
        dp = DataParallelTrainer(Trainer(cfg, rank_train_config(tc, n), device), group, tc,
                                 on_close=ranks.stop)
        try:
            row = time_steps(dp, batches(args, cfg, tc), args, sync=dp.sync)
            dp.rank_hashes()                           # the ranks still agree
        finally:
            dp.close()
        rows.append({"engine": "istanbul", "gpus": n,
                     "path": "Gloo all-reduce via host" + (" (group of one)" if n == 1 else ""),
                     **row})
    base = rows[0]
    for r in rows:
        r["tokens_per_s"] = r["gpus"] * base_tokens_per_s(r, args, cfg)
        r["efficiency"] = r["tokens_per_s"] / (r["gpus"] * base_tokens_per_s(base, args, cfg))
        if "sync_ms" in r:
            r["sync_share"] = r["sync_ms"] / r["step_ms"]
    return rows, device.info.summary()


def base_tokens_per_s(row: dict, args, cfg) -> float:
    """Tokens per second of one GPU's share of a row's step."""
    return args.batch * (args.seq or cfg.max_seq) / (row["step_ms"] / 1e3)


# ---- PyTorch DDP ----------------------------------------------------------------------------

def _torch_rank(rank: int, world: int, port: int, cfg_json: str, args_dict: dict, mode: str,
                result_path: str) -> None:
    import torch
    import torch.distributed as dist
    from tests.torch_reference import TorchReference
    from trainer_svc.model.init import init_parameters
    from trainer_svc.model.layout import ParameterLayout
    on_cpu = args_dict["torch_on_cpu"]
    where = "cpu" if on_cpu else f"cuda:{rank}"
    if not on_cpu:
        torch.cuda.set_device(rank)
    dist.init_process_group("gloo" if on_cpu else "nccl",
                            init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    sync = (lambda: None) if on_cpu else torch.cuda.synchronize
    torch.backends.cuda.matmul.allow_tf32 = mode != "fp32"
    torch.backends.cudnn.allow_tf32 = mode != "fp32"
    cfg = ModelConfig.from_json(cfg_json)
    layout = ParameterLayout.for_config(cfg)
    ref = TorchReference(cfg, layout.unpack(init_parameters(cfg, layout, 0)), device=where)
    ref.params = {k: torch.nn.Parameter(v.detach()) for k, v in ref.params.items()}

    class Loss(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.weights = torch.nn.ParameterList(list(ref.params.values()))

        def forward(self, batch):
            return ref.loss(batch, autocast_dtype=torch.bfloat16 if mode == "bf16" else None)

    model = torch.nn.parallel.DistributedDataParallel(Loss(),
                                                      device_ids=None if on_cpu else [rank])
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, betas=(0.9, 0.95), weight_decay=0.1)
    seq = args_dict["seq"] or cfg.max_seq
    rng = np.random.default_rng(rank)
    batch = torch.as_tensor(rng.integers(0, args_dict["n_vocab"],
                                         size=(args_dict["batch"], seq + 1)),
                            device=where)
    times = []
    for i in range(args_dict["warmup"] + args_dict["steps"]):
        sync()
        start = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = model(batch)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        float(loss)                        # one read-back per step, as istanbul
        if i >= args_dict["warmup"]:
            times.append(time.perf_counter() - start)
    if rank == 0:
        Path(result_path).write_text(json.dumps({"step_ms": statistics.median(times) * 1e3,
                                                 "final_loss": float(loss)}))
    dist.destroy_process_group()


def torch_rows(args, cfg, n_cuda: int, tmp: Path) -> list[dict]:
    import torch.multiprocessing as mp
    rows = []
    for mode in ("fp32", "bf16"):
        for n in [n for n in args.gpus if n <= n_cuda]:
            result = tmp / f"torch_{mode}_{n}.json"
            mp.spawn(_torch_rank, args=(n, free_port(), cfg.to_json(), vars_for_torch(args),
                                        mode, str(result)), nprocs=n, join=True)
            rows.append({"engine": "pytorch DDP (" + ("Gloo, CPU" if args.torch_on_cpu
                                                      else "NCCL") + ")",
                         "mode": mode, "gpus": n, "path": "CPU tensors (a dry run)"
                         if args.torch_on_cpu else "DistributedDataParallel, NCCL on device",
                         **json.loads(result.read_text())})
        base = next(r for r in rows if r["mode"] == mode and r["gpus"] == 1)
        for r in rows:
            if r["mode"] == mode:
                r["tokens_per_s"] = r["gpus"] * base_tokens_per_s(r, args, cfg)
                r["efficiency"] = r["tokens_per_s"] / (r["gpus"] * base_tokens_per_s(base, args,
                                                                                     cfg))
    return rows


def vars_for_torch(args) -> dict:
    return {"seq": args.seq, "batch": args.batch, "n_vocab": args.n_vocab,
            "warmup": args.warmup, "steps": args.steps, "torch_on_cpu": args.torch_on_cpu}


# ---- what exists, the table ------------------------------------------------------------------

def hardware_adapters() -> tuple[list[str], int]:
    """(adapters to use, hardware GPUs): without a GPU, the software adapter for N=1."""
    from trainer_svc.distributed.launch import rank_adapters
    from istanbul.shaders.adapters import enumerate_adapters
    n = sum(1 for info, _ in enumerate_adapters("wgpu") if not info.is_software)
    return (rank_adapters(n) if n else rank_adapters(1)), n


def cuda_count() -> tuple[int, str]:
    try:
        import torch
    except ImportError:
        return 0, "torch is not installed"
    if not torch.cuda.is_available():
        return 0, f"torch {torch.__version__} sees no CUDA device"
    return torch.cuda.device_count(), ""


def markdown(results: dict) -> str:
    lines = [f"# Data-parallel training ({results['model']}, {results['batch']} x "
             f"{results['seq']} per GPU, {results['adapter']})", "",
             "| engine | mode | GPUs | path | step ms | tokens/s | scaling efficiency | "
             "all-reduce after the backward, ms (share) |",
             "|---|---|---:|---|---:|---:|---:|---:|"]
    for r in results["rows"]:
        sync = f"{r['sync_ms']:.1f} ({100 * r['sync_share']:.0f}%)" if "sync_ms" in r else "-"
        lines.append(f"| {r['engine']} | {r.get('mode', results['precision'])} | {r['gpus']} "
                     f"| {r['path']} | {r['step_ms']:.1f} "
                     f"| {r['tokens_per_s']:,.0f} | {100 * r['efficiency']:.0f}% | {sync} |")
    if results["not_available"]:
        lines += ["", "Not available on this machine: " + "; ".join(results["not_available"])]
    return "\n".join(lines) + "\n"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=None,
                   help="output directory for train_ddp.json / .md "
                        "(default bench/results/<machine>/)")
    p.add_argument("--model", default="124m")
    p.add_argument("--vocab", type=int, default=50257, help="vocabulary size (default GPT-2's)")
    p.add_argument("--batch", type=int, default=8, help="rows per GPU (default 8)")
    p.add_argument("--seq", type=int, default=0, help="default: the preset's max_seq")
    p.add_argument("--gpus", default="1,2,4,8", help="GPU counts to try (default 1,2,4,8)")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--precision", choices=("mixed", "fp32", "f16"), default="mixed")
    p.add_argument("--no-torch", action="store_true", help="skip the PyTorch DDP rows")
    p.add_argument("--torch-on-cpu", type=int, default=0, metavar="N",
                   help="try the PyTorch DDP rows without CUDA: N CPU processes over Gloo")
    p.add_argument("--adapters", default=None, metavar="A,B,...",
                   help="istanbul's rank adapters (default: the hardware GPUs; '0,0' runs two "
                        "ranks on one adapter, e.g. lavapipe, to try the path)")
    args = p.parse_args()
    args.gpus = sorted({int(x) for x in args.gpus.split(",")})
    args.n_vocab = args.vocab
    cfg = ModelConfig.preset(args.model, args.vocab)
    args.out = args.out or default_dir()
    args.out.mkdir(parents=True, exist_ok=True)
    adapters, n_hardware = hardware_adapters()
    if args.adapters:
        adapters = args.adapters.split(",")
    n_cuda, why_no_cuda = (0, "--no-torch") if args.no_torch else \
        (args.torch_on_cpu, "") if args.torch_on_cpu else cuda_count()
    missing = [f"{n} GPUs for istanbul ({len(adapters)} adapter(s): wgpu lists {n_hardware} "
               "GPU(s))"
               for n in args.gpus if n > len(adapters)]
    if not n_cuda:
        missing.append(f"PyTorch DDP ({why_no_cuda})")
    else:
        missing += [f"{n} GPUs for PyTorch DDP ({n_cuda} CUDA device(s))"
                    for n in args.gpus if n > n_cuda]
    start = time.perf_counter()
    rows, adapter = istanbul_rows(args, cfg, adapters)
    if n_cuda:
        import tempfile
        with tempfile.TemporaryDirectory() as tmp:
            rows += torch_rows(args, cfg, n_cuda, Path(tmp))
    results = {"model": args.model, "batch": args.batch, "seq": args.seq or cfg.max_seq,
               "precision": args.precision, "adapter": adapter, "host": platform.node(),
               "rows": rows, "not_available": missing,
               "wall_s": time.perf_counter() - start,
               "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())}
    (args.out / "train_ddp.json").write_text(json.dumps(results, indent=2) + "\n")
    table = markdown(results)
    (args.out / "train_ddp.md").write_text(table)
    print(table)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("XDG_RUNTIME_DIR", "/tmp")
    sys.exit(main())
