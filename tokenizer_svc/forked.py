"""What an `Encoding` computes on in a process forked from one that held GPU state.

wgpu (Vulkan) state does not survive `fork`: the child inherits the parent's device, buffers
and driver handles, but not the driver's threads, and the driver's state is not fork-safe
(NVIDIA's above all; a child's ioctl on the inherited descriptors could even free the
parent's memory). `fork` is still the default start method of `multiprocessing`, of
PyTorch's DataLoader workers and of `datasets.map(num_proc=...)` on Linux up to Python 3.13,
so such a child must keep working without touching the GPU:

- `note_gpu_backend` records the process whose Encodings built GPU state (`gpu_pid`) and
  each such backend. After a fork (os.register_at_fork) the child pins every one of them and
  the engine's process-wide devices: an extra reference that is never dropped, so their
  finalizers (which release wgpu objects) never run in the child, not even when the child's
  Encodings are dropped or at interpreter exit. A child is also "forked from GPU state" when
  only the engine's default devices existed in the parent (the trainer's, say).
- `forked_from_gpu()` is true in such a child, and in its own forked children.
- `ForkedCpuBackend` is what an Encoding uses there: exact ids on the CPU, from tiktoken (a
  tiktoken-style vocabulary: its own `Encoding` built from the same ranks and pattern) or
  Hugging Face `tokenizers` (a tokenizer.json: the same file, without normalizer, added tokens
  or post-processor, which `Encoding` applies itself), whichever the vocabulary needs and is
  installed; the plain-Python reference only when neither is. Their ids are ours by definition
  for the vocabularies they read (the tests compare all three).
- `warn_once` emits one `ForkedGpuWarning` per process, naming the faster choice: the "spawn"
  or "forkserver" start method, whose workers build their own GPU state.

A fresh device in the child (the parent's objects pinned, wgpu's instance and the engine's
device cache forgotten) was tried and not chosen: on lavapipe it gave exact ids in 15
children, grandchildren included, but each child spent 3 to 17 s starting a device and
compiling kernels before its first ids, N workers would hold N device contexts on one GPU,
and a hardware GPU host stopped answering during the same probe (one try, cause not
established). A process forked before any GPU state existed is not affected: it builds its
own GPU state at its first call, as any process does.

Pinning matters: without it, a child that drops the parent's Encoding (or ends through the
interpreter's normal exit) runs wgpuDeviceRelease, which deadlocked in lavapipe's
vkDestroyDevice (tests/test_fork.py's spy test caught wgpuAdapterRelease, then the hang).
The driver's own C exit handlers are out of reach: lavapipe's joins the parent's threads and
crashes a child that ends through exit(); multiprocessing, DataLoader and datasets end their
children with os._exit, as a bare os.fork() child should.
"""

from __future__ import annotations

import ctypes
import itertools
import os
import sys
import threading
import warnings
import weakref

import numpy as np

from .reference import ReferenceTokenizer
from .vocab import Vocabulary


class ForkedGpuWarning(RuntimeWarning):
    """An Encoding runs on the CPU in a process forked after its parent used the GPU."""


_gpu_pid: int | None = None   # the process whose GPU state this one has (itself or an ancestor)
_gpu_backends: "weakref.WeakSet" = weakref.WeakSet()   # GPU backends made by this process
_pinned: list = []            # what this process keeps alive for its ancestor (never released)
_warned_pid: int | None = None
_PACKAGE = os.path.dirname(os.path.abspath(__file__)) + os.sep
_lock = threading.Lock()      # made anew in each child: one held by another thread at fork
                              # time would never be released there


def note_gpu_backend(backend) -> None:
    """Record that this process built GPU state (`backend` holds it)."""
    global _gpu_pid
    _gpu_pid = os.getpid()
    _gpu_backends.add(backend)


def forked_from_gpu() -> bool:
    """True in a process forked (at any depth) from one that held GPU state."""
    return _gpu_pid is not None and _gpu_pid != os.getpid()


def pin(obj) -> None:
    """Keep `obj` alive in this process for good: its finalizer never runs here (an extra
    reference count no one drops; a list alone would be emptied at interpreter exit)."""
    if any(o is obj for o in _pinned):
        return
    ctypes.pythonapi.Py_IncRef(ctypes.py_object(obj))
    _pinned.append(obj)


def _engine_devices() -> list:
    engine = sys.modules.get("istanbul.shaders.engine")
    return list(getattr(engine, "_default_devices", {}).values()) if engine else []


def _after_fork_in_child() -> None:
    global _gpu_pid, _lock
    _lock = threading.Lock()
    devices = _engine_devices()
    if _gpu_pid is None and not devices:
        return   # no GPU state here: this child may build its own
    for obj in [*_gpu_backends, *devices]:
        pin(obj)
    if _gpu_pid is None:   # only the engine's devices: its default_device() would hand
        _gpu_pid = os.getppid()  # them out, so Encodings here stay off the GPU too


os.register_at_fork(after_in_child=_after_fork_in_child)


def warn_once(name: str, engine: str) -> None:
    """One ForkedGpuWarning per process (the message names the process, so a grandchild that
    inherits the warnings registry still gets its own)."""
    global _warned_pid
    if _warned_pid == os.getpid():
        return
    _warned_pid = os.getpid()
    level, frame = 1, sys._getframe()   # point at the caller's line, outside this package
    while frame is not None and frame.f_code.co_filename.startswith(_PACKAGE):
        frame, level = frame.f_back, level + 1
    warnings.warn(
        f"istanbul: Encoding {name!r} in process {os.getpid()}, forked from process "
        f"{_gpu_pid} (or from a child of it) after that one used the GPU. wgpu (Vulkan) "
        "state cannot be used across fork, so this process encodes and decodes on the CPU "
        f"with {engine}: the same ids, without the GPU's speed. For the GPU in worker "
        "processes use the 'spawn' or 'forkserver' start method "
        "(multiprocessing.get_context('spawn'), DataLoader(multiprocessing_context='spawn')): "
        "each worker then builds its own GPU state. Shown once per process; filter "
        "tokenizer_svc.forked.ForkedGpuWarning to silence it.", ForkedGpuWarning,
        stacklevel=level)


def cpu_backend(vocab: Vocabulary) -> "ForkedCpuBackend":
    """This process's CPU backend for `vocab` (built here under the per-process lock)."""
    with _lock:
        return ForkedCpuBackend(vocab)


class ForkedCpuBackend:
    """Exact ids on the CPU behind gpu_backend.GpuBackend's interface (encode_segments,
    encode_pieces, last_piece_length, decode); `engine` names what computes them."""

    kind = "cpu-forked"

    def __init__(self, vocab: Vocabulary):
        self.vocab = vocab
        self.ref = ReferenceTokenizer(vocab)
        self.pre = self.ref.pre
        self._tiktoken = self._hf = None
        self._whole = False   # tiktoken cuts the pieces too (a pattern it runs exactly)
        if vocab.hf is not None:
            self._hf = _hf_tokenizer(vocab)
        elif vocab.merges is None:
            self._tiktoken, self._whole = _tiktoken_encoding(vocab)
        self.engine = ("tiktoken" if self._tiktoken is not None else
                       "Hugging Face tokenizers" if self._hf is not None else
                       "the plain-Python reference (install tiktoken or tokenizers for speed)")
        self._decoder = vocab.decoder

    def describe(self) -> str:
        return f"CPU ({self.engine}): forked from a process that used the GPU"

    def encode_segments(self, segments: list[bytes]) -> tuple[np.ndarray, np.ndarray]:
        """Flat ids and len(segments) + 1 offsets; segments are valid UTF-8 without special
        tokens left to cut (normalized already for tokenizer.json vocabularies)."""
        if self._tiktoken is not None and self._whole:
            encode = self._tiktoken.encode_ordinary
            parts = [encode(s.decode("utf-8")) for s in segments]
        elif self._hf is not None:
            encode = self._hf.encode
            parts = [encode(s.decode("utf-8"), add_special_tokens=False).ids for s in segments]
        else:
            bpe, split = self._bpe, self.pre.split
            parts = [[t for p in split(s.decode("utf-8")) for t in bpe(p.encode("utf-8"))]
                     for s in segments]
        return _flatten(parts)

    def encode_pieces(self, pieces: list[bytes]) -> tuple[np.ndarray, np.ndarray]:
        return _flatten([self._bpe(p) for p in pieces])

    def _bpe(self, piece: bytes) -> list[int]:
        if self._tiktoken is not None:
            return self._tiktoken._encode_single_piece(piece)
        return self.ref.bpe(piece)

    def last_piece_length(self, prefix: bytes) -> int:
        """Byte length of the last pre-tokenized piece of `prefix` (for encode_bytes)."""
        from istanbul.shaders.kernels.bpe.cuts import PATTERNS, find_cut
        if not prefix:
            return 0
        start = 0
        if self.vocab.hf is None and self.vocab.pattern_name in PATTERNS and len(prefix) > 1:
            start = find_cut(np.frombuffer(prefix, dtype=np.uint8), 0, len(prefix) - 1,
                             self.vocab.pattern_name) or 0
        pieces = self.pre.split(prefix[start:].decode("utf-8"))
        return len(pieces[-1].encode("utf-8")) if pieces else 0

    def decode(self, ids: np.ndarray) -> bytes:
        from istanbul.shaders.kernels.bpe.decode import InvalidIdError
        decoder = self._decoder
        tokens = ids.tolist()
        try:
            return b"".join(map(decoder.__getitem__, tokens))
        except KeyError:
            pos = next(i for i, t in enumerate(tokens) if t not in decoder)
            raise InvalidIdError(tokens[pos], pos) from None


def _flatten(parts: list) -> tuple[np.ndarray, np.ndarray]:
    offsets = np.zeros(len(parts) + 1, dtype=np.int64)
    np.cumsum(np.fromiter(map(len, parts), dtype=np.int64, count=len(parts)), out=offsets[1:])
    ids = np.fromiter(itertools.chain.from_iterable(parts), dtype=np.uint32,
                      count=int(offsets[-1]))
    return ids, offsets


def _tiktoken_encoding(vocab: Vocabulary):
    """(tiktoken.Encoding of the vocabulary's ranks, whether it also cuts the pieces), or
    (None, False) without tiktoken. tiktoken runs the known patterns exactly as we do
    (patterns.py holds its own strings); a custom regex is cut by our pre-tokenizer (the
    `regex` module, as on the GPU path) and only merged by tiktoken."""
    try:
        import tiktoken
    except ImportError:
        return None, False
    whole = vocab.pattern_name is not None and vocab.hf_splits is None
    if any(bytes([b]) not in vocab.ranks for b in range(256)):
        return None, False   # tiktoken needs every byte to be a token; the reference copes
    try:
        enc = tiktoken.Encoding(f"{vocab.name} (forked CPU path)",
                                pat_str=vocab.pattern if whole else r"[\s\S]+",
                                mergeable_ranks=vocab.ranks, special_tokens={})
    except Exception:   # noqa: BLE001 (a pattern tiktoken's regex engine refuses, ...)
        return None, False
    return enc, whole


def _hf_tokenizer(vocab: Vocabulary):
    """`tokenizers.Tokenizer` of the vocabulary's own file with no normalizer, added tokens,
    post-processor or decoder (Encoding applies those itself, as on the GPU path), or None
    (tokenizers missing, or no file)."""
    try:
        import json

        from tokenizers import Tokenizer
    except ImportError:
        return None
    if not vocab.source or not os.path.isfile(vocab.source):
        return None
    with open(vocab.source, encoding="utf-8") as f:
        data = json.load(f)
    data.update(normalizer=None, post_processor=None, decoder=None, added_tokens=[],
                truncation=None, padding=None)
    try:
        return Tokenizer.from_str(json.dumps(data))
    except Exception:   # noqa: BLE001 (a file tokenizers itself refuses: use the reference)
        return None
