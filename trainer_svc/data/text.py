"""Text <-> ids for the training CLIs, through the project's tokenizer.

The tokenizer is the tokenizer engineer's (`tokenizer_svc.encoding.get_encoding`, GPU BPE
with the CPU reference). Until that module is in the build, the same vocabulary (ranks,
pattern, special tokens from `tokenizer_svc.vocab`) is handed to tiktoken for .tiktoken
files and to Hugging Face `tokenizers` for tokenizer.json files — the very libraries the
tokenizer is tested to be identical to. Decoding is a table lookup of each id's bytes.
"""

from __future__ import annotations

import codecs
from pathlib import Path

from tokenizer_svc.vocab import Vocabulary, load_vocabulary


class TextCodec:
    def __init__(self, vocab: Vocabulary, spec: str):
        self.vocab = vocab
        self.spec = spec
        self._encode = _make_encoder(vocab, spec)

    @property
    def n_vocab(self) -> int:
        return self.vocab.n_vocab

    @property
    def eot_token(self) -> int | None:
        return self.vocab.eot_token

    @property
    def content_hash(self) -> str:
        return self.vocab.content_hash

    @property
    def path(self) -> Path | None:
        return Path(self.vocab.source) if self.vocab.source else None

    def encode(self, text: str) -> list[int]:
        return self._encode(text)

    def decode_bytes(self, ids) -> bytes:
        table = self.vocab.decoder
        return b"".join(table.get(int(i), b"") for i in ids)

    def stream_decoder(self):
        """A function id -> newly complete text (UTF-8 split across tokens is held back)."""
        dec = codecs.getincrementaldecoder("utf-8")(errors="replace")
        table = self.vocab.decoder
        return lambda token: dec.decode(table.get(int(token), b""))


def _make_encoder(vocab: Vocabulary, spec: str):
    try:
        from tokenizer_svc.encoding import get_encoding  # the project's tokenizer, once built
        enc = get_encoding(vocab)
        return lambda text: list(enc.encode_ordinary(text))
    except ImportError:
        pass
    if vocab.merges is not None:  # tokenizer.json
        from tokenizers import Tokenizer
        tok = Tokenizer.from_file(vocab.source)
        return lambda text: tok.encode(text, add_special_tokens=False).ids
    import tiktoken
    enc = tiktoken.Encoding(name=f"istanbul-{vocab.name}", pat_str=vocab.pattern,
                            mergeable_ranks=vocab.ranks, special_tokens=vocab.special_tokens,
                            explicit_n_vocab=None)
    return enc.encode_ordinary


def load_codec(spec) -> TextCodec:
    return TextCodec(load_vocabulary(spec), str(spec))
