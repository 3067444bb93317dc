"""istanbul as a drop-in for tiktoken and Hugging Face `tokenizers` (issue 17).

Every test compares with the real library: Unicode classes and normalizers read again out of
`tokenizers`, tokenizer.json files built here with `tokenizers` itself (a tiny BPE trained by
its BpeTrainer, then each component set), tiktoken twins of the project-trained vocabularies,
threads, pickling and both multiprocessing start methods.
"""

from __future__ import annotations

import json
import multiprocessing
import pickle
import threading
import unicodedata
import warnings

import numpy as np
import pytest
import regex
from hypothesis import HealthCheck, given, settings, strategies as st

from istanbul.shaders.kernels.bpe import unicode_table as U
from tokenizer_svc.encoding import Encoding, ForkedGpuWarning, InvalidTokenError, get_encoding
from tokenizer_svc.hf.normalize import build_normalizer
from tokenizer_svc.vocab import VocabularyError, load_vocabulary

from .tokenizer_support import MULTILINGUAL, TRICKY, corpus_docs, load_trained, tiktoken_twin

TEXTS = TRICKY + MULTILINGUAL + corpus_docs()[:4]
ALPHABET = st.sampled_from(list("abcXYZ 019.,!?'\n\t-_/日本語한국äöüßçİıΣς€😀"
                                "\u0301\u0558ＡⅫ<>|"))
# ByteLevel as the last pre-tokenizer step, without its regex
BYTES = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}


# ---- 1. Unicode tables per family: every code point in context (tables: test_tokenizer_unicode)

def gpt2_style_file(tmp_path, name="gpt2style.json", **edit):
    """A GPT-2-style tokenizer.json (ByteLevel with its regex) of the project-trained ranks."""
    from tokenizer_svc.hf.tokenizer_json import bytes_to_unicode
    ranks = load_trained("gpt2").ranks
    to_str = bytes_to_unicode()
    enc = lambda b: "".join(to_str[x] for x in b)  # noqa: E731
    merges = []
    for token, rank in sorted(ranks.items(), key=lambda kv: kv[1]):
        for k in range(1, len(token)):
            if rank >= 256 and ranks.get(token[:k], 1 << 30) < rank and \
                    ranks.get(token[k:], 1 << 30) < rank:
                merges.append(f"{enc(token[:k])} {enc(token[k:])}")
                break
    data = {"version": "1.0", "truncation": None, "padding": None, "added_tokens": [],
            "normalizer": None,
            "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False,
                              "trim_offsets": True, "use_regex": True},
            "post_processor": None,
            "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True,
                        "use_regex": True},
            "model": {"type": "BPE", "dropout": None, "unk_token": None,
                      "continuing_subword_prefix": None, "end_of_word_suffix": None,
                      "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                      "vocab": {enc(t): i for t, i in ranks.items()}, "merges": merges}}
    data.update(edit)
    path = tmp_path / name
    path.write_text(json.dumps(data, ensure_ascii=False), encoding="utf-8")
    return path


def assigned_docs() -> list[str]:
    """Every code point that is assigned for Python's regex module or for Oniguruma, in
    context (after a space, before "'s", before a digit), 20,000 per document."""
    table = U.load_table("tokenizers")
    known = np.zeros(U.MAX_CP, dtype=bool)
    for key in ("L", "M", "N", "P", "Symbol", "S", "Z", "Cc", "Cf"):
        known |= table.members(key)
    cps = [c for c in range(U.MAX_CP) if not 0xD800 <= c < 0xE000 and
           (known[c] or unicodedata.category(chr(c)) != "Cn" or
            regex.match(r"[\p{L}\p{N}\p{M}\p{P}\p{S}]", chr(c)))]
    cells = [f" {chr(c)}'s{chr(c)}1" for c in cps]
    return ["\n".join(cells[i:i + 20000]) for i in range(0, len(cells), 20000)]


def check_sweep(path, device, docs):
    from tokenizers import Tokenizer
    hf = Tokenizer.from_file(str(path))
    enc = get_encoding(load_vocabulary(path), device=device)
    want = [e.ids for e in hf.encode_batch(docs, add_special_tokens=False)]
    got = enc.encode_ordinary_batch(docs)
    for doc, g, w in zip(docs, got, want):
        if g != w:
            first = next(i for i, (a, b) in enumerate(zip(g, w)) if a != b)
            raise AssertionError(f"differs from tokenizers at token {first}: "
                                 f"{enc.decode_bytes(g[max(0, first - 3):first + 3])!r}")


@pytest.mark.slow
def test_every_assigned_code_point_in_context_gpt2_style(tmp_path, device):
    path = gpt2_style_file(tmp_path)
    assert get_encoding(path, device=device).backend.on_gpu_pretok  # the GPU's gpt2 rules
    check_sweep(path, device, assigned_docs())
    split = gpt2_style_file(tmp_path, "split.json", pre_tokenizer={
        "type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": r"\p{N}{1,3}"}, "behavior": "Isolated",
             "invert": False},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
             "use_regex": True}]})
    assert not get_encoding(split, device=device).backend.on_gpu_pretok  # CPU regex
    check_sweep(split, device, assigned_docs()[::3])


@pytest.mark.slow
def test_every_assigned_code_point_in_context_deepseek(device):
    from tests.conftest import shared_vocab
    check_sweep(shared_vocab("deepseek_tokenizer.json"), device, assigned_docs())


def test_issue_examples(tmp_path, device):
    from tokenizers import Tokenizer
    path = gpt2_style_file(tmp_path)
    enc = get_encoding(load_vocabulary(path), device=device)
    hf = Tokenizer.from_file(str(path))
    for text in ["\u0558's", " \u0558", "x\u0558y"]:
        assert enc.encode_ordinary(text) == hf.encode(text, add_special_tokens=False).ids


# ---- 2. threads ------------------------------------------------------------------------

def test_threads_share_one_encoding(device):
    """12 threads, two Encodings on one device, batches of 1..30 documents, encode and decode:
    every result equals the single-threaded one."""
    encs = [Encoding(load_trained("cl100k"), device=device),
            Encoding(load_trained("gpt2"), device=device)]
    docs = TEXTS * 2
    batches = [docs[i:i + n] for i, n in zip(range(0, 200, 7), [1, 3, 9, 17, 2, 30] * 6)
               if docs[i:i + n]]
    want = [[enc.encode_ordinary_batch(b) for b in batches] for enc in encs]
    want_decoded = [[enc.decode_bytes_batch(w) for w in ws] for enc, ws in zip(encs, want)]
    errors, results = [], {}

    def work(k: int):
        e = k % 2
        try:
            for rep in range(3):
                i = (k + rep) % len(batches)
                ids = encs[e].encode_ordinary_batch(batches[i])
                results[(k, rep)] = (e, i, ids, encs[e].decode_bytes_batch(ids))
        except BaseException as exc:  # noqa: BLE001 (reported below)
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert not errors, errors[0]
    assert len(results) == 36
    for e, i, ids, decoded in results.values():
        assert ids == want[e][i] and decoded == want_decoded[e][i]


# ---- 3. pickling and processes ---------------------------------------------------------

def _child_encode(args):
    enc, texts = args
    return enc.encode_ordinary_batch(texts)


def _forked_child(enc, queue):
    try:
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            ids = enc.encode_ordinary_batch(TEXTS)
        queue.put((ids, [str(w.message) for w in seen if w.category is ForkedGpuWarning]))
    except BaseException as exc:  # noqa: BLE001 (the parent checks it)
        queue.put(f"{type(exc).__name__}: {exc}")


def test_pickle_by_identity_and_lazy_gpu(tmp_path, device, monkeypatch):
    from collections import OrderedDict

    import tokenizer_svc.encoding as encoding_module
    monkeypatch.setattr(encoding_module, "_CACHE", OrderedDict())  # a receiver's empty cache
    vocab = load_trained("gpt2")
    enc = Encoding(vocab, device=device)
    data = pickle.dumps(enc)
    assert len(data) < 20_000 + len(pickle.dumps(vocab))
    again = pickle.loads(data)
    assert again._backend is None  # nothing built until it is used
    assert again.encode_ordinary_batch(TEXTS) == enc.encode_ordinary_batch(TEXTS)
    path = gpt2_style_file(tmp_path)
    hf_enc = get_encoding(path, device="cpu")
    blob = pickle.dumps(hf_enc)
    assert str(path).encode() in blob and len(blob) < 2000  # by path and hash, not by value
    assert pickle.loads(blob).encode_ordinary("héllo wörld") == \
        hf_enc.encode_ordinary("héllo wörld")
    path.write_text(path.read_text().replace('"ignore_merges": false', '"ignore_merges": true'))
    with pytest.raises(VocabularyError, match="not the one that was pickled"):
        pickle.loads(blob)


def test_pickle_known_vocabulary_by_name_or_file(monkeypatch):
    from tests.conftest import shared_vocab
    path = shared_vocab("gpt2.tiktoken")
    by_path = get_encoding(path, device="cpu")  # a known name, loaded from its file
    blob = pickle.dumps(by_path)
    assert len(blob) < 2000 and pickle.loads(blob).encode("hi <|endoftext|>",
                                                          allowed_special="all") == \
        by_path.encode("hi <|endoftext|>", allowed_special="all")
    monkeypatch.setenv("ISTANBUL_VOCAB_DIR", str(path.parent))
    by_name = get_encoding("gpt2", device="cpu")
    assert pickle.loads(pickle.dumps(by_name)).vocab.content_hash == by_name.vocab.content_hash


def test_spawn_children_rebuild_their_gpu_state(device):
    enc = Encoding(load_trained("gpt2"), device=device)
    want = enc.encode_ordinary_batch(TEXTS)
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        got = pool.map(_child_encode, [(enc, TEXTS)], chunksize=1)[0]
    assert got == want


def test_fork_after_gpu_use_keeps_working_on_the_cpu(device):
    # issue 52; tests/test_fork.py covers every method, pools, DataLoader, grandchildren
    enc = Encoding(load_trained("gpt2"), device=device)
    want = enc.encode_ordinary_batch(TEXTS)
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    child = ctx.Process(target=_forked_child, args=(enc, queue))
    child.start()
    result = queue.get(timeout=60)
    child.join(timeout=60)
    assert not isinstance(result, str), result
    ids, warned = result
    assert ids == want and len(warned) == 1 and "'spawn'" in warned[0], warned
    assert enc.backend.kind == "gpu" and enc.encode_ordinary_batch(TEXTS) == want
    cpu = Encoding(load_trained("gpt2"), device="cpu")  # the CPU reference forks fine
    with ctx.Pool(1) as pool:
        assert pool.map(_child_encode, [(cpu, TEXTS[:5])])[0] == \
            cpu.encode_ordinary_batch(TEXTS[:5])


# ---- 4. tokenizer.json components ------------------------------------------------------

@pytest.fixture(scope="module")
def trained_json(tmp_path_factory):
    """A tiny byte-level BPE trained by `tokenizers` itself, as a tokenizer.json dict."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=700, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(corpus_docs()[:40] + MULTILINGUAL * 3, trainer)
    return json.loads(tok.to_str())


def build(tmp_path, base: dict, name: str, **parts):
    data = json.loads(json.dumps(base))
    model = parts.pop("model", {})
    data["model"].update(model)
    data.update(parts)
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(data, ensure_ascii=False), encoding="utf-8")
    return path


def added(content, id_, **flags):
    item = {"id": id_, "content": content, "single_word": False, "lstrip": False,
            "rstrip": False, "normalized": False, "special": True}
    item.update(flags)
    return item


def assert_same_as_tokenizers(path, texts, device="cpu"):
    from tokenizers import Tokenizer
    hf = Tokenizer.from_file(str(path))
    enc = get_encoding(load_vocabulary(path), device=device)
    for text in texts:
        for special in (False, True):
            want = hf.encode(text, add_special_tokens=special).ids
            assert enc.encode_hf(text, add_special_tokens=special) == want, (path.name, text)
    assert enc.encode_hf_batch(texts) == [e.ids for e in hf.encode_batch(texts)]
    ids = [i for text in texts[:30] for i in hf.encode(text).ids]
    for skip in (True, False):
        assert enc.decode_hf(ids, skip_special_tokens=skip) == \
            hf.decode(ids, skip_special_tokens=skip)
    return enc, hf


COMPONENT_TEXTS = TRICKY[:40] + MULTILINGUAL + [
    "qzjv", "xqzjvx", " <s> hi <s>there</s>  ", "[DAY] monday [day]", "ABC abc Ａｂｃ ＡＢＣ",
    "e\u0301 é ﬁ ① ⅻ ㋿ \U00011935\U00011930 ΣΑΣ", "call me at 555 123 4567 or ٣٤٥",
    "tab\tsep  double  spaces", "x\U0001F600y 😀😀", "mask<mask>mask <mask> end",
]


@pytest.mark.parametrize("normalizer", [
    {"type": "NFC"}, {"type": "NFD"}, {"type": "NFKC"}, {"type": "NFKD"}, {"type": "Lowercase"},
    {"type": "Sequence", "normalizers": [{"type": "NFKC"}, {"type": "Lowercase"}]},
    {"type": "Replace", "pattern": {"String": " "}, "content": "_"},
    {"type": "Replace", "pattern": {"Regex": r"\s+"}, "content": " "},
    {"type": "Sequence", "normalizers": [{"type": "Prepend", "prepend": "Ġ"},
                                         {"type": "NFC"}]},
])
def test_normalizers_match_tokenizers(tmp_path, trained_json, normalizer):
    path = build(tmp_path, trained_json, "norm", normalizer=normalizer)
    assert_same_as_tokenizers(path, COMPONENT_TEXTS)


def test_bytes_input_with_a_normalizer(tmp_path, trained_json):
    path = build(tmp_path, trained_json, "normbytes", normalizer={"type": "NFKC"})
    enc = get_encoding(path, device="cpu")
    assert enc.encode_bytes("Ｈｉ ①".encode()) == enc.encode_ordinary("Ｈｉ ①") == \
        enc.encode_ordinary("Hi 1")
    with pytest.raises(ValueError, match="invalid UTF-8 at byte 2"):
        enc.encode_batch_flat([b"ok", b"ab\xff"])


def test_normalizers_on_every_code_point():
    from tokenizers import normalizers as hf
    chars = [chr(c) for c in range(U.MAX_CP) if not 0xD800 <= c < 0xE000 and c != 10]
    for name in ("NFC", "NFD", "NFKC", "NFKD", "Lowercase"):
        ours = build_normalizer({"type": name})
        # marks after each code point exercise combining classes and compositions
        text = "\n".join(ch + "\u0301\u0345" if i % 3 == 0 else ch for i, ch in enumerate(chars))
        want = getattr(hf, name)().normalize_str(text)
        got = ours(text)
        if got != want:
            first = next(i for i, (a, b) in enumerate(zip(got, want)) if a != b)
            raise AssertionError(f"{name}: {got[first - 5:first + 5]!r} != "
                                 f"{want[first - 5:first + 5]!r}")


@pytest.mark.parametrize("pre_tokenizer", [
    {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": r"\p{N}{1,3}"}, "behavior": b, "invert": inv},
        BYTES]}
    for b in ("Isolated", "Removed", "MergedWithPrevious", "MergedWithNext", "Contiguous")
    for inv in (False, True)] + [
    {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"String": " "}, "behavior": "MergedWithNext",
         "invert": False}, dict(BYTES, add_prefix_space=True)]},
    {"type": "Sequence", "pretokenizers": [
        {"type": "Digits", "individual_digits": True},
        dict(BYTES, add_prefix_space=True, use_regex=True)]},
    {"type": "Sequence", "pretokenizers": [
        {"type": "Digits", "individual_digits": False},
        {"type": "Split", "pattern": {"Regex": r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?"
                                      r"\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|"
                                      r"\s+(?!\S)|\s+"}, "behavior": "Isolated", "invert": False},
        BYTES]},
    {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": r"^\s+|\s+$| "}, "behavior": "Isolated",
         "invert": False},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
         "use_regex": False}]},
])
def test_pre_tokenizers_match_tokenizers(tmp_path, trained_json, pre_tokenizer):
    path = build(tmp_path, trained_json, "pre", pre_tokenizer=pre_tokenizer)
    assert_same_as_tokenizers(path, COMPONENT_TEXTS + ["a\nb\n  c  \n", "  lead\ntrail  "])


LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
                r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2_SPLIT = LLAMA3_SPLIT.replace(r"\p{N}{1,3}", r"\p{N}")
NEMO_SPLIT = (r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+|"
              r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|"
              r"\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")


def family(split: str | None, normalizer=None, bos: bool = False, neox: bool = False) -> dict:
    """The normalizer / pre-tokenizer / post-processor shape of a model family's file."""
    steps = ([{"type": "Split", "pattern": {"Regex": split}, "behavior": "Isolated",
               "invert": False}, BYTES] if split else
             [dict(BYTES, use_regex=True)])
    parts = {"normalizer": normalizer,
             "pre_tokenizer": {"type": "Sequence", "pretokenizers": steps}}
    if bos:
        parts["post_processor"] = {"type": "TemplateProcessing", "single": [
            {"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A",
                                                                         "type_id": 0}}],
            "pair": [], "special_tokens": {"<s>": {"id": "<s>", "ids": [0], "tokens": ["<s>"]}}}
    if neox:  # GPT-NeoX: runs of spaces are normalized, non-special added tokens
        parts["added_tokens"] = [added(" " * k, 0, special=False, normalized=True)
                                 for k in (2, 3, 4, 8)]
    return parts


@pytest.mark.parametrize("name, parts", [
    ("llama3", family(LLAMA3_SPLIT, bos=True)),
    ("qwen2", family(QWEN2_SPLIT, {"type": "NFC"})),
    ("mistral-nemo", family(NEMO_SPLIT, bos=True)),
    ("gpt-neox", family(None, {"type": "NFC"}, neox=True)),
])
def test_model_family_shapes(tmp_path, trained_json, name, parts):
    data = json.loads(json.dumps(trained_json))
    n = max(data["model"]["vocab"].values()) + 1
    data["added_tokens"] = [added("<s>", n)] + parts.pop("added_tokens", [])
    if "post_processor" in parts:
        parts["post_processor"]["special_tokens"]["<s>"]["ids"] = [n]
    path = build(tmp_path, data, name, **parts)
    texts = COMPONENT_TEXTS + ["    indented\n        more", "<s>Hello<s> world", "a  b   c"]
    assert_same_as_tokenizers(path, texts, device="cpu")


def test_added_token_options_and_precedence(tmp_path, trained_json):
    n = max(trained_json["model"]["vocab"].values()) + 1
    tokens = [added("<s>", n, lstrip=True), added("</s>", n + 1, rstrip=True),
              added("[DAY]", n + 2), added("day", n + 3, normalized=True, special=False),
              added("zjv", n + 4, normalized=True, special=False), added("qz", n + 5),
              added("<mask>", n + 6, single_word=True), added("mon", n + 7, single_word=True,
                                                             normalized=True, special=False)]
    for normalizer in (None, {"type": "Lowercase"}):
        path = build(tmp_path, trained_json, "added", added_tokens=tokens, normalizer=normalizer)
        enc, hf = assert_same_as_tokenizers(path, COMPONENT_TEXTS)
        # the issue's precedence case: a non-normalized token is matched first
        assert enc.encode_hf("qzjv", False) == hf.encode("qzjv", add_special_tokens=False).ids


def test_added_token_that_is_an_ordinary_merged_token(tmp_path, trained_json):
    vocab = trained_json["model"]["vocab"]
    merged = next(t for t, i in sorted(vocab.items(), key=lambda kv: -kv[1]) if len(t) > 3)
    path = build(tmp_path, trained_json, "overlap",
                 added_tokens=[added(merged, vocab[merged], special=False, normalized=True)])
    enc, _ = assert_same_as_tokenizers(path, COMPONENT_TEXTS + [merged * 3, f"x{merged}y"])
    assert enc.encode_ordinary(merged) == [vocab[merged]]  # merges still make it


def test_bpe_options_prefix_suffix_unk(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    for options in ({"continuing_subword_prefix": "##"}, {"end_of_word_suffix": "</w>"}):
        tok = Tokenizer(models.BPE(**options))
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        trainer = trainers.BpeTrainer(vocab_size=900, show_progress=False, **options,
                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
        tok.train_from_iterator(corpus_docs()[:30], trainer)
        data = json.loads(tok.to_str())
        path = build(tmp_path, data, "opts-" + "-".join(options))
        enc, _ = assert_same_as_tokenizers(path, COMPONENT_TEXTS[:60])
        assert "merges on the CPU" in get_encoding(path, device=None).backend.describe()
    data["model"]["unk_token"] = "x"
    path = build(tmp_path, data, "unk")
    assert_same_as_tokenizers(path, ["日本語 x ok", "plain"])


def test_post_processors_add_bos_eos(tmp_path, trained_json):
    n = max(trained_json["model"]["vocab"].values()) + 1
    tokens = [added("<|begin_of_text|>", n), added("<|end|>", n + 1)]
    template = {"type": "TemplateProcessing",
                "single": [{"SpecialToken": {"id": "<|begin_of_text|>", "type_id": 0}},
                           {"Sequence": {"id": "A", "type_id": 0}},
                           {"SpecialToken": {"id": "<|end|>", "type_id": 0}}],
                "pair": [{"Sequence": {"id": "A", "type_id": 0}},
                         {"Sequence": {"id": "B", "type_id": 1}}],
                "special_tokens": {"<|begin_of_text|>": {"id": "<|begin_of_text|>",
                                                         "ids": [n], "tokens": [
                                                             "<|begin_of_text|>"]},
                                   "<|end|>": {"id": "<|end|>", "ids": [n + 1],
                                               "tokens": ["<|end|>"]}}}
    for post in (template, {"type": "Sequence", "processors": [
            {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False,
             "use_regex": True}, template]},
            {"type": "RobertaProcessing", "sep": ["<|end|>", n + 1],
             "cls": ["<|begin_of_text|>", n], "trim_offsets": True, "add_prefix_space": False}):
        path = build(tmp_path, trained_json, "post", added_tokens=tokens, post_processor=post)
        enc, _ = assert_same_as_tokenizers(path, COMPONENT_TEXTS[:30])
        assert enc.encode_hf("hi")[0] == n and enc.encode_hf("hi")[-1] == n + 1
        assert enc.encode_hf("hi", add_special_tokens=False)[0] != n


def split_then_bytes(pattern: str) -> dict:
    return {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": pattern}, "behavior": "Isolated", "invert": False},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
         "use_regex": False}]}


@pytest.mark.parametrize("change, component", [
    ({"normalizer": {"type": "BertNormalizer"}}, "normalizer 'BertNormalizer'"),
    ({"pre_tokenizer": {"type": "Whitespace"}}, "pre_tokenizer: type 'Whitespace'"),
    ({"pre_tokenizer": {"type": "Metaspace", "replacement": "▁"}}, "'Metaspace'"),
    ({"model": {"dropout": 0.1}}, "model.dropout"),
    ({"model": {"byte_fallback": True}}, "model.byte_fallback"),
    ({"post_processor": {"type": "BertPiece"}}, "post_processor: type 'BertPiece'"),
    ({"decoder": {"type": "WordPiece"}}, "decoder"),
    ({"pre_tokenizer": None}, "no ByteLevel step"),
    ({"truncation": {"max_length": 8}}, "truncation"),
    ({"pre_tokenizer": split_then_bytes(r"\p{Han}+")}, r"\\p\{Han\}"),
    ({"pre_tokenizer": split_then_bytes(r"\bx")}, r"escape \\b"),
    ({"pre_tokenizer": split_then_bytes(r"x*")}, "empty string"),
    ({"pre_tokenizer": {"type": "Sequence", "pretokenizers": [
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True},
        {"type": "Digits", "individual_digits": True}]}}, "ByteLevel before"),
])
def test_unsupported_components_are_refused_at_load(tmp_path, trained_json, change, component):
    path = build(tmp_path, trained_json, "bad", **change)
    with pytest.raises(VocabularyError, match=component):
        load_vocabulary(path)


def test_dropout_zero_is_accepted(tmp_path, trained_json):
    path = build(tmp_path, trained_json, "dropout0", model={"dropout": 0.0})
    assert_same_as_tokenizers(path, COMPONENT_TEXTS[:20])


# ---- 5. tiktoken API parity ------------------------------------------------------------

@pytest.fixture(scope="module")
def twins():
    vocab = load_trained("cl100k")
    return Encoding(vocab, device="cpu"), tiktoken_twin(vocab)


def test_tiktoken_api_parity(twins):
    ours, theirs = twins
    text = "hello <|endoftext|> world"
    arr = ours.encode_to_numpy(text, allowed_special="all")
    assert arr.dtype == np.uint32 and arr.tolist() == \
        theirs.encode_to_numpy(text, allowed_special="all").tolist()
    assert ours._encode_bytes(b"caf\xc3\xa9 \xff\xfe x") == \
        theirs._encode_bytes(b"caf\xc3\xa9 \xff\xfe x")
    assert ours.encode_single_token(b"<|endoftext|>") == \
        theirs.encode_single_token(b"<|endoftext|>")
    assert ours.encode_single_token("<|endoftext|>") == theirs.encode_single_token("<|endoftext|>")
    with pytest.raises(KeyError):
        ours.encode_single_token(b"definitely not one token")
    # a string in allowed_special that is not a special token is ignored, as in tiktoken
    odd = {"hello", "<|endoftext|>"}
    assert ours.encode(text, allowed_special=odd) == theirs.encode(text, allowed_special=odd)
    with pytest.raises(ValueError):
        ours.encode("say hi", disallowed_special={"hi"})
    with pytest.raises(ValueError):
        theirs.encode("say hi", disallowed_special={"hi"})
    hole = ours.n_vocab + 5
    for call in (lambda e: e.decode_single_token_bytes(hole), lambda e: e.decode([1, hole]),
                 lambda e: e.decode_bytes([hole])):
        with pytest.raises(KeyError):
            call(theirs)
        with pytest.raises(KeyError) as info:
            call(ours)
        assert isinstance(info.value, InvalidTokenError) and str(hole) in str(info.value)


@pytest.mark.parametrize("text", ["hello fan", "hello world ", "x  ", "def f(a", "12", "",
                                  "end<|endoftext|>", "naïve caf", "a\n\n", "Straße überm"])
def test_encode_with_unstable_matches_tiktoken(twins, text):
    ours, theirs = twins
    tokens, completions = ours.encode_with_unstable(text, allowed_special="all")
    want_tokens, want_completions = theirs.encode_with_unstable(text, allowed_special="all")
    assert tokens == want_tokens
    assert sorted(map(tuple, completions)) == sorted(map(tuple, want_completions))


def test_encoding_for_model_matches_tiktoken():
    import tiktoken.model as tm
    from tokenizer_svc.model_names import MODEL_PREFIX_TO_ENCODING, MODEL_TO_ENCODING
    from tokenizer_svc.model_names import encoding_name_for_model
    assert MODEL_TO_ENCODING == tm.MODEL_TO_ENCODING
    assert list(MODEL_PREFIX_TO_ENCODING.items()) == list(tm.MODEL_PREFIX_TO_ENCODING.items())
    for name in ["gpt-4o-mini-2024", "gpt-4-0613", "ft:gpt-3.5-turbo:x", "o3-pro", "gpt-5-nano"]:
        assert encoding_name_for_model(name) == tm.encoding_name_for_model(name)
    with pytest.raises(KeyError):
        encoding_name_for_model("no-such-model")


def test_encoding_for_model_loads_local_files(monkeypatch):
    from tests.conftest import shared_vocab
    from tokenizer_svc.encoding import encoding_for_model
    path = shared_vocab("cl100k_base.tiktoken")
    monkeypatch.setenv("ISTANBUL_VOCAB_DIR", str(path.parent))
    assert encoding_for_model("gpt-4", device="cpu").name == "cl100k_base"
    with pytest.raises(KeyError, match="p50k_base"):
        encoding_for_model("text-davinci-003")


# ---- 6. hypothesis differentials -------------------------------------------------------

@settings(max_examples=60, derandomize=True, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=st.text(alphabet=ALPHABET, max_size=50))
def test_hypothesis_against_tiktoken(twins, text):
    ours, theirs = twins
    assert ours.encode(text, allowed_special="all") == \
        theirs.encode(text, allowed_special="all")
    assert ours.encode_ordinary(text) == theirs.encode_ordinary(text)


@pytest.fixture(scope="module")
def rich_json(tmp_path_factory, trained_json):
    n = max(trained_json["model"]["vocab"].values()) + 1
    path = build(tmp_path_factory.mktemp("rich"), trained_json, "rich",
                 normalizer={"type": "Sequence", "normalizers": [{"type": "NFKC"},
                                                                 {"type": "Lowercase"}]},
                 pre_tokenizer={"type": "Sequence", "pretokenizers": [
                     {"type": "Digits", "individual_digits": True},
                     dict(BYTES, add_prefix_space=True, use_regex=True)]},
                 added_tokens=[added("<|x|>", n, lstrip=True), added("ab", n + 1,
                                                                    normalized=True,
                                                                    special=False)])
    from tokenizers import Tokenizer
    return get_encoding(path, device="cpu"), Tokenizer.from_file(str(path))


@settings(max_examples=60, derandomize=True, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=st.lists(st.one_of(ALPHABET, st.sampled_from(["<|x|>", "ab", "AB", "  "])),
                    max_size=30).map("".join))
def test_hypothesis_against_tokenizers(rich_json, text):
    ours, hf = rich_json
    assert ours.encode_hf(text) == hf.encode(text).ids
    assert ours.encode(text, allowed_special="all") == \
        hf.encode(text, add_special_tokens=False).ids


def test_normalizer_data_for_another_python_is_probed_from_tokenizers_and_cached(
        tmp_path, monkeypatch):
    # the shipped corrections are differences from the unicodedata of the Python that probed
    # them (3.11: 14.0.0); on another Python (3.12: 15.0.0) they are read out of `tokenizers`
    # once and cached, never applied to the wrong tables (found on the H200's Python 3.12)
    import json as json_
    import sys
    from tokenizer_svc.hf import normalize as hf_normalize
    shipped = json_.loads(hf_normalize.DATA_FILE.read_text())
    other = tmp_path / "hf_normalization.json"
    other.write_text(json_.dumps(dict(shipped, unicodedata_version="0.0.0")))
    monkeypatch.setattr(hf_normalize, "DATA_FILE", other)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    hf_normalize.load_normalization_table.cache_clear()
    try:
        table = hf_normalize.load_normalization_table()
        cached = hf_normalize._cache_file()
        assert cached.is_file() and cached.parent == tmp_path / "cache" / "istanbul"
        assert table["unknown"] == frozenset(shipped["unknown"])   # same Python: same probe
        hf_normalize.load_normalization_table.cache_clear()
        cached.unlink()
        monkeypatch.setitem(sys.modules, "tokenizers", None)      # not installed
        with pytest.raises(ValueError, match="pip install tokenizers"):
            hf_normalize.load_normalization_table()
    finally:
        hf_normalize.load_normalization_table.cache_clear()
