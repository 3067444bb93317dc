#!/usr/bin/env python
"""Encode/decode throughput: istanbul on the GPU vs the exact CPU tokenizers, same machine.

    python bench/tokenize_bench.py --out bench/results/h200 [--mb 64] [--vocab gpt2,cl100k_base,o200k_base]
                             [--vocab-dir DIR] [--repeats 3] [--warm 2] [--adapter A]

Corpus (>= --mb MB, no network, the same bytes on every machine with the same Python):
--generated-share of it (default 0.2) generated from a fixed seed: word-sampled text in 14
scripts, and adversarial documents (random code points from all planes, emoji sequences,
mixed whitespace, and single pieces of 64-256 KB: one letter repeated, CJK without spaces,
spaces, digits, "=" runs, random letters); the rest real text: the Python standard library's
sources and text files, then other installed packages' sources, plus multilingual files (the
stdlib's CJK test files and, when present, ../shared/seeds). The composition is written into
the results.

For each vocabulary every implementation is first checked for ids identical to tiktoken's on
every document (the count of documents that differ is reported), then timed (median of
--repeats passes after a warm-up, wall clock, whole batch; istanbul's after --warm seconds of
calls, so the GPU has left its idle clock):
  istanbul   Encoding.encode_batch_flat / decode_bytes_batch_flat of its (ids, offsets) on
             the GPU (one batch; decode_bytes_batch of per-document arrays reported beside)
  tiktoken   encode_ordinary_batch / decode_bytes_batch with num_threads = all cores
  hf         tokenizers (the vocabulary converted by trainer_svc.export_hf.tokenizer_json),
             encode_batch / decode_batch, all cores
  peers      gigatoken, toktok-rs, bpe-openai, tokie: only if importable (skipped with a note)
plus a lone 1 KB document (istanbul encode_ordinary, p50/p99 of --lone-calls calls), single
pieces of --piece-bytes (one letter, CJK, random letters: istanbul and tiktoken, exact?) and
istanbul's time split by phase in one profiled pass: upload (host writes), GPU kernels per
phase (GPU timestamps), readback (waiting for and copying the results), the same for decode,
and the host split of one encode, one decode and the lone calls (bench/host_split.py: per
step the calls, wall and the calling thread's own CPU, and the wgpu calls made).
Runs on either WebGPU implementation: ISTANBUL_BACKEND=wgpu or dawn.

Writes DIR/tokenize.json and DIR/tokenize.md and prints the table.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import sysconfig
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

PEERS = ("gigatoken", "toktok", "bpe_openai", "tokie")


# ---- corpus ---------------------------------------------------------------------------------

SCRIPTS = {   # code point ranges of each script's letters, for word-sampled text
    "latin": [(0x61, 0x7A), (0xE0, 0xFF)], "cyrillic": [(0x430, 0x44F)],
    "greek": [(0x3B1, 0x3C9)], "arabic": [(0x627, 0x64A)], "hebrew": [(0x5D0, 0x5EA)],
    "devanagari": [(0x905, 0x939)], "bengali": [(0x985, 0x9B9)], "tamil": [(0xB85, 0xBB9)],
    "thai": [(0xE01, 0xE2E)], "georgian": [(0x10D0, 0x10F0)], "armenian": [(0x561, 0x586)],
    "hangul": [(0xAC00, 0xD7A3)], "kana": [(0x3041, 0x3096), (0x30A1, 0x30FA)],
    "han": [(0x4E00, 0x9FFF)],
}
NO_SPACES = {"thai", "han", "kana"}


def generated_docs(target: int, seed: int = 2026) -> list[tuple[str, str]]:
    """(source, document) pairs of about `target` UTF-8 bytes, the same for a given seed."""
    import random
    rng = random.Random(seed)
    out, total = [], 0

    def add(source: str, doc: str) -> None:
        nonlocal total
        out.append((source, doc))
        total += len(doc.encode("utf-8", "surrogatepass"))

    long_pieces = [("x" * 262_144), "日本語中文漢字" * 12_000, "a" + " " * 65_536 + "b",
                   "7" * 65_536, "=" * 65_536,
                   "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(65_536))]
    for doc in long_pieces:
        add("adversarial: long single pieces", doc)
    while total < target:
        kind = rng.random()
        if kind < 0.8:
            name = rng.choice(sorted(SCRIPTS))
            lo, hi = rng.choice(SCRIPTS[name])
            vocab = ["".join(chr(rng.randint(lo, hi)) for _ in range(rng.randint(1, 8)))
                     for _ in range(300)]
            sep = "" if name in NO_SPACES else " "
            words = [rng.choice(vocab) for _ in range(rng.randint(50, 2000))]
            lines = [sep.join(words[i:i + 12]) for i in range(0, len(words), 12)]
            add("generated: 14 scripts", ".\n".join(lines) + "\n")
        elif kind < 0.9:
            cps = [rng.randint(0, 0x10FFFF) for _ in range(rng.randint(10, 3000))]
            add("adversarial: random code points",
                "".join(chr(c) for c in cps if not 0xD800 <= c <= 0xDFFF))
        elif kind < 0.95:
            emoji = ["👍🏽", "👩‍💻", "🇹🇷", "🏳️‍🌈", "❤️", "😀"]
            add("adversarial: emoji", " ".join(rng.choice(emoji) * rng.randint(1, 5)
                                               for _ in range(rng.randint(10, 500))))
        else:
            ws = [" ", "  ", "\t", "\n", "\r\n", "\u3000", "\xa0", "\n\n   "]
            add("adversarial: whitespace", "".join(rng.choice(ws) + rng.choice(["a", "1", ".", ""])
                                                   for _ in range(rng.randint(10, 3000))))
    return out


def build_corpus(megabytes: float, generated_share: float = 0.2) -> tuple[list[str], dict]:
    target = int(megabytes * (1 << 20))
    docs, sources, total = [], {}, 0
    for source, doc in generated_docs(int(target * generated_share)):
        docs.append(doc)
        size = len(doc.encode("utf-8"))
        total += size
        sources[source] = sources.get(source, 0) + size

    def add(path: Path, source: str) -> bool:
        nonlocal total
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            return False
        if not text:
            return False
        docs.append(text)
        size = len(text.encode("utf-8"))
        total += size
        sources[source] = sources.get(source, 0) + size
        return True

    stdlib = Path(sysconfig.get_paths()["stdlib"])
    multilingual = sorted(stdlib.glob("test/cjkencodings/*utf-8*")) + \
        sorted(stdlib.glob("test/cjkencodings/*utf8*"))
    seeds = REPO.parent / "shared" / "seeds"
    if seeds.is_dir():
        multilingual += sorted(seeds.glob("*.txt"))
    for path in multilingual:
        add(path, "multilingual")
    roots = [("stdlib", stdlib)] + [("site-packages", Path(p)) for p in
                                    {sysconfig.get_paths()["purelib"],
                                     sysconfig.get_paths()["platlib"]}]
    for source, root in roots:
        for path in sorted(root.rglob("*")):
            if total >= target:
                break
            if path.suffix in (".py", ".txt", ".rst", ".md", ".pyi") and path.is_file():
                add(path, source)
    non_ascii = sum(sum(1 for c in d if ord(c) > 127) for d in docs[:2000])
    info = {"documents": len(docs), "bytes": total, "bytes_by_source": sources,
            "non_ascii_chars_in_first_2000_docs": non_ascii}
    return docs, info


# ---- implementations ------------------------------------------------------------------------

def tiktoken_encoding(vocab):
    import tiktoken
    return tiktoken.Encoding(vocab.name, pat_str=vocab.pattern, mergeable_ranks=vocab.ranks,
                             special_tokens=vocab.special_tokens)


def peer_encoder(name: str, vocab, path: Path):
    """(encode(docs) -> list[list[int]], decode(batch) -> list[bytes] | None) or a reason."""
    cores = os.cpu_count() or 1
    try:
        if name == "gigatoken":
            import gigatoken as gt
            # gpt2.tiktoken is r50k_base's rank file under another name: say which split rule
            scheme = {"gpt2": "gpt2", "r50k_base": "gpt2", "cl100k_base": "cl100k",
                      "o200k_base": "o200k"}.get(vocab.name)
            tok = gt.Tokenizer.from_tiktoken(str(path), pretokenizer=scheme,
                                             special_tokens=vocab.special_tokens)
            # encode_batch (awkward array: flat ids + offsets) is gigatoken's fast batch path,
            # the same shape of result as istanbul's encode_batch_flat; lists would time
            # Python object creation instead of tokenization.
            return (lambda docs: tok.encode_batch(docs, parallel=True)), None
        if name == "toktok":
            import toktok
            tok = toktok._encoding(vocab.name)
            return (lambda docs: [list(x) for x in tok.encode_batch(
                [d.encode() for d in docs], 0, False)]), None
        if name == "bpe_openai":
            import bpe_openai
            enc = bpe_openai.get_encoding(vocab.name)
            return (lambda docs: enc.encode_ordinary_batch(docs, num_threads=cores)), \
                (lambda batch: enc.decode_bytes_batch(batch, num_threads=cores))
        if name == "tokie":
            import tokie
            tok = tokie.Tokenizer.from_file(str(path))
            return (lambda docs: [e.ids for e in tok.encode_batch(docs,
                                                                   add_special_tokens=False)]), None
    except Exception as exc:  # a peer that is absent or cannot load this vocabulary
        return f"{type(exc).__name__}: {str(exc).splitlines()[0][:160] if str(exc) else ''}"
    return "unknown peer"


def median_of(fn, repeats: int, warm_s: float = 0.0) -> float:
    """Median wall seconds of `repeats` calls, after calls for at least warm_s seconds (the
    caller has made the first: compile, allocate). A GPU idles at a low clock and needs
    ~0.5-1 s of work to reach its full one (the H200: 345 -> 1980 MHz, dev/RESULTS.md), so a
    single warm-up call of 50 ms would time a GPU still speeding up."""
    end = time.perf_counter() + warm_s
    while time.perf_counter() < end:
        fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return float(np.median(times))


def hf_encoder(vocab):
    """(encode(docs) -> list[list[int]], decode(batch) -> list[str]) with HF tokenizers."""
    try:
        from trainer_svc.export_hf import tokenizer_json
        tok = tokenizer_json(vocab)
    except Exception as exc:
        return f"{type(exc).__name__}: {str(exc).splitlines()[0][:160] if str(exc) else ''}"
    return (lambda docs: [e.ids for e in tok.encode_batch(docs, add_special_tokens=False)],
            lambda batch: tok.decode_batch(batch, skip_special_tokens=False))


def mismatches(got, want) -> int:
    """Documents whose ids differ (a vectorised check first: all equal is the common case)."""
    try:
        if len(got) == len(want) and [len(g) for g in got] == [len(w) for w in want] and \
                np.array_equal(np.concatenate([np.asarray(g, np.int64) for g in got] or [[]]),
                               np.concatenate([np.asarray(w, np.int64) for w in want] or [[]])):
            return 0
    except (TypeError, ValueError):
        pass
    return sum(1 for g, w in zip(got, want) if list(map(int, g)) != w) + abs(len(got) - len(want))


# ---- main -----------------------------------------------------------------------------------

def bench_vocab(name: str, vocab_dir: Path | None, docs: list[str], nbytes: int, args) -> dict:
    from istanbul.shaders.engine import default_device
    from tokenizer_svc.encoding import get_encoding
    from tokenizer_svc.gpu_backend import ROBUSTNESS
    from tokenizer_svc.vocab import load_vocabulary

    path = None
    if vocab_dir is not None and (vocab_dir / f"{name}.tiktoken").is_file():
        path = vocab_dir / f"{name}.tiktoken"
    vocab = load_vocabulary(path or name)
    path = Path(vocab.source)
    device = default_device(args.adapter, robustness=ROBUSTNESS)   # as the product's
    mb = nbytes / 1e6
    rows, notes = [], []
    tik = tiktoken_encoding(vocab)
    cores = os.cpu_count() or 1
    want = tik.encode_ordinary_batch(docs, num_threads=cores)
    flat_want = np.fromiter((t for w in want for t in w), dtype=np.uint32)

    # istanbul
    enc = get_encoding(vocab, device=device)
    ids, offsets = enc.encode_batch_flat(docs)  # warm-up: compile, allocate
    batch = [ids[offsets[i]:offsets[i + 1]] for i in range(len(docs))]
    wrong = mismatches(batch, want)
    enc_s = median_of(lambda: enc.encode_batch_flat(docs), args.repeats, args.warm)
    # decode: from encode_batch_flat's own (ids, offsets), and from per-document arrays (the
    # peers' shape of input: n Python objects to look at first)
    decoded = enc.decode_bytes_batch_flat(ids, offsets)
    dec_wrong = sum(1 for d, doc in zip(decoded, docs) if d != doc.encode())
    dec_wrong += sum(1 for d, doc in zip(enc.decode_bytes_batch(batch), docs) if d != doc.encode())
    dec_s = median_of(lambda: enc.decode_bytes_batch_flat(ids, offsets), args.repeats, args.warm)
    dec_list_s = median_of(lambda: enc.decode_bytes_batch(batch), args.repeats, args.warm)
    rows.append({"impl": "istanbul (GPU)", "exact": wrong == 0 and dec_wrong == 0,
                 "docs_differing": wrong, "decode_docs_differing": dec_wrong,
                 "encode_MBps": mb / enc_s, "decode_MBps": mb / dec_s,
                 "decode_list_MBps": mb / dec_list_s,
                 "encode_s": enc_s, "decode_s": dec_s, "decode_list_s": dec_list_s})

    # a lone 1 KB document (what one small request costs)
    lone = next((d for d in docs if 900 <= len(d.encode()) <= 1100 and d.isascii()), None) or \
        next((d[:1000] for d in docs if len(d) > 1100 and d.isascii() and
              len(set(d[:1000])) > 30), docs[0][:1024])   # small corpora: real text, not "x" * n
    for _ in range(5):
        enc.encode_ordinary(lone)
    lone_s = []
    for _ in range(args.lone_calls):
        start = time.perf_counter()
        enc.encode_ordinary(lone)
        lone_s.append(time.perf_counter() - start)
    lone_ms = {"bytes": len(lone.encode()), "p50_ms": float(np.percentile(lone_s, 50)) * 1e3,
               "p99_ms": float(np.percentile(lone_s, 99)) * 1e3}

    # single long pieces (one pre-token each): time and exactness, istanbul and tiktoken
    single = []
    rng = np.random.default_rng(7)
    letters = "".join(chr(c) for c in rng.integers(ord("a"), ord("z") + 1, args.piece_bytes))
    pieces = [(kind, size) for size in (args.piece_bytes // 100, args.piece_bytes // 10,
                                        args.piece_bytes)
              for kind in ("one letter", "CJK without spaces", "random letters")]
    for kind, size in pieces:   # 10 KB, 100 KB, 1 MB by default: the scaling
        text = {"one letter": "x" * size, "CJK without spaces": ("日本語中文漢字" * size)[:size // 3],
                "random letters": letters[:size]}[kind]
        start = time.perf_counter()
        got = enc.encode_ordinary(text)
        ist_s = time.perf_counter() - start
        start = time.perf_counter()
        ref = tik.encode_ordinary(text)
        tik_s = time.perf_counter() - start
        single.append({"piece": kind, "bytes": len(text.encode()), "exact": got == ref,
                       "istanbul_s": ist_s, "tiktoken_s": tik_s})

    # where istanbul's time goes (one profiled run: per-dispatch timestamps), then the host
    # split (bench/host_split.py) of one untimed-GPU run of each: encode, decode, lone calls
    from bench.host_split import HostSplit
    encoder, decoder = enc.backend.encoder, enc.backend.decoder

    def warm_clock() -> None:
        # the GPU's clock fell during the lone and single-piece calls (it idles at 345 MHz
        # and climbs only under load): the profiled and split runs follow --warm s of encodes
        until = time.perf_counter() + args.warm
        while time.perf_counter() < until:
            enc.encode_batch_flat(docs)

    warm_clock()
    encoder.profile = True
    start = time.perf_counter()
    enc.encode_batch_flat(docs)
    wall = time.perf_counter() - start
    encoder.profile = False
    prof = encoder.last_profile
    # the counts now: later unprofiled calls add to the same Profile object
    long_windows, long_retried = prof.long_windows, prof.long_retried
    phases = {"upload": prof.upload_s, "readback+wait": prof.readback_s,
              **{f"gpu:{k}": v for k, v in prof.gpu.items()}}
    phases["rest of wall (submits, host work, GPU wait)"] = max(
        0.0, wall - prof.upload_s - prof.readback_s)
    decoder.profile, decoder.gpu_times = True, []
    decoder.upload_s = decoder.readback_s = 0.0
    start = time.perf_counter()
    enc.decode_bytes_batch_flat(ids, offsets)
    dec_wall = time.perf_counter() - start
    decoder.profile = False
    dec_phases = {"upload (ids)": decoder.upload_s, "map + read": decoder.readback_s}
    for label, seconds in decoder.gpu_times:
        dec_phases[f"gpu:{label}"] = dec_phases.get(f"gpu:{label}", 0.0) + seconds
    dec_phases["rest of wall"] = max(0.0, dec_wall - decoder.upload_s - decoder.readback_s)
    splits = {}
    warm_clock()
    with HostSplit() as split:
        enc.encode_batch_flat(docs)
    splits["encode_batch_flat (corpus)"] = (split, 1)
    with HostSplit() as split:
        enc.decode_bytes_batch_flat(ids, offsets)
    splits["decode_bytes_batch_flat (corpus)"] = (split, 1)
    with HostSplit() as split:
        for _ in range(args.lone_calls):
            enc.encode_ordinary(lone)
    splits[f"lone {lone_ms['bytes']} B document (per call)"] = (split, args.lone_calls)
    encoder.profile = True
    enc.encode_ordinary(lone)
    encoder.profile = False
    lone_ms["gpu_s"] = dict(encoder.last_profile.gpu)
    lone_ms["pretok_chunk"] = encoder.call_chunk   # bytes per pre-tokenizer invocation

    # tiktoken
    tk_enc = median_of(lambda: tik.encode_ordinary_batch(docs, num_threads=cores), args.repeats)
    tk_dec = median_of(lambda: tik.decode_bytes_batch(want, num_threads=cores), args.repeats)
    rows.append({"impl": f"tiktoken ({cores} threads)", "exact": True,
                 "encode_MBps": mb / tk_enc, "decode_MBps": mb / tk_dec,
                 "encode_s": tk_enc, "decode_s": tk_dec})

    got = hf_encoder(vocab)
    if isinstance(got, str):
        notes.append(f"hf tokenizers: skipped ({got})")
    else:
        encode, decode = got
        wrong = mismatches(encode(docs), want)
        h_enc = median_of(lambda: encode(docs), args.repeats)
        decode(want[:10])
        h_dec = median_of(lambda: decode(want), args.repeats)
        rows.append({"impl": f"hf tokenizers ({cores} cores)", "exact": wrong == 0,
                     "docs_differing": wrong, "encode_MBps": mb / h_enc,
                     "decode_MBps": mb / h_dec, "encode_s": h_enc, "decode_s": h_dec})

    for peer in PEERS:
        got = peer_encoder(peer, vocab, path)
        if isinstance(got, str):
            notes.append(f"{peer}: skipped ({got})")
            continue
        encode, decode = got
        try:
            out = encode(docs)
            wrong = mismatches(out, want)
            p_enc = median_of(lambda: encode(docs), args.repeats)
            row = {"impl": peer, "exact": wrong == 0, "docs_differing": wrong,
                   "encode_MBps": mb / p_enc, "encode_s": p_enc}
            if decode is not None:
                p_dec = median_of(lambda: decode(want), args.repeats)
                row.update(decode_MBps=mb / p_dec, decode_s=p_dec)
            rows.append(row)
        except Exception as exc:
            notes.append(f"{peer}: failed ({type(exc).__name__}: {str(exc)[:160]})")
    exact_peers = [r for r in rows[1:] if r["exact"]]
    fastest = max(exact_peers, key=lambda r: r["encode_MBps"])
    return {"vocab": name, "tokens": int(flat_want.size), "rows": rows, "notes": notes,
            "istanbul_phases_s": phases, "istanbul_profiled_wall_s": wall,
            "istanbul_decode_phases_s": dec_phases, "istanbul_decode_profiled_wall_s": dec_wall,
            "istanbul_host_split": {k: dict(sp.as_dict(), calls=n)
                                    for k, (sp, n) in splits.items()},
            "istanbul_host_split_md": {k: sp.table(n) for k, (sp, n) in splits.items()},
            "istanbul_lone_1kb": lone_ms, "single_long_pieces": single,
            "istanbul_long_windows": long_windows,
            "istanbul_long_retried": long_retried,
            "fastest_exact_peer": fastest["impl"],
            "speedup_vs_fastest_exact_peer": rows[0]["encode_MBps"] / fastest["encode_MBps"],
            "target_speedup": 2.0}


def markdown(result: dict) -> str:
    lines = [f"# Tokenizer benchmark — {result['device']}", "",
             f"Corpus: {result['corpus']['bytes'] / 1e6:.1f} MB in "
             f"{result['corpus']['documents']} documents "
             f"({', '.join(f'{k} {v / 1e6:.1f} MB' for k, v in result['corpus']['bytes_by_source'].items())}); "
             f"{result['cpu_cores']} CPU cores.", ""]
    for v in result["vocabs"]:
        lines += [f"## {v['vocab']} ({v['tokens']:,} tokens)", "",
                  "| implementation | exact ids (documents differing) | encode MB/s | "
                  "decode MB/s |", "|---|---|---|---|"]
        for r in v["rows"]:
            dec = f"{r['decode_MBps']:.0f}" if "decode_MBps" in r else "—"
            exact = "yes" if r["exact"] else f"NO ({r.get('docs_differing', '?')})"
            lines.append(f"| {r['impl']} | {exact} | {r['encode_MBps']:.0f} | {dec} |")
        lone = v["istanbul_lone_1kb"]
        own = v["rows"][0]
        if "decode_list_MBps" in own:
            lines += ["", f"istanbul decode: {own['decode_MBps']:.0f} MB/s from "
                          "encode_batch_flat's (ids, offsets) (`decode_bytes_batch_flat`), "
                          f"{own['decode_list_MBps']:.0f} MB/s from a list of per-document "
                          "arrays (`decode_bytes_batch`)."]
        lines += ["", f"istanbul vs fastest exact peer ({v['fastest_exact_peer']}): "
                      f"{v['speedup_vs_fastest_exact_peer']:.2f}x (target 2x)", "",
                  f"Lone {lone['bytes']} B document: p50 {lone['p50_ms']:.2f} ms, "
                  f"p99 {lone['p99_ms']:.2f} ms (target <= 1 ms). Long pieces: "
                  f"{v['istanbul_long_windows']} windows, {v['istanbul_long_retried']} pieces "
                  "merged again.", "",
                  "| single piece | bytes | exact | istanbul s | tiktoken s |",
                  "|---|---:|---|---:|---:|"] + [
                  f"| {p['piece']} | {p['bytes']:,} | {'yes' if p['exact'] else 'NO'} | "
                  f"{p['istanbul_s']:.3f} | {p['tiktoken_s']:.3f} |"
                  for p in v["single_long_pieces"]] + ["",
                  "istanbul encode, one profiled run (GPU timestamps per phase; the profiled run "
                  "waits for every submit, so its wall time is above the timed runs'):", "",
                  "| phase | ms |", "|---|---|"]
        for k, s in v["istanbul_phases_s"].items():
            lines.append(f"| {k} | {s * 1e3:.1f} |")
        lines += ["", "istanbul decode, one profiled run "
                      f"({v['istanbul_decode_profiled_wall_s'] * 1e3:.1f} ms wall):", "",
                  "| phase | ms |", "|---|---|"]
        for k, s in v["istanbul_decode_phases_s"].items():
            lines.append(f"| {k} | {s * 1e3:.1f} |")
        gpu = v["istanbul_lone_1kb"].get("gpu_s", {})
        if gpu:
            lines += ["", "Lone document, GPU timestamps of one profiled call: " + ", ".join(
                f"{k} {s * 1e3:.3f} ms" for k, s in gpu.items())]
        for k, table in v.get("istanbul_host_split_md", {}).items():
            lines += ["", f"Host split, {k} (bench/host_split.py; inclusive steps; own CPU is "
                          "the calling thread's; wall - own CPU is waiting):", "", table]
        lines += [""] + [f"- {n}" for n in v["notes"]] + [""]
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, help="directory for tokenize.json / tokenize.md")
    parser.add_argument("--mb", type=float, default=64.0, help="corpus size in MB (default 64)")
    parser.add_argument("--vocab", default="gpt2,cl100k_base,o200k_base")
    parser.add_argument("--vocab-dir", default=os.environ.get("ISTANBUL_VOCAB_DIR") or
                        str(REPO.parent / "shared" / "vocab"))
    parser.add_argument("--repeats", type=int, default=3,
                        help="timed passes per implementation, after a warm-up (median)")
    parser.add_argument("--warm", type=float, default=2.0,
                        help="seconds of istanbul calls before each of its timings, so the GPU "
                             "reaches its full clock (default 2)")
    parser.add_argument("--generated-share", type=float, default=0.2,
                        help="share of the corpus generated (multilingual, adversarial)")
    parser.add_argument("--lone-calls", type=int, default=200,
                        help="calls timed for the lone 1 KB document")
    parser.add_argument("--piece-bytes", type=int, default=1_000_000,
                        help="largest single long piece timed, also 1/10 and 1/100 of it "
                             "(default 1 MB)")
    parser.add_argument("--adapter", default=None)
    args = parser.parse_args(argv)
    os.environ.setdefault("XDG_RUNTIME_DIR", "/tmp")

    from istanbul.shaders.engine import default_device
    from tokenizer_svc.gpu_backend import ROBUSTNESS
    device = default_device(args.adapter, robustness=ROBUSTNESS)   # as the product's
    docs, corpus = build_corpus(args.mb, args.generated_share)
    print(f"corpus: {corpus['bytes'] / 1e6:.1f} MB, {corpus['documents']} documents; "
          f"device: {device.name}", flush=True)
    vocab_dir = Path(args.vocab_dir) if args.vocab_dir else None
    result = {"device": device.name, "backend": device.backend.name,
              "cpu_cores": os.cpu_count(), "python": platform.python_version(),
              "corpus": corpus, "vocabs": []}
    for name in args.vocab.split(","):
        res = bench_vocab(name.strip(), vocab_dir, docs, corpus["bytes"], args)
        result["vocabs"].append(res)
        for r in res["rows"]:
            print(f"{name:<12} {r['impl']:<24} exact={r['exact']!s:<5} "
                  f"encode {r['encode_MBps']:8.1f} MB/s  "
                  f"decode {r.get('decode_MBps', float('nan')):8.1f} MB/s", flush=True)
        for n in res["notes"]:
            print(f"{name:<12} {n}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "tokenize.json").write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    (out / "tokenize.md").write_text(markdown(result), encoding="utf-8")
    print(f"wrote {out / 'tokenize.json'} and {out / 'tokenize.md'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
