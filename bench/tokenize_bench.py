#!/usr/bin/env python
"""Encode throughput by kind of text: istanbul on the GPU (str and bytes input) vs the exact CPU
tokenizers on the same machine, interleaved, medians with their spread.

    python bench/tokenize_bench.py [--out DIR] [--mb 64] [--vocab gpt2,cl100k_base,o200k_base]
        [--vocab-dir DIR] [--mix prose=0.25,multilingual=0.25,code=0.25,adversarial=0.25]
        [--passes 5] [--peers gigatoken,hf] [--warm 1] [--no-extras] [--adapter A]

Corpus (bench/tokenize_corpus.py; no network, deterministic): four labelled categories of
--mb * share each: prose (licences, /usr/share/doc, info manuals, Python's and packages'
documentation), multilingual (23 languages in 14 scripts generated from embedded word lists,
plus the stdlib's CJK files and shared/seeds), code (stdlib and package .py, /usr/include .h)
and adversarial (random code points, emoji, whitespace runs, digits, "=" runs, random
letters, single pieces of 64-256 KB). Its composition (MB per category and per source, and
any shortfall) is written into the report.

For each vocabulary, each category and the whole corpus ("all": every document, categories
shuffled together, one batch) the implementations run as one batch call each:
  istanbul str    Encoding.encode_batch_flat(list of str) -> (ids, offsets)
  istanbul bytes  Encoding.encode_batch_flat(list of bytes): the same documents, UTF-8
  gigatoken       Tokenizer.from_tiktoken(...).encode_batch(docs, parallel=True) on str and
                  on bytes (an awkward array: flat ids + offsets, like istanbul's result)
  tiktoken        encode_ordinary_batch(docs, num_threads=cores): the reference (no bytes
                  batch API)
  hf              tokenizers (trainer_svc.training.export_hf.tokenizer_json), encode_batch, all cores,
                  ids as lists (no bytes API)
A warm-up pass first (tiktoken's ids there are the reference; every other implementation and
input kind is compared with them per document and the count that differ is reported and
flagged in the table), then --passes timed passes in which the implementations take turns in
a rotating order (istanbul's two inputs, gigatoken's two, are adjacent, their order swapped
every pass). Before istanbul's turn the GPU gets --warm s of the same call (a GPU idles at a
low clock and reaches its full one after ~0.5-1 s of work; `istanbul serve --gpu-keep-clock`
holds it there; skipped on software adapters). Every timed call gets `str` documents no
library has seen (decoded from the bytes just before it, outside the timing): CPython caches a
str's UTF-8 once a C extension asks for it, so without this the implementations timed after the
reference would read `str` input for free, and `str` would look faster than `bytes`.
Reported: the median MB/s per implementation
and its min-max over the passes; the ratios istanbul / gigatoken for str and for bytes.

Extras (--no-extras leaves them out), on the whole corpus: decode (istanbul from
encode_batch_flat's (ids, offsets) and from a list of arrays, tiktoken decode_bytes_batch;
interleaved, verified), a lone ~1 KB document (p50/p99 of --lone-calls calls), single pieces
of up to --piece-bytes (istanbul and tiktoken, exact?), one profiled encode per input kind
(upload, GPU kernels by phase, readback) and the host split (bench/host_split.py) of one
encode per input kind, one decode and the lone calls.

Writes DIR/tokenize.json and DIR/tokenize.md (default DIR: bench/results/<machine>/, the
machine named from the adapter as bench/acceptance.py does). A vocabulary run again on the
same corpus replaces its own rows and keeps the others', so --vocab one at a time composes.
Runs on either WebGPU implementation: ISTANBUL_BACKEND=wgpu or dawn.
"""

from __future__ import annotations

import argparse
import gc
import importlib.metadata
import json
import os
import platform
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench import tokenize_corpus  # noqa: E402
from bench.tokenize_corpus import CATEGORIES, Corpus, parse_mix  # noqa: E402

PEERS = ("gigatoken", "hf")
COLUMNS = ("istanbul str", "istanbul bytes", "gigatoken str", "gigatoken bytes",
           "tiktoken str", "hf str")


# ---- implementations ------------------------------------------------------------------------

@dataclass
class Batch:
    name: str
    docs: list[str]
    raw: list[bytes]           # the same documents as UTF-8
    nbytes: int

    def refresh(self) -> None:
        """New `str` objects for the documents, decoded from `raw`: CPython keeps a str's UTF-8
        once any C extension has asked for it (tiktoken, gigatoken and PyO3 libraries do), so a
        str seen before is encoded for free; a user's documents arrive without that cache."""
        self.docs = [r.decode("utf-8") for r in self.raw]


@dataclass
class Impl:
    label: str                                   # "<implementation> <str|bytes>"
    run: Callable[[Batch], object]
    flat: Callable[[object], tuple]              # its result -> (ids, offsets) numpy


@dataclass
class Group:
    """Implementations timed back to back (one tool's input kinds); `before` runs first."""
    impls: list[Impl]
    before: Callable[[Batch], None] | None = None


def _lists_flat(lists) -> tuple[np.ndarray, np.ndarray]:
    offsets = np.zeros(len(lists) + 1, dtype=np.int64)
    np.cumsum(np.fromiter(map(len, lists), dtype=np.int64, count=len(lists)), out=offsets[1:])
    ids = np.fromiter((t for ids in lists for t in ids), dtype=np.int64, count=int(offsets[-1]))
    return ids, offsets


def _awkward_flat(array) -> tuple[np.ndarray, np.ndarray]:
    """gigatoken's awkward array -> (ids, offsets), from its layout (no copy) when it is the
    usual ListOffsetArray."""
    import awkward as ak
    layout = array.layout
    if hasattr(layout, "offsets") and hasattr(layout.content, "data"):
        offsets = np.asarray(layout.offsets.data, dtype=np.int64)
        return np.asarray(layout.content.data)[offsets[0]:offsets[-1]], offsets - offsets[0]
    counts = ak.to_numpy(ak.num(array))
    return ak.to_numpy(ak.flatten(array)), np.concatenate([[0], np.cumsum(counts)])


def tiktoken_encoding(vocab):
    import tiktoken
    return tiktoken.Encoding(vocab.name, pat_str=vocab.pattern, mergeable_ranks=vocab.ranks,
                             special_tokens=vocab.special_tokens)


def gigatoken_group(vocab, path: Path) -> Group | str:
    """gigatoken on str and on bytes, or why not."""
    try:
        import gigatoken as gt
        # gpt2.tiktoken is r50k_base's rank file under another name: say which split rule.
        # No special tokens: with them gigatoken matches "<|endoftext|>" in the text, and the
        # ids compared are tiktoken's encode_ordinary ones.
        scheme = {"gpt2": "gpt2", "r50k_base": "gpt2", "cl100k_base": "cl100k",
                  "o200k_base": "o200k"}.get(vocab.name)
        if scheme is None:
            return f"no gigatoken pre-tokenizer known for {vocab.name}"
        tok = gt.Tokenizer.from_tiktoken(str(path), pretokenizer=scheme)
    except Exception as exc:   # absent, or cannot load this vocabulary
        return f"{type(exc).__name__}: {str(exc).splitlines()[0][:160] if str(exc) else ''}"
    return Group([Impl("gigatoken str", lambda b: tok.encode_batch(b.docs, parallel=True),
                       _awkward_flat),
                  Impl("gigatoken bytes", lambda b: tok.encode_batch(b.raw, parallel=True),
                       _awkward_flat)])


def hf_group(vocab) -> Group | str:
    try:
        from trainer_svc.training.export_hf import tokenizer_json
        tok = tokenizer_json(vocab)
    except Exception as exc:
        return f"{type(exc).__name__}: {str(exc).splitlines()[0][:160] if str(exc) else ''}"
    return Group([Impl("hf str", lambda b: [e.ids for e in tok.encode_batch(
        b.docs, add_special_tokens=False)], _lists_flat)])


def differing(got: tuple, want: tuple) -> int:
    """Documents whose ids differ (one vectorised comparison first: all equal is the rule)."""
    ids, offsets = (np.asarray(a, dtype=np.int64) for a in got)
    ref_ids, ref_offsets = want
    if offsets.shape == ref_offsets.shape and np.array_equal(offsets, ref_offsets) and \
            np.array_equal(ids, ref_ids):
        return 0
    n = min(len(offsets), len(ref_offsets)) - 1
    bad = abs(len(offsets) - len(ref_offsets))
    for i in range(n):
        if not np.array_equal(ids[offsets[i]:offsets[i + 1]],
                              ref_ids[ref_offsets[i]:ref_offsets[i + 1]]):
            bad += 1
    return bad


# ---- interleaved timing ---------------------------------------------------------------------

def interleaved(groups: list[Group], batch: Batch, passes: int, reference: Impl) -> dict:
    """{label: {"seconds": [...], "docs_differing": n}}: a warm-up pass (the reference first:
    its result is what the others are compared with), then `passes` passes, the groups in a
    rotating order and each group's own order swapped every pass."""
    cells: dict = {}
    gc.collect()
    want = reference.flat(reference.run(batch))
    want = tuple(np.asarray(a, dtype=np.int64) for a in want)
    for group in groups:
        for impl in group.impls:
            if group.before is not None and impl is group.impls[0]:
                group.before(batch)
            got = impl.run(batch) if impl is not reference else None
            cells[impl.label] = {"seconds": [], "docs_differing":
                                 0 if impl is reference else differing(impl.flat(got), want)}
            del got
    tokens = int(want[0].size)
    del want
    for p in range(passes):
        k = p % len(groups)
        for group in groups[k:] + groups[:k]:
            if group.before is not None:
                group.before(batch)
            for impl in (group.impls if p % 2 == 0 else group.impls[::-1]):
                batch.refresh()
                gc.collect()
                start = time.perf_counter()
                out = impl.run(batch)
                cells[impl.label]["seconds"].append(time.perf_counter() - start)
                del out
    mb = batch.nbytes / 1e6
    for cell in cells.values():
        rates = [mb / s for s in cell["seconds"]] or [float("nan")]
        cell.update(MBps=float(np.median(rates)), MBps_min=float(min(rates)),
                    MBps_max=float(max(rates)))
    return {"documents": len(batch.docs), "bytes": batch.nbytes, "tokens": tokens,
            "impls": cells}


def clock_warmer(fn: Callable[[Batch], object], seconds: float) -> Callable[[Batch], None]:
    """Calls of fn for `seconds` (at least one when seconds > 0): the GPU at its full clock."""
    def warm(batch: Batch) -> None:
        if seconds <= 0:
            return
        end = time.perf_counter() + seconds
        while True:
            fn(batch)
            if time.perf_counter() >= end:
                return
    return warm


# ---- extras: decode, lone call, long pieces, phases, host split -----------------------------

def extras(enc, tik, batch: Batch, args, warm: Callable[[Batch], None]) -> dict:
    from bench.host_split import STEPS, HostSplit
    cores = os.cpu_count() or 1
    out: dict = {"notes": []}
    ids, offsets = enc.encode_batch_flat(batch.docs)
    arrays = [ids[offsets[i]:offsets[i + 1]] for i in range(len(batch.docs))]
    lists = [a.tolist() for a in arrays]
    want = batch.raw
    impls = {"istanbul decode_bytes_batch_flat": lambda: enc.decode_bytes_batch_flat(ids, offsets),
             "istanbul decode_bytes_batch (list of arrays)": lambda: enc.decode_bytes_batch(arrays),
             "tiktoken decode_bytes_batch": lambda: tik.decode_bytes_batch(
                 lists, num_threads=cores)}
    dec = {k: {"seconds": [], "docs_differing": sum(1 for d, w in zip(fn(), want) if d != w)}
           for k, fn in impls.items()}
    names = list(impls)
    for p in range(args.passes):
        for k in names[p % len(names):] + names[:p % len(names)]:
            if k.startswith("istanbul"):
                warm(batch)
            gc.collect()
            start = time.perf_counter()
            impls[k]()
            dec[k]["seconds"].append(time.perf_counter() - start)
    for cell in dec.values():
        rates = [batch.nbytes / 1e6 / s for s in cell["seconds"]] or [float("nan")]
        cell.update(MBps=float(np.median(rates)), MBps_min=float(min(rates)),
                    MBps_max=float(max(rates)))
    out["decode"] = dec

    # a lone ~1 KB document (what one small request costs)
    lone = next((d for d in batch.docs if 900 <= len(d.encode()) <= 1100 and d.isascii()),
                None) or next((d[:1000] for d in batch.docs if len(d) > 1100 and d.isascii()
                               and len(set(d[:1000])) > 30), batch.docs[0][:1024])
    for _ in range(5):
        enc.encode_ordinary(lone)
    times = []
    for _ in range(args.lone_calls):
        start = time.perf_counter()
        enc.encode_ordinary(lone)
        times.append(time.perf_counter() - start)
    out["lone"] = {"bytes": len(lone.encode()), "exact": enc.encode_ordinary(lone) ==
                   tik.encode_ordinary(lone), "p50_ms": float(np.percentile(times, 50)) * 1e3,
                   "p99_ms": float(np.percentile(times, 99)) * 1e3}

    # single long pieces (one pre-token each): time and exactness, istanbul and tiktoken
    rng = np.random.default_rng(7)
    letters = "".join(chr(c) for c in rng.integers(ord("a"), ord("z") + 1, args.piece_bytes))
    out["long_pieces"] = []
    for size in (args.piece_bytes // 100, args.piece_bytes // 10, args.piece_bytes):
        for kind in ("one letter", "CJK without spaces", "random letters"):
            text = {"one letter": "x" * size, "random letters": letters[:size],
                    "CJK without spaces": ("日本語中文漢字" * size)[:size // 3]}[kind]
            start = time.perf_counter()
            got = enc.encode_ordinary(text)
            ist_s = time.perf_counter() - start
            start = time.perf_counter()
            ref = tik.encode_ordinary(text)
            tik_s = time.perf_counter() - start
            out["long_pieces"].append({"piece": kind, "bytes": len(text.encode()),
                                       "exact": got == ref, "istanbul_s": ist_s,
                                       "tiktoken_s": tik_s})

    # where istanbul's time goes: one profiled call per input kind (GPU timestamps per
    # dispatch; a profiled call waits for each submit), after --warm s of calls
    encoder, decoder = enc.backend.encoder, enc.backend.decoder
    out["phases_ms"] = {}
    for kind in ("str", "bytes"):
        warm(batch)
        batch.refresh()
        docs = batch.docs if kind == "str" else batch.raw
        encoder.profile = True
        start = time.perf_counter()
        enc.encode_batch_flat(docs)
        wall = time.perf_counter() - start
        encoder.profile = False
        prof = encoder.last_profile
        phases = {"upload": prof.upload_s, "readback+wait": prof.readback_s,
                  **{f"gpu:{k}": v for k, v in prof.gpu.items()},
                  "rest of wall (host work, submits, GPU wait)":
                      max(0.0, wall - prof.upload_s - prof.readback_s), "wall": wall}
        out["phases_ms"][kind] = {k: v * 1e3 for k, v in phases.items()}
        out[f"long_windows_{kind}"] = prof.long_windows
    decoder.profile, decoder.gpu_times = True, []
    decoder.upload_s = decoder.readback_s = 0.0
    start = time.perf_counter()
    enc.decode_bytes_batch_flat(ids, offsets)
    wall = time.perf_counter() - start
    decoder.profile = False
    phases = {"upload (ids)": decoder.upload_s, "map + read": decoder.readback_s}
    for label, seconds in decoder.gpu_times:
        phases[f"gpu:{label}"] = phases.get(f"gpu:{label}", 0.0) + seconds
    phases["rest of wall"] = max(0.0, wall - decoder.upload_s - decoder.readback_s)
    phases["wall"] = wall
    out["phases_ms"]["decode"] = {k: v * 1e3 for k, v in phases.items()}

    # the host split (bench/host_split.py), with the bytes input's own preparation step
    steps = STEPS + [("tokenizer_svc.encoding", None, "_pack_valid_utf8",
                      "prep: join bytes + check UTF-8 (bytes input)")]
    splits = {}
    try:
        for name, call, n in (
                ("encode_batch_flat, str", lambda: enc.encode_batch_flat(batch.docs), 1),
                ("encode_batch_flat, bytes", lambda: enc.encode_batch_flat(batch.raw), 1),
                ("decode_bytes_batch_flat", lambda: enc.decode_bytes_batch_flat(ids, offsets), 1),
                (f"lone {out['lone']['bytes']} B document (per call)",
                 lambda: [enc.encode_ordinary(lone) for _ in range(args.lone_calls)],
                 args.lone_calls)):
            warm(batch)
            batch.refresh()   # str documents no library has seen (Batch.refresh)
            with HostSplit(steps) as split:
                call()
            splits[name] = {"table": split.table(n), **split.as_dict(), "calls": n}
    except (AttributeError, ImportError) as exc:   # a step renamed in the product
        out["notes"].append(f"host split skipped: {type(exc).__name__}: {exc}")
    out["host_split"] = splits
    return out


# ---- one vocabulary -------------------------------------------------------------------------

def bench_vocab(name: str, corpus: Corpus, device, args) -> dict:
    from tokenizer_svc.encoding import get_encoding
    from tokenizer_svc.vocab import load_vocabulary

    path = Path(args.vocab_dir) / f"{name}.tiktoken" if args.vocab_dir else None
    vocab = load_vocabulary(path if path is not None and path.is_file() else name)
    path = Path(vocab.source)
    cores = os.cpu_count() or 1
    notes: list[str] = []
    tik = tiktoken_encoding(vocab)
    reference = Impl("tiktoken str",
                     lambda b: tik.encode_ordinary_batch(b.docs, num_threads=cores), _lists_flat)
    enc = get_encoding(vocab, device=device)
    ist = [Impl("istanbul str", lambda b: enc.encode_batch_flat(b.docs), lambda r: r),
           Impl("istanbul bytes", lambda b: enc.encode_batch_flat(b.raw), lambda r: r)]
    warm = clock_warmer(ist[0].run, args.warm)
    groups = [Group([reference]), Group(ist, warm)]
    for peer in args.peers:
        group = gigatoken_group(vocab, path) if peer == "gigatoken" else hf_group(vocab)
        if isinstance(group, str):
            notes.append(f"{peer}: skipped ({group})")
        else:
            groups.append(group)
    cells = {}
    for cat in corpus.names():
        docs = corpus.docs_of(cat)
        raw = [d.encode("utf-8") for d in docs]
        batch = Batch(cat, docs, raw, sum(map(len, raw)))
        started = time.perf_counter()
        cells[cat] = interleaved(groups, batch, args.passes, reference)
        line = "  ".join(f"{k} {v['MBps']:.4g}" + ("" if v["docs_differing"] == 0 else
                                                   f" (DIFFER {v['docs_differing']})")
                         for k, v in cells[cat]["impls"].items())
        print(f"{name:<12} {cat:<13} {batch.nbytes / 1e6:6.1f} MB  MB/s: {line}  "
              f"[{time.perf_counter() - started:.0f} s]", flush=True)
    result = {"vocab": name, "cells": cells, "notes": notes,
              "run": {k: args.meta[k] for k in ("device", "date", "commit")}}
    if args.extras:
        started = time.perf_counter()
        result["extras"] = extras(enc, tik, batch, args, warm)   # the last batch: "all"
        print(f"{name:<12} extras [{time.perf_counter() - started:.0f} s]", flush=True)
    return result


# ---- for the dev/ probes, which import these ---------------------------------------------

def build_corpus(megabytes: float, generated_share: float | None = None) -> tuple[list, dict]:
    """(the whole corpus's documents, its composition): the four categories at a quarter each
    (`generated_share`, the old corpus's knob, is ignored)."""
    corpus = tokenize_corpus.build_corpus(megabytes)
    return corpus.docs_of("all"), corpus.composition


def median_of(fn, repeats: int, warm_s: float = 0.0) -> float:
    """Median wall seconds of `repeats` calls of fn, after calls for at least warm_s seconds."""
    end = time.perf_counter() + warm_s
    while time.perf_counter() < end:
        fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return float(np.median(times))


# ---- report ---------------------------------------------------------------------------------

def _num(x: float) -> str:
    return "—" if x != x else f"{x:.0f}" if x >= 100 else f"{x:.3g}"


def _cell(c: dict | None) -> str:
    if c is None:
        return "—"
    text = f"{_num(c['MBps'])} ({_num(c['MBps_min'])}-{_num(c['MBps_max'])})"
    return text if c["docs_differing"] == 0 else f"{text} **{c['docs_differing']} docs differ**"


def _ratio(cells: dict, kind: str) -> float | None:
    a, b = cells.get(f"istanbul {kind}"), cells.get(f"gigatoken {kind}")
    return a["MBps"] / b["MBps"] if a and b else None


def markdown(result: dict) -> str:
    meta, comp = result["meta"], result["corpus"]
    versions = ", ".join(f"{k} {v}" for k, v in meta["versions"].items())
    lines = [f"# Tokenizer benchmark — {meta['machine']}", "",
             f"{meta['device']} ({meta['backend']}); {meta['cpu']}, {meta['cores']} cores; "
             f"Python {meta['python']}; {versions}; {meta['date']}, commit {meta['commit']}.", "",
             f"`{meta['command']}`", "",
             f"Corpus: {comp['bytes'] / 1e6:.1f} MB in {comp['documents']:,} documents "
             f"(sha256 {comp['sha256'][:12]}):", "",
             "| category | MB | documents | files | sources (MB) |", "|---|---:|---:|---:|---|"]
    for cat, c in comp["categories"].items():
        src = "; ".join(f"{k} {v['bytes'] / 1e6:.2f}" for k, v in c["sources"].items())
        lines.append(f"| {cat} | {c['bytes'] / 1e6:.1f} | {c['documents']:,} | {c['files']:,} "
                     f"| {src} |")
    lines += [f"- {cat}: {n}" for cat, c in comp["categories"].items() for n in c["notes"]]
    lines += ["", f"Encode MB/s: the median of {meta['passes']} interleaved passes after a "
              "warm-up pass, (min-max) over the passes; a batch call per category, and one "
              "of the whole corpus (\"all\"). Ids compared with tiktoken's per document for "
              "every implementation and input kind; a cell that differs says how many "
              f"documents. istanbul: --warm {meta['warm_s']} s of calls before its turn. "
              "Each timed call gets `str` objects no library has seen (CPython keeps a str's "
              "UTF-8 once a C extension asks for it: a str read before is encoded for free).",
              "",
              "| vocab | category | " + " | ".join(COLUMNS) +
              " | istanbul/gigatoken str | istanbul/gigatoken bytes |",
              "|---|---|" + "---:|" * (len(COLUMNS) + 2)]
    bad = []
    for v in result["vocabs"].values():
        for cat, cell in v["cells"].items():
            impls = cell["impls"]
            ratios = [_ratio(impls, k) for k in ("str", "bytes")]
            lines.append(f"| {v['vocab']} | {cat} | " +
                         " | ".join(_cell(impls.get(c)) for c in COLUMNS) + " | " +
                         " | ".join("—" if r is None else f"{r:.2f}x" for r in ratios) + " |")
            bad += [f"{v['vocab']} {cat} {k}: {c['docs_differing']} of {cell['documents']}"
                    for k, c in impls.items() if c["docs_differing"]]
    lines += ["", "Every document of every implementation and input kind has tiktoken's ids."
              if not bad else "**Documents whose ids differ from tiktoken's:** " + "; ".join(bad)]
    for v in result["vocabs"].values():
        lines += [f"- {v['vocab']}: {n}" for n in v["notes"]]
        run = v.get("run", {})
        if run and any(run.get(k) != meta[k] for k in run):
            lines.append(f"- {v['vocab']}: from an earlier run on the same corpus "
                         f"({run['device']}, {run['date']}, commit {run['commit']})")
    for v in result["vocabs"].values():
        x = v.get("extras")
        if not x:
            continue
        lines += ["", f"## {v['vocab']}: decode, lone call, long pieces, phases (whole corpus)",
                  "", "| decode | MB/s (min-max) | documents differing |", "|---|---:|---:|"]
        for k, c in x["decode"].items():
            lines.append(f"| {k} | {_num(c['MBps'])} ({_num(c['MBps_min'])}-"
                         f"{_num(c['MBps_max'])}) | {c['docs_differing']} |")
        lone = x["lone"]
        lines += ["", f"Lone {lone['bytes']} B document: p50 {lone['p50_ms']:.2f} ms, p99 "
                      f"{lone['p99_ms']:.2f} ms, exact: {'yes' if lone['exact'] else 'NO'}.", "",
                  "| single piece | bytes | exact | istanbul s | tiktoken s |",
                  "|---|---:|---|---:|---:|"]
        lines += [f"| {p['piece']} | {p['bytes']:,} | {'yes' if p['exact'] else '**NO**'} | "
                  f"{p['istanbul_s']:.3f} | {p['tiktoken_s']:.3f} |" for p in x["long_pieces"]]
        phases = x["phases_ms"]
        names = list(dict.fromkeys(list(phases["str"]) + list(phases["bytes"])))
        lines += ["", "One profiled call each (GPU timestamps; a profiled call waits for every "
                      "submit, so its wall is above the timed calls'), ms:", "",
                  "| encode phase | str | bytes |", "|---|---:|---:|"]
        lines += [f"| {n} | " + " | ".join(f"{phases[k][n]:.1f}" if n in phases[k] else ""
                                           for k in ("str", "bytes")) + " |" for n in names]
        lines += ["", "| decode phase | ms |", "|---|---:|"]
        lines += [f"| {n} | {ms:.1f} |" for n, ms in phases["decode"].items()]
        for k, s in x["host_split"].items():
            lines += ["", f"Host split, {k} (bench/host_split.py; inclusive steps; own CPU is "
                          "the calling thread's; wall - own CPU is waiting):", "", s["table"]]
        lines += [f"- {n}" for n in x["notes"]]
    return "\n".join(lines) + "\n"


def _versions() -> dict:
    out = {}
    for pkg in ("gigatoken", "tiktoken", "tokenizers", "wgpu", "wgpudawn", "numpy"):
        try:
            out[pkg] = importlib.metadata.version(pkg)
        except importlib.metadata.PackageNotFoundError:
            pass
    return out


def _cpu() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--commit", default=None,
                        help="the tree's commit for the report, where the copy has no .git (the "
                             "GPU machine); default: git rev-parse HEAD")
    parser.add_argument("--out", default=None,
                        help="directory for tokenize.json / .md (default bench/results/<machine>)")
    parser.add_argument("--mb", type=float, default=64.0,
                        help="corpus size in MiB (default 64; reported in MB of 10^6 bytes)")
    parser.add_argument("--mix", default=",".join(f"{c}=0.25" for c in CATEGORIES),
                        help="category shares (default a quarter each)")
    parser.add_argument("--seed", type=int, default=2026, help="the corpus's seed")
    parser.add_argument("--vocab", default="gpt2,cl100k_base,o200k_base")
    parser.add_argument("--vocab-dir", default=os.environ.get("ISTANBUL_VOCAB_DIR") or
                        str(REPO.parent / "shared" / "vocab"))
    parser.add_argument("--passes", type=int, default=5,
                        help="timed passes after the warm-up pass (median, min-max)")
    parser.add_argument("--peers", default=",".join(PEERS),
                        help="peers besides tiktoken (always run: it is the reference): "
                             f"some of {','.join(PEERS)}, or 'none'")
    parser.add_argument("--warm", type=float, default=1.0,
                        help="seconds of istanbul calls before each of its turns, so the GPU "
                             "is at its full clock (default 1; 0 on software adapters)")
    parser.add_argument("--no-extras", dest="extras", action="store_false",
                        help="leave out decode, the lone call, long pieces, phases, host split")
    parser.add_argument("--lone-calls", type=int, default=200,
                        help="calls timed for the lone 1 KB document")
    parser.add_argument("--piece-bytes", type=int, default=1_000_000,
                        help="largest single long piece timed, also 1/10 and 1/100 of it")
    parser.add_argument("--adapter", default=None)
    args = parser.parse_args(argv)
    args.peers = [] if args.peers == "none" else [p for p in args.peers.split(",") if p]
    unknown = [p for p in args.peers if p not in PEERS]
    if unknown:
        parser.error(f"--peers: unknown {unknown}; the peers are {', '.join(PEERS)} "
                     "(tiktoken always runs)")
    try:
        mix = parse_mix(args.mix)
    except ValueError as exc:
        parser.error(str(exc))
    os.environ.setdefault("XDG_RUNTIME_DIR", "/tmp")

    from bench.results_dir import machine_name
    from istanbul.shaders.engine import default_device
    from tokenizer_svc.gpu_backend import ROBUSTNESS
    device = default_device(args.adapter, robustness=ROBUSTNESS)   # as the product's
    if device.info.is_software:
        args.warm = 0.0     # no clock to raise
    machine = machine_name(device.name)
    started = time.perf_counter()
    corpus = tokenize_corpus.build_corpus(args.mb, mix, args.seed)
    comp = corpus.composition
    print(f"corpus: {comp['bytes'] / 1e6:.1f} MB, {comp['documents']} documents ("
          + ", ".join(f"{k} {c['bytes'] / 1e6:.1f} MB" for k, c in comp["categories"].items())
          + f") in {time.perf_counter() - started:.0f} s; device: {device.name}", flush=True)
    for cat, c in comp["categories"].items():
        for n in c["notes"]:
            print(f"corpus: {cat}: {n}", flush=True)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO,
                            capture_output=True, text=True).stdout.strip() or "?"
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO,
                           capture_output=True, text=True).stdout.strip()
    meta = {"machine": machine, "device": device.name, "backend": device.backend.name,
            "software": bool(device.info.is_software), "cpu": _cpu(), "cores": os.cpu_count(),
            "python": platform.python_version(), "versions": _versions(),
            "date": time.strftime("%Y-%m-%d"),
            "commit": args.commit or commit + (" (+ local changes)" if dirty else ""),
            "passes": args.passes, "warm_s": args.warm, "mix": mix,
            "command": "python bench/tokenize_bench.py " + " ".join(
                sys.argv[1:] if argv is None else argv)}
    args.meta = meta
    out = Path(args.out) if args.out else REPO / "bench" / "results" / machine
    old = {}
    if (out / "tokenize.json").is_file():
        try:
            before = json.loads((out / "tokenize.json").read_text())
            if before.get("corpus", {}).get("sha256") == comp["sha256"]:
                old = before.get("vocabs", {})   # same corpus: other vocabularies' rows stay
        except (ValueError, OSError):
            pass
    vocabs = {}
    for name in filter(None, (v.strip() for v in args.vocab.split(","))):
        vocabs[name] = bench_vocab(name, corpus, device, args)
    result = {"meta": meta, "corpus": comp,
              "vocabs": {**{k: v for k, v in old.items() if k not in vocabs}, **vocabs}}
    out.mkdir(parents=True, exist_ok=True)
    (out / "tokenize.json").write_text(json.dumps(result, indent=1, ensure_ascii=False) + "\n",
                                       encoding="utf-8")
    (out / "tokenize.md").write_text(markdown(result), encoding="utf-8")
    print(f"wrote {out / 'tokenize.json'} and {out / 'tokenize.md'} "
          f"({time.perf_counter() - started:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
