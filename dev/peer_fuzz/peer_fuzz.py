"""Differential fuzz: istanbul's encode on this machine's device against the peer a user
would compare it with (tiktoken for .tiktoken vocabularies, Hugging Face tokenizers for a
tokenizer.json), on random documents built to hit the pre-tokenizers' corners.

    python dev/peer_fuzz/peer_fuzz.py --vocab PATH [--seconds 300] [--seed 1] [--batch 64]
                            [--out DIR]

A document is 1-40 pieces, each one of: a listed troublemaker (contractions in every case,
whitespace and newline runs, digit runs, combining marks, ligatures, Turkish dotted I,
scripts without spaces, emoji ZWJ sequences and flags, zero-width and exotic spaces,
special-token text, code); 1-6 random assigned code points from any plane; printable ASCII;
one code point repeated 2-40 times; a space run; or rarely a 200-3,000 character run of one
character (a long piece). Documents go through `encode_batch(..., allowed_special="all")`
64 at a time (the service's path); every id list is compared. Mismatching documents (the
first 5) are written to OUT/mismatch_*.json with both id lists. Exit status 1 on any
mismatch. This is a search for bugs, not a test: the suite's hypothesis differentials run
small, deterministic versions of it.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
import unicodedata
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

TROUBLE = ["'s", "'S", "'ll", "'LL", "'Re", "'ve", "'d", "'m", "'t", " ", "  ", "\n", "\r\n",
           "\t", "\n\n\n", "   \n", "123", "4567", "1234567890", "3.14", "-", "_", "...", "!!",
           "é", "e\u0301", "ß", "İ", "ﬁ", "Ⅻ", "١٢٣", "𝟙𝟚", "中文", "日本語", "한국어", "👍🏽",
           "👨\u200d👩\u200d👧", "🇹🇷", "\u200b", "\u00a0", "\u3000", "\u2028", "Hello", "WORLD",
           "camelCase", "snake_case", "<|endoftext|>", "<|fim_prefix|>",
           "<｜begin▁of▁sentence｜>", "def f(x):\n    return x", "http://a.b/c?d=e", "ÀÉÎÕÜ",
           "ǅ", "ᾈ", "ᵃ", "Ⓐ"]


class Documents:
    def __init__(self, seed: int):
        self.rng = random.Random(seed)
        self.assigned = [c for c in range(0x110000) if not 0xD800 <= c < 0xE000
                         and unicodedata.category(chr(c)) != "Cn"]

    def piece(self) -> str:
        rng, r = self.rng, self.rng.random()
        if r < 0.35:
            return rng.choice(TROUBLE)
        if r < 0.6:
            return "".join(chr(rng.choice(self.assigned)) for _ in range(rng.randint(1, 6)))
        if r < 0.8:
            return "".join(chr(rng.randint(0x20, 0x7E)) for _ in range(rng.randint(1, 12)))
        if r < 0.9:
            return chr(rng.choice(self.assigned)) * rng.randint(2, 40)
        if r < 0.97:
            return " " * rng.randint(1, 30) + rng.choice(["", "\n", "x", "\t"])
        return rng.choice(["a", "1", " ", "é", "中", "\n"]) * rng.randint(200, 3000)

    def document(self) -> str:
        return "".join(self.piece() for _ in range(self.rng.randint(1, 40)))


def peers(vocab: str):
    """(ours, theirs): functions from a list of documents to their id lists."""
    from tokenizer_svc.encoding import get_encoding
    ours = get_encoding(vocab)

    def mine(docs):
        return [list(ids) for ids in ours.encode_batch(docs, allowed_special="all")]

    if vocab.endswith(".json"):
        from tokenizers import Tokenizer
        hf = Tokenizer.from_file(vocab)
        return mine, lambda docs: [e.ids for e in hf.encode_batch(docs,
                                                                  add_special_tokens=False)]
    import tiktoken
    v = ours.vocab
    ref = tiktoken.Encoding(v.name, pat_str=v.pattern, mergeable_ranks=v.ranks,
                            special_tokens=v.special_tokens)
    return mine, lambda docs: ref.encode_batch(docs, allowed_special="all")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--vocab", required=True, help="a .tiktoken file or a tokenizer.json")
    p.add_argument("--seconds", type=float, default=300.0)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--out", type=Path, default=Path("."))
    args = p.parse_args()
    mine, theirs = peers(args.vocab)
    docs_of = Documents(args.seed)
    end, checked, bad, nbytes = time.monotonic() + args.seconds, 0, 0, 0
    while time.monotonic() < end:
        docs = [docs_of.document() for _ in range(args.batch)]
        for doc, ours, peer in zip(docs, mine(docs), theirs(docs)):
            checked += 1
            nbytes += len(doc.encode("utf-8", "surrogatepass"))
            if ours != peer:
                bad += 1
                if bad <= 5:
                    args.out.mkdir(parents=True, exist_ok=True)
                    (args.out / f"mismatch_{Path(args.vocab).stem}_{args.seed}_{bad}.json"
                     ).write_text(json.dumps({"doc": doc, "ours": ours, "peer": peer}))
    print(f"{Path(args.vocab).name} seed {args.seed}: {checked:,} documents "
          f"({nbytes / 1e6:.1f} MB), {bad} mismatches", flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
