"""`istanbul encode` and `istanbul decode`: text <-> token ids on the GPU, from the shell.

    echo "hello world" | istanbul encode --vocab cl100k_base          # [15339, 1917, 198]
    istanbul encode --vocab o200k_base --jsonl < docs.jsonl          # per line: "text" or
                                                                     # {"text": "..."} in,
                                                                     # a JSON array out
    istanbul encode --vocab o200k_base docs.jsonl.zst a.txt 'x/*.parquet'   # FILES: a JSON
                                                                     # array per document
    echo "[15339, 1917]" | istanbul decode --vocab cl100k_base       # hello world
    echo "hello world" | istanbul encode --tokenizer localhost:50051  # the same, by the service
    istanbul encode --vocab cl100k_base --chunk 512 --overlap 64 < doc.txt   # a JSON object
                                                                     # per window (RAG)
"""

from __future__ import annotations

import json
import sys

from istanbul_errors import UserFacingError
from istanbul.shaders.cli import add_device_args

from .service.client_options import add_tokenizer_arguments, client_from_args

SPECIAL_HELP = ("what to do with text that spells a special token: 'raise' (tiktoken's default: "
                "an error), 'allow' (encode it as the special token), 'text' (encode it as "
                "ordinary text)")


ENCODE_BATCH_BYTES = 8 << 20   # encode FILES: text per encode call (memory stays bounded)


def register(sub) -> None:
    from .corpus_files import TEXT_FIELD, add_corpus_arguments
    e = sub.add_parser("encode", help="text on stdin (or FILES) -> JSON arrays of token ids "
                                      "on stdout")
    e.add_argument("files", nargs="*", metavar="FILES",
                   help="read these instead of stdin (files, directories, quoted globs, - for "
                        "stdin) as `istanbul prepare` does: a text file is one document, "
                        ".jsonl/.json/.parquet/.arrow files and datasets folders one per "
                        "record, compressed or not; print one JSON array per document")
    e.add_argument("--vocab", metavar="V",
                   help="vocabulary: a path (.tiktoken with optional sidecar, tokenizer.json) or "
                        "a known name (gpt2, r50k_base, cl100k_base, o200k_base); required "
                        "unless --tokenizer")
    e.add_argument("--pattern", metavar="P",
                   help="pre-tokenizer for a .tiktoken file without a sidecar: gpt2, r50k, "
                        "cl100k, o200k or a regex")
    e.add_argument("--jsonl", action="store_true",
                   help="stdin has one document per line: a JSON string, or a JSON object whose "
                        "--text-field holds the text (e.g. {\"text\": \"...\"}); print one "
                        "JSON array per line (default: all of stdin is one document)")
    e.add_argument("--text-field", metavar="NAME", default=None,
                   help=f"with --jsonl or FILES: the field of a JSON object, or the Parquet or "
                        f"Arrow column, that holds the text (default: {TEXT_FIELD})")
    add_corpus_arguments(e, skip_bad=False, text_field=False)
    e.add_argument("--special", choices=("raise", "allow", "text"), default="raise",
                   help=SPECIAL_HELP)
    e.add_argument("--chunk", type=int, metavar="N",
                   help="cut each document into windows of at most N tokens and print one JSON "
                        "object per window and line: document (its index), ids, text, start, "
                        "end (characters), byte_start, byte_end (UTF-8 bytes): what retrieval "
                        "pipelines embed (see --overlap)")
    e.add_argument("--overlap", type=int, metavar="M",
                   help="with --chunk: tokens shared by neighbouring windows (default 0; less "
                        "than N)")
    e.add_argument("--cpu", action="store_true", help="use the CPU reference instead of the GPU")
    add_device_args(e)
    add_tokenizer_arguments(e, help="use the tokenizer service at HOST:PORT instead of a local "
                            "vocabulary (the same output as --vocab with its vocabulary)")
    e.set_defaults(func=cmd_encode)

    d = sub.add_parser("decode", help="JSON arrays of token ids on stdin -> text on stdout")
    d.add_argument("--vocab", metavar="V", help="vocabulary (as for encode); required unless "
                   "--tokenizer")
    d.add_argument("--pattern", metavar="P",
                   help="pre-tokenizer of a .tiktoken file without a sidecar (needed to load it)")
    d.add_argument("--jsonl", action="store_true",
                   help="stdin has one JSON array per line; print one JSON string per line "
                        "(default: stdin is one JSON array, the text is written as is)")
    d.add_argument("--errors", choices=("strict", "replace"), default="replace",
                   help="bytes that are not valid UTF-8: 'replace' with U+FFFD (default, as "
                        "tiktoken) or 'strict' (an error)")
    d.add_argument("--cpu", action="store_true", help="use the CPU reference instead of the GPU")
    add_device_args(d)
    add_tokenizer_arguments(d, help="use the tokenizer service at HOST:PORT instead of a local "
                            "vocabulary (the same output as --vocab with its vocabulary)")
    d.set_defaults(func=cmd_decode)


def _encoding(args):
    if args.tokenizer:  # the gRPC service: a client with the same API and the same output
        return client_from_args(args)
    if args.vocab is None:
        raise UserFacingError("give --vocab V (a local vocabulary) or --tokenizer HOST:PORT")
    from .encoding import get_encoding
    from .vocab import VocabularyError, load_vocabulary
    try:
        vocab = load_vocabulary(args.vocab, pattern=args.pattern)
    except VocabularyError as exc:
        raise UserFacingError(str(exc)) from None
    if args.cpu:
        return get_encoding(vocab, device="cpu")
    from istanbul.shaders.engine import default_device
    return get_encoding(vocab, device=default_device(args.adapter))


def _special_args(policy: str) -> dict:
    if policy == "allow":
        return {"allowed_special": "all", "disallowed_special": ()}
    if policy == "text":
        return {"allowed_special": set(), "disallowed_special": ()}
    return {"allowed_special": set(), "disallowed_special": "all"}


def cmd_encode(args) -> int:
    from .corpus_files import TEXT_FIELD, CorpusReader
    from .reference import DisallowedSpecialTokenError
    if args.text_field is not None and not (args.jsonl or args.files
                                            or args.format not in ("auto", "text")):
        raise UserFacingError("--text-field applies to JSON, Parquet or Arrow input: add "
                              "--jsonl (stdin), or give such FILES")
    field = TEXT_FIELD if args.text_field is None else args.text_field
    windows = _window_args(args)
    corpus = None
    if args.files or args.jsonl or args.format != "auto":
        fmt = "jsonl" if args.jsonl and args.format == "auto" else args.format
        corpus = CorpusReader(args.files or ["-"], format=fmt, text_field=field,
                              skip_bad=None)
    enc = _encoding(args)
    special = _special_args(args.special)
    try:
        if windows is not None:
            batches = _batches(corpus) if corpus is not None else [[_stdin_document()]]
            first = 0
            for batch in batches:
                _write_windows(enc, batch, first, *windows, special)
                first += len(batch)
            return 0
        if corpus is not None:
            for batch in _batches(corpus):
                ids, offsets = enc.encode_batch_flat(batch, **special)
                flat = ids.tolist()
                sys.stdout.write("".join(json.dumps(flat[offsets[i]:offsets[i + 1]]) + "\n"
                                         for i in range(len(batch))))
            return 0
        raw = sys.stdin.buffer.read()
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            ids = enc.encode_bytes(raw)  # raw bytes: special-token text is ordinary text
        else:
            ids = enc.encode(text, **special)
    except DisallowedSpecialTokenError as exc:
        first = str(exc).splitlines()[0]
        raise UserFacingError(f"{first} Pass --special allow or --special text.") from None
    sys.stdout.write(json.dumps(ids) + "\n")
    return 0


def _window_args(args) -> tuple | None:
    """(N, M) of --chunk N --overlap M, checked before any work; None without --chunk."""
    if args.chunk is None:
        if args.overlap is not None:
            raise UserFacingError("--overlap M applies to windows: add --chunk N")
        return None
    from .chunking import check_window_arguments
    overlap = args.overlap or 0
    try:
        check_window_arguments(args.chunk, overlap)
    except ValueError as exc:
        message = str(exc).replace("max_tokens", "--chunk").replace("overlap", "--overlap", 1)
        raise UserFacingError(message) from None
    return args.chunk, overlap


def _stdin_document():
    """All of stdin as one document: text, or raw bytes when it is not UTF-8."""
    raw = sys.stdin.buffer.read()
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return raw


def _write_windows(enc, docs: list, first: int, max_tokens: int, overlap: int,
                   special: dict) -> None:
    """One JSON line per window of each document (documents numbered from `first`)."""
    if hasattr(enc, "chunk_batch"):   # the service
        chunked = enc.chunk_batch(docs, max_tokens, overlap, **special)
    else:
        from .chunking import chunk
        chunked = [chunk(enc, doc, max_tokens, overlap, **special) for doc in docs]
    lines = []
    for n, windows in enumerate(chunked, first):
        for c in windows:
            text = c.text.decode("utf-8", "replace") if isinstance(c.text, bytes) else c.text
            lines.append(json.dumps({"document": n, "ids": c.ids, "text": text,
                                     "start": c.start, "end": c.end,
                                     "byte_start": c.byte_start, "byte_end": c.byte_end},
                                    ensure_ascii=False) + "\n")
    sys.stdout.write("".join(lines))


def _batches(corpus):
    """The corpus's documents in lists of about ENCODE_BATCH_BYTES: text as str (so that the
    --special policy applies), bytes where a text file is not UTF-8 (encoded as raw bytes)."""
    batch, size = [], 0
    for doc in corpus.documents():
        data = doc.data
        if isinstance(data, bytes):
            try:
                data = data.decode("utf-8")
            except UnicodeDecodeError:
                pass
        batch.append(data)
        size += len(data)
        if size >= ENCODE_BATCH_BYTES:
            yield batch
            batch, size = [], 0
    if batch:
        yield batch


def _parse_ids(value, where: str) -> list[int]:
    if not isinstance(value, list) or not all(isinstance(v, int) and not isinstance(v, bool)
                                              for v in value):
        raise UserFacingError(f"{where}: expected a JSON array of integers")
    return value


def cmd_decode(args) -> int:
    from .encoding import InvalidTokenError
    enc = _encoding(args)
    text = sys.stdin.read()
    try:
        if args.jsonl:
            batch = []
            for lineno, line in enumerate(text.splitlines(), 1):
                if not line.strip():
                    continue
                try:
                    batch.append(_parse_ids(json.loads(line), f"stdin line {lineno}"))
                except json.JSONDecodeError as exc:
                    raise UserFacingError(f"stdin line {lineno}: not JSON ({exc.msg})") from None
            for doc in enc.decode_batch(batch, errors=args.errors):
                sys.stdout.write(json.dumps(doc, ensure_ascii=False) + "\n")
            return 0
        try:
            ids = _parse_ids(json.loads(text), "stdin")
        except json.JSONDecodeError as exc:
            raise UserFacingError(f"stdin: not JSON ({exc.msg}); expected one array of ids") \
                from None
        data = enc.decode_bytes(ids)
        if args.errors == "strict":
            data.decode("utf-8")
        sys.stdout.buffer.write(data if args.errors == "strict" else
                                data.decode("utf-8", errors="replace").encode("utf-8"))
        sys.stdout.flush()
    except InvalidTokenError as exc:
        raise UserFacingError(str(exc)) from None
    except UnicodeDecodeError as exc:
        raise UserFacingError(f"the tokens decode to bytes that are not valid UTF-8 at byte "
                              f"{exc.start}; use --errors replace") from None
    return 0
