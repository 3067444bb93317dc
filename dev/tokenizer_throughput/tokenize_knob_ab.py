"""The tokenizer's host-path knobs, each value against the shipped one, alternating call by
call in one process (issue 19): on a machine whose speed drifts by 20% between runs, old
and new must alternate to be compared.

    python dev/tokenizer_throughput/tokenize_knob_ab.py --out DIR [--vocabs gpt2,cl100k_base,o200k_base] [--mb 64]
                                   [--rounds 10] [--warm 1.5] [--only TEXT]

On bench/tokenize_bench.py's corpus, per vocabulary, each knob's shipped value ("old")
against another ("new"): `encode_batch_flat(docs)` with GpuEncoder.pipeline_bytes doubled,
fill_invocations doubled (half the bytes per pre-tokenizer invocation), PackedRange.
JOIN_STR_FIRST flipped (a packed batch's groups of ASCII str parts joined as str and encoded
once, shipped since session 17, or each part encoded), without the short build of the
workgroup long-piece merge (long_wg_short off) and with other builds of it
(--short-builds); `decode_bytes_batch_flat(ids, offsets)` with
GpuDecoder.upload_piece_bytes quadrupled. --only picks knobs by name. Every variant's
output is checked (the ids of the first encode; every document decoded back), and each
encode variant's GPU phases are kept from one profiled call. Rounds alternate the order of
the variants (AB, BA, ...). Writes DIR/tokenize_knob_ab.md and .json: per vocabulary and
comparison the median and min wall, MB/s of text, the new/old speed ratio of the medians.

Session 15 ran it (as encode_submit_ab.py, at 406ca12) with two more comparisons whose code
is gone: chunk k+1 submitted before chunk k was waited for, and decoded bytes read out of
the mapping in one parallel copy (both slower; dev/RESULTS.md), and with 8 MB decode pieces
shipped against 32 MB. Session 16 dropped the decode knobs it had decided (pieces of a
quarter, 32-bit ids for gpt2) and ran two encode knobs whose code is gone (a packed batch's
text joined in host memory, then copied into the mapping in parallel; the whole-piece
lookup matching a piece's first 8 bytes against a copy in its slot): dev/RESULTS.md.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from bench.tokenize_bench import build_corpus  # noqa: E402

def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--vocabs", default="gpt2,cl100k_base,o200k_base")
    ap.add_argument("--vocab-dir", type=Path, default=REPO.parent / "shared" / "vocab")
    ap.add_argument("--mb", type=float, default=64.0)
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--warm", type=float, default=1.5)
    ap.add_argument("--only", default="",
                    help="run only the knobs whose name contains this text")
    ap.add_argument("--short-builds", default="",
                    type=lambda v: [tuple(map(int, b.split(":"))) for b in v.split(",") if b],
                    help="LW_MAX:LW_WG builds of the short workgroup merge tried in place of "
                         "the shipped one, comma-separated (session 16: 576:32,256:64,128:32)")
    args = ap.parse_args()
    from tokenizer_svc.encoding import get_encoding
    from tokenizer_svc.packed_text import PackedRange
    docs, corpus = build_corpus(args.mb)
    nbytes = corpus["bytes"]
    want = [d.encode() for d in docs]
    result = {"bytes": nbytes, "rounds": args.rounds, "vocabs": {}}
    lines = ["# Tokenizer host knobs, interleaved A/B", "",
             f"{nbytes / 1e6:.1f} MB corpus, {args.rounds} rounds (AB, BA, ...) after "
             f"{args.warm} s of calls per vocabulary.", "",
             "| vocab | what | variant | median ms | min ms | MB/s (median) | new / old |",
             "|---|---|---|---:|---:|---:|---:|"]
    for vocab in args.vocabs.split(","):
        enc = get_encoding(str(args.vocab_dir / f"{vocab}.tiktoken"))
        encoder, decoder = enc.backend.encoder, enc.backend.decoder
        ids, offsets = enc.encode_batch_flat(docs)
        checks = {"decode exact (shipped)": enc.decode_bytes_batch_flat(ids, offsets) == want}
        row = {"checks": checks}
        # (name, object, attribute, the value to try): "old" is the shipped value
        knobs = [("encode: chunks of twice pipeline_bytes", encoder, "pipeline_bytes",
                  2 * encoder.pipeline_bytes),
                 ("encode: twice the pre-tokenizer invocations (16-byte chunks at 16 MB)",
                  encoder, "fill_invocations", encoder.fill_invocations * 2),
                 (f"encode: PackedRange.JOIN_STR_FIRST {not PackedRange.JOIN_STR_FIRST} ("
                  + ("each ASCII str part encoded, then joined" if PackedRange.JOIN_STR_FIRST
                     else "groups of ASCII str parts joined as str, encoded once") + ")",
                  PackedRange, "JOIN_STR_FIRST", not PackedRange.JOIN_STR_FIRST)]
        if encoder.k_long_wg_short is not None:
            knobs.append(("encode: no short build (all windows in the full workgroup merge)",
                          encoder, "long_wg_short", False))
            # other builds of the short workgroup merge in its place: (LW_MAX, LW_WG)
            for lw_max, lw_wg in args.short_builds:
                build = encoder.device.kernel("bpe_encode.wgsl", "bpe_merge_long_wg",
                                              {"LW_MAX": lw_max, "LW_WG": lw_wg})
                knobs.append((f"encode: short build LW_MAX {lw_max}, LW_WG {lw_wg}", encoder,
                              "k_long_wg_short", build))
        knobs.append(("decode: upload pieces of four times", decoder, "upload_piece_bytes",
                      4 * decoder.upload_piece_bytes))
        encode = lambda: enc.encode_batch_flat(docs)  # noqa: E731
        decode = lambda: enc.decode_bytes_batch_flat(ids, offsets)  # noqa: E731
        for what, obj, attr, value in [k for k in knobs if args.only in k[0]]:
            shipped = getattr(obj, attr)
            run = encode if what.startswith("encode") else decode

            def setter(new: bool, obj=obj, attr=attr, value=value, shipped=shipped) -> None:
                setattr(obj, attr, value if new else shipped)

            end = time.perf_counter() + args.warm
            while time.perf_counter() < end:
                run()
            times = {False: [], True: []}
            for r in range(args.rounds):
                for new in ((False, True) if r % 2 == 0 else (True, False)):
                    setter(new)
                    t = time.perf_counter()
                    run()
                    times[new].append(time.perf_counter() - t)
            setter(True)   # the variant's output checked too
            got = run()
            checks[f"{what}: new exact"] = bool(
                np.array_equal(got[0], ids) and np.array_equal(got[1], offsets)) \
                if what.startswith("encode") else got == want
            if what.startswith("encode"):   # GPU phases of one profiled call each
                row.setdefault("gpu_ms", {})[what] = {}
                for new in (False, True):
                    setter(new)
                    encoder.profile = True
                    run()
                    encoder.profile = False
                    row["gpu_ms"][what]["new" if new else "old"] = {
                        k: v * 1e3 for k, v in encoder.last_profile.gpu.items()}
                print(f"  gpu ms: {row['gpu_ms'][what]}", flush=True)
            setter(False)   # the shipped value again
            med = {k: statistics.median(v) for k, v in times.items()}
            row[what] = {("new" if k else "old"): {"median_s": med[k], "min_s": min(v),
                                                   "MBps": nbytes / med[k] / 1e6, "times_s": v}
                         for k, v in times.items()}
            row[what]["new_over_old_speed"] = med[False] / med[True]
            for name in ("old", "new"):
                v = row[what][name]
                ratio = f"{row[what]['new_over_old_speed']:.3f}x" if name == "new" else ""
                lines.append(f"| {vocab} | {what} | {name} | {v['median_s'] * 1e3:.1f} | "
                             f"{v['min_s'] * 1e3:.1f} | {v['MBps']:.0f} | {ratio} |")
            print(f"{vocab} {what}: old {med[False] * 1e3:.1f} ms, new {med[True] * 1e3:.1f} ms "
                  f"({row[what]['new_over_old_speed']:.3f}x), {checks}", flush=True)
        result["vocabs"][vocab] = row
    lines += ["", "Checks (ids identical to the first encode; every document decoded back): " +
              "; ".join(f"{v}: {c}" for v, r in result["vocabs"].items()
                        for c in [all(r["checks"].values())])]
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "tokenize_knob_ab.json").write_text(json.dumps(result, indent=1))
    (args.out / "tokenize_knob_ab.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
