"""Ladder entries for the BPE tokenizer kernels (bpe_encode/scan/compact/decode.wgsl, the
encoder's UTF-8 check included).

The launches run the family's op classes through their public entry points
(`GpuEncoder.encode_docs`, `GpuScan.record`, `GpuDecoder.decode`), the ones the tokenizer
service runs, so the ladder checks the served path; the encoder and decoder submit and read
back themselves and report their GPU time from their profiles. References (reference.py) are
exact: plain-Python BPE for encoding, numpy for the scan, the vocabulary's bytes for decoding.

The vocabulary: cl100k_base / o200k_base / gpt2 when their `.tiktoken` files are in
$ISTANBUL_VOCAB_DIR or ~/.cache/istanbul/vocab (where `istanbul vocab fetch` puts them), else
a small synthetic one (the 256 bytes plus the Python standard library's most frequent 2- to
6-byte strings, each a token made of a shorter token and a byte) so the ladder runs on any
machine. Either has one special token, <|endoftext|>, after its last rank.

Inputs stay small (no piece longer than 130 bytes; on llvmpipe the encoder works in budgeted
rounds, and tests/test_tokenizer_gpu.py covers long runs); the `bench` variant is 4 MB of
text.
"""

from __future__ import annotations

import base64
import sysconfig
from collections import Counter
from functools import lru_cache
from pathlib import Path

import numpy as np

from ... import settings
from ...ladder import KernelCase, Launch, register
from . import reference
from .patterns import PATTERN_IDS
from .tables import RankVocabulary, VocabTables

WORDS = ("the of and to in is for def return self if else None import class from with as "
         "not print value data index Istanbul İstanbul ÇOK güzel straße ÄÖÜ naïve 東京 "
         "日本語 한국어 русский ελληνικά عربي עברית हिन्दी ไทย don't WE'LL it's ſ's "
         "x1 42 3.14 12345678 $5 /path //x ... !!! (a) [b] {c} 👍🏽 👩‍💻").split()
SEPARATORS = (" ", " ", " ", "  ", "\n", "\n    ", "\r\n", "\t", ", ", ". ", "\n\n")


KNOWN_FILES = {"gpt2": "gpt2.tiktoken", "cl100k": "cl100k_base.tiktoken",
               "o200k": "o200k_base.tiktoken"}


def vocab_dirs() -> list[Path]:
    """Where the real vocabularies are looked for: $ISTANBUL_VOCAB_DIR, ~/.cache/istanbul/vocab."""
    own = settings.read("ISTANBUL_VOCAB_DIR")
    return ([own] if own is not None else []) + [Path.home() / ".cache" / "istanbul" / "vocab"]


def read_tiktoken(path: Path) -> dict:
    """The ranks of a `.tiktoken` file: one `base64-token rank` pair per line."""
    ranks = {}
    for line in path.read_bytes().splitlines():
        if line.strip():
            token, rank = line.split()
            ranks[base64.b64decode(token)] = int(rank)
    return ranks


def synthetic_ranks() -> dict:
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    text = b"".join((stdlib / f).read_bytes() for f in ("textwrap.py", "string.py", "shlex.py")
                    if (stdlib / f).is_file())
    ranks = {bytes([i]): i for i in range(256)}
    for n in range(2, 7):
        grams = Counter(text[i:i + n] for i in range(0, len(text) - n, 1))
        for gram, _ in grams.most_common(600):
            if gram[:-1] in ranks and gram not in ranks:
                ranks[gram] = len(ranks)
    return ranks


@lru_cache(maxsize=None)
def ladder_vocab(pattern: str) -> RankVocabulary:
    found = next((d / KNOWN_FILES[pattern] for d in vocab_dirs()
                  if (d / KNOWN_FILES[pattern]).is_file()), None)
    ranks = read_tiktoken(found) if found else synthetic_ranks()
    name = found.stem if found else f"ladder-{pattern}"
    return RankVocabulary(name=name, ranks=ranks, source=str(found or ""),
                          special_tokens={"<|endoftext|>": max(ranks.values()) + 1})


@lru_cache(maxsize=None)
def _tables(pattern: str):
    return VocabTables.build(ladder_vocab(pattern))


def _docs(rng, variant: str) -> list[str]:
    if variant == "bench":
        n_docs, words = 2000, 400   # ~4 MB
    elif variant == "many":
        n_docs, words = 3000, 2
    elif variant == "small":   # < 4 KB: bpe_scan_compact's one-workgroup path
        n_docs, words = 4, 60
    else:
        n_docs, words = 40, 60
    docs = []
    for _ in range(n_docs):
        parts = []
        for _ in range(rng.integers(0, words + 1)):
            if variant == "unicode" and rng.random() < 0.3:
                parts.append("".join(chr(int(c)) for c in rng.integers(0x20, 0x30000, 4)
                                     if not 0xD800 <= c < 0xE000))
            elif variant == "long" and rng.random() < 0.05:
                parts.append(str(rng.choice(["a", " ", "7", "!", "\n", "日"])) *
                             int(rng.integers(65, 130)))  # > 64: the long-piece path
            else:
                parts.append(str(rng.choice(WORDS)))
            parts.append(str(rng.choice(SEPARATORS)))
        docs.append("".join(parts))
    return docs


def _encode_inputs(pattern):
    def inputs(rng, variant):
        docs = _docs(rng, variant)
        data = [d.encode("utf-8") for d in docs]
        return {"docs": docs, "data": b"".join(data), "pattern": pattern,
                "starts": np.concatenate([[0], np.cumsum([len(d) for d in data])])}
    return inputs


def _encode_launch(dev, inp):
    """The family's encoder, through its public entry point (budgeted rounds on software
    adapters, as served), timed by its per-dispatch GPU profile."""
    from .encode import GpuEncoder
    enc = GpuEncoder(dev, _tables(inp["pattern"]), inp["pattern"])
    enc.profile = True
    data, starts = np.frombuffer(inp["data"], np.uint8), inp["starts"]
    result = {}

    def encode(rec):   # the encoder submits and reads back itself; `rec` stays empty
        result["ids"], result["offsets"] = enc.encode_docs(data, starts)

    return Launch(encode=encode,
                  read=lambda: {"ids": result["ids"],
                                "offsets": np.asarray(result["offsets"], np.int64)},
                  gpu_seconds=lambda: sum(enc.last_profile.gpu.values()))


def _encode_reference(inp):
    ids, offsets = reference.encode(ladder_vocab(inp["pattern"]).ranks, inp["pattern"],
                                    inp["docs"])
    return {"ids": ids, "offsets": offsets}


for _pattern in ("gpt2", "cl100k", "o200k"):
    register(KernelCase(
        name=f"bpe_encode_{_pattern}", family="bpe", precision="exact",
        description=f"GPU pre-tokenizer ({_pattern} rules) + BPE merges + compaction",
        kernels=[("bpe_encode.wgsl", k, {"PATTERN": PATTERN_IDS[_pattern]})
                 for k in ("bpe_cuts", "bpe_digit_cuts", "bpe_pretok")] +
                [("bpe_encode.wgsl", k) for k in ("bpe_fill_none", "bpe_merge_long",
                                                  "bpe_long_stitch", "bpe_long_copy",
                                                  "bpe_merge_pieces", "bpe_merge_long_wg")] +
                # the workgroup merge's short build (encode.WG_SHORT_LONG_*)
                [("bpe_encode.wgsl", "bpe_merge_long_wg", {"LW_MAX": 256, "LW_WG": 32})] +
                [("bpe_compact.wgsl", k) for k in ("bpe_compact", "bpe_scan_compact")],
        inputs=_encode_inputs(_pattern), launch=_encode_launch, reference=_encode_reference,
        variants=("random", "unicode", "long", "many", "small"),
        bytes=lambda inp: 21.0 * len(inp["data"])))


# ---- UTF-8 check ---------------------------------------------------------------------------

# Byte strings Python's strict decoder rejects, one per way to fail (bytes.decode("utf-8")),
# and boundary cases it accepts.
UTF8_INVALID_FORMS = (
    b"\x80", b"\xbf", b"\x80\x80\x80\x80",                      # stray continuation bytes
    b"\xc0\xaf", b"\xc1\xbf", b"\xe0\x80\xaf", b"\xe0\x9f\xbf",     # overlong forms
    b"\xf0\x80\x80\xaf", b"\xf0\x8f\xbf\xbf",
    b"\xed\xa0\x80", b"\xed\xbf\xbf",                              # surrogates
    b"\xf4\x90\x80\x80", b"\xf5\x80\x80\x80", b"\xf8\x88\x80\x80\x80",  # above U+10FFFF
    b"\xfe", b"\xff",
    b"\xc3", b"\xe6\x97", b"\xf0\x9f\x98",                          # cut short
    b"\xc3\x28", b"\xe6\x28\xa5", b"\xe6\x97\x28", b"\xf0\x9f\x28\x80",  # a non-continuation
    b"\xf0\x9f\x98\x28", b"\xc3\xa9\x80", b"\xf0\x9f\x98\x80\x80")  # one continuation too many
UTF8_VALID_EDGES = (b"\xc2\x80", b"\xdf\xbf", b"\xe0\xa0\x80", b"\xed\x9f\xbf", b"\xee\x80\x80",
                    b"\xef\xbf\xbf", b"\xf0\x90\x80\x80", b"\xf4\x8f\xbf\xbf", b"\x7f", b"\x00")


def utf8_adversarial(rng) -> list[bytes]:
    """Documents with each invalid form and valid edge at a document's start, middle (every
    offset around bpe_utf8_check's 16-byte spans) and end, after ASCII or multi-byte text;
    valid characters cut in two across a document boundary; empty documents between."""
    docs = []
    pads = (b"", b"a", b"xyz", "é".encode(), "日本".encode(), "👍".encode())
    for form in UTF8_INVALID_FORMS + UTF8_VALID_EDGES:
        for lead in range(0, 20, 3):
            pad = pads[int(rng.integers(len(pads)))]
            docs.append(b"q" * lead + pad + form + pads[int(rng.integers(len(pads)))])
        docs += [form, form + b"tail", b"head" + form, b""]
    for char in ("é", "日", "👍"):
        raw = char.encode()
        for cut in range(1, len(raw)):
            docs += [b"x" * 15 + raw[:cut], raw[cut:] + b"y", b""]
    return docs


def utf8_valid_prefixes(docs: list[bytes]) -> np.ndarray:
    """Per document the length of its longest valid UTF-8 prefix (Python's decoder; the
    document's length when it is valid): the oracle of bpe_utf8_check."""
    out = []
    for doc in docs:
        try:
            doc.decode("utf-8")
            out.append(len(doc))
        except UnicodeDecodeError as exc:
            out.append(exc.start)
    return np.array(out, np.int64)


def gpu_valid_prefixes(encoder, docs: list[bytes]) -> np.ndarray:
    """The same from `encoder.encode_docs(check_utf8=True)` (InvalidUtf8 names the first
    invalid byte): called again from the document after each invalid one, so every document
    gets its answer."""
    from .encode import InvalidUtf8
    out, first = [], 0
    while first < len(docs):
        rest = docs[first:]
        starts = np.concatenate([[0], np.cumsum([len(d) for d in rest])]).astype(np.int64)
        try:
            encoder.encode_docs(np.frombuffer(b"".join(rest), np.uint8), starts,
                                check_utf8=True)
        except InvalidUtf8 as exc:
            d = int(np.searchsorted(starts, exc.position, side="right")) - 1
            out += [len(x) for x in rest[:d]] + [exc.position - int(starts[d])]
            first += d + 1
        else:
            out += [len(x) for x in rest]
            break
    return np.array(out, np.int64)


def _utf8_inputs(rng, variant):
    if variant == "adversarial":
        docs = utf8_adversarial(rng)
    elif variant == "random":   # random bytes, mostly short
        docs = [rng.integers(0, 256, int(rng.integers(0, 12))).astype(np.uint8).tobytes()
                for _ in range(60)]
    else:   # valid text in many scripts ("bench": 4 MB) with a few flipped bytes ("flips")
        docs = [d.encode() for d in _docs(rng, "bench" if variant == "bench" else "unicode")]
        if variant == "flips":
            for k in rng.choice(len(docs), 6, replace=False):
                d = bytearray(docs[k])
                if d:
                    d[int(rng.integers(len(d)))] ^= 1 << int(rng.integers(6, 8))
                docs[k] = bytes(d)
    return {"docs": docs}


def _utf8_launch(dev, inp):
    """The encoder's check through its public entry point (encode_docs(check_utf8=True)),
    called again after each invalid document; timed by its per-dispatch GPU profile."""
    from .encode import GpuEncoder
    enc = GpuEncoder(dev, _tables("o200k"), "o200k")
    enc.profile = True
    result = {}

    def encode(rec):   # the encoder submits and reads back itself; `rec` stays empty
        result["valid"] = gpu_valid_prefixes(enc, inp["docs"])

    return Launch(encode=encode, read=lambda: dict(result),
                  gpu_seconds=lambda: enc.last_profile.gpu.get("utf8_check", 0.0))


register(KernelCase(
    name="bpe_utf8_check", family="bpe", precision="exact",
    description="is every document valid UTF-8 (Python's strict decoder): the first invalid "
                "byte, in the encoder's counters",
    kernels=[("bpe_encode.wgsl", "bpe_utf8_check"), ("bpe_encode.wgsl", "bpe_fill_none")],
    inputs=_utf8_inputs, launch=_utf8_launch,
    reference=lambda inp: {"valid": utf8_valid_prefixes(inp["docs"])},
    variants=("adversarial", "random", "unicode", "flips"),
    bytes=lambda inp: float(sum(len(d) for d in inp["docs"]))))


# ---- scan -------------------------------------------------------------------------------

SCAN_SIZES = {"random": 100_003, "one": 1, "block": 1024, "deep": 1_500_000, "bench": 1 << 24}


def _scan_inputs(rng, variant):
    n = SCAN_SIZES[variant]
    return {"x": rng.integers(0, 1000, n).astype(np.uint32)}


def _scan_launch(dev, inp):
    from .scan import BufferPool, GpuScan
    pool = BufferPool(dev)
    scan = GpuScan(dev, pool)
    n = inp["x"].size
    src = dev.upload(inp["x"])
    dst = dev.empty(n + 1, np.uint32)
    return Launch(encode=lambda rec: scan.record(rec, src, n, dst, mode=0),
                  read=lambda: {"excl": dev.download(dst)})


register(KernelCase(
    name="bpe_scan", family="bpe", precision="exact",
    description="exclusive prefix sum of u32 (n + 1 outputs, the last is the total)",
    kernels=[("bpe_scan.wgsl", "scan_blocks", {"MODE": 0}), ("bpe_scan.wgsl", "scan_add")],
    inputs=_scan_inputs, launch=_scan_launch,
    reference=lambda inp: {"excl": reference.exclusive_scan(inp["x"])},
    variants=("random", "one", "block", "deep"), bytes=lambda inp: 12.0 * inp["x"].size))


# ---- decode -----------------------------------------------------------------------------

def _decode_inputs(rng, variant):
    # "narrow": gpt2's vocabulary (under 65,536 ids) uploads its ids two per word
    pattern = "gpt2" if variant == "narrow" else "o200k"
    vocab = ladder_vocab(pattern)
    n = {"random": 50_000, "narrow": 50_001, "one": 1, "bench": 4_000_000}[variant]
    ids = np.array(sorted(vocab.decoder), dtype=np.uint32)
    return {"ids": ids[rng.integers(0, ids.size, n)], "pattern": pattern}


def _decode_launch(dev, inp):
    """The family's decoder, through its public entry point."""
    from .decode import GpuDecoder
    tables = _tables(inp["pattern"])
    dec = GpuDecoder(dev, tables, dev.upload(tables.vocab_words))
    dec.profile = True
    result = {}

    def encode(rec):   # the decoder submits and reads back itself; `rec` stays empty
        dec.gpu_times = []
        result["bytes"] = np.frombuffer(dec.decode(inp["ids"]), np.uint8)

    return Launch(encode=encode, read=lambda: dict(result),
                  gpu_seconds=lambda: sum(t for _, t in dec.gpu_times))


def _decode_reference(inp):
    return {"bytes": reference.decode(ladder_vocab(inp["pattern"]).decoder, inp["ids"])}


register(KernelCase(
    name="bpe_decode", family="bpe", precision="exact",
    description="ids -> bytes: token lengths, prefix sum, gather (ids of vocabularies under "
                "65,536 two per word)",
    kernels=[("bpe_decode.wgsl", "dec_lengths"), ("bpe_decode.wgsl", "dec_gather"),
             ("bpe_decode.wgsl", "dec_total"), ("bpe_decode.wgsl", "dec_bounds")],
    inputs=_decode_inputs, launch=_decode_launch, reference=_decode_reference,
    variants=("random", "narrow", "one"),
    bytes=lambda inp: 4.0 * inp["ids"].size * 4 + 8.0 * inp["ids"].size))
