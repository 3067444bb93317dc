"""What `tokenizers` does to text before BPE, for one tokenizer.json vocabulary, on the CPU.

    pipe = HFPipeline(vocab)
    pipe.sections("I read <s>Hey")        # [("I read ", None), ("", <id of <s>>), ("Hey", None)]
    pipe.pre_tokenize("I read ")          # ['I', ' read', ' ']
    pipe.post_process([ids...])           # BOS/EOS of the post_processor

The order is `tokenizers`' (tokenizer/added_vocabulary.rs, `extract_and_normalize`):

1. added tokens with `normalized: false` are cut out of the original text;
2. each remaining stretch is normalized (`normalize`), then added tokens with
   `normalized: true` are cut out of the normalized stretch (matching their normalized text);
3. each remaining stretch is pre-tokenized (`pre_tokenize`): the steps of the sequence one
   after the other, each subdividing the pieces of the previous one;
4. BPE per piece (reference.py / the GPU); then, for `add_special_tokens=True`, the
   post-processor adds its tokens.

Added tokens are matched leftmost-longest; a match that breaks its `single_word` rule is
skipped (and hides shorter tokens inside it, as in `tokenizers`); `lstrip`/`rstrip` swallow
the whitespace beside the token. Which added tokens take part is the caller's choice
(`allowed`): all of them for `tokenizers`' semantics, tiktoken's `allowed_special` otherwise.
"""

from __future__ import annotations

import numpy as np
import regex

from istanbul.shaders.kernels.bpe.unicode_table import load_table
from .tokenizer_json import AddedToken
from .normalize import build_normalizer
from .oniguruma import oniguruma_pattern


def _class_mask(family: str, name: str) -> np.ndarray:
    return load_table(family).members(name)


class HFPipeline:
    def __init__(self, vocab):
        self.vocab = vocab
        self.config = vocab.hf
        origin = vocab.source or vocab.name
        self.normalize = build_normalizer(self.config.normalizer, origin)
        self.steps = [self._compile(step, origin) for step in self.config.pre_tokenizers]
        self.added = {a.content: a for a in self.config.added}
        normalized = {}
        for a in self.config.added:
            if a.normalized and self.normalize(a.content):  # an empty text never matches
                normalized[self.normalize(a.content)] = a
        self.normalized_added = normalized  # normalized text -> token
        self._matchers: dict = {}  # frozenset of token texts -> compiled alternation
        # Rust regex `\s` and `\w` (tiktoken's engine family) for lstrip/rstrip/single_word.
        self.space = _class_mask("tiktoken", "S")
        self.word = _class_mask("tiktoken", "W")
        self.numeric = _class_mask("tokenizers", "RustNumeric")

    # ---- compile ---------------------------------------------------------------------------

    @staticmethod
    def _compile(step: dict, origin: str) -> dict:
        step = dict(step)
        if "regex" in step:
            try:
                source = oniguruma_pattern(step["regex"])
            except ValueError as exc:
                raise ValueError(f"pre_tokenizer {step['type']}: {exc}") from None
            step["compiled"] = regex.compile(source)
        elif "string" in step:
            step["compiled"] = regex.compile(regex.escape(step["string"])) if step["string"] \
                else None
        if step.get("compiled") is not None and step["compiled"].fullmatch(""):
            raise ValueError(f"pre_tokenizer {step['type']}: pattern "
                             f"{step.get('regex', step.get('string'))!r} can match the empty "
                             "string (not supported)")
        return step

    # ---- added tokens ---------------------------------------------------------------------

    def _matcher(self, tokens: frozenset):
        found = self._matchers.get(tokens)
        if found is None and tokens:
            ordered = sorted(tokens, key=lambda t: (-len(t), t))  # longest first: leftmost-longest
            found = regex.compile("|".join(regex.escape(t) for t in ordered))
            self._matchers[tokens] = found
        return found

    def _find(self, text: str, table: dict, allowed) -> list[tuple[str, int | None]]:
        """`find_matches` of added_vocabulary.rs over one stretch: [(text, None | id)]."""
        tokens = frozenset(t for t, a in table.items() if allowed is None or a.content in allowed)
        pat = self._matcher(tokens)
        if pat is None or not text:
            return [(text, None)] if text else []
        out, start_offset = [], 0
        for m in pat.finditer(text):
            start, stop = m.start(), m.end()
            token: AddedToken = table[m.group()]
            if token.single_word:
                before_word = start > 0 and self.word[ord(text[start - 1])]
                after_word = stop < len(text) and self.word[ord(text[stop])]
                if before_word or after_word:
                    continue
            if token.lstrip:
                s = start
                while s > 0 and self.space[ord(text[s - 1])]:
                    s -= 1
                start = max(s, start_offset)
            if token.rstrip:
                while stop < len(text) and self.space[ord(text[stop])]:
                    stop += 1
            if start_offset < start:
                out.append((text[start_offset:start], None))
            out.append((text[start:stop], token.id))
            start_offset = stop
        if start_offset < len(text):
            out.append((text[start_offset:], None))
        return out

    def sections(self, text: str, allowed=None) -> list[tuple[str, int | None]]:
        """Steps 1-2: [(normalized text, None) | (matched text, added token id)].

        `allowed`: the contents of the added tokens that may match (None: all of them).
        """
        raw = {t: a for t, a in self.added.items() if not a.normalized}
        out = []
        for part, token in self._find(text, raw, allowed):
            if token is not None:
                out.append((part, token))
                continue
            out.extend(self._find(self.normalize(part), self.normalized_added, allowed))
        return out

    # ---- pre-tokenizers -------------------------------------------------------------------

    def pre_tokenize(self, text: str) -> list[str]:
        """Step 3 for one normalized stretch without added tokens."""
        pieces = [text] if text else []
        for step in self.steps:
            kind = step["type"]
            if kind == "Split":
                pieces = [p for piece in pieces for p in self._split(piece, step)]
            elif kind == "ByteLevel":
                if step["add_prefix_space"]:
                    pieces = [p if p.startswith(" ") else " " + p for p in pieces]
                if step["use_regex"]:
                    pieces = [p for piece in pieces for p in
                              _behave(piece, _regex_matches(piece, step["compiled"]),
                                      "Isolated")]
            elif kind == "Digits":
                behavior = "Isolated" if step["individual_digits"] else "Contiguous"
                pieces = [p for piece in pieces for p in
                          _behave(piece, self._digit_matches(piece), behavior)]
        return pieces

    def _split(self, piece: str, step: dict) -> list[str]:
        if step["compiled"] is None:  # an empty String pattern matches nothing
            matches = [(0, len(piece), False)]
        else:
            matches = _regex_matches(piece, step["compiled"])
        if step["invert"]:
            matches = [(a, b, not m) for a, b, m in matches]
        return _behave(piece, matches, step["behavior"])

    def _digit_matches(self, piece: str) -> list[tuple[int, int, bool]]:
        out, last = [], 0
        for i, ch in enumerate(piece):
            if self.numeric[ord(ch)]:
                if last < i:
                    out.append((last, i, False))
                out.append((i, i + 1, True))
                last = i + 1
        if last < len(piece):
            out.append((last, len(piece), False))
        return out

    # ---- post-processing ------------------------------------------------------------------

    def post_process(self, ids: list[int]) -> list[int]:
        """The post_processor's tokens around one sequence (`add_special_tokens=True`)."""
        return _post(self.config.post_processor, list(ids))


def _regex_matches(piece: str, compiled) -> list[tuple[int, int, bool]]:
    """pattern.rs `find_matches`: the whole piece as (start, end, is_match) stretches."""
    out, prev = [], 0
    for m in compiled.finditer(piece):
        if prev != m.start():
            out.append((prev, m.start(), False))
        out.append((m.start(), m.end(), True))
        prev = m.end()
    if prev != len(piece):
        out.append((prev, len(piece), False))
    return out


def _behave(piece: str, matches: list, behavior: str) -> list[str]:
    """normalizer.rs `split`: apply a SplitDelimiterBehavior to the stretches."""
    spans: list[list] = []  # [start, end, remove]
    if behavior == "Isolated":
        spans = [[a, b, False] for a, b, _ in matches]
    elif behavior == "Removed":
        spans = [[a, b, m] for a, b, m in matches]
    elif behavior == "Contiguous":
        previous = False
        for a, b, m in matches:
            if m == previous and spans:
                spans[-1][1] = b
            else:
                spans.append([a, b, False])
            previous = m
    elif behavior == "MergedWithPrevious":
        previous = False
        for a, b, m in matches:
            if m and not previous and spans:
                spans[-1][1] = b
            else:
                spans.append([a, b, False])
            previous = m
    elif behavior == "MergedWithNext":
        previous = False
        for a, b, m in reversed(matches):
            if m and not previous and spans:
                spans[-1][0] = a
            else:
                spans.append([a, b, False])
            previous = m
        spans.reverse()
    else:
        raise ValueError(f"unknown Split behavior {behavior!r}")
    return [piece[a:b] for a, b, remove in spans if not remove and b > a]


def _post(spec: dict | None, ids: list[int]) -> list[int]:
    if spec is None:
        return ids
    kind = spec["type"]
    if kind == "Sequence":
        for sub in spec.get("processors", []):
            ids = _post(sub, ids)
        return ids
    if kind == "ByteLevel":
        return ids
    if kind in ("RobertaProcessing", "BertProcessing"):
        return [int(spec["cls"][1]), *ids, int(spec["sep"][1])]
    if kind == "TemplateProcessing":
        specials = spec.get("special_tokens") or {}
        out = []
        for piece in spec.get("single") or []:
            if "SpecialToken" in piece:
                out.extend(int(i) for i in specials[piece["SpecialToken"]["id"]]["ids"])
            else:
                out.extend(ids)
        return out
    raise ValueError(f"post_processor {kind!r} is not supported")
