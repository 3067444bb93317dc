"""The GPU side of an `Encoding`: ordinary segments -> ids, single pieces -> ids, ids -> bytes.

Segments are valid UTF-8 byte strings with no special-token handling left to do
(tokenizer_svc/encoding.py splits special tokens on the CPU, as the issue allows). For the
gpt2/r50k, cl100k and o200k patterns everything runs on the GPU; for any other pattern (a
custom regex, a tokenizer.json Split sequence) the pieces are cut on the CPU with the reference
pre-tokenizer and merged on the GPU (tokenizer.json BPE options the merge kernels do not
implement, `continuing_subword_prefix` / `end_of_word_suffix` / `unk_token`, merge on the CPU).

Threads: the encoder and decoder keep per-call buffers, and one wgpu queue must not be fed by
two threads at once, so every GPU call of a device holds that device's lock (`device_lock`;
an encoder takes it after its own lock, the order a begun call needs: it holds its encoder
between its halves and the device only within them); CPU pre-tokenization runs outside it,
in parallel.
"""

from __future__ import annotations

import threading

import numpy as np

from istanbul.shaders.engine import Device
from istanbul.shaders.kernels.bpe.cuts import find_cut
from istanbul.shaders.kernels.bpe.decode import GpuDecoder
from istanbul.shaders.kernels.bpe.encode import GpuEncoder
from istanbul.shaders.kernels.bpe.packed_text import PackedText
from istanbul.shaders.kernels.bpe.patterns import PATTERN_IDS
from istanbul.shaders.kernels.bpe.scan import device_lock
from istanbul.shaders.kernels.bpe.tables import TableError, VocabTables
from istanbul.shaders.kernels.bpe.unicode_table import load_table
from .hf.tokenizer_json import BYTE_LEVEL_REGEX
from .reference import PreTokenizer, ReferenceTokenizer
from .vocab import Vocabulary, VocabularyError


def _tables(vocab: Vocabulary) -> VocabTables:
    """The kernels' tables of `vocab`; VocabularyError if they cannot use it."""
    try:
        return VocabTables.build(vocab)
    except TableError as exc:
        raise VocabularyError(str(exc)) from None


MAX_TWINS = 3   # encoders besides the first that begun calls may add (one per thread in flight)


class FinishedCall:
    """A begun call whose result is already there (a backend or call that cannot be split)."""
    encoder = None

    def __init__(self, result: tuple):
        self._result = result

    def finish(self) -> tuple:
        return self._result

    def cancel(self) -> None:
        self._result = None


def hf_gpu_pattern(vocab: Vocabulary) -> str | None:
    """"gpt2" for a tokenizer.json whose whole pipeline is `tokenizers`' ByteLevel regex.

    That regex ('s|'t|...| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+) cuts
    every text exactly where tiktoken's gpt2 pattern does (its last two alternatives only
    differ from gpt2's `\\s++$|\\s+(?!\\S)|\\s` on runs they cut the same way), so the GPU
    pre-tokenizer runs it, with tokenizers' Unicode classes (VocabTables picks the family's
    table). The piece-boundary rule used to split long documents (cuts.cut_rule) reads
    tiktoken's table, so this is only used while the two families' class bytes are equal.
    """
    hf = vocab.hf
    if hf.needs_cpu_merges or hf.pre_tokenizers != [
            {"type": "ByteLevel", "add_prefix_space": False, "use_regex": True,
             "regex": BYTE_LEVEL_REGEX}]:
        return None
    if hf.normalizer not in (None, {"type": "Sequence", "normalizers": []}):
        return None
    if not np.array_equal(load_table("tokenizers").class_bytes, load_table("tiktoken").class_bytes):
        return None
    return "gpt2"


# Dawn's bounds-checking transform on the tokenizer's devices: off, as on the trainer's
# (shaders/backends.py: only the project's kernels run, and they check their own bounds).
# With it the pre-tokenizer runs about half as fast (dev/tokenizer_throughput/README.md).
ROBUSTNESS = False

class GpuBackend:
    kind = "gpu"

    def __init__(self, vocab: Vocabulary, device: Device, tables: VocabTables | None = None):
        self.vocab = vocab
        self.device = device
        self.tables = tables or _tables(vocab)
        gpu_pattern = hf_gpu_pattern(vocab) if vocab.hf is not None else \
            vocab.pattern_name if vocab.hf_splits is None else None
        self.gpu_pattern = gpu_pattern
        self.on_gpu_pretok = gpu_pattern in PATTERN_IDS
        # encode_packed(check_utf8=True) checks the documents on the GPU, in the call itself
        self.checks_utf8 = self.on_gpu_pretok
        self.encoder = GpuEncoder(device, self.tables, gpu_pattern)
        self._twins: list[GpuEncoder] = []   # begin_packed's other encoders
        self._twin_lock = threading.Lock()
        self.decoder = GpuDecoder(device, self.tables, self.encoder.vocab_buf)
        self.pre = PreTokenizer(vocab)
        self.lock = device_lock(device)
        self.cpu_merges = ReferenceTokenizer(vocab) if (
            vocab.hf is not None and vocab.hf.needs_cpu_merges) else None

    def describe(self) -> str:
        if self.cpu_merges is not None:
            where = "CPU (regex), merges on the CPU (BPE options the GPU does not implement)"
        else:
            where = "GPU" if self.on_gpu_pretok else "CPU (regex), merges on the GPU"
        return f"GPU {self.device.name}; pre-tokenization on the {where}"

    def encode_segments(self, segments: list[bytes]) -> tuple[np.ndarray, np.ndarray]:
        """Flat ids and len(segments) + 1 offsets."""
        if self.on_gpu_pretok:
            lengths = np.fromiter((len(s) for s in segments), dtype=np.int64, count=len(segments))
            starts = np.zeros(len(segments) + 1, dtype=np.int64)
            np.cumsum(lengths, out=starts[1:])
            # joined range by range as the encoder uploads them; the encoder holds the
            # device's lock (after its own: a begun call holds its encoder between halves)
            return self.encoder.encode_docs(PackedText(segments, starts), starts)
        pieces, per_segment = [], []
        for seg in segments:
            cut = [p.encode("utf-8") for p in self.pre.split(seg.decode("utf-8"))]
            pieces.extend(cut)
            per_segment.append(len(cut))
        ids, piece_offsets = self.encode_pieces(pieces)
        first_piece = np.zeros(len(segments) + 1, dtype=np.int64)
        np.cumsum(per_segment, out=first_piece[1:])
        return ids, piece_offsets[first_piece]

    def encode_packed(self, data, starts: np.ndarray, out: np.ndarray | None = None,
                      check_utf8: bool = False) -> tuple[np.ndarray, np.ndarray]:
        """Like encode_segments for segments already packed (bytes or a PackedText): `starts`
        holds n + 1 offsets; `out` and `check_utf8` (InvalidUtf8 when a segment is not valid
        UTF-8; only with the GPU pre-tokenizer, `checks_utf8`) as GpuEncoder.encode_docs."""
        if check_utf8 and not self.checks_utf8:
            raise ValueError("check_utf8 needs the GPU pre-tokenizer (checks_utf8 is False): "
                             "check the segments on the host")
        if not self.on_gpu_pretok:
            segments = data.segments() if isinstance(data, PackedText) else \
                [data[starts[i]:starts[i + 1]] for i in range(starts.size - 1)]
            ids, offsets = self.encode_segments(segments)
            if out is None:
                return ids, offsets
            out[:ids.size] = ids
            return out[:ids.size], offsets
        return self.encoder.encode_docs(data, starts, out=out, check_utf8=check_utf8)

    def begin_packed(self, data, starts: np.ndarray, check_utf8: bool = False):
        """encode_packed in two halves (GpuEncoder.begin_docs): submitted here, (ids, offsets)
        from the returned call's finish() (`check_utf8` as in encode_packed: InvalidUtf8 from
        finish(), the encoder given back). A call begun while the encoder is held (by an
        unfinished begun call, or another thread's call) goes to a free twin encoder (made when
        none is free, up to MAX_TWINS), so calls can be in flight back to back; when every
        encoder is held it waits for one another thread holds, never for one of this
        thread's own begun calls (those only this thread can finish)."""
        if not self.on_gpu_pretok:
            return FinishedCall(self.encode_packed(data, starts, check_utf8=check_utf8))
        me = threading.get_ident()
        with self._twin_lock:
            encoders = [self.encoder] + self._twins
            encoder = next((e for e in encoders if not e.busy()), None)
            if encoder is None:
                encoder = next((e for e in encoders if e.holder != me), None)
            if encoder is None:
                if len(self._twins) >= MAX_TWINS:
                    raise RuntimeError(f"this thread holds {len(encoders)} begun encode calls "
                                       "unfinished: finish one before beginning another")
                encoder = self.encoder.twin()
                self._twins.append(encoder)
        return encoder.begin_docs(data, starts, check_utf8=check_utf8)

    def encode_pieces(self, pieces: list[bytes]) -> tuple[np.ndarray, np.ndarray]:
        if self.cpu_merges is not None:
            parts = [self.cpu_merges.bpe(p) for p in pieces]
            offsets = np.zeros(len(parts) + 1, dtype=np.int64)
            np.cumsum([len(p) for p in parts], out=offsets[1:])
            return np.array([t for p in parts for t in p], dtype=np.uint32), offsets
        lengths = np.fromiter((len(p) for p in pieces), dtype=np.int64, count=len(pieces))
        starts = np.zeros(len(pieces) + 1, dtype=np.int64)
        np.cumsum(lengths, out=starts[1:])
        return self.encoder.merge_pieces(b"".join(pieces), starts)

    def last_piece_length(self, prefix: bytes) -> int:
        """Byte length of the last pre-tokenized piece of `prefix` (for encode_bytes)."""
        if not prefix:
            return 0
        start = 0
        if self.on_gpu_pretok and len(prefix) > 1:
            data = np.frombuffer(prefix, dtype=np.uint8)
            start = find_cut(data, 0, len(prefix) - 1, self.gpu_pattern) or 0
        pieces = self.pre.split(prefix[start:].decode("utf-8"))
        return len(pieces[-1].encode("utf-8")) if pieces else 0

    def decode(self, ids: np.ndarray) -> bytes:
        with self.lock:
            return self.decoder.decode(ids)

    def decode_docs(self, ids: np.ndarray, doc_starts: np.ndarray) -> list[bytes]:
        """uint32 ids of many documents (doc_starts: n + 1 token offsets) -> their bytes."""
        with self.lock:
            return self.decoder.decode_docs(ids, doc_starts)
