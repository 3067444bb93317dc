"""bench/tokenize_bench.py tells the truth: its corpus has the four labelled categories at
their shares, the same bytes every time, prose that is not code; a tiny run measures every
category and the whole corpus on str and bytes input, with ids checked against tiktoken's."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import unicodedata
from pathlib import Path

import pytest

from tests.conftest import shared_vocab

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.tokenize_corpus import (CATEGORIES, LANGUAGES, Sentences, build_corpus,  # noqa: E402
                                   parse_mix)


def test_the_corpus_has_every_category_at_its_share_and_is_deterministic():
    corpus = build_corpus(0.4)
    comp = corpus.composition
    share = int(0.4 * (1 << 20)) // 4
    assert list(comp["categories"]) == list(CATEGORIES)
    for name, cat in comp["categories"].items():
        assert cat["documents"] > 0, name
        assert share * 0.98 <= cat["bytes"] <= share, (name, cat["bytes"])
        assert sum(s["bytes"] for s in cat["sources"].values()) == cat["bytes"]
    assert corpus.names() == list(CATEGORIES) + ["all"]
    assert sorted(corpus.docs_of("all")) == sorted(d for c in CATEGORIES
                                                    for d in corpus.docs_of(c))
    assert build_corpus(0.4).digest() == comp["sha256"]
    # code never stands in for prose: no .py or .h source among prose's
    assert not any(".py" in s or ".h" in s for s in comp["categories"]["prose"]["sources"])


def test_multilingual_text_is_in_many_scripts_with_their_punctuation():
    import random
    scripts = set()
    for lang in LANGUAGES:
        text = Sentences(lang, random.Random(1)).document()
        scripts |= {unicodedata.name(ch).split()[0] for ch in text if ch.isalpha()}
    for script in ("CJK", "HIRAGANA", "HANGUL", "THAI", "ARABIC", "DEVANAGARI", "CYRILLIC",
                   "GREEK", "HEBREW", "LATIN"):
        assert script in scripts
    zh = Sentences("zh", random.Random(2)).sentence()
    assert " " not in zh and zh.endswith(("。", "？"))


def test_mix_names_only_known_categories():
    assert parse_mix("prose=1,code=3") == {"prose": 0.25, "code": 0.75}
    with pytest.raises(ValueError, match="unknown category 'poetry'"):
        parse_mix("poetry=1")


def test_a_tiny_run_measures_every_category_on_str_and_bytes(tmp_path):
    vocab = shared_vocab("gpt2.tiktoken")
    peers = [p for p, module in (("gigatoken", "gigatoken"), ("hf", "tokenizers"))
             if importlib.util.find_spec(module)]
    out = tmp_path / "report"
    proc = subprocess.run(
        [sys.executable, str(REPO / "bench" / "tokenize_bench.py"), "--mb", "0.5",
         "--vocab", "gpt2", "--vocab-dir", str(vocab.parent), "--passes", "1",
         "--peers", ",".join(peers) or "none", "--no-extras", "--out", str(out)],
        cwd=REPO, capture_output=True, text=True, timeout=300,
        env={**os.environ, "XDG_RUNTIME_DIR": os.environ.get("XDG_RUNTIME_DIR", "/tmp")})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads((out / "tokenize.json").read_text())
    assert set(result["corpus"]["categories"]) == set(CATEGORIES)
    cells = result["vocabs"]["gpt2"]["cells"]
    assert list(cells) == list(CATEGORIES) + ["all"]
    wanted = {"istanbul str", "istanbul bytes", "tiktoken str"}
    wanted |= {"gigatoken str", "gigatoken bytes"} if "gigatoken" in peers else set()
    wanted |= {"hf str"} if "hf" in peers else set()
    for cat, cell in cells.items():
        assert set(cell["impls"]) == wanted, cat
        for label, impl in cell["impls"].items():
            assert impl["docs_differing"] == 0, (cat, label)
            assert len(impl["seconds"]) == 1 and impl["MBps"] > 0, (cat, label)
    md = (out / "tokenize.md").read_text()
    assert "| gpt2 | adversarial |" in md and "istanbul bytes" in md
    assert "Every document of every implementation and input kind has tiktoken's ids." in md


def test_every_timed_str_call_gets_documents_no_library_has_seen():
    """CPython keeps a str's UTF-8 once a C extension asks for it: the reference (tiktoken)
    would otherwise hand every later str implementation its input encoded for free."""
    import numpy as np
    from bench.tokenize_bench import Batch, Group, Impl, interleaved

    docs = ["héllo wörld " * 50, "plain ascii", "日本語のテキスト" * 20]
    raw = [d.encode() for d in docs]
    seen: list[list[str]] = []   # the objects themselves, kept alive: ids are not reused

    def run(b):
        assert b.docs == docs
        seen.append(list(b.docs))
        return np.zeros(0, np.int64), np.zeros(len(b.docs) + 1, np.int64)

    flat = lambda r: r  # noqa: E731
    reference = Impl("reference str", run, flat)
    timed = Impl("timed str", run, flat)
    batch = Batch("t", list(docs), raw, sum(map(len, raw)))
    interleaved([Group([reference]), Group([timed])], batch, passes=3, reference=reference)
    timed_calls = seen[2:]   # after the warm-up pass's reference and check calls
    assert len(timed_calls) == 6
    ids = [id(d) for call in timed_calls for d in call]
    assert len(set(ids)) == len(ids), "a timed call saw str objects an earlier call had"
