"""Is the pre-tokenizer's GPU time on a kind of text its walk or its merges? (issue 50)

    python dev/tokenizer_throughput/walk_merge_probe.py --out DIR [--mb 32] [--vocab gpt2,o200k_base]

For each vocabulary, on bench/tokenize_corpus.py's categories (and the adversarial category
split by its generator: random code points, emoji, whitespace runs, digit runs, punctuation
runs, random letters, the long single pieces), each group as one `bytes` batch
(`GpuEncoder.encode_docs` of the packed UTF-8, the path `encode_batch_flat` takes):
  shipped  the GPU phases of one profiled call, and the median wall of R calls
  walk     the same call with bpe_pretok built with MARK_PIECES = 1: it finds the pieces but
           merges none (ids meaningless), so pretok_merge(shipped) - pretok_merge(walk) is
           the short pieces' BPE and the rest of the phase the walk
Rates are MB/s of the group's bytes. Writes OUT/walk_merge.md and .json.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from bench import tokenize_corpus  # noqa: E402
from bench.tokenize_bench import median_of  # noqa: E402


# seconds of calls before the first timed group of a vocabulary: after the host builds a
# vocabulary's tables the GPU ran its first seconds of work slow (session 33: fill and scan,
# the same work in every configuration, at 2x their time)
HOST_WORK_WARM_S = 3.0


def groups(mb: float) -> dict[str, list[str]]:
    """The categories, "all", and the adversarial category's documents by generator."""
    corpus = tokenize_corpus.build_corpus(mb)
    out = {name: corpus.docs_of(name) for name in corpus.names()}

    class Recording(tokenize_corpus.Category):
        def add(self, source, text, files=1):
            super().add(source, text, files)
            by_source.setdefault(source, []).append(text)

    by_source: dict[str, list[str]] = {}
    # the category's own target and generator (tokenize_corpus.build_corpus): the same documents
    target = int(int(mb * (1 << 20)) / len(tokenize_corpus.CATEGORIES))
    tokenize_corpus.fill_adversarial(Recording("adversarial"), target,
                                     random.Random(f"{corpus.seed}:adversarial"))
    assert sum(map(len, by_source.values())) == len(out["adversarial"])
    for source, docs in by_source.items():
        out["adv: " + source] = docs
    return out


def gpu_ms(encoder, packed, starts) -> dict:
    encoder.profile = True
    try:
        encoder.encode_docs(packed, starts)
    finally:
        encoder.profile = False
    return {k: round(v * 1e3, 3) for k, v in encoder.last_profile.gpu.items()}


def probe_vocab(name: str, docs_by_group: dict, repeats: int) -> dict:
    from istanbul.shaders.kernels.bpe.encode import ENCODE_FILE, GpuEncoder
    from istanbul.shaders.kernels.bpe.patterns import PATTERN_IDS
    from tokenizer_svc.encoding import _pack_utf8, get_encoding
    enc = get_encoding(name)
    backend = enc.backend
    shipped = backend.encoder
    device = shipped.device
    walk = GpuEncoder(device, backend.tables, backend.gpu_pattern)
    walk.k_pretok = device.kernel(ENCODE_FILE, "bpe_pretok", {
        "PATTERN": PATTERN_IDS[backend.gpu_pattern], "MARK_PIECES": 1,
        "LONG_WINDOW": walk.long_window, "LONG_OVERLAP": walk.long_overlap})
    rows = {}
    warm_s = HOST_WORK_WARM_S   # the first group's calls also bring the GPU back after host work
    for group, docs in docs_by_group.items():
        packed, starts = _pack_utf8(docs)
        nbytes = int(starts[-1])
        wall = median_of(lambda: shipped.encode_docs(packed, starts), repeats, warm_s=warm_s)
        warm_s = 0.3
        row = {"bytes": nbytes, "docs": len(docs), "MBps": nbytes / 1e6 / wall,
               "shipped_gpu_ms": gpu_ms(shipped, packed, starts)}
        try:
            row["walk_gpu_ms"] = gpu_ms(walk, packed, starts)
        except Exception as e:   # noqa: BLE001 - the walk's later phases read piece lengths
            row["walk_error"] = f"{type(e).__name__}: {e}"
        rows[group] = row
        print(name, group, json.dumps(row), flush=True)
    walk.pool.release()
    return {"vocab": name, "adapter": device.info.summary(), "groups": rows}


def markdown(results: list[dict]) -> str:
    adapter = results[0]["adapter"] if results else ""
    lines = [f"# The pre-tokenizer's walk vs its merges, by kind of text ({adapter})", "",
             "bytes batches through GpuEncoder.encode_docs. pretok_merge: the shipped kernel's "
             "GPU ms; walk: the same with MARK_PIECES 1 (pieces found, none merged); merge = "
             "pretok_merge - walk. long: merge_long_wg + merge_long_wg_short + merge_long + "
             "stitch + long_copy. GPU MB/s = bytes / all GPU phases; wall MB/s from the "
             "median call.", ""]
    for r in results:
        lines += [f"## {r['vocab']}", "",
                  "| group | MB | wall MB/s | GPU MB/s | GPU ms | pretok_merge | walk | merge | "
                  "long | other |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for group, x in r["groups"].items():
            g = x["shipped_gpu_ms"]
            total = sum(g.values())
            pm = g.get("pretok_merge", 0.0)
            walk = x.get("walk_gpu_ms", {}).get("pretok_merge", float("nan"))
            long = sum(g.get(k, 0.0) for k in ("merge_long_wg", "merge_long_wg_short",
                                                "merge_long", "stitch", "long_copy"))
            lines.append(f"| {group} | {x['bytes'] / 1e6:.2f} | {x['MBps']:.0f} | "
                         f"{x['bytes'] / 1e3 / total:.0f} | {total:.2f} | {pm:.2f} | "
                         f"{walk:.2f} | {pm - walk:.2f} | {long:.2f} | "
                         f"{total - pm - long:.2f} |")
        lines.append("")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--mb", type=float, default=32.0)
    ap.add_argument("--vocab", default="gpt2,o200k_base")
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args(argv)
    docs_by_group = groups(args.mb)
    results = [probe_vocab(v, docs_by_group, args.repeats) for v in args.vocab.split(",")]
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "walk_merge.json").write_text(json.dumps(results, indent=1))
    md = markdown(results)
    (args.out / "walk_merge.md").write_text(md)
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
