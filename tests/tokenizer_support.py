"""Shared pieces of the tokenizer tests: corpora, tricky inputs, a small deterministic BPE
trainer (so exactness is always tested on vocabularies the project trains itself, even where
../shared/vocab is absent) and tiktoken twins of our vocabularies.

Everything expensive is cached per process (lru_cache), so test modules can share it.
"""

from __future__ import annotations

import atexit
import shutil
import sysconfig
import tempfile
from collections import Counter
from functools import lru_cache
from pathlib import Path

import regex

from tokenizer_svc.patterns import ENDOFTEXT, PATTERNS
from tokenizer_svc.reference import exact_pattern
from tokenizer_svc.vocab import Vocabulary, load_vocabulary, save_vocabulary

STDLIB = Path(sysconfig.get_paths()["stdlib"])
TRAIN_FILES = ("textwrap.py", "string.py", "shlex.py", "fnmatch.py", "colorsys.py", "bisect.py",
               "heapq.py", "glob.py", "keyword.py", "this.py")

# Short original sentences in several scripts (contractions, case changes, numbers, marks).
MULTILINGUAL = [
    "İstanbul'da yağmur yağıyor; ÇOK güzel bir gün değil mi? 2024'te 1.234.567 kişi geldi.",
    "Die Straße ist 12,5 km lang – das Wetter: WÖRTER, Wörter und ÄÖÜ.",
    "Les élèves n'ont pas compris l'exercice ; c'est très DIFFICILE !",
    "Это ПРОСТОЙ тест: 42 ежа и 7 котов.",
    "Η ΓΛΩΣΣΑ είναι ωραία· ΑΒΓ αβγ.",
    "日本語の文章です。東京は大きい都市です！カタカナとひらがな。",
    "中文文本测试，包括标点符号。一二三四五六七八九十。",
    "한국어 문장입니다. 서울은 큰 도시입니다!",
    "هذا نص عربي قصير، مع أرقام ٣٤٥ وعلامات.",
    "זה טקסט בעברית עם ניקוד: שָׁלוֹם",
    "यह हिंदी का एक वाक्य है। संख्या ४२।",
    "นี่คือประโยคภาษาไทย ที่ไม่มีช่องว่างระหว่างคำ",
    "Emoji: 👩‍👩‍👧‍👦 👍🏽 🏳️‍🌈 ❤️ family done.",
    "Combining: e\u0301 a\u0308\u0304 ǅungla ǈ Ǌ ʕ ꟲ ᾈ ﬁ ﬃ",
    "I'm sure they'LL say it's FINE, WE'VE DONE IT, you'd agree, ſ's 'ſ",
]

# Inputs chosen for the pre-tokenizer rules' corners.
TRICKY = [
    "", " ", "  ", "\n", "\r\n", "\t", "a", "'", "''", "'s", "'S", "'ſ", "'LL", "'Ll", "'ve",
    "don't DON'T Don'T dOn'T", "I'M you'RE he'S we'D they'VE it'LL", "abc's'", "x'y",
    "hello world", "hello  world", "hello   \n\n  world  ", "trailing   ", "trailing\n\n",
    "  leading", "\n\n\nx", "a\r\nb\r\n\r\nc", " \r\n \r\n ", "x \n y \r z",
    "12345678901234", "1 22 333 4444 55555", "x1y22z333", "3.14159 -2e10 0x1F",
    "$100 /path/to/file //x ///\n/ \n//", "a/b", "!!!???...", "a!b?c.", " !x", "!\n\n/x",
    "HELLOworld helloWORLD HelloWorld hELLO", "ABCªDEF xyzABC", "ǅemal ǄEMAL ǆemal",
    "\u0301", "a\u0301\u0301b", "!\u0301", " \u0301x", "\u0301 \u0301", "x\u200dy",
    "👩‍💻👨‍👩‍👧", "🇹🇷🇺🇸", "\u00a0\u00a0x", "\u3000テスト\u3000", "\u2028\u2029\x85\x0b\x0c",
    "tab\tafter\t\tdouble", "mixed \t \n \r\n end", "'\n'", "' s", "\t\n\t\n", "a" * 70,
    "ab" * 40 + " " + "cd" * 50, "€€€€€€", "x" + " " * 100 + "y", "\n" * 67 + "z",
]


def long_runs(n: int = 10_000) -> list[str]:
    """Runs of n (10k: the issue's list) of one kind, plus a few mixed ends."""
    h = n // 2
    return [" " * n, "\n" * n, "\r\n" * h, "\t" * n, "7" * n, "a" * n, "x" + " " * n + "x",
            "\n" * h + "q", "1" * (n - 1) + "a", " " * h + "\n" * h + " " * h,
            "ab " * (n // 3), "Aa" * h]


@lru_cache(maxsize=1)
def stdlib_text() -> str:
    parts = []
    for name in TRAIN_FILES:
        path = STDLIB / name
        if path.is_file():
            parts.append(path.read_text(encoding="utf-8", errors="replace"))
    return "\n".join(parts)


def corpus_docs() -> list[str]:
    """Real text: stdlib sources in lines of code plus the multilingual sentences."""
    text = stdlib_text()
    lines = text.splitlines(keepends=True)
    docs = ["".join(lines[i:i + 40]) for i in range(0, len(lines), 40)]
    return docs + MULTILINGUAL


def megabyte_document() -> str:
    base = stdlib_text() + "\n".join(MULTILINGUAL * 20)
    return (base * (1_000_000 // len(base) + 1))[:1_000_000]


def train_bpe(texts: list[str], pattern: str, n_merges: int) -> dict:
    """A plain byte-level BPE trainer: count adjacent pairs inside pre-tokenized pieces,
    merge the most frequent (ties: the smallest (left, right) bytes), repeat.

    Deterministic; rank = order of discovery after the 256 single bytes.
    """
    pre = regex.compile(exact_pattern(pattern))
    words = Counter(p.encode("utf-8") for t in texts for p in pre.findall(t))
    ranks = {bytes([i]): i for i in range(256)}
    seqs = {w: [bytes([b]) for b in w] for w in words}
    pair_count: Counter = Counter()
    where: dict = {}
    for w, c in words.items():
        s = seqs[w]
        for a, b in zip(s, s[1:]):
            pair_count[(a, b)] += c
            where.setdefault((a, b), set()).add(w)
    for _ in range(n_merges):
        if not pair_count:
            break
        best = min(pair_count.items(), key=lambda kv: (-kv[1], kv[0]))[0]
        if pair_count[best] < 2:
            break
        merged = best[0] + best[1]
        if merged not in ranks:
            ranks[merged] = len(ranks)
        for w in list(where.get(best, ())):
            s, c = seqs[w], words[w]
            for a, b in zip(s, s[1:]):
                pair_count[(a, b)] -= c
                if pair_count[(a, b)] <= 0:
                    del pair_count[(a, b)]
                where.get((a, b), set()).discard(w)
            out, i = [], 0
            while i < len(s):
                if i + 1 < len(s) and (s[i], s[i + 1]) == best:
                    out.append(merged)
                    i += 2
                else:
                    out.append(s[i])
                    i += 1
            seqs[w] = out
            for a, b in zip(out, out[1:]):
                pair_count[(a, b)] += c
                where.setdefault((a, b), set()).add(w)
    return ranks


CUSTOM_PATTERN = r"""[A-Za-z]+|[0-9]{1,2}|\s+|[^\sA-Za-z0-9]+"""


_TRAINED_DIR: list = []


def trained_dir() -> str:
    if not _TRAINED_DIR:
        _TRAINED_DIR.append(tempfile.mkdtemp(prefix="istanbul-trained-"))
        atexit.register(shutil.rmtree, _TRAINED_DIR[0], True)
    return _TRAINED_DIR[0]


@lru_cache(maxsize=None)
def trained_vocab_path(pattern_name: str, directory: str | None = None) -> Path:
    """Train a vocabulary with `pattern_name` (gpt2, cl100k, o200k or "custom"), save it as
    .tiktoken + sidecar, return the path (load it with load_vocabulary)."""
    directory = directory or trained_dir()
    pattern = CUSTOM_PATTERN if pattern_name == "custom" else PATTERNS[pattern_name]
    texts = corpus_docs() + MULTILINGUAL * 5
    ranks = train_bpe(texts, pattern if pattern_name == "custom" else pattern, 400)
    vocab = Vocabulary(name=f"trained-{pattern_name}", ranks=ranks,
                       pattern=pattern, special_tokens={ENDOFTEXT: len(ranks)})
    path = Path(directory) / f"trained-{pattern_name}.tiktoken"
    save_vocabulary(vocab, path)
    return path


def load_trained(pattern_name: str) -> Vocabulary:
    return load_vocabulary(trained_vocab_path(pattern_name))


SHARED = ("gpt2", "cl100k_base", "o200k_base")
TRAINED = ("trained-gpt2", "trained-cl100k", "trained-o200k", "trained-custom")


def vocabulary_for(spec: str) -> Vocabulary:
    """A shared real vocabulary (skips the test when ../shared/vocab is absent) or a trained one."""
    if spec.startswith("trained-"):
        return load_trained(spec.removeprefix("trained-"))
    from tests.conftest import shared_vocab
    return load_vocabulary(shared_vocab(f"{spec}.tiktoken"))


def tiktoken_twin(vocab: Vocabulary):
    """tiktoken's own Encoding for the same ranks, pattern and special tokens."""
    import tiktoken
    return tiktoken.Encoding(vocab.name, pat_str=vocab.pattern, mergeable_ranks=vocab.ranks,
                             special_tokens=vocab.special_tokens)
