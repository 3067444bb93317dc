"""Host time to record one training step's commands (never submitted), per dispatch.

    python dev/training_step/record_step_cost.py [--out dev/training_step/results/record_step/NAME.json] [--repeats 20]
        [--precision fp32|f16] [--model 124m] [--d-model 192 --ffn 512 --vocab 4096]

The trainer records step n+1 while the GPU runs step n (GpuModel.train_step), so this time
is hidden until it exceeds the GPU's step. The model keeps the preset's layer count and
heads (so the dispatch count) with a narrow width, so it fits a CPU device's 128 MiB
binding: the recording does not depend on the sizes, only on the calls. Prints the median
and minimum over `repeats` recordings and writes them as JSON.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from istanbul.shaders.engine import default_device  # noqa: E402
from trainer_svc.model.config import ModelConfig  # noqa: E402
from trainer_svc.training import TrainConfig, Trainer  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out")
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--precision", default="fp32")
    ap.add_argument("--model", default="124m")
    ap.add_argument("--d-model", type=int, default=192)
    ap.add_argument("--ffn", type=int, default=512)
    ap.add_argument("--vocab", type=int, default=4096)
    ap.add_argument("--seq", type=int, default=256)
    args = ap.parse_args()
    dev = default_device()
    cfg = ModelConfig.preset(args.model, args.vocab, d_model=args.d_model,
                             ffn_hidden=args.ffn)
    tc = TrainConfig(batch=1, seq=args.seq, steps=100, lr=3e-4, min_lr=3e-5, warmup=10,
                     precision=args.precision, seed=0)
    model = Trainer(cfg, tc, dev).model
    model._record_step_commands(1, tc)      # compiles every kernel once
    rec = dev.record("count")
    model._record_step(rec, 1, tc)
    dispatches = rec.dispatch_count
    rec.finish()
    times = []
    for _ in range(args.repeats):
        start = time.perf_counter()
        model._record_step_commands(1, tc)
        times.append(time.perf_counter() - start)
    result = {"device": dev.name, "backend": dev.backend.name, "precision": args.precision,
              "model": cfg.to_dict(), "dispatches": dispatches,
              "record_ms_median": statistics.median(times) * 1e3,
              "record_ms_min": min(times) * 1e3,
              "us_per_dispatch": statistics.median(times) * 1e6 / dispatches}
    print(f"{dev.name} [{dev.backend.name}] {args.precision}: {dispatches} dispatches, "
          f"record {result['record_ms_median']:.2f} ms median ({result['record_ms_min']:.2f} "
          f"min), {result['us_per_dispatch']:.1f} us a dispatch")
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
