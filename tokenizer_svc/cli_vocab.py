"""`istanbul vocab train`: learn a byte-level BPE vocabulary from a corpus, on the GPU;
`istanbul vocab fetch NAME`: get a published one (tokenizer_svc/vocab_fetch.py).

    istanbul vocab train corpus/*.txt --size 32000 --pattern o200k \\
        --special '<|endoftext|>' -o my.tiktoken
    istanbul vocab train 'fineweb/*.parquet' web.jsonl.zst --size 32000 -o web.tiktoken

The inputs are read by tokenizer_svc/corpus_files.py (text files, directories, globs, stdin;
JSON Lines, JSON, Parquet, Arrow, `datasets` folders; compressed or not).

writes `my.tiktoken` (base64 token + rank per line: tiktoken's format) and `my.tiktoken.json`
(pattern and special tokens), both atomically, only once training has succeeded. The
semantics (ranks, tie-break, overlapping runs, special ids) are in
shaders/kernels/bpe_train/merges.py.
"""

from __future__ import annotations

import os
from pathlib import Path

from istanbul_errors import UserFacingError

DESCRIPTION = """\
Learn a byte-level BPE vocabulary from a corpus: text files (each one text), directories,
quoted globs, - for stdin; JSON Lines, JSON, Parquet, Arrow files and datasets folders (each
record one text; --text-field), any of them .gz/.zst/.xz/.bz2. Ranks 0-255 are the single
bytes; each merge adds the next rank (most frequent adjacent pair; ties: lowest left rank,
then lowest right rank); special tokens get the ids after the last merge, in the order
given. The result loads in tiktoken: tiktoken.Encoding(name, pat_str=PATTERN,
mergeable_ranks=..., ...).
Pre-tokenization and piece counting run on the GPU (gpt2, cl100k, o200k patterns, on a
hardware GPU; else on the CPU in parallel: --pretokenizer), pair counting and merging on the
GPU. Both pre-tokenizers give the same pieces.
"""


def register(sub) -> None:
    from istanbul.shaders.cli import add_device_args
    from .patterns import KNOWN_VOCABULARIES, PATTERNS

    v = sub.add_parser("vocab", help="BPE vocabularies: train one from a corpus, fetch a "
                       "published one")
    vsub = v.add_subparsers(dest="vocab_command", metavar="ACTION", required=True)
    t = vsub.add_parser("train", help="learn a BPE vocabulary (.tiktoken) from a corpus",
                        description=DESCRIPTION)
    t.add_argument("files", nargs="+", metavar="FILE",
                   help="the corpus: UTF-8 text files (each one text), directories (searched "
                        "recursively), quoted globs, - for stdin; .jsonl/.json/.parquet/.arrow "
                        "files and datasets folders (each record one text); see --format")
    from .corpus_files import add_corpus_arguments
    add_corpus_arguments(t)
    t.add_argument("--size", type=int, required=True, metavar="N",
                   help="vocabulary size: 256 byte tokens + merges + special tokens")
    t.add_argument("--pattern", default="o200k", metavar="P",
                   help=f"pre-tokenizer: {', '.join(PATTERNS)} (tiktoken's patterns) or a "
                        "regex (default: o200k)")
    t.add_argument("--special", action="append", default=[], metavar="TEXT",
                   help="a special token, e.g. '<|endoftext|>' (repeatable; ids follow the "
                        "last merge in this order; the corpus is split at them)")
    t.add_argument("--max-token-bytes", type=int, default=None, metavar="B",
                   help="never make a token longer than B bytes (default: no limit)")
    t.add_argument("--invalid-utf8", choices=("error", "keep"), default="error",
                   help="invalid UTF-8 in a file: stop with an error naming the file and "
                        "offset (default), or keep the bytes as bytes")
    t.add_argument("--trainer", choices=("gpu", "cpu"), default="gpu",
                   help="gpu (WGSL kernels, default) or cpu (the readable reference: the "
                        "same merges; far slower than a real GPU)")
    t.add_argument("--pretokenizer", choices=("auto", "gpu", "cpu"), default="auto",
                   help="where pre-tokenization and piece counting run: gpu (the encoder's "
                        "kernels; gpt2, cl100k, o200k patterns), cpu (--workers processes) or "
                        "auto (gpu with --trainer gpu on a hardware GPU for those patterns, "
                        "else cpu; default)")
    t.add_argument("--workers", type=int, default=None, metavar="W",
                   help="CPU pre-tokenization processes (default: one per CPU core)")
    t.add_argument("--name", default=None, help="vocabulary name (default: the output's stem)")
    t.add_argument("-o", "--output", required=True, metavar="OUT.tiktoken",
                   help="where to write the vocabulary (and OUT.tiktoken.json beside it)")
    t.add_argument("--no-progress", action="store_true",
                   help="no progress bars (there are none without a terminal either)")
    add_device_args(t)
    t.set_defaults(func=cmd_train)

    f = vsub.add_parser("fetch", help="get a published vocabulary (gpt2, r50k_base, "
                        "cl100k_base, o200k_base) where --vocab NAME finds it",
                        description="Put a published vocabulary file where `--vocab NAME` finds "
                        "it ($ISTANBUL_VOCAB_DIR, else ~/.cache/istanbul/vocab), after checking "
                        "it against tiktoken's published sha256. Without --from: tiktoken's "
                        "cache if it holds the file, else a download from the published URL. "
                        "On a machine without internet, copy the file (or a tiktoken cache "
                        "folder) over and give it with --from.")
    f.add_argument("name", metavar="NAME", choices=sorted(KNOWN_VOCABULARIES),
                   help=f"one of {', '.join(KNOWN_VOCABULARIES)}")
    f.add_argument("--from", dest="source", metavar="PATH|URL",
                   help="a copy of the file, a folder holding it (or a tiktoken cache folder), "
                        "or an http(s) URL (default: tiktoken's cache, else the published URL)")
    f.add_argument("--to", dest="dest", type=Path, metavar="DIR",
                   help="folder to write NAME's file into (default: $ISTANBUL_VOCAB_DIR, else "
                        "~/.cache/istanbul/vocab)")
    f.set_defaults(func=cmd_fetch)


def check_output(output: str, files) -> Path:
    """The output path, refused before any work if it cannot be written."""
    out = Path(output)
    if out.is_dir():
        raise UserFacingError(f"-o {out}: is a directory; give a file name like "
                              f"{out / 'vocab.tiktoken'}")
    parent = out.parent if str(out.parent) else Path(".")
    if not parent.is_dir():
        raise UserFacingError(f"-o {out}: directory {parent} does not exist; create it first")
    if not os.access(parent, os.W_OK):
        raise UserFacingError(f"-o {out}: directory {parent} is not writable")
    resolved = out.resolve()
    for f in files:
        if Path(f).resolve() in (resolved, Path(str(resolved) + ".json")):
            raise UserFacingError(f"-o {out}: would overwrite the input file {f}")
    return out


def check_arguments(args):
    """Every check the arguments allow on their own (the output path, the inputs, the size,
    special tokens, token cap, pattern, pre-tokenizer, workers), before any device is opened
    or any GPU module imported; returns (the output path, the corpus reader)."""
    from .corpus_files import TEXT_FIELD, CorpusFileError, CorpusReader
    from .patterns import PATTERNS, pattern_name_for
    from .training import CorpusError, TrainingError, resolve_pattern
    from .training.corpus import split_inputs
    from istanbul.shaders.kernels.bpe_train.merges import check_request

    try:
        corpus = CorpusReader(args.files, format=args.format,
                              text_field=args.text_field or TEXT_FIELD, skip_bad=args.skip_bad)
        out = check_output(args.output, [i.path for i in corpus.inputs if i.path is not None])
        split_inputs(corpus)         # text files: each readable
        check_request(args.size, args.special, args.max_token_bytes)
        resolve_pattern(args.pattern)
    except (CorpusError, CorpusFileError, TrainingError) as exc:
        raise UserFacingError(f"{exc} (no output written)") from None
    if args.pretokenizer == "gpu" and args.pattern not in PATTERNS and \
            pattern_name_for(args.pattern) is None:
        raise UserFacingError(f"--pretokenizer gpu needs one of the GPU patterns (gpt2, r50k, "
                              f"cl100k, o200k), not {args.pattern[:80]!r}; use --pretokenizer "
                              "cpu")
    if args.workers is not None and args.workers < 1:
        raise UserFacingError(f"--workers {args.workers}: give 1 or more (or leave it out for "
                              "one per CPU core)")
    return out, corpus


def cmd_train(args) -> int:
    from .corpus_files import CorpusFileError
    from .training import CorpusError, TrainingError, train_vocabulary
    from .vocab import save_vocabulary, sidecar_path

    out, corpus = check_arguments(args)
    name = args.name or out.name.removesuffix(".tiktoken")
    device = None
    if "gpu" in (args.trainer, args.pretokenizer):
        from istanbul.shaders.engine import Device
        from .gpu_backend import ROBUSTNESS
        device = Device(args.adapter, robustness=ROBUSTNESS)
        print(f"device: {device.info.summary()}")
        if device.info.is_software:
            print("note: this is software Vulkan (no GPU found); --trainer cpu gives the "
                  "same merges faster here")
    try:
        vocab, report = train_vocabulary(
            corpus, args.size, args.pattern, args.special, args.max_token_bytes,
            args.invalid_utf8, args.trainer, device=device, workers=args.workers, name=name,
            progress=not args.no_progress, pretokenizer=args.pretokenizer)
    except (CorpusError, CorpusFileError, TrainingError) as exc:
        raise UserFacingError(f"{exc} (no output written)") from None
    try:
        save_vocabulary(vocab, out)
    except OSError as exc:
        raise UserFacingError(f"-o {out}: cannot write the vocabulary: "
                              f"{exc.strerror or exc}") from None
    print(report.summary())
    if corpus.stats.skipped:
        print(f"skipped {corpus.stats.skipped:,} bad record(s) (--skip-bad); the first: "
              + "; ".join(corpus.stats.bad_examples[:3]))
    print(f"wrote {out} ({vocab.n_vocab:,} ids: {len(vocab.ranks):,} tokens + "
          f"{len(vocab.special_tokens)} special) and {sidecar_path(out)}")
    return 0


def cmd_fetch(args) -> int:
    from .vocab_fetch import fetch_vocabulary
    done = fetch_vocabulary(args.name, args.source, args.dest)
    print(f"{args.name}: {done.path} (from {done.source}; sha256 {done.sha256} matches the "
          "published hash)")
    return 0
