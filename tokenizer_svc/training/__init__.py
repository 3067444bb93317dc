"""BPE vocabulary training: corpus files -> a `.tiktoken` vocabulary that tiktoken loads.

    from tokenizer_svc.training import train_vocabulary
    vocab, report = train_vocabulary(["corpus.txt"], size=32000, pattern="o200k",
                                     specials=["<|endoftext|>"])
    save_vocabulary(vocab, "my.tiktoken")          # tokenizer_svc.vocab; + my.tiktoken.json

The modules, in the order data flows through them:

- `corpus`: files -> unique pre-tokenized pieces with counts (streaming, optionally parallel)
- `gpu_corpus`: the same on the GPU (files cut into chunks for the kernel family's piece
  counter, istanbul.shaders.kernels.bpe_train.piece_count)
- istanbul.shaders.kernels.bpe_train.merges: the contract both trainers implement (ranks,
  tie-break, overlapping runs)
- `cpu_reference`: the readable trainer
- istanbul.shaders.kernels.bpe_train.trainer: the WGSL trainer; same merges, much faster
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from istanbul.shaders.kernels.bpe_train.merges import (N_BYTES, CorpusExhausted, TrainingError,
                                                       TrainingResult, check_request)
from ..patterns import PATTERNS
from ..vocab import Vocabulary
from .corpus import DEFAULT_CHUNK_BYTES, CorpusError, PieceCounts, count_pieces

TRAINERS = ("gpu", "cpu")
PRETOKENIZERS = ("auto", "gpu", "cpu")


@dataclass
class TrainingReport:
    corpus: PieceCounts
    result: TrainingResult
    trainer: str
    pretokenize_seconds: float
    train_seconds: float
    details: dict = field(default_factory=dict)

    def summary(self) -> str:
        merges = len(self.result.merges)
        rate = merges / self.train_seconds if self.train_seconds else 0.0
        where = self.result.details.get("device", "CPU reference")
        where_pre = self.details.get("pretokenizer", "cpu").upper()
        return (f"corpus: {self.corpus.describe()} (pre-tokenized in "
                f"{self.pretokenize_seconds:.1f}s on the {where_pre}); learned {merges:,} "
                f"merges in {self.train_seconds:.1f}s ({rate:,.0f} merges/s) on {where}")


def vocabulary_from(result: TrainingResult, name: str, pattern: str, specials=()) -> Vocabulary:
    """The trained vocabulary, special tokens numbered after the last ordinary token."""
    return Vocabulary(name=name, ranks=result.ranks(), pattern=pattern,
                      special_tokens=result.special_ids(specials))


def resolve_pattern(pattern: str) -> str:
    """A pattern name (gpt2, r50k, cl100k, o200k) or a regex -> the regex."""
    if pattern in PATTERNS:
        return PATTERNS[pattern]
    import regex
    try:
        regex.compile(pattern)
    except regex.error as exc:
        raise CorpusError(f"--pattern {pattern[:80]!r} is neither a known pattern "
                          f"({', '.join(PATTERNS)}) nor a valid regex: {exc}") from None
    return pattern


def train_vocabulary(files, size: int, pattern: str = "o200k", specials=(),
                     max_token_bytes: int | None = None, invalid_utf8: str = "error",
                     trainer: str = "gpu", device=None, workers: int | None = None,
                     chunk_bytes: int = DEFAULT_CHUNK_BYTES, name: str = "trained",
                     progress: bool = False, gpu_options=None,
                     pretokenizer: str = "auto") -> tuple[Vocabulary, TrainingReport]:
    """Train a byte-level BPE vocabulary of `size` ids (ordinary tokens + `specials`).

    pretokenizer: where pre-tokenization and piece counting run. "gpu": on the device
    (gpu_corpus; gpt2, cl100k and o200k patterns only); "cpu": corpus.py with `workers`
    processes; "auto": the GPU with the GPU trainer on a hardware GPU for those patterns, else
    the CPU (software Vulkan pre-tokenizes slower than the CPU itself). Same pieces either way.

    Raises CorpusError (unreadable input, invalid UTF-8, bad pattern), TrainingError (a size
    or limit that cannot work) or CorpusExhausted (too little text for `size`).
    """
    if trainer not in TRAINERS:
        raise TrainingError(f"trainer must be one of {TRAINERS}, got {trainer!r}")
    specials = list(specials)
    n_tokens = check_request(size, specials, max_token_bytes)
    regex_text = resolve_pattern(pattern)
    if pretokenizer not in PRETOKENIZERS:
        raise TrainingError(f"pretokenizer must be one of {PRETOKENIZERS}, got {pretokenizer!r}")
    from .gpu_corpus import count_pieces_gpu, gpu_pattern
    if pretokenizer == "gpu" and gpu_pattern(pattern) is None:
        raise TrainingError(f"--pretokenizer gpu needs one of the GPU patterns (gpt2, r50k, "
                            f"cl100k, o200k), not {pattern[:80]!r}; use --pretokenizer cpu")
    if device is None and "gpu" in (trainer, pretokenizer):
        from istanbul.shaders.engine import default_device
        device = default_device()
    on_gpu = pretokenizer == "gpu" or (
        pretokenizer == "auto" and trainer == "gpu" and gpu_pattern(pattern) is not None
        and not device.info.is_software)
    t0 = time.perf_counter()
    if on_gpu:
        corpus = count_pieces_gpu(files, pattern, specials, invalid_utf8, device,
                                  progress=progress)
    else:
        corpus = count_pieces(files, regex_text, specials, invalid_utf8, workers, chunk_bytes,
                              progress)
    t1 = time.perf_counter()
    if corpus.bytes_read == 0:
        raise CorpusError("the corpus is empty: every input file has zero bytes")
    has_pair = getattr(corpus.pieces, "has_pair", None)  # GPU-counted: without a dict
    if not (has_pair() if has_pair else any(len(p) >= 2 for p in corpus.pieces)):
        raise CorpusExhausted(
            "the corpus has no piece of two or more bytes, so there is no pair to merge "
            f"({corpus.describe()}); give more text, or a pattern that keeps characters "
            "together", N_BYTES + len(specials))

    bar = None
    callback = None
    if progress:
        from tqdm import tqdm
        bar = tqdm(total=n_tokens - N_BYTES, unit="merge", desc=f"learning merges ({trainer})",
                   disable=None)   # None: no bar without a terminal

        def callback(merges_done, _tokens):
            bar.update(merges_done - bar.n)
    try:
        if trainer == "gpu":
            from istanbul.shaders.kernels.bpe_train.trainer import train as train_gpu
            result = train_gpu(corpus.pieces, n_tokens, max_token_bytes, len(specials),
                               device=device, progress=callback, options=gpu_options)
        else:
            from . import cpu_reference
            result = cpu_reference.train(corpus.pieces, n_tokens, max_token_bytes,
                                         len(specials), progress=callback)
    finally:
        if bar is not None:
            bar.close()
    t2 = time.perf_counter()
    vocab = vocabulary_from(result, name, regex_text, specials)
    return vocab, TrainingReport(corpus=corpus, result=result, trainer=trainer,
                                 pretokenize_seconds=t1 - t0, train_seconds=t2 - t1,
                                 details={"pretokenizer": "gpu" if on_gpu else "cpu"})


__all__ = ["CorpusError", "CorpusExhausted", "TrainingError", "TrainingReport",
           "TrainingResult", "resolve_pattern", "train_vocabulary", "vocabulary_from"]
