"""Where the GPU trainer's merge phase spends its time, and which schedule knobs move it.

    python dev/vocab_train_speed/vocab_merge_probe.py --out dev/results/vocab_merge_probe [--size-mb 100]
                                    [--merges 32000] [--corpus-dir /tmp/vt_corpus]

Counts the pieces of the first --size-mb MB of bench/vocab_train.py's corpus once (built in
--corpus-dir if it is not there yet), then learns --merges merges from them with each
TrainerOptions variant below, one run each: wall seconds, the host phases (recording,
submitting, waiting for the device), and for the profiled run the GPU time of each kernel
per merge step. Every variant must give the default's merges (a schedule knob must never
change the result); the table says so per row. Writes OUT/vocab_merge_probe.md and .json.
Expected wall time on the H200: ~1 minute (plus ~1 minute if the corpus must be built).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from tokenizer_svc.training import gpu_trainer  # noqa: E402
from tokenizer_svc.training.gpu_corpus import count_pieces_gpu  # noqa: E402
from tokenizer_svc.training.gpu_trainer import TrainerOptions  # noqa: E402

VARIANTS = {
    "default": {},
    "GPU profile (sampled rounds timed)": {"profile": True, "profile_rounds": 8},
    "apply capped at 1024 workgroups": {"find_groups": 1024},
    "apply capped at 4096 workgroups": {"find_groups": 4096},
    "rounds of 5 ms": {"round_seconds": 0.005},
    "rounds of 50 ms, up to 2048 merges": {"round_seconds": 0.05, "max_round_merges": 2048},
    "compact below 80% live": {"compact_below": 0.8},
    "compact below 25% live": {"compact_below": 0.25},
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--size-mb", type=float, default=100.0)
    parser.add_argument("--merges", type=int, default=32_000)
    parser.add_argument("--pattern", default="o200k")
    parser.add_argument("--corpus-dir", type=Path, default=Path("/tmp/vt_corpus"))
    parser.add_argument("--adapter", default=None)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)

    import vocab_train as bench  # bench/vocab_train.py: the same corpus as the benchmark
    meta_path = args.corpus_dir / "meta.json"
    if not (meta_path.is_file() and json.loads(meta_path.read_text())["bytes"]
            >= args.size_mb * 1e6):
        meta_path.parent.mkdir(parents=True, exist_ok=True)
        meta_path.write_text(json.dumps(bench.build_corpus(args.corpus_dir, args.size_mb)))
    files = bench.files_for(bench.corpus_files(args.corpus_dir), args.size_mb)

    from istanbul.shaders.engine import Device
    device = Device(args.adapter)
    t = time.perf_counter()
    pieces = count_pieces_gpu(files, args.pattern, device=device).pieces
    count_s = time.perf_counter() - t
    gpu_trainer.train({b"warm up": 1, b"ab": 2}, 258, device=device)  # kernels compiled
    n_tokens = 256 + args.merges
    rows, reference = [], None
    for name, opts in VARIANTS.items():
        t = time.perf_counter()
        result = gpu_trainer.train(pieces, n_tokens, device=device,
                                   options=TrainerOptions(**opts))
        seconds = time.perf_counter() - t
        reference = reference if reference is not None else result.merges
        rows.append({"variant": name, "options": opts, "seconds": seconds,
                     "us_per_merge": 1e6 * seconds / max(1, len(result.merges)),
                     "same_merges": result.merges == reference,
                     "details": result.details})
        print(f"{name}: {seconds:.2f}s {result.details.get('phases')}", flush=True)

    lines = [f"# GPU merge phase: {args.merges:,} merges, {len(pieces):,} unique pieces of "
             f"{args.size_mb:g} MB ({args.pattern})", "",
             f"Device: {device.info.summary()}. Pieces counted in {count_s:.2f}s (once). One run "
             "per row; host phases in seconds.", "",
             "| variant | s | µs/merge | rounds | compactions | record | finish | submit | wait | "
             "same merges |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        d, ph = r["details"], r["details"]["phases"]
        lines.append(f"| {r['variant']} | {r['seconds']:.2f} | {r['us_per_merge']:.1f} | "
                     f"{d['rounds']} | {d['compactions']} | {ph['record']:.2f} | "
                     f"{ph.get('finish', 0.0):.2f} | {ph['submit']:.2f} | {ph['wait']:.2f} | "
                     f"{r['same_merges']} |")
    prof = next((r["details"].get("gpu_profile") for r in rows
                 if r["details"].get("gpu_profile")), None)
    if prof:
        lines += ["", f"GPU time per merge step ({prof['steps']} steps in {prof['rounds']} "
                  "sampled rounds, one pass per dispatch):", "",
                  "| kernel | µs per step | µs per dispatch |", "|---|---:|---:|"]
        for k, v in prof["kernels"].items():
            lines.append(f"| {k} | {v['us_per_step']:.2f} | {v['us_per_dispatch']:.2f} |")
        lines.append(f"| all | {prof['us_per_step']:.2f} | |")
    table = "\n".join(lines) + "\n"
    (args.out / "vocab_merge_probe.md").write_text(table, encoding="utf-8")
    (args.out / "vocab_merge_probe.json").write_text(json.dumps(
        {"device": device.info.summary(), "pieces": len(pieces), "count_seconds": count_s,
         "merges": args.merges, "rows": rows}, indent=2, default=str) + "\n")
    print(table)
    return 0 if all(r["same_merges"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
