#!/usr/bin/env python
"""`istanbul prepare` on published corpus formats: MB/s of a JSONL.zst and a Parquet corpus
beside the in-process encoder's MB/s on the same text.

    python bench/prepare_bench.py [--mb 1024] [--vocab gpt2] [--vocab-dir DIR] [--work DIR]
        [--out DIR] [--adapter A] [--keep]

Corpus (no network, deterministic): this Python's standard library sources, each .py file one
document, repeated in order until --mb MB of text, written twice as a corpus is published:
  corpus.jsonl.zst   one {"id": k, "text": ...} per line, zstd level 3 (streamed as written)
  corpus.parquet     columns id, text; 2048 rows per row group, snappy (pyarrow's default,
                     and FineWeb's)
For each file:
  read       the reader alone (tokenizer_svc/corpus_files.py, documents as UTF-8 bytes): MB/s
  prepare    `istanbul prepare FILE --vocab V --out DIR --no-progress` as a command: its own
             MB/s (first read to last shard, as it prints it) and the wall time of the
             command (start-up, device, vocabulary load included)
and, on the same documents in memory, the in-process encoder (`get_encoding(V)` on the same
device): `Encoding.encode_batch_flat` of bytes in batches of 8 MB and of
trainer_svc.data.prepare.LOCAL_BATCH_BYTES (as prepare feeds it), and of str in batches of 64 MB. The GPU is warmed up first (~1 s of the same call). prepare / encoder is the share
of the encoder's speed that prepare keeps.

Writes DIR/prepare.json and DIR/prepare.md (default DIR: bench/results/<machine>/, the machine
named from the adapter as bench/acceptance.py does). The corpus files go to --work (default: a
temporary folder, removed unless --keep).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

ROW_GROUP_ROWS = 2048
STR_BATCH_BYTES = 64 << 20


# ---- the corpus -------------------------------------------------------------------------------

def stdlib_documents() -> list[str]:
    """Every UTF-8 .py file of this Python's standard library, sorted by path."""
    root = Path(os.__file__).parent
    docs = []
    for path in sorted(root.rglob("*.py")):
        try:
            docs.append(path.read_text(encoding="utf-8"))
        except (UnicodeDecodeError, OSError):
            continue
    return [d for d in docs if d]


def documents(total_bytes: int):
    """The stdlib documents repeated until `total_bytes` of UTF-8: (k, text)."""
    base = [(d, len(d.encode())) for d in stdlib_documents()]
    made = k = 0
    while made < total_bytes:
        text, size = base[k % len(base)]
        yield k, text
        made += size
        k += 1


def write_jsonl_zst(path: Path, total_bytes: int) -> dict:
    import zstandard
    started, n, size = time.perf_counter(), 0, 0
    with open(path, "wb") as fh, zstandard.ZstdCompressor(level=3, threads=-1).stream_writer(
            fh) as out:
        for k, text in documents(total_bytes):
            out.write((json.dumps({"id": k, "text": text}, ensure_ascii=False) + "\n").encode())
            n, size = n + 1, size + len(text.encode())
    return {"documents": n, "text_bytes": size, "file_bytes": path.stat().st_size,
            "write_s": round(time.perf_counter() - started, 1)}


def write_parquet(path: Path, total_bytes: int) -> dict:
    import pyarrow as pa
    import pyarrow.parquet as pq
    started, n, size = time.perf_counter(), 0, 0
    schema = pa.schema([("id", pa.int64()), ("text", pa.string())])
    with pq.ParquetWriter(path, schema) as writer:
        ids, texts = [], []
        for k, text in documents(total_bytes):
            ids.append(k)
            texts.append(text)
            n, size = n + 1, size + len(text.encode())
            if len(texts) == ROW_GROUP_ROWS:
                writer.write_table(pa.table({"id": ids, "text": texts}, schema=schema))
                ids, texts = [], []
        if texts:
            writer.write_table(pa.table({"id": ids, "text": texts}, schema=schema))
    return {"documents": n, "text_bytes": size, "file_bytes": path.stat().st_size,
            "write_s": round(time.perf_counter() - started, 1)}


# ---- measurements -----------------------------------------------------------------------------

def time_reader(path: Path) -> dict:
    from tokenizer_svc.corpus_files import CorpusReader
    started = time.perf_counter()
    reader = CorpusReader([str(path)])
    for _ in reader.documents(as_bytes=True):
        pass
    seconds = time.perf_counter() - started
    return {"seconds": round(seconds, 3), "mb_per_s": round(reader.stats.bytes / 1e6 / seconds, 1),
            "documents": reader.stats.documents}


def time_prepare(path: Path, vocab: str, out: Path, env: dict, adapter: str | None) -> dict:
    cmd = [sys.executable, "-m", "istanbul", "prepare", str(path), "--vocab", vocab, "--out",
           str(out), "--no-progress", "--replace"] + (["--adapter", adapter] if adapter else [])
    started = time.perf_counter()
    with tempfile.TemporaryFile("w+") as log:
        child = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, text=True, env=env,
                                 cwd=REPO)
        _, status, usage = os.wait4(child.pid, 0)        # this child's own peak RSS
        child.returncode = os.waitstatus_to_exitcode(status)
        wall = time.perf_counter() - started
        log.seek(0)
        stdout = log.read()
    if child.returncode != 0:
        raise SystemExit(f"prepare failed ({child.returncode}):\n{stdout}")
    m = re.search(r"([\d,]+) documents, ([\d,.]+) MB of text in .*?, ([\d,]+) tokens out, in "
                  r"([\d.]+) s \(([\d,.]+) MB/s\)", stdout)
    if m is None:
        raise SystemExit(f"prepare's summary line not found in:\n{stdout}")
    num = lambda s: float(s.replace(",", ""))  # noqa: E731
    return {"documents": int(num(m[1])), "text_mb": num(m[2]), "tokens": int(num(m[3])),
            "seconds": num(m[4]), "mb_per_s": num(m[5]), "wall_s": round(wall, 2),
            "wall_mb_per_s": round(num(m[2]) / wall, 1), "peak_rss_mb": round(
                usage.ru_maxrss / 1024, 1), "output": stdout.strip()}


def _batches(docs, limit: int):
    batch, size = [], 0
    for d in docs:
        batch.append(d)
        size += len(d)
        if size >= limit:
            yield batch
            batch, size = [], 0
    if batch:
        yield batch


def time_encoder(enc, texts: list[str], is_software: bool) -> dict:
    """encode_batch_flat of bytes in 8 MB and in LOCAL_BATCH_BYTES batches (prepare's), and of
    str in 64 MB batches; warmed up first."""
    from trainer_svc.data.prepare import LOCAL_BATCH_BYTES
    raw = [t.encode() for t in texts]
    total = sum(map(len, raw))
    calls = {f"bytes_{mb}mb_batches": list(_batches(raw, mb << 20))
             for mb in sorted({8, LOCAL_BATCH_BYTES >> 20})}
    calls[f"str_{STR_BATCH_BYTES >> 20}mb_batches"] = list(_batches(texts, STR_BATCH_BYTES))
    if not is_software:         # the GPU idles at a low clock: ~1 s of the same work first
        first = next(iter(calls.values()))[0]
        until = time.perf_counter() + 1.0
        while time.perf_counter() < until:
            enc.encode_batch_flat(first)
    out = {}
    for name, batches in calls.items():
        started = time.perf_counter()
        tokens = 0
        for batch in batches:
            ids, _ = enc.encode_batch_flat(batch)
            tokens += int(ids.size)
        seconds = time.perf_counter() - started
        out[name] = {"seconds": round(seconds, 3), "mb_per_s": round(total / 1e6 / seconds, 1),
                     "tokens": tokens, "prepare_batches": name == f"bytes_"
                     f"{LOCAL_BATCH_BYTES >> 20}mb_batches"}
    return out


def _cpu() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next(line.split(":", 1)[1].strip() for line in f
                        if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or platform.machine()


# ---- report -----------------------------------------------------------------------------------

def markdown(result: dict) -> str:
    meta, enc = result["meta"], result["encoder"]
    best = max(v["mb_per_s"] for v in enc.values())
    lines = [f"# istanbul prepare on published formats: {meta['machine']}", "",
             f"{meta['device']}; {meta['cores']} cores ({meta['cpu']}); Python "
             f"{meta['python']}; tree {meta['commit']}; {meta['date']}. "
             f"`{meta['command']}`.", "",
             f"Text: the standard library's .py files, repeated: {result['text_mb']:,.0f} MB in "
             f"{result['documents']:,} documents; vocabulary {meta['vocab']}.", "",
             "| input | file MB | read MB/s | prepare MB/s | prepare wall s (MB/s) | "
             "prepare / encoder | prepare peak RSS MB | tokens |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for name, row in result["inputs"].items():
        p = row["prepare"]
        lines.append(f"| {name} | {row['file']['file_bytes'] / 1e6:,.0f} | "
                     f"{row['read']['mb_per_s']:,.0f} | **{p['mb_per_s']:,.0f}** | "
                     f"{p['wall_s']:.1f} ({p['wall_mb_per_s']:,.0f}) | "
                     f"{p['mb_per_s'] / best:.2f} | {p['peak_rss_mb']:,.0f} | {p['tokens']:,} |")
    lines += ["", "In-process encoder on the same documents (`Encoding.encode_batch_flat`):", "",
              "| call | MB/s | tokens |", "| --- | ---: | ---: |"]
    for name, row in enc.items():
        mark = " (prepare's calls)" if row.get("prepare_batches") else ""
        lines.append(f"| {name.replace('_', ' ')}{mark} | {row['mb_per_s']:,.0f} | "
                     f"{row['tokens']:,} |")
    lines += ["", "read: the reader alone (documents as UTF-8 bytes). prepare MB/s: prepare's own "
              "timing, first read to last shard written; wall: the whole command (start-up, "
              "device, vocabulary). prepare / encoder: prepare MB/s over the encoder's best. peak RSS: "
              "the prepare process's maximum resident memory (wait4), to set beside the text "
              "size: flat memory keeps it far below it.", ""]
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mb", type=float, default=1024.0,
                        help="MB of text in each corpus file (default 1024)")
    parser.add_argument("--vocab", default="gpt2", help="vocabulary name or path (default gpt2)")
    parser.add_argument("--vocab-dir", default=os.environ.get("ISTANBUL_VOCAB_DIR") or
                        str(REPO.parent / "shared" / "vocab"),
                        help="where --vocab NAME is found ($ISTANBUL_VOCAB_DIR)")
    parser.add_argument("--work", default=None,
                        help="folder for the corpus files and shards (default: a temporary one)")
    parser.add_argument("--keep", action="store_true", help="keep --work's files")
    parser.add_argument("--commit", default=None,
                        help="the tree's commit for the report, where the copy has no .git (the "
                             "GPU machine); default: git rev-parse HEAD")
    parser.add_argument("--out", default=None,
                        help="folder for prepare.json / .md (default bench/results/<machine>)")
    parser.add_argument("--adapter", default=None)
    args = parser.parse_args(argv)
    os.environ.setdefault("XDG_RUNTIME_DIR", "/tmp")
    if args.vocab_dir and Path(args.vocab_dir).is_dir():
        os.environ["ISTANBUL_VOCAB_DIR"] = args.vocab_dir

    from bench.results_dir import machine_name
    from istanbul.shaders.engine import default_device
    from tokenizer_svc.encoding import get_encoding
    from tokenizer_svc.gpu_backend import ROBUSTNESS
    device = default_device(args.adapter, robustness=ROBUSTNESS)
    machine = machine_name(device.name)
    total = int(args.mb * 1e6)
    work = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="prepare-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    try:
        files = {"jsonl.zst": work / "corpus.jsonl.zst", "parquet": work / "corpus.parquet"}
        made = {"jsonl.zst": write_jsonl_zst(files["jsonl.zst"], total),
                "parquet": write_parquet(files["parquet"], total)}
        for name, info in made.items():
            print(f"{name}: {info['text_bytes'] / 1e6:,.0f} MB of text, {info['documents']:,} "
                  f"documents -> {info['file_bytes'] / 1e6:,.0f} MB file in {info['write_s']} s",
                  flush=True)
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(
            filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
        inputs = {}
        for name, path in files.items():
            read = time_reader(path)
            prep = time_prepare(path, args.vocab, work / f"shards-{name}", env, args.adapter)
            shutil.rmtree(work / f"shards-{name}", ignore_errors=True)
            inputs[name] = {"file": made[name], "read": read, "prepare": prep}
            print(f"{name}: read {read['mb_per_s']:,.0f} MB/s; prepare {prep['mb_per_s']:,.0f} "
                  f"MB/s ({prep['tokens']:,} tokens; the command {prep['wall_s']} s)", flush=True)
        texts = [t for _, t in documents(total)]
        enc = get_encoding(args.vocab, device=device)
        encoder = time_encoder(enc, texts, device.info.is_software)
        print("encoder: " + ", ".join(f"{k} {v['mb_per_s']:,.0f} MB/s"
                                      for k, v in encoder.items()), flush=True)
    finally:
        if not args.keep and not args.work:
            shutil.rmtree(work, ignore_errors=True)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO,
                            capture_output=True, text=True).stdout.strip() or "?"
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO,
                           capture_output=True, text=True).stdout.strip()
    meta = {"machine": machine, "device": device.name, "software": bool(
                device.info.is_software), "cores": os.cpu_count(),
            "cpu": _cpu(),
            "python": platform.python_version(), "date": time.strftime("%Y-%m-%d"),
            "commit": args.commit or commit + (" (+ local changes)" if dirty else ""),
            "vocab": args.vocab, "command": "python bench/prepare_bench.py " + " ".join(
                sys.argv[1:] if argv is None else argv)}
    first = next(iter(made.values()))
    result = {"meta": meta, "text_mb": first["text_bytes"] / 1e6,
              "documents": first["documents"], "inputs": inputs, "encoder": encoder}
    out = Path(args.out) if args.out else REPO / "bench" / "results" / machine
    out.mkdir(parents=True, exist_ok=True)
    (out / "prepare.json").write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    (out / "prepare.md").write_text(markdown(result), encoding="utf-8")
    print(f"wrote {out / 'prepare.json'} and {out / 'prepare.md'} "
          f"({time.perf_counter() - started:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
