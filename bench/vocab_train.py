"""BPE vocabulary training: istanbul (WGSL, GPU) next to HF `tokenizers` and rustbpe, same run.

    python bench/vocab_train.py [--out DIR] [--sizes 100,1000]
                                [--merges 32000] [--pattern o200k] [--workers N] [--adapter A]
                                [--skip-cpu-reference] [--skip-hf] [--no-profile]
                                [--corpus-dir DIR | --corpus DIR]

Expected wall time on the H200 (16 cores) with --sizes 100,1000: about 5-6 minutes (building
the 1 GB corpus ~1 min, the 100 MB run with its CPU checks ~1 min, HF and rustbpe at 1 GB
~1-2 min each); --sizes 100: about 1.5 minutes.

1. Builds a corpus of at least the largest --sizes-mb MB in OUT/corpus/ (files of 8 MB) from
   text found on the machine: the Python standard library's sources, then the .py/.pyi/.md/
   .rst/.txt files of site-packages, then /usr/share/doc (gzip files unpacked). If that is not
   enough, the text is repeated with its ASCII letters rotated (ROT-k for the k-th repetition)
   so the repeats still bring new words. About 1 MB of files is kept apart as held-out text.
   Each size trains on the first files of the corpus that add up to it.
2. For every size, times learning --merges merges (vocabulary 256 + merges) from those files,
   end to end (files -> vocabulary), with the same pattern, one run:
   - read: reading the files as bytes alone (also warms the page cache for every trainer);
   - istanbul, GPU: pre-tokenization + piece counting on the GPU (training/gpu_corpus.py),
     then the WGSL trainer (two dispatches per merge, merge_select and merge_apply, under
     one bind group per round); both phases reported, the merge phase also split into host
     phases (recording, finishing the command buffers, submitting, waiting for the device;
     the first three also per merge), with the peak host RSS and device memory. Device
     start-up and kernel compilation are done beforehand by a small warm-up and reported
     separately. On the smallest size the merges run once more with GPU timestamps on a
     few sampled rounds (microseconds per merge of select, apply and, on software devices,
     the CONTINUE passes; not timed as a result, --no-profile skips it).
   - on the smallest size only: istanbul's CPU pre-tokenizer (--workers processes), whose
     pieces must equal the GPU's, and the CPU reference trainer (unless
     --skip-cpu-reference), whose merge list must equal the GPU's (both reported as checks);
   - Hugging Face tokenizers BpeTrainer: Split(pattern, isolated) + ByteLevel, all 256 bytes
     as the initial alphabet, its own parallel file reading (all cores);
   - rustbpe (karpathy/rustbpe, `pip install rustbpe`), when importable; otherwise the row
     says why. Fed blocks of ~1 MB of whole lines.
3. Reports each result's tokens per byte on the held-out text (lower is better; the trainers
   differ in tie-breaks and details, so compression should be close, not equal), and checks
   that tiktoken loads istanbul's vocabulary and encodes the held-out text to the same ids as
   istanbul's encoder.
Writes OUT/vocab_train.json and OUT/vocab_train.md (after every size, so a run cut short
keeps the sizes it finished) and prints the tables.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import platform
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from bench.results_dir import default_dir  # noqa: E402  (bench/results/<machine>/)

from tokenizer_svc.patterns import PATTERNS  # noqa: E402
from istanbul.shaders.kernels.bpe_train import trainer as gpu_trainer  # noqa: E402
from tokenizer_svc.training import cpu_reference, vocabulary_from  # noqa: E402
from tokenizer_svc.training.corpus import count_pieces  # noqa: E402
from tokenizer_svc.training.gpu_corpus import count_pieces_gpu  # noqa: E402

PART_BYTES = 8 << 20
HELD_OUT_BYTES = 1 << 20
TEXT_SUFFIXES = (".py", ".pyi", ".md", ".rst", ".txt")


# ---- the corpus ---------------------------------------------------------------------------

def source_files():
    """Text files on this machine, in a fixed order: stdlib, site-packages, /usr/share/doc."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    yield from sorted(p for p in stdlib.rglob("*.py") if "site-packages" not in p.parts)
    for key in ("purelib", "platlib"):
        root = Path(sysconfig.get_paths()[key])
        if root.is_dir():
            yield from sorted(p for p in root.rglob("*") if p.suffix in TEXT_SUFFIXES)
        if sysconfig.get_paths()["purelib"] == sysconfig.get_paths()["platlib"]:
            break
    doc = Path("/usr/share/doc")
    if doc.is_dir():
        yield from sorted(p for p in doc.rglob("*") if p.is_file())


def read_text(path: Path) -> str | None:
    try:
        data = path.read_bytes()
        if path.suffix == ".gz":
            data = gzip.decompress(data)
        if len(data) > 16 << 20 or b"\0" in data[:4096]:
            return None
        return data.decode("utf-8")
    except (OSError, UnicodeDecodeError, EOFError, gzip.BadGzipFile):
        return None


def rot(text: str, k: int) -> str:
    """ASCII letters rotated by k (k-th repetition of the corpus: new words, same shape)."""
    if k % 26 == 0:
        return text
    low = "abcdefghijklmnopqrstuvwxyz"
    table = str.maketrans(low + low.upper(), low[k:] + low[:k] + (low[k:] + low[:k]).upper())
    return text.translate(table)


def build_corpus(out: Path, size_mb: float) -> dict:
    """Write >= size_mb MB of text to out/part-*.txt and ~1 MB to out/held_out.txt."""
    out.mkdir(parents=True, exist_ok=True)
    target = int(size_mb * 1e6)
    texts, seen, total = [], set(), 0
    for path in source_files():
        text = read_text(path)
        if not text or text in seen:
            continue
        seen.add(text)
        texts.append(text)
        total += len(text.encode("utf-8"))
        if total >= target + HELD_OUT_BYTES:
            break
    if not texts:
        raise SystemExit("no text files found to build a corpus from")
    held, held_bytes = [], 0
    while texts and held_bytes < min(HELD_OUT_BYTES, total // 20):
        t = texts.pop()  # the last files read are held out
        held.append(t)
        held_bytes += len(t.encode("utf-8"))
    (out / "held_out.txt").write_text("".join(held), encoding="utf-8")
    written, part, repetition, buf, buf_bytes = 0, 0, 0, [], 0
    while written < target:
        for text in texts:
            buf.append(rot(text, repetition))
            size = len(buf[-1].encode("utf-8"))
            written, buf_bytes = written + size, buf_bytes + size
            if buf_bytes >= PART_BYTES or written >= target:
                (out / f"part-{part:04d}.txt").write_text("".join(buf), encoding="utf-8")
                part, buf, buf_bytes = part + 1, [], 0
            if written >= target:
                break
        repetition += 1
    if buf:
        (out / f"part-{part:04d}.txt").write_text("".join(buf), encoding="utf-8")
    return {"bytes": written, "source_texts": len(texts), "repetitions": repetition,
            "held_out_bytes": held_bytes}


def corpus_files(corpus: Path) -> list[Path]:
    return sorted(corpus.glob("part-*.txt"))


def own_corpus(folder: Path) -> tuple[list[Path], str, dict]:
    """--corpus: every file under `folder` in name order; the last ~1 MB is held out."""
    files = sorted(p for p in folder.rglob("*") if p.is_file())
    if not files:
        raise SystemExit(f"--corpus {folder}: no files there")
    held, held_bytes = [], 0
    while len(files) > 1 and held_bytes < HELD_OUT_BYTES:
        held.append(files.pop())
        held_bytes += held[-1].stat().st_size
    try:
        text = "".join(p.read_text(encoding="utf-8") for p in reversed(held))
    except UnicodeDecodeError as exc:
        raise SystemExit(f"--corpus {folder}: the held-out files are not UTF-8 ({exc})")
    return files, text, {"bytes": sum(p.stat().st_size for p in files),
                         "source_texts": len(files), "repetitions": 1,
                         "held_out_bytes": held_bytes, "from": str(folder)}


# ---- trainers -----------------------------------------------------------------------------

def tokens_per_byte(ranks: dict, pattern: str, held_out: str) -> float:
    import tiktoken
    enc = tiktoken.Encoding("bench", pat_str=pattern, mergeable_ranks=ranks, special_tokens={})
    return len(enc.encode_ordinary(held_out)) / len(held_out.encode("utf-8"))


def files_for(files: list[Path], size_mb: float) -> list[Path]:
    """The first corpus files that add up to size_mb MB."""
    chosen, total = [], 0
    for f in files:
        if total >= size_mb * 1e6:
            break
        chosen.append(f)
        total += f.stat().st_size
    return chosen


def read_seconds(files) -> float:
    t0 = time.perf_counter()
    for f in files:
        f.read_bytes()
    return time.perf_counter() - t0


def peak_rss_mb() -> float:
    import resource
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def run_istanbul(files, args, held_out: str, device, out: Path) -> tuple[dict, dict, object]:
    n_tokens = 256 + args.merges
    pattern = PATTERNS[args.pattern]
    device.memory.reset_peak()
    t0 = time.perf_counter()
    corpus = count_pieces_gpu(files, args.pattern, device=device)
    t1 = time.perf_counter()
    count_peak = device.memory.peak
    device.memory.reset_peak()
    result = gpu_trainer.train(corpus.pieces, n_tokens, device=device)
    t2 = time.perf_counter()
    row = {"trainer": "istanbul (GPU, WGSL)", "device": device.info.summary(),
           "seconds": t2 - t0, "pretokenize_seconds": t1 - t0, "merge_seconds": t2 - t1,
           "merges": len(result.merges), "merges_per_second": len(result.merges) / (t2 - t1),
           "tokens_per_byte": tokens_per_byte(result.ranks(), pattern, held_out),
           "unique_pieces": len(corpus.pieces), "cpu_fallback_files": corpus.fallback_chunks,
           "pretokenize_details": corpus.details,
           "peak_host_rss_mb": round(peak_rss_mb(), 1),
           "peak_device_mb": {"counting": round(count_peak / 2**20, 1),
                              "merging": round(device.memory.peak / 2**20, 1)},
           "tiktoken_agrees": tiktoken_agrees(result, args, held_out, device, out),
           "details": result.details}
    return row, corpus.pieces, result


def profile_merges(pieces, args, device) -> dict:
    """The merge phase once more, with GPU timestamps on sampled rounds (not a timed row)."""
    options = gpu_trainer.TrainerOptions(profile=True)
    result = gpu_trainer.train(pieces, 256 + args.merges, device=device, options=options)
    return {"seconds": result.seconds, "phases": result.details["phases"],
            "gpu_profile": result.details.get("gpu_profile")}


def tiktoken_agrees(result, args, held_out: str, device, out: Path) -> bool:
    """tiktoken loads the written vocabulary and encodes held-out text as istanbul does."""
    import tiktoken

    import istanbul
    from tokenizer_svc.vocab import load_vocabulary, save_vocabulary
    path = out / f"istanbul-{args.pattern}-{args.merges}.tiktoken"
    save_vocabulary(vocabulary_from(result, path.stem, PATTERNS[args.pattern]), path)
    vocab = load_vocabulary(path)
    enc = tiktoken.Encoding(vocab.name, pat_str=vocab.pattern, mergeable_ranks=vocab.ranks,
                            special_tokens=vocab.special_tokens)
    ours = istanbul.get_encoding(path, device=device)
    return enc.encode_ordinary(held_out) == list(ours.encode_ordinary(held_out))


def run_cpu_pretokenizer(files, args, gpu_pieces) -> tuple[dict, bool]:
    t0 = time.perf_counter()
    corpus = count_pieces(files, PATTERNS[args.pattern], workers=args.workers)
    seconds = time.perf_counter() - t0
    return ({"trainer": f"istanbul CPU pre-tokenizer ({args.workers} processes), pieces only",
             "seconds": seconds, "pretokenize_seconds": seconds},
            corpus.pieces == gpu_pieces)


def run_cpu_reference(pieces, args, pattern, held_out, gpu_result, pretok_s) -> dict:
    t0 = time.perf_counter()
    result = cpu_reference.train(pieces, 256 + args.merges)
    seconds = time.perf_counter() - t0
    return {"trainer": "istanbul CPU reference (Python)", "seconds": seconds + pretok_s,
            "pretokenize_seconds": pretok_s, "merge_seconds": seconds,
            "merges": len(result.merges), "merges_per_second": len(result.merges) / seconds,
            "tokens_per_byte": tokens_per_byte(result.ranks(), pattern, held_out),
            "equal_to_gpu": result.merges == gpu_result.merges}


def run_hf(files, args, pattern, held_out) -> dict:
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(pattern), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=256 + args.merges, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  min_frequency=0)
    t0 = time.perf_counter()
    tok.train([str(f) for f in files], trainer)
    seconds = time.perf_counter() - t0
    ids = tok.encode(held_out).ids
    import tokenizers
    return {"trainer": f"HF tokenizers {tokenizers.__version__} BpeTrainer", "seconds": seconds,
            "merges": tok.get_vocab_size() - 256, "merges_per_second": None,
            "tokens_per_byte": len(ids) / len(held_out.encode("utf-8")),
            "threads": os.environ.get("RAYON_NUM_THREADS", f"all ({os.cpu_count()})")}


def agreement(ours: dict, theirs: dict) -> dict:
    """How far two merge lists (bytes -> rank) agree: the first rank whose token differs."""
    a = sorted(ours, key=ours.get)
    b = sorted(theirs, key=theirs.get)
    first = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    return {"identical": a == b, "equal_prefix_tokens": first}


def run_rustbpe(files, args, pattern, held_out, ours: dict) -> dict:
    try:
        import rustbpe
    except ImportError as exc:
        return {"trainer": "rustbpe", "skipped": f"not importable here ({exc}); "
                "`pip install rustbpe` (in istanbul[bench]) where a registry is reachable"}

    def lines():  # blocks of ~1 MB of whole lines: rustbpe splits and counts them in parallel
        for f in files:
            with open(f, encoding="utf-8") as fh:
                block, size = [], 0
                for line in fh:
                    block.append(line)
                    size += len(line)
                    if size >= 1 << 20:
                        yield "".join(block)
                        block, size = [], 0
                if block:
                    yield "".join(block)
    tok = rustbpe.Tokenizer()
    t0 = time.perf_counter()
    tok.train_from_iterator(lines(), 256 + args.merges, pattern=pattern)
    seconds = time.perf_counter() - t0
    ranks = {bytes(b): r for b, r in tok.get_mergeable_ranks()}
    return {"trainer": f"rustbpe {getattr(rustbpe, '__version__', '')}".strip(),
            "seconds": seconds, "merges": len(ranks) - 256,
            "merges_per_second": None, "tokens_per_byte": tokens_per_byte(ranks, pattern,
                                                                          held_out),
            "note": "fed blocks of ~1 MB of whole lines (pieces never span blocks)",
            "vs_istanbul": agreement(ours, ranks)}


# ---- report -------------------------------------------------------------------------------

def markdown(payload: dict) -> str:
    s, c = payload["settings"], payload["corpus"]
    lines = [f"# BPE vocabulary training: {s['merges']:,} merges on "
             + ", ".join(f"{r['bytes'] / 1e6:,.0f} MB" for r in payload["runs"]), "",
             f"Machine: {payload['machine']['cpus']} CPU cores, {payload['machine']['platform']}; "
             f"GPU: {payload['device']}. Pattern: {s['pattern']}. Corpus: {c['source_texts']} "
             f"source texts, {c['repetitions']} repetition(s), files of 8 MB. Tokens/byte on "
             f"{c['held_out_bytes'] / 1e6:.1f} MB of held-out text. One run.", ""]

    def num(v, fmt):
        return format(v, fmt) if isinstance(v, (int, float)) and v is not True else "—"
    for run in payload["runs"]:
        hf = next((r["seconds"] for r in run["results"]
                   if r["trainer"].startswith("HF") and "seconds" in r), None)
        lines += [f"## {run['bytes'] / 1e6:,.0f} MB ({run['files']} files, "
                  f"{run.get('unique_pieces', 0):,} unique pieces; reading the files alone: "
                  f"{run['read_seconds']:.2f} s)", "",
                  "| trainer | total s | pre-tokenize + count s | merges s | merges/s | "
                  "tokens/byte | vs HF |", "|---|---:|---:|---:|---:|---:|---:|"]
        for r in run["results"]:
            if "skipped" in r or "error" in r:
                lines.append(f"| {r['trainer']} | {r.get('skipped') or r.get('error')} "
                             "| | | | | |")
                continue
            speed = f"{hf / r['seconds']:.2f}x" if hf and r.get("merges") else "—"
            lines.append(f"| {r['trainer']} | {num(r['seconds'], '.2f')} | "
                         f"{num(r.get('pretokenize_seconds'), '.2f')} | "
                         f"{num(r.get('merge_seconds'), '.2f')} | "
                         f"{num(r.get('merges_per_second'), ',.0f')} | "
                         f"{num(r.get('tokens_per_byte'), '.4f')} | {speed} |")
        ist = run["results"][0]
        if "details" in ist:
            phases, done = ist["details"].get("phases") or {}, max(1, ist.get("merges") or 1)
            per_merge = ", ".join(f"{k} {1e6 * phases[k] / done:.1f}"
                                  for k in ("record", "finish", "submit") if k in phases)
            lines += ["", f"istanbul merge phase, host seconds: {phases}; host µs per merge: "
                      f"{per_merge}; {ist['details'].get('rounds')} rounds, "
                      f"{ist['details'].get('dispatches_per_merge')} dispatches per merge. "
                      f"Peak host RSS {ist.get('peak_host_rss_mb')} MB (the whole process); "
                      f"peak device memory {ist.get('peak_device_mb')} MB."]
        rust = next((r for r in run["results"] if "vs_istanbul" in r), None)
        if rust:
            v = rust["vs_istanbul"]
            lines += ["", f"rustbpe's vocabulary against istanbul's (same tie-break rule; "
                      f"rustbpe's own regex tables and line blocks): "
                      f"{'identical' if v['identical'] else 'first ' + format(v['equal_prefix_tokens'], ',') + ' ranks identical'}."]
        prof = (run.get("merge_profile") or {}).get("gpu_profile")
        if prof:
            kernels = ", ".join(f"{k} {v['us_per_step']:.1f}" for k, v in prof["kernels"].items())
            lines += ["", f"GPU time per merge step, µs (timestamps, {prof['steps']} steps in "
                      f"{prof['rounds']} sampled rounds, one pass per dispatch): {kernels}; "
                      f"total {prof['us_per_step']:.1f} µs. The timed run above: "
                      f"{1e6 * ist['merge_seconds'] / max(1, ist['merges']):.1f} µs per merge "
                      "wall."]
        lines.append("")
    lines += [f"Checks: {json.dumps(payload['checks'])}. Warm-up (device start, kernel "
              f"compilation): {payload['warmup_seconds']:.2f}s, not included above."]
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=None, type=Path,
                        help="output directory for vocab_train.json / .md "
                             "(default bench/results/<machine>/)")
    parser.add_argument("--sizes", "--sizes-mb", dest="sizes_mb", default="100",
                        help="corpus sizes in MB, comma-separated, e.g. 100,1000 (default 100)")
    parser.add_argument("--merges", type=int, default=32_000)
    parser.add_argument("--pattern", default="o200k", choices=sorted(PATTERNS))
    parser.add_argument("--workers", type=int, default=os.cpu_count(),
                        help="processes of istanbul's CPU pre-tokenizer (the check run)")
    parser.add_argument("--adapter", default=None)
    parser.add_argument("--corpus-dir", type=Path, default=None,
                        help="reuse (or build) the generated corpus here instead of OUT/corpus")
    parser.add_argument("--corpus", type=Path, default=None,
                        help="a folder of your own UTF-8 text files to train on instead (all "
                        "files, in name order; the last ~1 MB of files is held out)")
    parser.add_argument("--no-profile", action="store_true",
                        help="skip the GPU-timestamp profile of the merge phase")
    parser.add_argument("--skip-cpu-reference", action="store_true")
    parser.add_argument("--skip-hf", action="store_true")
    args = parser.parse_args()
    try:
        sizes = sorted(float(x) for x in args.sizes_mb.split(","))
    except ValueError:
        parser.error(f"--sizes-mb {args.sizes_mb!r}: give MB numbers separated by commas")
    # the corpus and the trained vocabulary go to --out, or to a temporary folder when the
    # report goes to bench/results/<machine>/
    work = args.out or Path(tempfile.gettempdir()) / "istanbul-vocab-train"
    work.mkdir(parents=True, exist_ok=True)
    args.out = args.out or default_dir(args.adapter)
    args.out.mkdir(parents=True, exist_ok=True)
    pattern = PATTERNS[args.pattern]

    if args.corpus is not None:
        all_files, held_out, meta = own_corpus(args.corpus)
        corpus_dir = work / "corpus"
        corpus_dir.mkdir(exist_ok=True)
    else:
        corpus_dir = args.corpus_dir or work / "corpus"
        meta_path = corpus_dir / "meta.json"
        meta = json.loads(meta_path.read_text()) if meta_path.is_file() else None
        if meta and corpus_files(corpus_dir) and meta["bytes"] >= sizes[-1] * 1e6:
            print(f"corpus: reusing {corpus_dir}")
        else:
            t = time.perf_counter()
            meta = build_corpus(corpus_dir, sizes[-1])
            meta_path.write_text(json.dumps(meta))
            print(f"corpus: built {meta['bytes'] / 1e6:.0f} MB in {time.perf_counter() - t:.1f}s")
        all_files = corpus_files(corpus_dir)
        held_out = (corpus_dir / "held_out.txt").read_text(encoding="utf-8")

    from istanbul.shaders.engine import Device
    t = time.perf_counter()
    device = Device(args.adapter)
    warm = corpus_dir / "warm-up.txt"
    warm.write_text("warm up the kernels and the device, abab 123 " * 50, encoding="utf-8")
    gpu_trainer.train(count_pieces_gpu([warm], args.pattern, device=device).pieces, 262,
                      device=device)
    warmup = time.perf_counter() - t
    print(f"device: {device.info.summary()} (warm-up {warmup:.2f}s)")

    runs, checks = [], {}
    for k, size in enumerate(sizes):
        files = files_for(all_files, size)
        run = {"size_mb": size, "files": len(files),
               "bytes": sum(f.stat().st_size for f in files), "results": []}
        run["read_seconds"] = read_seconds(files)
        results = run["results"]
        print(f"{run['bytes'] / 1e6:,.0f} MB: istanbul (GPU) ...", flush=True)
        row, pieces, gpu_result = run_istanbul(files, args, held_out, device, work)
        results.append(row)
        run["unique_pieces"] = len(pieces)
        checks[f"tiktoken_agrees_{size:g}mb"] = row["tiktoken_agrees"]
        print(f"  {row['seconds']:.2f}s ({row['pretokenize_seconds']:.2f}s pre-tokenize + "
              f"count: {row['pretokenize_details']}; {row['merges_per_second']:,.0f} merges/s)",
              flush=True)
        print(f"  merge phases (host s): {row['details']['phases']}", flush=True)
        if k == 0 and not args.no_profile:
            print("  istanbul merges again, GPU-profiled ...", flush=True)
            run["merge_profile"] = profile_merges(pieces, args, device)
            print(f"  {run['merge_profile']['gpu_profile']}", flush=True)
        if k == 0:  # correctness against the CPU paths on the smallest size
            print("  istanbul CPU pre-tokenizer ...", flush=True)
            cpu_row, same_pieces = run_cpu_pretokenizer(files, args, pieces)
            results.append(cpu_row)
            checks[f"gpu_pieces_equal_cpu_pieces_{size:g}mb"] = same_pieces
            if not args.skip_cpu_reference:
                print("  istanbul CPU reference trainer ...", flush=True)
                ref = run_cpu_reference(pieces, args, pattern, held_out, gpu_result,
                                        cpu_row["seconds"])  # CPU pieces, CPU merges
                results.append(ref)
                checks[f"gpu_merges_equal_cpu_reference_{size:g}mb"] = ref.pop("equal_to_gpu")
        if not args.skip_hf:
            print("  HF tokenizers ...", flush=True)
            try:
                results.append(run_hf(files, args, pattern, held_out))
            except Exception as exc:  # report, keep the other rows
                results.append({"trainer": "HF tokenizers BpeTrainer", "error": repr(exc)[:300]})
        print("  rustbpe ...", flush=True)
        try:
            results.append(run_rustbpe(files, args, pattern, held_out, gpu_result.ranks()))
        except Exception as exc:
            results.append({"trainer": "rustbpe", "error": repr(exc)[:300]})
        runs.append(run)
        if len(runs) > 1:  # no worse than linear: time ratio <= size ratio
            first, last = runs[0]["results"][0], runs[-1]["results"][0]
            checks["istanbul_scales_linearly"] = (
                last["seconds"] / first["seconds"] <= runs[-1]["bytes"] / runs[0]["bytes"])
        # written after every size: a run cut short by a time limit keeps the sizes it did
        payload = {"machine": {"cpus": os.cpu_count(), "platform": platform.platform(),
                               "python": platform.python_version()},
                   "device": device.info.summary(), "corpus": meta,
                   "settings": {"merges": args.merges, "vocab_size": 256 + args.merges,
                                "pattern": args.pattern, "workers": args.workers,
                                "sizes_mb": sizes},
                   "warmup_seconds": warmup, "runs": runs, "checks": checks}
        (args.out / "vocab_train.json").write_text(json.dumps(payload, indent=2, default=str)
                                                   + "\n")
        table = markdown(payload)
        (args.out / "vocab_train.md").write_text(table, encoding="utf-8")
    print(table)
    return 0 if all(checks.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
