"""What vocabulary training computes, and what it produces: the merge list and its tokens.

Both trainers (the readable CPU reference, tokenizer_svc/training/cpu_reference.py, and the
WGSL one, trainer.py) implement exactly this contract, and their merge lists are compared
equal.

Input: the corpus's unique pieces with their counts (tokenizer_svc/training/corpus.py); pieces
shorter than two bytes never hold a pair and play no part.

1. Ids 0..255 are the single bytes, in byte order. Every piece starts as its bytes.
2. The count of a pair (a, b) is the sum over pieces of (piece count) x (number of positions
   i with piece[i] = a and piece[i+1] = b). Overlapping positions all count: "aaa" holds
   (a, a) twice, "aaaa" three times; "abab" holds (a, b) twice and (b, a) once.
3. The chosen pair has the highest count; ties go to the lowest left id, then the lowest
   right id. With `max_token_bytes = B`, pairs whose bytes together are longer than B are
   never counted or chosen.
4. Applying the merge (a, b) -> t to a piece goes left to right and replaces each a followed
   by b that does not overlap a replacement already made: "aaa" -> [aa, a],
   "aaaa" -> [aa, aa], "abab" with (a, b) -> [ab, ab].
5. Every merge makes a new token, id 256 + (merge index): the bytes of a chosen pair are
   never those of an existing token. (Why: the edges of any token occurrence have been token
   boundaries since the start, so the span in between was always segmented exactly like its
   bytes on their own. The occurrence that made S = X + Y shows that S on its own was [X, Y]
   just before that merge, hence [S] after it. Adjacent Z, W with Z + W = S would span S's
   bytes, so they would have become [S] then too, and tokens never split.)
   `tokens_from_merges` checks this on every result.
6. Training stops once there are `n_tokens` ordinary tokens (ids 0..n_tokens-1; the rank of
   a token is its id). If no pair with a count above zero is left before that, the corpus is
   exhausted: `CorpusExhausted` says how many tokens it supports.
7. Special tokens get the ids after the last ordinary token, in the order given.

Everything here is exact integer arithmetic (the GPU keeps 64-bit counts), so the result is
deterministic: it does not depend on piece order, thread order or the device.
"""

from __future__ import annotations

from dataclasses import dataclass, field

N_BYTES = 256


class TrainingError(ValueError):
    """A training request that cannot be met; the message says why and what to do."""


class CorpusExhausted(TrainingError):
    """No pair is left to merge before the vocabulary reached the requested size."""

    def __init__(self, message: str, supported_tokens: int):
        super().__init__(message)
        self.supported_tokens = supported_tokens


@dataclass(frozen=True)
class Merge:
    left: int
    right: int
    token: int  # the new token's id: 256 + the merge's index
    count: int  # the pair's count when it was chosen


@dataclass
class TrainingResult:
    merges: list  # [Merge], in the order they were chosen
    tokens: list  # id -> bytes for the ordinary tokens
    pieces: int = 0  # unique pieces of two or more bytes the training ran on
    seconds: float = 0.0
    details: dict = field(default_factory=dict)  # trainer-specific numbers (rounds, ...)

    @property
    def n_tokens(self) -> int:
        return len(self.tokens)

    def ranks(self) -> dict:
        """bytes -> rank (= id) for a `.tiktoken` file."""
        return {tok: i for i, tok in enumerate(self.tokens)}

    def special_ids(self, specials=()) -> dict:
        """{special token: id}, numbered after the last ordinary token in the order given."""
        return {text: self.n_tokens + i for i, text in enumerate(specials)}


def check_request(size: int, specials=(), max_token_bytes: int | None = None) -> int:
    """Validate a training request; returns the number of ordinary tokens to learn."""
    specials = list(specials)
    for s in specials:
        if not isinstance(s, str) or not s:
            raise TrainingError(f"special token {s!r} must be a non-empty string")
    dupes = sorted({s for s in specials if specials.count(s) > 1})
    if dupes:
        raise TrainingError(f"special token(s) given twice: {', '.join(dupes)}")
    n_tokens = size - len(specials)
    if n_tokens <= N_BYTES:
        raise TrainingError(
            f"--size {size} leaves {n_tokens} ordinary tokens after {len(specials)} special "
            f"token(s); the 256 byte tokens come first, so the size must be at least "
            f"{N_BYTES + 1 + len(specials)} to learn any merge")
    if max_token_bytes is not None and max_token_bytes < 2:
        raise TrainingError(f"--max-token-bytes {max_token_bytes} allows no merge; "
                            "use 2 or more (or leave it out for no limit)")
    return n_tokens


def exhausted(n_tokens_reached: int, n_tokens_wanted: int, n_specials: int,
              max_token_bytes: int | None) -> CorpusExhausted:
    cap = f" within --max-token-bytes {max_token_bytes}" if max_token_bytes else ""
    supported = n_tokens_reached + n_specials
    return CorpusExhausted(
        f"the corpus ran out of pairs to merge{cap} after {n_tokens_reached - N_BYTES} new "
        f"tokens: it supports a vocabulary of at most {supported} (asked for "
        f"{n_tokens_wanted + n_specials}). Use --size {supported} or less, or give more "
        "varied text", supported)


def merge_piece(ids: list, left: int, right: int, token: int) -> list:
    """Rule 4: replace left-to-right, non-overlapping occurrences of (left, right) by token."""
    out = []
    i = 0
    while i < len(ids):
        if i + 1 < len(ids) and ids[i] == left and ids[i + 1] == right:
            out.append(token)
            i += 2
        else:
            out.append(ids[i])
            i += 1
    return out


def tokens_from_merges(merges) -> list:
    """Rebuild id -> bytes from a merge list, checking rule 5 (every merge makes a new token)."""
    tokens = [bytes([b]) for b in range(N_BYTES)]
    seen = set(tokens)
    for m in merges:
        joined = tokens[m.left] + tokens[m.right]
        if m.token != len(tokens) or joined in seen:
            raise AssertionError(f"merge {m} breaks rule 5 (bytes {joined!r}); this is a bug "
                                 "in the trainer, please report it")
        tokens.append(joined)
        seen.add(joined)
    return tokens
