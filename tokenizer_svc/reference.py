"""The CPU reference tokenizer: plain, slow, readable. It defines what the GPU must produce.

    ref = ReferenceTokenizer(load_vocabulary("cl100k_base"))
    ref.encode_ordinary("hello world")          # -> [15339, 1917]
    ref.encode("<|endoftext|>", allowed_special="all")

The core, the exact reference of the GPU kernels, is the kernel family's
(istanbul.shaders.kernels.bpe.reference: `explicit_pattern`, `pre_tokenize`, `bpe_ranks`,
`bpe_merges`); this module adds what the product's tokenizer does around it.

Encoding is two steps, exactly as tiktoken does them:

1. **Pre-tokenize** (`split`): cut the text into pieces with the vocabulary's regex. For the
   three built-in patterns (gpt2/r50k, cl100k, o200k) the regex is rewritten first
   (`exact_pattern`): every `\\p{..}` and `\\s` becomes an explicit character class read out of
   tiktoken itself (the kernels' class table). Python's `regex` module ships a newer Unicode
   version than tiktoken's Rust regex crate (tens of thousands of code points are letters for
   one and not the other), so asking `regex` what a letter is would disagree with tiktoken; the
   explicit classes make the reference agree with tiktoken on every code point. Any other
   pattern (a vocabulary trained with a custom regex) is used as written, i.e. with the `regex`
   module's Unicode tables; for such patterns tiktoken itself would use its own tables and may
   differ on code points assigned in recent Unicode versions.
   Hugging Face `tokenizer.json` vocabularies run `tokenizers`' pipeline (hf/pipeline.py:
   added tokens, normalizer, then the pre-tokenizer steps one after the other), with their
   regexes rewritten by `oniguruma_pattern` so that they mean what Oniguruma, `tokenizers`'
   engine, makes of them: its Unicode classes (read out of `tokenizers`), its `(?i:)` case
   folds and Ruby's line anchors.
2. **BPE** (`bpe`) within each piece: start from single bytes and repeatedly merge the adjacent
   pair with the lowest priority, the leftmost one among equals. For `.tiktoken` vocabularies a
   pair's priority is the rank of its concatenation (if that is a token); first, a piece that is
   itself a token is that token (tiktoken's whole-piece shortcut). For tokenizer.json
   vocabularies only the listed merges apply, priority = position in the merge list
   (`bpe_hf` adds `continuing_subword_prefix`, `end_of_word_suffix` and `unk_token`).

Special tokens follow tiktoken: `split_special` cuts the text at allowed special tokens (the
leftmost occurrence first; at one position the longest special wins), and each ordinary
stretch in between is pre-tokenized on its own (so `$` in a pattern matches at its end).

`encode_bytes` takes raw bytes with invalid UTF-8 and reproduces tiktoken's `_encode_bytes`:
the valid UTF-8 prefix is encoded normally; its last piece (extended backwards over tokens
made only of spaces, newlines and tabs) is joined with the remaining bytes, and that one
string of bytes is a single BPE piece.
"""

from __future__ import annotations

import functools

import regex

from istanbul.shaders.kernels.bpe.reference import (NO_PRIORITY, bpe_merges, bpe_ranks,
                                                    explicit_pattern, pre_tokenize)
from .hf.oniguruma import oniguruma_pattern
from .vocabulary import Vocabulary


# ---- special tokens -----------------------------------------------------------------------------

class DisallowedSpecialTokenError(ValueError):
    """Text that spells a special token which the caller did not allow (tiktoken's ValueError)."""


def disallowed_message(token: str) -> str:
    """tiktoken's wording, so callers that match on it keep working."""
    return (f"Encountered text corresponding to disallowed special token {token!r}.\n"
            "If you want this text to be encoded as a special token, "
            f"pass it to `allowed_special`, e.g. `allowed_special={{{token!r}, ...}}`.\n"
            f"If you want this text to be encoded as normal text, disable the check for this "
            f"token by passing `disallowed_special=(enc.special_tokens_set - {{{token!r}}})`.\n"
            "To disable this check for all special tokens, pass `disallowed_special=()`.\n")


def resolve_special(special_tokens: dict, allowed_special, disallowed_special) -> tuple:
    """tiktoken's argument rules -> (allowed frozenset, disallowed frozenset)."""
    everything = frozenset(special_tokens)
    if allowed_special == "all":
        allowed = everything
    else:  # like tiktoken, a string that is not a special token is never matched
        allowed = frozenset(allowed_special) & everything
    if disallowed_special == "all":
        disallowed = everything - allowed
    else:
        disallowed = frozenset(disallowed_special)
    return allowed, disallowed


def special_regex(tokens) -> regex.Pattern | None:
    """Alternation of the given specials, longest first (at one position the longest wins)."""
    if not tokens:
        return None
    return _special_regex(frozenset(tokens))


@functools.lru_cache(maxsize=64)   # the service asks once per request, mostly the same set
def _special_regex(tokens: frozenset) -> regex.Pattern:
    ordered = sorted(tokens, key=lambda t: (-len(t), t))
    return regex.compile("|".join(regex.escape(t) for t in ordered))


def check_disallowed(text: str, disallowed) -> None:
    """Raise tiktoken's ValueError if `text` contains a disallowed special token."""
    pat = special_regex(disallowed)
    if pat is not None:
        found = pat.search(text)
        if found:
            raise DisallowedSpecialTokenError(disallowed_message(found.group()))


def split_special(text: str, allowed, special_tokens: dict) -> list[tuple[str, int | None]]:
    """[(text, None) for ordinary stretches, (text, id) for allowed special tokens], in order.

    Ordinary stretches may be empty; each one is pre-tokenized on its own, as in tiktoken.
    """
    pat = special_regex(allowed)
    if pat is None:
        return [(text, None)]
    out, start = [], 0
    for found in pat.finditer(text):
        out.append((text[start:found.start()], None))
        out.append((found.group(), special_tokens[found.group()]))
        start = found.end()
    out.append((text[start:], None))
    return out


def fix_surrogates(text: str) -> str:
    """tiktoken's repair for lone surrogates: they become U+FFFD (pairs are joined)."""
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")


# ---- pre-tokenization -----------------------------------------------------------------------

def exact_pattern(pattern: str, family: str = "tiktoken", fast: bool = False) -> str:
    """Rewrite a pattern so its Unicode classes are the explicit ones of `family`'s engine.

    "tiktoken": every `\\p{X}` / `\\s` / `\\S` becomes the explicit class tiktoken uses
    (`explicit_pattern`, the kernels' reference); handles what the three built-in patterns
    contain. "tokenizers": Oniguruma's view for tokenizer.json patterns (`oniguruma_pattern`).
    Raises ValueError on a construct it cannot rewrite exactly (`\\S` inside a class,
    `\\P{..}`, a class it has no table for).
    """
    if family == "tokenizers":
        return oniguruma_pattern(pattern)
    return explicit_pattern(pattern, family, fast)


def hf_isolated_split(pieces: list[str], pat: regex.Pattern) -> list[str]:
    """Hugging Face `Split(behavior="Isolated")`: matches and the gaps between them."""
    out = []
    for piece in pieces:
        start = 0
        for found in pat.finditer(piece):
            if found.start() == found.end():
                continue
            if found.start() > start:
                out.append(piece[start:found.start()])
            out.append(found.group())
            start = found.end()
        if start < len(piece):
            out.append(piece[start:])
    return out


class PreTokenizer:
    """The vocabulary's pre-tokenization rule as a function text -> pieces.

    For tokenizer.json vocabularies this is `hf.pipeline.HFPipeline.pre_tokenize` (the text
    must be normalized already; `ReferenceTokenizer` and `Encoding` do that).
    """

    def __init__(self, vocab: Vocabulary):
        self.vocab = vocab
        if vocab.hf is not None:
            from .hf.pipeline import HFPipeline
            self.hf = HFPipeline(vocab)
            self.pattern = None
        elif vocab.hf_splits is not None:  # a Vocabulary built by hand with Split regexes
            self.hf = None
            self.splits = [regex.compile(exact_pattern(p, "tokenizers")) for p in vocab.hf_splits]
            self.pattern = None
        else:
            self.hf = self.splits = None
            source = exact_pattern(vocab.pattern) if vocab.pattern_name else vocab.pattern
            self.pattern = regex.compile(source)

    def split(self, text: str) -> list[str]:
        if self.hf is not None:
            return self.hf.pre_tokenize(text)
        if self.splits is not None:
            pieces = [text] if text else []
            for pat in self.splits:
                pieces = hf_isolated_split(pieces, pat)
            return pieces
        return pre_tokenize(self.pattern, text)


# ---- BPE ------------------------------------------------------------------------------------

def bpe_hf(piece: bytes, ranks: dict, merges: dict, config, ignore_merges: bool = False
           ) -> list[int]:
    """Hugging Face's BPE with `continuing_subword_prefix`, `end_of_word_suffix` and
    `unk_token` (models/bpe/model.rs `merge_word`): every byte but the first starts as
    prefix + byte, the last one ends with the suffix; a start that is not a token becomes the
    unknown token (fused with its neighbours under `fuse_unk`), or is dropped without one; a
    merge of (a, b) makes a + b without b's prefix."""
    if ignore_merges and piece in ranks:
        return [ranks[piece]]
    prefix, suffix = config.continuing_subword_prefix, config.end_of_word_suffix
    parts: list = []  # bytes of a known symbol, or None for the unknown token
    for i in range(len(piece)):
        s = (prefix if i else b"") + piece[i:i + 1] + (suffix if i == len(piece) - 1 else b"")
        if s in ranks:
            parts.append(s)
        elif config.unk_id is not None and not (config.fuse_unk and parts and parts[-1] is None):
            parts.append(None)
    while len(parts) > 1:
        best, best_prio = -1, NO_PRIORITY
        for i in range(len(parts) - 1):
            if parts[i] is None or parts[i + 1] is None:
                continue
            prio = merges.get((parts[i], parts[i + 1]), NO_PRIORITY)
            if prio < best_prio:
                best, best_prio = i, prio
        if best < 0:
            break
        parts[best:best + 2] = [parts[best] + parts[best + 1][len(prefix):]]
    return [config.unk_id if p is None else ranks[p] for p in parts]


class ReferenceTokenizer:
    """Plain-Python encode/decode for one vocabulary (the semantics the GPU must match).

    tokenizer.json vocabularies: `encode_ordinary` normalizes, pre-tokenizes and merges (added
    tokens are plain text); `encode` also cuts out the allowed added tokens with
    `tokenizers`' rules (hf/pipeline.py); `encode_hf` is `tokenizers`' own
    `Tokenizer.encode(text, add_special_tokens=...).ids`.
    """

    def __init__(self, vocab: Vocabulary):
        self.vocab = vocab
        self.pre = PreTokenizer(vocab)
        self.hf = self.pre.hf

    def bpe(self, piece: bytes) -> list[int]:
        if self.vocab.hf is not None and self.vocab.hf.needs_cpu_merges:
            return bpe_hf(piece, self.vocab.ranks, self.vocab.merges, self.vocab.hf,
                          self.vocab.hf_ignore_merges)
        if self.vocab.merges is not None:
            return bpe_merges(piece, self.vocab.ranks, self.vocab.merges,
                              self.vocab.hf_ignore_merges)
        return bpe_ranks(piece, self.vocab.ranks)

    def split(self, text: str) -> list[str]:
        return self.pre.split(text)

    def encode_pieces(self, text: str) -> list[list[int]]:
        """Token ids per piece (what `encode_ordinary` concatenates); text already normalized."""
        return [self.bpe(p.encode("utf-8")) for p in self.split(text)]

    def encode_ordinary(self, text: str) -> list[int]:
        text = fix_surrogates(text)
        if self.hf is not None:
            text = self.hf.normalize(text)
        return [t for piece in self.encode_pieces(text) for t in piece]

    def encode(self, text: str, *, allowed_special=frozenset(), disallowed_special="all"):
        allowed, disallowed = resolve_special(self.vocab.special_tokens, allowed_special,
                                              disallowed_special)
        check_disallowed(text, disallowed)
        text = fix_surrogates(text)
        if self.hf is not None:
            return self._encode_sections(self.hf.sections(text, allowed))
        out = []
        for part, special in split_special(text, allowed, self.vocab.special_tokens):
            if special is not None:
                out.append(special)
            else:
                out.extend(t for piece in self.encode_pieces(part) for t in piece)
        return out

    def encode_hf(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """`tokenizers.Tokenizer.from_file(...).encode(text, add_special_tokens=...).ids`."""
        if self.hf is None:
            raise ValueError(f"{self.vocab.name}: encode_hf needs a tokenizer.json vocabulary")
        ids = self._encode_sections(self.hf.sections(fix_surrogates(text)))
        return self.hf.post_process(ids) if add_special_tokens else ids

    def _encode_sections(self, sections) -> list[int]:
        out = []
        for part, token in sections:
            if token is not None:
                out.append(token)
            else:
                out.extend(t for piece in self.encode_pieces(part) for t in piece)
        return out

    def encode_bytes(self, data: bytes) -> list[int]:
        try:
            return self.encode_ordinary(data.decode("utf-8"))
        except UnicodeDecodeError as exc:
            valid = exc.start
        pieces = self.encode_pieces(data[:valid].decode("utf-8"))
        tokens = [t for piece in pieces for t in piece]
        last = len(pieces[-1]) if pieces else 0
        last = extend_over_space_tokens(tokens, last, self.vocab.decoder)
        unstable = self.decode_bytes(tokens[len(tokens) - last:]) + data[valid:]
        del tokens[len(tokens) - last:]
        if unstable:
            tokens.extend(bpe_ranks(unstable, self.vocab.ranks) if self.vocab.merges is None
                          else self.bpe(unstable))
        return tokens

    def decode_bytes(self, ids) -> bytes:
        decoder = self.vocab.decoder
        return b"".join(decoder[int(i)] for i in ids)


def extend_over_space_tokens(tokens: list[int], last: int, decoder: dict) -> int:
    """tiktoken's `_increase_last_piece_token_len`: if the last piece starts with a token of
    only spaces/newlines/tabs, count the all-space tokens before it into the last piece."""
    def all_space(token: int) -> bool:
        return all(b in b" \n\t" for b in decoder.get(token, b"x"))
    if last > 0 and all_space(tokens[len(tokens) - last]):
        while last < len(tokens) and all_space(tokens[len(tokens) - last - 1]):
            last += 1
    return last
