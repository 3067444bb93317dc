"""`Encoding`: tiktoken's API, computed on the GPU (or by the CPU reference), exact ids.

    from tokenizer_svc.encoding import get_encoding
    enc = get_encoding("cl100k_base")                  # was: tiktoken.get_encoding(...)
    enc.encode("hello world")                          # [15339, 1917]
    enc.encode("<|endoftext|>", allowed_special="all")
    enc.decode(enc.encode_ordinary("héllo"))           # 'héllo'
    ids, offsets = enc.encode_batch_flat(["a", b"b\\xff"])   # numpy; doc i = ids[offsets[i]:offsets[i+1]]

`get_encoding(spec, device=None)`: `spec` is a known name (gpt2, r50k_base, cl100k_base,
o200k_base), a path (.tiktoken, with an optional sidecar; tokenizer.json) or a `Vocabulary`;
`device` is an `istanbul.shaders.engine.Device`, None for the process-wide default GPU, or "cpu" for the
plain-Python reference (slow; for checking and for machines where no Vulkan device exists).

Semantics are tiktoken's (tokenizer_svc/reference.py defines them): special tokens are cut out
on the CPU (allowed_special / disallowed_special exactly as tiktoken; the default raises
ValueError on text that spells a special token), the rest is pre-tokenized and merged on the GPU.
Lone surrogates in `str` input become U+FFFD as in tiktoken. `encode_bytes` accepts any bytes,
including invalid UTF-8, with tiktoken's `_encode_bytes` rule (see reference.py). `bytes`
documents go to the GPU as they are: calls of GPU_UTF8_CHECK_BYTES or more check their UTF-8
in the device call itself, smaller ones on the host, and a call with an invalid document
encodes document by document with that rule.

tokenizer.json vocabularies: their "special tokens" are the added tokens. `encode_ordinary`
normalizes, pre-tokenizes and merges (added-token text is ordinary text); `encode` also cuts
out the allowed added tokens with `tokenizers`' rules (normalized / lstrip / rstrip /
single_word, hf/pipeline.py); `encode_hf(text, add_special_tokens=True)` is exactly
`tokenizers.Tokenizer.encode(text, add_special_tokens=...).ids` (every added token matched,
the post-processor's BOS/EOS added).

Sharing: an `Encoding` may be used by any number of threads (CPU pre-tokenization runs in
parallel, GPU calls of one device are serialized). It pickles by vocabulary identity (a known
name or a file path plus its content hash, else the vocabulary itself) and builds its GPU state
lazily in the process that uses it. A process forked after the GPU was used (the default
start method of `multiprocessing`, DataLoader workers and `datasets.map(num_proc=...)` on
Linux) keeps working with the same ids: wgpu does not survive fork, so there every method
computes on the CPU (tiktoken or `tokenizers`, whichever reads the vocabulary, else the
reference), the parent's GPU objects are never touched or released, and one
`ForkedGpuWarning` per process names the faster choice, the "spawn" or "forkserver" start
method (tokenizer_svc/forked.py).
"""

from __future__ import annotations

import bisect
import operator
import os
import threading
from collections import OrderedDict
from itertools import filterfalse
from typing import AbstractSet, Collection, Literal, Sequence

import numpy as np

from istanbul.shaders.kernels.bpe.cuts import valid_utf8_prefix
from istanbul.shaders.kernels.bpe.packed_text import LazyPackedText, PackedText
from istanbul.shaders.kernels.bpe.reference import bpe_ranks
from . import forked
from .forked import ForkedGpuWarning
from .reference import (ReferenceTokenizer, check_disallowed, extend_over_space_tokens,
                        fix_surrogates, resolve_special, split_special)
from .model_names import encoding_name_for_model
from .patterns import KNOWN_VOCABULARIES
from .vocab import Vocabulary, load_vocabulary


class InvalidTokenError(KeyError, ValueError):
    """A token id that is not in the vocabulary (outside 0..n_vocab-1, or a hole).

    A KeyError like tiktoken's (code written for tiktoken catches it), and a ValueError as
    before.
    """

    def __init__(self, token: int, position: int, vocab_name: str, n_vocab: int,
                 document: int | None = None):
        where = f"position {position}" + (f" of document {document}" if document is not None
                                          else "")
        super().__init__(f"token id {token} at {where} is not in vocabulary {vocab_name!r} "
                         f"(ids are 0..{n_vocab - 1}, some of them unassigned); decode only ids "
                         "produced with this vocabulary")
        self.token = token
        self.position = position
        self.document = document

    def __str__(self) -> str:  # KeyError would show the repr of the message
        return str(self.args[0])


class CpuBackend:
    """The reference, behind the same interface as gpu_backend.GpuBackend."""

    kind = "cpu"

    def __init__(self, vocab: Vocabulary):
        self.vocab = vocab
        self.ref = ReferenceTokenizer(vocab)

    def describe(self) -> str:
        return "CPU reference (plain Python)"

    def encode_segments(self, segments: list[bytes]) -> tuple[np.ndarray, np.ndarray]:
        parts = [np.array([t for piece in self.ref.encode_pieces(s.decode("utf-8")) for t in piece],
                          dtype=np.uint32) for s in segments]
        return _flatten(parts)

    def encode_pieces(self, pieces: list[bytes]) -> tuple[np.ndarray, np.ndarray]:
        return _flatten([np.array(self.ref.bpe(p), dtype=np.uint32) for p in pieces])

    def last_piece_length(self, prefix: bytes) -> int:
        pieces = self.ref.split(prefix.decode("utf-8"))
        return len(pieces[-1].encode("utf-8")) if pieces else 0

    def decode(self, ids: np.ndarray) -> bytes:
        from istanbul.shaders.kernels.bpe.decode import InvalidIdError
        decoder = self.vocab.decoder
        out = []
        for pos, i in enumerate(ids.tolist()):
            token = decoder.get(i)
            if token is None:
                raise InvalidIdError(i, pos)
            out.append(token)
        return b"".join(out)


def _flatten(parts: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    offsets = np.zeros(len(parts) + 1, dtype=np.int64)
    np.cumsum([p.size for p in parts], out=offsets[1:])
    ids = np.concatenate(parts).astype(np.uint32) if parts else np.zeros(0, np.uint32)
    return ids, offsets


class Encoding:
    """A vocabulary with tiktoken's encode/decode API; GPU-backed unless device="cpu".

    tiktoken's surface, with tiktoken's semantics: `name`, `n_vocab`, `max_token_value`,
    `eot_token`, `special_tokens_set`, `is_special_token`, `encode`, `encode_ordinary`,
    `encode_to_numpy`, `encode_batch`, `encode_ordinary_batch`, `encode_with_unstable`,
    `encode_single_token`, `decode`, `decode_bytes`, `decode_batch`, `decode_bytes_batch`,
    `decode_single_token_bytes`, `decode_tokens_bytes`, `decode_with_offsets`,
    `token_byte_values`.

    Beyond tiktoken, a small set:

    - flat batches, one GPU call for many documents: `encode_batch_flat(docs)` -> (ids,
      offsets), document i is ids[offsets[i]:offsets[i+1]]; `decode_bytes_batch_flat(ids,
      offsets)` is its inverse;
    - `encode_bytes(data)`: raw bytes, invalid UTF-8 included (tiktoken's `_encode_bytes`);
    - `encode_with_offsets(text, unit)`: ids and each token's start, in bytes or characters;
    - Hugging Face semantics for tokenizer.json vocabularies: `encode_hf`, `encode_hf_batch`
      (every added token matched, then the post-processor), `decode_hf`.

    And what it runs on: `vocab`, `backend` (GPU or CPU reference), `reference` (the CPU
    reference tokenizer of the same vocabulary).
    """

    def __init__(self, vocab: Vocabulary, device=None, *, lazy: bool = False):
        """`lazy`: build the GPU state at the first call instead of now (unpickled copies)."""
        self.vocab = vocab
        self._device = device
        self._backend = None
        self._build_lock = threading.Lock()
        self._hf = None
        if vocab.hf is not None:
            from .hf.pipeline import HFPipeline
            self._hf = HFPipeline(vocab)
        self._ref = None
        self._special_ids = frozenset(vocab.special_tokens.values())
        decoder = vocab.decoder
        size = max(decoder) + 1
        self._token_lengths = np.zeros(size, dtype=np.int64)
        self._token_chars = np.zeros(size, dtype=np.int64)
        self._token_mid_char = np.zeros(size, dtype=bool)
        for i, token in decoder.items():
            self._token_lengths[i] = len(token)
            self._token_chars[i] = sum(1 for b in token if not 0x80 <= b < 0xC0)
            self._token_mid_char[i] = bool(token) and 0x80 <= token[0] < 0xC0
        if not lazy:
            self.backend  # noqa: B018 (build now: errors and compile time at construction)

    @property
    def backend(self):
        """The CPU reference or the GPU backend, built on first use in this process; in a
        process forked after the GPU was used, forked.ForkedCpuBackend instead."""
        backend = self._backend
        if backend is not None and backend.kind == "cpu":
            return backend
        if self._device != "cpu" and forked.forked_from_gpu():
            return self._forked_backend()
        if backend is None:
            with self._build_lock:
                if self._backend is None:
                    if self._device == "cpu":
                        self._backend = CpuBackend(self.vocab)
                    else:
                        from istanbul.shaders.engine import default_device
                        from .gpu_backend import ROBUSTNESS, GpuBackend
                        device = self._device if self._device is not None else \
                            default_device(robustness=ROBUSTNESS)
                        self._backend = GpuBackend(self.vocab, device)
                        forked.note_gpu_backend(self._backend)
                backend = self._backend
        return backend

    def _forked_backend(self):
        """This process's CPU backend (made at its first call), the GPU state inherited from
        the parent pinned, never used or released here."""
        cpu = self.__dict__.get("_forked")
        if cpu is None:
            if self._backend is not None:
                forked.pin(self._backend)   # also when the fork skipped the at-fork hooks
            cpu = self.__dict__["_forked"] = forked.cpu_backend(self.vocab)
        forked.warn_once(self.name, cpu.engine)
        return cpu

    @property
    def reference(self) -> ReferenceTokenizer:
        """The plain-Python reference for this vocabulary (for encode_with_unstable)."""
        if self._ref is None:
            self._ref = ReferenceTokenizer(self.vocab)
        return self._ref

    def __repr__(self) -> str:
        if self._device != "cpu" and forked.forked_from_gpu():
            where = "the CPU (forked from a process that used the GPU)"
        else:
            where = self._backend.describe() if self._backend is not None else (
                "CPU reference" if self._device == "cpu" else "GPU (not started)")
        return f"<Encoding {self.name!r} on {where}>"

    def __reduce__(self):
        """Pickle by vocabulary identity; the receiver builds its own GPU state lazily."""
        return (_unpickle_encoding, (_vocab_identity(self.vocab), self.vocab.content_hash,
                                     "cpu" if self._device == "cpu" else None))

    # ---- facts --------------------------------------------------------------------------

    @property
    def name(self) -> str:
        return self.vocab.name

    @property
    def n_vocab(self) -> int:
        return self.vocab.n_vocab

    @property
    def max_token_value(self) -> int:
        return max([*self.vocab.ranks.values(), *self.vocab.special_tokens.values()])

    @property
    def eot_token(self) -> int | None:
        return self.vocab.eot_token

    @property
    def special_tokens_set(self) -> set[str]:
        return set(self.vocab.special_tokens)

    def is_special_token(self, token: int) -> bool:
        return token in self._special_ids

    # ---- encoding -----------------------------------------------------------------------

    def encode_ordinary(self, text: str) -> list[int]:
        """Encode ignoring special tokens (their text is ordinary text)."""
        ids, _ = self._encode_ordinary_many([text])
        return ids.tolist()

    def encode_to_numpy(self, text: str, *,
                        allowed_special: Literal["all"] | AbstractSet[str] = set(),
                        disallowed_special: Literal["all"] | Collection[str] = "all"
                        ) -> np.ndarray:
        """tiktoken's `encode_to_numpy`: `encode` as a uint32 array."""
        ids, _ = self._encode_texts([text], allowed_special, disallowed_special)
        return ids.astype(np.uint32)

    def encode_hf(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """`tokenizers.Tokenizer.encode(text, add_special_tokens=...).ids` for tokenizer.json
        vocabularies: every added token matched, then the post-processor (BOS/EOS...)."""
        return self.encode_hf_batch([text], add_special_tokens=add_special_tokens)[0]

    def encode_hf_batch(self, texts: Sequence[str], add_special_tokens: bool = True
                        ) -> list[list[int]]:
        """`tokenizers`' `encode_batch(...)` ids, all documents in one GPU call."""
        if self._hf is None:
            raise ValueError(f"{self.name}: encode_hf needs a tokenizer.json vocabulary (use "
                             "encode for tiktoken-style vocabularies)")
        ids, offsets = self._encode_texts(list(texts), "all", (), hf_all=True)
        out = _split(ids, offsets)
        return [self._hf.post_process(x) for x in out] if add_special_tokens else out

    def encode(self, text: str, *, allowed_special: Literal["all"] | AbstractSet[str] = set(),
               disallowed_special: Literal["all"] | Collection[str] = "all") -> list[int]:
        """tiktoken's `encode`: raises ValueError on disallowed special-token text."""
        ids, _ = self._encode_texts([text], allowed_special, disallowed_special)
        return ids.tolist()

    def encode_ordinary_batch(self, text: Sequence[str], *, num_threads: int = 8) -> list[list[int]]:
        """One GPU batch for all texts (`num_threads` is accepted for tiktoken compatibility)."""
        ids, offsets = self._encode_ordinary_many(list(text))
        return _split(ids, offsets)

    def _encode_ordinary_many(self, texts: list[str]):
        if self._hf is not None:
            texts = [self._hf.normalize(fix_surrogates(t)) for t in texts]
        packed_encode = getattr(self.backend, "encode_packed", None)
        if packed_encode is not None and sum(map(len, texts)) >= LAZY_PACK_CHARS:
            lazy = LazyPackedText(texts, encode=_utf8)
            return packed_encode(lazy, lazy.starts)
        packed = _pack_utf8(texts) if packed_encode is not None else None
        if packed is not None:
            return packed_encode(*packed)
        return self.backend.encode_segments([_utf8(t) for t in texts])

    def encode_batch(self, text: Sequence[str], *, num_threads: int = 8,
                     allowed_special: Literal["all"] | AbstractSet[str] = set(),
                     disallowed_special: Literal["all"] | Collection[str] = "all") -> list[list[int]]:
        ids, offsets = self._encode_texts(list(text), allowed_special, disallowed_special)
        return _split(ids, offsets)

    def encode_bytes(self, data: bytes) -> list[int]:
        """Encode raw bytes, including invalid UTF-8 (tiktoken's `_encode_bytes` rule)."""
        ids, _ = self._encode_bytes_many([bytes(data)])
        return ids.tolist()

    _encode_bytes = encode_bytes  # tiktoken's name

    def encode_with_unstable(self, text: str, *,
                             allowed_special: Literal["all"] | AbstractSet[str] = set(),
                             disallowed_special: Literal["all"] | Collection[str] = "all"
                             ) -> tuple[list[int], list[list[int]]]:
        """tiktoken's `encode_with_unstable`: (stable tokens, possible completions).

        The tokens of the last piece (extended over all-space tokens before it) are unstable:
        more text could change them. The completions are every token sequence that could
        start there: tokens that start with the unstable bytes, and for each split of them,
        the prefix followed by a token starting with the rest, encoded (cut once they cover
        the unstable bytes); and, if they end in whitespace, that whitespace merged apart. The
        order of the completions is unspecified (tiktoken's is a hash set's).
        """
        if self.vocab.merges is not None:
            raise ValueError(f"{self.name}: encode_with_unstable is tiktoken's; it is not defined "
                             "for tokenizer.json vocabularies")
        allowed, disallowed = resolve_special(self.vocab.special_tokens, allowed_special,
                                              disallowed_special)
        if disallowed:
            check_disallowed(text, disallowed)
        ref = self.reference
        text = fix_surrogates(text)
        parts = split_special(text, allowed, self.vocab.special_tokens)
        tokens = self._encode_texts([text], allowed, ())[0].tolist()
        last_part, last_special = parts[-1]
        pieces = ref.split(last_part) if last_special is None else []
        if not pieces:
            return tokens, []
        last = len(ref.bpe(pieces[-1].encode("utf-8")))
        last = extend_over_space_tokens(tokens, last, self.vocab.decoder)
        unstable = self.decode_bytes(tokens[len(tokens) - last:])
        del tokens[len(tokens) - last:]
        completions: set = set()
        if not unstable:
            return tokens, []
        ordered = self._sorted_token_bytes
        ranks = self.vocab.ranks
        point = bisect.bisect_left(ordered, unstable)
        while point < len(ordered) and ordered[point].startswith(unstable):
            completions.add((ranks[ordered[point]],))
            point += 1
        for i in range(1, len(unstable)):
            prefix, suffix = unstable[:i], unstable[i:]
            point = bisect.bisect_left(ordered, suffix)
            while point < len(ordered) and ordered[point].startswith(suffix):
                possibility = prefix + ordered[point]
                try:
                    encoded = ref.encode_ordinary(possibility.decode("utf-8"))
                except UnicodeDecodeError:
                    encoded = bpe_ranks(possibility, ranks)
                seq, covered = [], 0
                for token in encoded:
                    seq.append(token)
                    covered += len(self.vocab.decoder[token])
                    if covered >= len(unstable):
                        break
                completions.add(tuple(seq))
                point += 1
        if len(unstable) > 1:
            last_char, width = _last_char(unstable)
            if len(unstable) - width > 0 and last_char is not None and last_char.isspace():
                again = bpe_ranks(unstable[:len(unstable) - width], ranks) + \
                    bpe_ranks(unstable[len(unstable) - width:], ranks)
                completions.add(tuple(again))
        return tokens, [list(c) for c in completions]

    @property
    def _sorted_token_bytes(self) -> list[bytes]:
        cached = self.__dict__.get("_sorted_tokens")
        if cached is None:
            cached = self.__dict__["_sorted_tokens"] = sorted(self.vocab.ranks)
        return cached

    def encode_batch_flat(self, docs: Sequence[str | bytes], *,
                          allowed_special: Literal["all"] | AbstractSet[str] = frozenset(),
                          disallowed_special: Literal["all"] | Collection[str] = (),
                          out: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Many documents in one GPU call -> (ids uint32, offsets int64 of len(docs) + 1).

        Document i is ids[offsets[i]:offsets[i+1]]. `str` documents follow `encode` with the
        given special-token arguments (default: like `encode_ordinary`); `bytes` documents
        follow `encode_bytes` (raw bytes, special-token text is ordinary text).

        `out`: a 1-D uint32 array with at least as many elements as the documents have UTF-8
        bytes (no document has more tokens than bytes); the ids are written into it and the
        ids returned are its first elements. For ordinary `str` documents on the GPU the ids
        go straight from the readback buffer into it.
        """
        docs = list(docs)
        if out is not None:
            return self._into(out, docs, allowed_special, disallowed_special)
        if all(isinstance(d, str) for d in docs):
            return self._encode_texts(docs, allowed_special, disallowed_special)
        if all(isinstance(d, (bytes, bytearray, memoryview)) for d in docs):
            return self._encode_bytes_many([bytes(d) for d in docs])
        parts: list = [None] * len(docs)
        texts = [i for i, d in enumerate(docs) if isinstance(d, str)]
        raws = [i for i, d in enumerate(docs) if not isinstance(d, str)]
        for group, (ids, offsets) in ((texts, self._encode_texts(
                [docs[i] for i in texts], allowed_special, disallowed_special)),
                (raws, self._encode_bytes_many([bytes(docs[i]) for i in raws]))):
            for k, i in enumerate(group):
                parts[i] = ids[offsets[k]:offsets[k + 1]]
        return _flatten(parts)

    def _encode_utf8_batch_flat(self, docs: Sequence[bytes]) -> tuple[np.ndarray, np.ndarray]:
        """`encode_batch_flat` of text documents given as their UTF-8, no special tokens
        allowed (`encode_ordinary`'s ids): `docs[i]` is `texts[i].encode()`, so each must be
        valid UTF-8 (raw bytes of unknown validity follow `encode_bytes`: give them to
        `encode_batch_flat`). The bytes go to the encoder as they are, neither decoded to
        `str` nor encoded back (the shared GPU process's workers send text so)."""
        docs = list(map(bytes, docs))   # PackedText takes bytes (`bytes(b) is b`: no copy)
        packed_encode = getattr(self.backend, "encode_packed", None)
        if self._hf is not None or packed_encode is None:   # a normalizer works on text
            return self._encode_ordinary_many([d.decode("utf-8") for d in docs])
        return packed_encode(*_joined(docs))

    def _begin_utf8_batch_flat(self, docs: Sequence[bytes]):
        """`_encode_utf8_batch_flat` in two halves: the call is submitted to the GPU here and
        the returned object's `finish()` gives (ids, offsets); `cancel()` drops it. Between
        the two the caller may do other work, including one more begun call (the GPU runs it
        right after: gpu_backend.GpuBackend.begin_packed). Backends or vocabularies without
        the packed GPU path encode here and finish() returns the result."""
        from .gpu_backend import FinishedCall
        docs = list(map(bytes, docs))
        begin = getattr(self.backend, "begin_packed", None)
        if self._hf is not None or begin is None:
            return FinishedCall(self._encode_utf8_batch_flat(docs))
        return begin(*_joined(docs))

    def _into(self, out, docs, allowed_special, disallowed_special):
        if not isinstance(out, np.ndarray) or out.dtype != np.uint32 or out.ndim != 1:
            raise ValueError("out must be a 1-D numpy uint32 array, got "
                             f"{getattr(out, 'dtype', type(out).__name__)} "
                             f"{getattr(out, 'shape', '')}")
        allowed, _ = resolve_special(self.vocab.special_tokens, allowed_special,
                                     disallowed_special)
        if not allowed and self._hf is None and all(isinstance(d, str) for d in docs):
            packed_encode = getattr(self.backend, "encode_packed", None)
            packed = _pack_utf8(docs) if packed_encode is not None else None
            if packed is not None:
                self._encode_texts(docs, allowed_special, disallowed_special, check_only=True)
                if out.size < len(packed[0]):
                    raise ValueError(f"out has {out.size:,} elements; these documents need "
                                     f"up to {len(packed[0]):,} (one per UTF-8 byte)")
                return packed_encode(*packed, out=out)
        ids, offsets = self.encode_batch_flat(docs, allowed_special=allowed_special,
                                              disallowed_special=disallowed_special)
        if out.size < ids.size:
            raise ValueError(f"out has {out.size:,} elements; these documents have "
                             f"{ids.size:,} tokens")
        out[:ids.size] = ids
        return out[:ids.size], offsets

    def encode_with_offsets(self, text: str, unit: Literal["byte", "char"] = "byte", *,
                            allowed_special: Literal["all"] | AbstractSet[str] = set(),
                            disallowed_special: Literal["all"] | Collection[str] = "all"
                            ) -> tuple[list[int], list[int]]:
        """(ids, start offset of each token) in bytes of the UTF-8 text, or in characters.

        Character offsets follow tiktoken's `decode_with_offsets`: a token that starts inside a
        character (a split multi-byte character) points at that character.
        """
        ids, _ = self._encode_texts([text], allowed_special, disallowed_special)
        return ids.tolist(), self._token_offsets(ids, unit).tolist()

    def _token_offsets(self, ids, unit: str = "byte") -> np.ndarray:
        """Start offset of each token of `ids` (bytes, or characters as tiktoken counts them)."""
        ids = np.asarray(ids, dtype=np.int64)
        if unit == "byte":
            lengths = self._token_lengths[ids]
            return np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64) \
                if ids.size else np.zeros(0, np.int64)
        if unit == "char":
            if not ids.size:
                return np.zeros(0, np.int64)
            chars = self._token_chars[ids]
            before = np.concatenate([[0], np.cumsum(chars)[:-1]])
            return np.maximum(0, before - self._token_mid_char[ids]).astype(np.int64)
        raise ValueError(f"unit must be 'byte' or 'char', got {unit!r}")

    def _encode_texts(self, texts: list[str], allowed_special, disallowed_special,
                      hf_all: bool = False, check_only: bool = False):
        allowed, disallowed = resolve_special(self.vocab.special_tokens, allowed_special,
                                              disallowed_special)
        if disallowed:
            for text in texts:
                check_disallowed(text, disallowed)
        if check_only:   # the disallowed-special check alone (encode_batch_flat's out=)
            return None
        if not allowed:
            return self._encode_ordinary_many(texts)
        if self._hf is not None:  # tokenizers' added-token rules, restricted to `allowed`
            hf_allowed = None if hf_all else allowed
            split = lambda text: self._hf.sections(fix_surrogates(text), hf_allowed)  # noqa
        else:
            split = lambda text: split_special(fix_surrogates(text), allowed,  # noqa: E731
                                               self.vocab.special_tokens)
        segments, layout = [], []  # per text: list of ("seg", index) / ("special", id)
        for text in texts:
            plan = []
            for part, special in split(text):
                if special is None:
                    plan.append((0, len(segments)))
                    segments.append(part.encode("utf-8"))
                else:
                    plan.append((1, special))
            layout.append(plan)
        ids, offsets = self.backend.encode_segments(segments)
        parts = []
        for plan in layout:
            pieces = [ids[offsets[v]:offsets[v + 1]] if kind == 0 else
                      np.array([v], dtype=np.uint32) for kind, v in plan]
            parts.append(np.concatenate(pieces) if pieces else np.zeros(0, np.uint32))
        return _flatten(parts)

    def _encode_bytes_many(self, docs: list[bytes]):
        if self._hf is not None and self.vocab.hf.normalizer not in (
                None, {"type": "Sequence", "normalizers": []}):
            texts = []  # a normalizer works on text: bytes must be valid UTF-8
            for k, d in enumerate(docs):
                try:
                    texts.append(d.decode("utf-8"))
                except UnicodeDecodeError as exc:
                    raise ValueError(
                        f"document {k}: invalid UTF-8 at byte {exc.start}; {self.name} has a "
                        "normalizer, which needs text: decode the bytes first (e.g. "
                        "errors='replace')") from None
            return self._encode_ordinary_many(texts)
        packed_encode = getattr(self.backend, "encode_packed", None)
        if packed_encode is not None:   # the common case: every document valid, one device call
            packed = _joined(docs) if getattr(self.backend, "checks_utf8", False) else None
            if packed is not None and int(packed[1][-1]) >= GPU_UTF8_CHECK_BYTES:
                # the call checks the documents itself (no host decode); an invalid one ends
                # it, and the documents go on below
                from istanbul.shaders.kernels.bpe.encode import InvalidUtf8   # GPU modules
                try:
                    return packed_encode(*packed, check_utf8=True)
                except InvalidUtf8:
                    pass
            else:
                packed = _pack_valid_utf8(docs)   # checked here
                if packed is not None:
                    return packed_encode(*packed)
        valid = [valid_utf8_prefix(d) for d in docs]
        ids, offsets = self.backend.encode_segments([d[:v] for d, v in zip(docs, valid)])
        if all(v == len(d) for d, v in zip(docs, valid)):
            return ids, offsets
        decoder = self.vocab.decoder
        parts = []
        for k, (d, v) in enumerate(zip(docs, valid)):
            toks = ids[offsets[k]:offsets[k + 1]]
            if v == len(d):
                parts.append(toks)
                continue
            # tiktoken: the last piece (extended over all-space tokens) joins the invalid tail
            last_len = self.backend.last_piece_length(d[:v])
            count, covered = 0, 0
            while covered < last_len:
                count += 1
                covered += int(self._token_lengths[toks[toks.size - count]])
            tokens = toks.tolist()
            count = extend_over_space_tokens(tokens, count, decoder)
            keep = len(tokens) - count
            unstable = b"".join(decoder[t] for t in tokens[keep:]) + d[v:]
            tail, _ = self.backend.encode_pieces([unstable])
            parts.append(np.concatenate([toks[:keep], tail]).astype(np.uint32))
        return _flatten(parts)

    def encode_single_token(self, text_or_bytes: str | bytes) -> int:
        """The id of one token given as text or bytes (ordinary or special), like tiktoken;
        KeyError(bytes) if it is not a single token."""
        data = text_or_bytes.encode("utf-8") if isinstance(text_or_bytes, str) \
            else bytes(text_or_bytes)
        if data in self.vocab.ranks:
            return self.vocab.ranks[data]
        try:
            special = self.vocab.special_tokens.get(data.decode("utf-8"))
        except UnicodeDecodeError:
            special = None
        if special is not None:
            return special
        raise KeyError(data)

    # ---- decoding -----------------------------------------------------------------------

    def decode_bytes(self, tokens: Sequence[int]) -> bytes:
        """The exact bytes of the tokens (special tokens decode to their text)."""
        return self._decode(np.asarray(tokens, dtype=np.int64).reshape(-1))

    def decode(self, tokens: Sequence[int], errors: str = "replace") -> str:
        """Text of the tokens; errors="strict" raises on invalid UTF-8, "replace" (tiktoken's
        default) substitutes U+FFFD."""
        return self.decode_bytes(tokens).decode("utf-8", errors=errors)

    def decode_hf(self, tokens: Sequence[int], skip_special_tokens: bool = True) -> str:
        """`tokenizers`' `decode(ids, skip_special_tokens=...)` for tokenizer.json vocabularies
        (ByteLevel decoder: the bytes, invalid UTF-8 replaced). Unlike `tokenizers`, an id that
        is not in the vocabulary raises InvalidTokenError instead of being dropped."""
        if self._hf is None:
            raise ValueError(f"{self.name}: decode_hf needs a tokenizer.json vocabulary")
        if skip_special_tokens:
            special = {a.id for a in self.vocab.hf.added if a.special}
            tokens = [t for t in tokens if int(t) not in special]
        if self.vocab.hf.byte_level_decoder:
            return self.decode(tokens, errors="replace")
        # no decoder in the file: tokenizers joins the token strings with spaces
        from .hf.tokenizer_json import bytes_to_unicode
        to_char = bytes_to_unicode()
        added = {a.id: a.content for a in self.vocab.hf.added}
        ranks_ids = set(self.vocab.ranks.values())
        words = []
        for t in tokens:
            t = int(t)
            if t in ranks_ids:
                words.append("".join(to_char[b] for b in self.decode_single_token_bytes(t)))
            elif t in added:
                words.append(added[t])
            else:
                self.decode_single_token_bytes(t)  # raises InvalidTokenError
        return " ".join(words)

    def decode_batch(self, batch: Sequence[Sequence[int]], *, errors: str = "replace",
                     num_threads: int = 8) -> list[str]:
        return [b.decode("utf-8", errors=errors) for b in self.decode_bytes_batch(batch)]

    def decode_bytes_batch(self, batch: Sequence[Sequence[int]], *,
                           num_threads: int = 8) -> list[bytes]:
        """All documents in one GPU call."""
        arrays = batch if isinstance(batch, list) else list(batch)
        flat = _adjacent_uint32(arrays)   # slices of one flat array: no copy
        if flat is None:
            arrays = [np.asarray(b).reshape(-1) for b in arrays]
            if not all(a.dtype == np.uint32 for a in arrays):   # numpy uint32 (encode's) as is
                arrays = [a.astype(np.int64) for a in arrays]
            flat = np.concatenate(arrays) if arrays else np.zeros(0, np.int64)
        starts = np.zeros(len(arrays) + 1, np.int64)
        np.cumsum(np.fromiter(map(len, arrays), dtype=np.int64, count=len(arrays)),
                  out=starts[1:])
        return self._decode_docs(flat, starts)

    def decode_bytes_batch_flat(self, ids, offsets) -> list[bytes]:
        """The inverse of encode_batch_flat: document i is ids[offsets[i]:offsets[i + 1]]
        (offsets non-decreasing, n + 1 of them, within ids). The same bytes as
        decode_bytes_batch of those slices, without looking at n Python objects: one GPU
        call for the documents' ids as they lie in `ids`."""
        ids = np.asarray(ids).reshape(-1)
        offsets = np.asarray(offsets, dtype=np.int64).reshape(-1)
        if offsets.size == 0:
            raise ValueError("offsets must hold n + 1 document boundaries (at least one)")
        if offsets[0] < 0 or offsets[-1] > ids.size or np.any(np.diff(offsets) < 0):
            raise ValueError(f"offsets must be non-decreasing within the {ids.size} ids "
                             f"(got {offsets[0]} .. {offsets[-1]})")
        if ids.dtype != np.uint32:
            ids = ids.astype(np.int64)
        return self._decode_docs(ids[offsets[0]:offsets[-1]], offsets - offsets[0])

    def _decode_docs(self, flat: np.ndarray, starts: np.ndarray) -> list[bytes]:
        """The bytes of each document: flat ids (uint32, or int64 to be checked), starts
        their n + 1 offsets from 0; errors name the document and the position in it."""
        from istanbul.shaders.kernels.bpe.decode import InvalidIdError
        decode_docs = getattr(self.backend, "decode_docs", None)
        try:
            if decode_docs is not None and flat.dtype == np.uint32:
                try:
                    return decode_docs(flat, starts)
                except InvalidIdError as exc:
                    raise InvalidTokenError(exc.token, exc.position, self.name,
                                            self.n_vocab) from None
            data = self._decode(flat)
        except InvalidTokenError as exc:
            doc = int(np.searchsorted(starts[1:], exc.position, side="right"))
            raise InvalidTokenError(exc.token, exc.position - int(starts[doc]), self.name,
                                    self.n_vocab, document=doc) from None
        byte_ends = np.concatenate([[0], np.cumsum(self._token_lengths[flat])])
        bounds = byte_ends[starts]
        return [data[bounds[i]:bounds[i + 1]] for i in range(starts.size - 1)]

    def decode_single_token_bytes(self, token: int) -> bytes:
        try:
            return self.vocab.decoder[int(token)]
        except KeyError:
            raise InvalidTokenError(int(token), 0, self.name, self.n_vocab) from None

    def decode_tokens_bytes(self, tokens: Sequence[int]) -> list[bytes]:
        return [self.decode_single_token_bytes(t) for t in tokens]

    def decode_with_offsets(self, tokens: Sequence[int]) -> tuple[str, list[int]]:
        """tiktoken's: (strict text, character offset of each token)."""
        text = self.decode_bytes(tokens).decode("utf-8", errors="strict")
        return text, self._token_offsets(tokens, "char").tolist()

    def token_byte_values(self) -> list[bytes]:
        return sorted(self.vocab.ranks)

    def _decode(self, ids: np.ndarray) -> bytes:
        from istanbul.shaders.kernels.bpe.decode import InvalidIdError
        try:
            return self.backend.decode(ids)
        except InvalidIdError as exc:
            raise InvalidTokenError(exc.token, exc.position, self.name, self.n_vocab) from None


def _adjacent_uint32(arrays: list) -> np.ndarray | None:
    """`arrays` as one uint32 array without copying when they are consecutive slices of one
    array (as callers split encode_batch_flat's flat ids per document), else None. Joining
    67 MB of ids with np.concatenate cost 144 ms on a 2-core VM (fresh pages); this check
    6 ms for 7,350 slices. Empty arrays hold nothing and may point anywhere: skipped."""
    owner = start = at = None
    for a in arrays:
        if type(a) is not np.ndarray or a.ndim != 1:
            return None
        if not a.size:
            continue
        if a.dtype != np.uint32 or not a.flags.c_contiguous:
            return None
        base = a.base if a.base is not None else a
        here = a.__array_interface__["data"][0]
        if owner is None:
            owner, start, at = base, here, here
        elif base is not owner or here != at:
            return None
        at += a.nbytes
    if type(owner) is not np.ndarray or not owner.flags.c_contiguous:
        return None
    origin = owner.__array_interface__["data"][0]
    return np.frombuffer(owner, np.uint8, count=at - start,
                         offset=start - origin).view(np.uint32)


def _last_char(data: bytes) -> tuple[str | None, int]:
    """The last UTF-8 character of `data` and its byte width (None, 1 if it is invalid)."""
    for width in range(1, min(4, len(data)) + 1):
        try:
            return data[len(data) - width:].decode("utf-8"), width
        except UnicodeDecodeError:
            continue
    return None, 1


def _vocab_identity(vocab: Vocabulary) -> tuple:
    """How a pickled Encoding names its vocabulary: a file (and known name), or the value."""
    path = os.path.abspath(vocab.source) if vocab.source and os.path.isfile(vocab.source) \
        else None
    if vocab.name in KNOWN_VOCABULARIES and vocab.hf is None and vocab.source:
        return ("known", vocab.name, path, vocab.pattern_name or vocab.pattern)
    if path is not None:
        pattern = None if vocab.hf is not None else (vocab.pattern_name or vocab.pattern)
        return ("path", path, pattern, vocab.name)
    return ("vocab", vocab)


def _unpickle_encoding(identity: tuple, content_hash: str, device):
    from .vocab import VocabularyError, load_known_file, load_vocabulary
    kind = identity[0]
    if kind == "vocab":
        vocab = identity[1]
    elif kind == "known":  # the same file if this machine has it, else found by name
        _, name, path, pattern = identity
        vocab = load_known_file(name, path, pattern) if path and os.path.isfile(path) else \
            load_vocabulary(name, pattern=pattern)
    else:
        _, path, pattern, name = identity
        vocab = load_vocabulary(path, pattern=pattern)
        vocab.name = name
    if vocab.content_hash != content_hash:
        raise VocabularyError(
            f"unpickling Encoding {vocab.name!r}: the vocabulary found here ({vocab.source}) "
            f"is not the one that was pickled (content hash {vocab.content_hash[:12]} != "
            f"{content_hash[:12]}); give this process the same vocabulary file")
    return get_encoding(vocab, device=device, lazy=True)


# `bytes` documents of at least this many bytes in all check their UTF-8 in the device call
# (GpuEncoder check_utf8: one more dispatch in each chunk's submit); smaller calls check on
# the host, where decoding them costs a lone small request less than one more dispatch
# (~1-1.4 ns per non-ASCII byte against ~10-25 us per dispatch: bpe_compact.wgsl;
# dev/tokenizer_throughput/README.md, issue 50).
GPU_UTF8_CHECK_BYTES = 16 << 10


# `str` batches of at least this many characters reach the encoder unencoded
# (LazyPackedText): the GPU encoder then encodes their non-ASCII texts chunk by chunk while
# the GPU works on the chunks before, where it can cut the call that way
# (GpuEncoder._cuts_lazily); smaller batches (at most 4 MB of UTF-8: one pipeline chunk) are
# encoded first (_pack_utf8), a lone request's shortest path (dev/tokenizer_throughput/
# README.md, issue 50).
LAZY_PACK_CHARS = 1 << 20


def _utf8(text: str) -> bytes:
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        return fix_surrogates(text).encode("utf-8")


def _joined(docs: list[bytes]) -> tuple[PackedText, np.ndarray]:
    """UTF-8 documents as one PackedText (joined range by range as the encoder uploads them)
    and their n + 1 byte offsets."""
    starts = np.zeros(len(docs) + 1, dtype=np.int64)
    np.cumsum(np.fromiter(map(len, docs), dtype=np.int64, count=len(docs)), out=starts[1:])
    return PackedText(docs, starts), starts


def _pack_utf8(texts: list[str]) -> tuple[PackedText, np.ndarray] | None:
    """(the texts' UTF-8 as a PackedText, their n + 1 byte starts) with a constant number of
    Python operations (C-level maps); None if a text holds a lone surrogate (then each text
    is encoded on its own, with tiktoken's replacement). Only the non-ASCII texts are
    encoded here (their UTF-8 length is needed now); an ASCII text's length is its UTF-8
    length, and the encoder encodes and joins the parts range by range while the GPU works.
    Joining the str first would widen the whole batch to 4 bytes per character for one
    astral character and still need each text's length."""
    parts = list(texts)
    wide = np.flatnonzero(~np.fromiter(map(str.isascii, texts), dtype=bool, count=len(texts)))
    if wide.size:
        picked = operator.itemgetter(*wide.tolist())(texts)
        try:
            encoded = list(map(str.encode, (picked,) if wide.size == 1 else picked))
        except UnicodeEncodeError:
            return None
        for i, data in zip(wide.tolist(), encoded):   # the non-ASCII texts only
            parts[i] = data
    starts = np.zeros(len(texts) + 1, dtype=np.int64)
    np.cumsum(np.fromiter(map(len, parts), dtype=np.int64, count=len(texts)), out=starts[1:])
    return PackedText(parts, starts), starts


def _pack_valid_utf8(docs: list[bytes]) -> tuple[PackedText, np.ndarray] | None:
    """(the documents as one PackedText, their n + 1 byte starts) when every document is
    valid UTF-8, checked on the host, else None: for calls the device does not check
    (GPU_UTF8_CHECK_BYTES, CPU pre-tokenization). An ASCII document is valid as it is
    (`bytes.isascii`, C speed, no copy); only the others are decoded to check them. Nothing
    is joined here: the encoder joins the documents range by range into its upload buffer
    while the GPU works, as it does for `str` documents (joining and decoding the whole
    batch first made `bytes` input 2-4x slower than `str`)."""
    for doc in filterfalse(bytes.isascii, docs):
        try:
            doc.decode("utf-8")
        except UnicodeDecodeError:
            return None
    return _joined(docs)


def _split(ids: np.ndarray, offsets: np.ndarray) -> list[list[int]]:
    flat = ids.tolist()
    bounds = offsets.tolist()
    return [flat[bounds[i]:bounds[i + 1]] for i in range(len(bounds) - 1)]


_CACHE: OrderedDict = OrderedDict()
_CACHE_SIZE = 8   # Encodings kept (vocabulary x device), least recently used dropped


def get_encoding(spec, device=None, *, lazy: bool = False) -> Encoding:
    """An Encoding for a known name, a vocabulary path or a `Vocabulary` (cached per device).

    `lazy=True` defers building its GPU state to the first call. Raises
    `tokenizer_svc.vocab.VocabularyError` (a ValueError) for unknown names and bad files.
    """
    vocab = spec if isinstance(spec, Vocabulary) else load_vocabulary(spec)
    dev_key = "cpu" if device == "cpu" else (id(device) if device is not None else "default")
    key = (vocab.content_hash, vocab.name, dev_key)
    enc = _CACHE.get(key)
    if enc is None:
        enc = Encoding(vocab, device, lazy=lazy)
        _CACHE[key] = enc
        if len(_CACHE) > _CACHE_SIZE:
            _CACHE.popitem(last=False)
    else:
        _CACHE.move_to_end(key)
    return enc


def encoding_for_model(model_name: str, device=None) -> Encoding:
    """tiktoken's `encoding_for_model`, from local vocabulary files (see vocab.py)."""
    name = encoding_name_for_model(model_name)
    if name not in KNOWN_VOCABULARIES:
        raise KeyError(f"model {model_name!r} uses the {name} encoding, which istanbul has no "
                       f"vocabulary for (known: {', '.join(KNOWN_VOCABULARIES)}); load its "
                       "file with get_encoding(path) if you have one")
    return get_encoding(name, device=device)


__all__ = ["Encoding", "ForkedGpuWarning", "InvalidTokenError",
           "encoding_for_model", "encoding_name_for_model", "get_encoding"]
