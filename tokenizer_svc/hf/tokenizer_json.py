"""Loading a Hugging Face `tokenizer.json` (byte-level BPE) into a `Vocabulary`.

    vocab = load_hf_tokenizer(Path("tokenizer.json"))
    vocab.hf.added[0]     # AddedToken(content='<|begin_of_text|>', id=128000, special=True...)

What is accepted (each component is checked here, at load time; anything else is refused
with a `VocabularyError` naming the component, never tokenized differently from `tokenizers`):

- model: BPE over the ByteLevel alphabet; `merges` in either syntax; `ignore_merges`;
  `continuing_subword_prefix`, `end_of_word_suffix`, `unk_token`, `fuse_unk`;
  `dropout` null or 0 (random dropout is refused: its ids are not reproducible);
  `byte_fallback` false. Vocabulary entries that are also added tokens are ordinary tokens
  too (merges may make them, as in `tokenizers`).
- normalizer: NFC, NFD, NFKC, NFKD, Lowercase, Replace, Prepend, Sequence
  (`normalize.build_normalizer`).
- pre_tokenizer: Split (String or Regex pattern, every behavior, invert), ByteLevel
  (add_prefix_space, use_regex; last in a sequence), Digits, Sequence of these.
- added tokens: content, id, special, lstrip, rstrip, single_word, normalized.
- post_processor: TemplateProcessing (single sequences), ByteLevel, RobertaProcessing,
  BertProcessing, Sequence of these; applied by `add_special_tokens=True` encodes.
- decoder: ByteLevel or none; truncation and padding must be null.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from ..vocabulary import Vocabulary, VocabularyError

SPLIT_BEHAVIORS = ("Removed", "Isolated", "MergedWithPrevious", "MergedWithNext", "Contiguous")
# `tokenizers`' ByteLevel pre-tokenizer regex (pre_tokenizers/byte_level.rs), run by Oniguruma.
BYTE_LEVEL_REGEX = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"


@dataclass(frozen=True)
class AddedToken:
    content: str
    id: int
    special: bool = False
    lstrip: bool = False
    rstrip: bool = False
    single_word: bool = False
    normalized: bool = True


@dataclass
class HFConfig:
    """The parts of a tokenizer.json beyond ranks and merges, validated."""
    normalizer: dict | None = None
    pre_tokenizers: list = field(default_factory=list)  # flattened steps (dicts)
    added: list = field(default_factory=list)  # [AddedToken], in file order
    post_processor: dict | None = None
    continuing_subword_prefix: bytes = b""
    end_of_word_suffix: bytes = b""
    unk_id: int | None = None
    fuse_unk: bool = False
    added_bytes: dict = field(default_factory=dict)  # id -> bytes its ByteLevel decoding gives
    byte_level_decoder: bool = True  # False: no decoder, tokenizers joins token strings by " "

    @property
    def needs_cpu_merges(self) -> bool:
        """BPE options the GPU merge kernels do not implement (prefix/suffix/unknown)."""
        return bool(self.continuing_subword_prefix or self.end_of_word_suffix or
                    self.unk_id is not None)

    def identity(self) -> str:
        """Everything here that changes ids, for the vocabulary's content hash."""
        return json.dumps({"n": self.normalizer, "p": self.pre_tokenizers,
                           "a": [a.__dict__ for a in self.added], "pp": self.post_processor,
                           "c": self.continuing_subword_prefix.hex(),
                           "e": self.end_of_word_suffix.hex(), "u": self.unk_id,
                           "f": self.fuse_unk}, sort_keys=True)


def bytes_to_unicode() -> dict:
    """GPT-2's byte -> printable character map used by HF ByteLevel vocabularies."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    mapping, extra = {}, 0
    for b in range(256):
        if b in keep:
            mapping[b] = chr(b)
        else:
            mapping[b] = chr(256 + extra)
            extra += 1
    return mapping


def load_hf_tokenizer(path: Path):

    def refuse(component: str, why: str):
        raise VocabularyError(f"{path}: {component}: {why}")

    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise VocabularyError(f"{path}: not a valid tokenizer.json: {exc}") from None
    model = data.get("model") or {}
    if model.get("type") != "BPE":
        refuse("model", f"type {model.get('type')!r}; only byte-level BPE tokenizer.json files "
                        "are supported")
    for key in ("truncation", "padding"):
        if data.get(key) is not None:
            refuse(key, "must be null (istanbul returns every token; truncate or pad the ids "
                        "yourself)")
    if model.get("dropout") not in (None, 0, 0.0):
        refuse("model.dropout", f"{model['dropout']} gives random ids; set it to null")
    if model.get("byte_fallback"):
        refuse("model.byte_fallback", "true is not supported (byte-level BPE needs no "
                                      "fallback)")
    byte_of = {c: b for b, c in bytes_to_unicode().items()}

    def to_bytes(text: str) -> bytes | None:
        try:
            return bytes(byte_of[c] for c in text)
        except KeyError:
            return None

    # Ids as `tokenizers` assigns them when it loads the file (serialization.rs, then
    # AddedVocabulary::add_tokens): the "id" fields are not used; a token whose text is in the
    # model's vocabulary gets that id, the others the next ids after the vocabulary's size, in
    # file order; a repeated text keeps its first id and takes the last entry's options.
    model_ids = {t: int(i) for t, i in (model.get("vocab") or {}).items()}
    next_id = len(model_ids)
    by_content: dict = {}
    for item in data.get("added_tokens", []):
        if not isinstance(item, dict) or not isinstance(item.get("content"), str):
            refuse("added_tokens", f"entry {item!r} needs a content string")
        content = item["content"]
        if not content:
            continue  # tokenizers ignores empty added tokens
        if content in by_content:
            token_id = by_content[content].id
        elif content in model_ids:
            token_id = model_ids[content]
        else:
            token_id, next_id = next_id, next_id + 1
        by_content[content] = AddedToken(
            content=content, id=token_id, special=bool(item.get("special", False)),
            lstrip=bool(item.get("lstrip", False)), rstrip=bool(item.get("rstrip", False)),
            single_word=bool(item.get("single_word", False)),
            normalized=bool(item.get("normalized", not item.get("special", False))))
    added = list(by_content.values())
    added_text = {a.content for a in added}
    ranks = {}
    for text, i in (model.get("vocab") or {}).items():
        token = to_bytes(text)
        if token is None:
            if text in added_text:
                continue  # a pure added token (its text is matched whole, never merged)
            refuse("model.vocab", f"token {text!r} has a character outside the ByteLevel "
                                  "alphabet (not a byte-level BPE)")
        ranks[token] = int(i)
    merges = {}
    for priority, item in enumerate(model.get("merges", [])):
        left, right = item.split(" ", 1) if isinstance(item, str) else item  # both syntaxes
        a, b = to_bytes(left), to_bytes(right)
        if a is None or b is None:
            refuse("model.merges", f"merge #{priority} {item!r} has a character outside the "
                                   "ByteLevel alphabet")
        merges[(a, b)] = priority  # a repeated pair keeps its last rank, as in tokenizers
    config = HFConfig(added=added)
    for key in ("continuing_subword_prefix", "end_of_word_suffix"):
        value = model.get(key)
        if value:
            encoded = to_bytes(value)
            if encoded is None:
                refuse(f"model.{key}", f"{value!r} is outside the ByteLevel alphabet")
            setattr(config, key, encoded)
    if model.get("unk_token") is not None:
        unk = model["unk_token"]
        if unk not in model_ids:
            refuse("model.unk_token", f"{unk!r} is not in the vocabulary")
        config.unk_id = model_ids[unk]
        config.fuse_unk = bool(model.get("fuse_unk", False))
    config.normalizer = data.get("normalizer")
    try:
        from .normalize import build_normalizer
        build_normalizer(config.normalizer, f"{path}")
    except ValueError as exc:
        raise VocabularyError(str(exc)) from None
    config.pre_tokenizers = _pre_tokenizer_steps(data.get("pre_tokenizer"), refuse)
    if not config.pre_tokenizers or config.pre_tokenizers[-1]["type"] != "ByteLevel":
        refuse("pre_tokenizer", "no ByteLevel step at the end: the BPE would see characters, "
                                "not bytes (only byte-level BPE is supported)")
    config.post_processor = data.get("post_processor")
    _check_post_processor(config.post_processor, refuse, {a.content: a.id for a in added},
                          model.get("vocab") or {})
    decoder = data.get("decoder")
    if decoder is not None and decoder.get("type") != "ByteLevel":
        refuse("decoder", f"type {decoder.get('type')!r} is not supported (ByteLevel or null)")
    config.byte_level_decoder = decoder is not None
    specials = {a.content: a.id for a in added}
    # ByteLevel decodes a token whose characters are all in its alphabet as those bytes
    ordinary_ids = set(ranks.values())
    config.added_bytes = {a.id: to_bytes(a.content) for a in added
                          if a.id not in ordinary_ids and to_bytes(a.content) is not None}
    splits = [s["regex"] for s in config.pre_tokenizers if "regex" in s]
    vocab = Vocabulary(name=path.stem, ranks=ranks, pattern=splits[0] if splits else "",
                       special_tokens=specials, merges=merges, hf_splits=splits,
                       hf_ignore_merges=bool(model.get("ignore_merges", False)),
                       source=str(path), hf=config)
    return vocab   # vocab.load_vocabulary compiles its pipeline (hf.pipeline) before use


def _pre_tokenizer_steps(spec, refuse) -> list:
    """Flatten the pre_tokenizer into validated steps: {"type", ...} dicts."""
    if spec is None:
        return []
    kind = spec.get("type")
    if kind == "Sequence":
        steps = [s for sub in spec.get("pretokenizers", []) for s in
                 _pre_tokenizer_steps(sub, refuse)]
        for i, step in enumerate(steps[:-1]):
            if step["type"] == "ByteLevel":
                refuse("pre_tokenizer", "ByteLevel before another pre-tokenizer is not "
                                        "supported (the next one would see mapped bytes)")
        return steps
    if kind == "Split":
        pattern = spec.get("pattern") or {}
        behavior = spec.get("behavior")
        if behavior not in SPLIT_BEHAVIORS:
            refuse("pre_tokenizer Split", f"behavior {behavior!r} is not one of "
                                          f"{', '.join(SPLIT_BEHAVIORS)}")
        if "Regex" in pattern:
            step = {"type": "Split", "regex": pattern["Regex"]}
        elif "String" in pattern:
            step = {"type": "Split", "string": pattern["String"]}
        else:
            refuse("pre_tokenizer Split", f"pattern {pattern!r} is neither String nor Regex")
        step.update(behavior=behavior, invert=bool(spec.get("invert", False)))
        return [step]
    if kind == "ByteLevel":
        step = {"type": "ByteLevel", "add_prefix_space": bool(spec.get("add_prefix_space", True)),
                "use_regex": bool(spec.get("use_regex", True))}
        if step["use_regex"]:
            step["regex"] = BYTE_LEVEL_REGEX
        return [step]
    if kind == "Digits":
        return [{"type": "Digits", "individual_digits": bool(spec.get("individual_digits",
                                                                      False))}]
    refuse("pre_tokenizer", f"type {kind!r} is not supported (Split, ByteLevel, Digits, "
                            "Sequence)")
    return []


def _check_post_processor(spec, refuse, added: dict, vocab: dict) -> None:
    if spec is None:
        return
    kind = spec.get("type")
    if kind == "Sequence":
        for sub in spec.get("processors", []):
            _check_post_processor(sub, refuse, added, vocab)
    elif kind == "ByteLevel":
        return
    elif kind in ("RobertaProcessing", "BertProcessing"):
        for key in ("cls", "sep"):
            if not isinstance(spec.get(key), list) or len(spec[key]) != 2:
                refuse(f"post_processor {kind}", f"{key} must be [token, id]")
    elif kind == "TemplateProcessing":
        specials = spec.get("special_tokens") or {}
        for piece in spec.get("single") or []:
            if "SpecialToken" in piece:
                name = piece["SpecialToken"].get("id")
                if name not in specials:
                    refuse("post_processor TemplateProcessing", f"special token {name!r} of "
                                                                "the template has no ids")
            elif "Sequence" not in piece:
                refuse("post_processor TemplateProcessing", f"template piece {piece!r}")
    else:
        refuse("post_processor", f"type {kind!r} is not supported (TemplateProcessing, "
                                 "ByteLevel, RobertaProcessing, BertProcessing, Sequence)")


__all__ = ["AddedToken", "BYTE_LEVEL_REGEX", "HFConfig", "bytes_to_unicode",
           "load_hf_tokenizer"]
