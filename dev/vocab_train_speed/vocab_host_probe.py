"""Host CPU time of recording the GPU trainer's merge steps: what one merge costs the
recording thread, independent of the device (the work happens in Python and wgpu-native).

    python dev/vocab_train_speed/vocab_host_probe.py --out dev/results/vocab_host_probe [--steps 512]
                                   [--repeats 8] [--profile]

Builds the trainer on the pieces of a few standard-library sources, then records --steps
merge steps into one command encoder --repeats times, exactly as a round of the trainer
does (its own `_record_steps`), without submitting them: per step the Python recording
calls ("record") and `encoder.finish()` ("finish": wgpu-native's validation and Vulkan
command encoding, which the trainer's "submit" phase includes). The GPU path is measured
(no CONTINUE passes: `work_budget` unlimited) on any device, lavapipe included: the GPU
never runs these steps. Minimum over the repeats (the machine's other load only adds).
With --profile, cProfile of one recording: which calls the time goes to.
Writes OUT/vocab_host_probe.md and .json. Wall time: ~10 s on lavapipe.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import random
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from tokenizer_svc.patterns import PATTERNS  # noqa: E402
from tokenizer_svc.training import gpu_trainer  # noqa: E402
from tokenizer_svc.training.corpus import pieces_of_text  # noqa: E402

SOURCES = ("textwrap.py", "json/decoder.py", "json/encoder.py", "shlex.py", "argparse.py")


def record_once(trainer, device, steps: int) -> tuple[float, float, int]:
    """Seconds recording `steps` steps, seconds in encoder.finish(), dispatches recorded."""
    rec = device.record("host probe")
    t0 = time.perf_counter()
    trainer._record_steps(rec, steps, trainer.n_pieces, trainer.n_positions)
    t1 = time.perf_counter()
    rec.finish()
    t2 = time.perf_counter()
    return t1 - t0, t2 - t1, rec.dispatch_count


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--steps", type=int, default=512)
    parser.add_argument("--repeats", type=int, default=8)
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--adapter", default=None)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)

    from istanbul.shaders.engine import Device
    device = Device(args.adapter)
    stdlib = Path(random.__file__).parent
    text = "".join((stdlib / name).read_text(encoding="utf-8") for name in SOURCES)
    pieces = pieces_of_text(text, PATTERNS["o200k"])
    trainer = gpu_trainer.GpuTrainer(device, pieces, 256 + 2000, options=gpu_trainer.
                                     TrainerOptions(work_budget=gpu_trainer.NO_CAP))
    record_once(trainer, device, 16)  # first encoder of the process: allocations, not steps
    runs = [record_once(trainer, device, args.steps) for _ in range(args.repeats)]
    record_s = min(r[0] for r in runs)
    finish_s = min(r[1] for r in runs)
    dispatches = runs[0][2]
    result = {"device": device.name, "steps": args.steps, "repeats": args.repeats,
              "dispatches_per_step": dispatches / args.steps,
              "record_us_per_step": 1e6 * record_s / args.steps,
              "finish_us_per_step": 1e6 * finish_s / args.steps,
              "host_us_per_step": 1e6 * (record_s + finish_s) / args.steps}
    profile_text = ""
    if args.profile:
        prof = cProfile.Profile()
        rec = device.record("host probe, profiled")
        prof.enable()
        trainer._record_steps(rec, args.steps, trainer.n_pieces, trainer.n_positions)
        prof.disable()
        rec.finish()
        out = io.StringIO()
        pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(12)
        profile_text = out.getvalue()
        result["profile"] = profile_text

    lines = ["# Host time per merge step of the GPU trainer's recording", "",
             f"Device: {device.name}. {args.steps} steps per recording, minimum of "
             f"{args.repeats}; {result['dispatches_per_step']:g} dispatches per step "
             "(GPU path, no CONTINUE passes).", "",
             "| record us/step | finish us/step | host us/step |", "|---:|---:|---:|",
             f"| {result['record_us_per_step']:.2f} | {result['finish_us_per_step']:.2f} | "
             f"{result['host_us_per_step']:.2f} |"]
    if profile_text:
        lines += ["", "cProfile of one recording (cProfile's own overhead inflates it):", "",
                  "```", profile_text.strip(), "```"]
    (args.out / "vocab_host_probe.md").write_text("\n".join(lines) + "\n")
    (args.out / "vocab_host_probe.json").write_text(json.dumps(result, indent=2) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
