"""Pre-tokenizer patterns and the built-in facts of the known vocabularies.

The three patterns are the GPU pre-tokenizer's (istanbul.shaders.kernels.bpe.patterns: exactly
tiktoken's); any other regex pre-tokenizes on the CPU with `regex`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from istanbul.shaders.kernels.bpe.patterns import CL100K_PATTERN, GPT2_PATTERN, O200K_PATTERN
from istanbul.shaders.kernels.bpe.patterns import PATTERNS as GPU_PATTERN_REGEXES

# Pattern names accepted wherever a pattern is asked for (--pattern, sidecar files).
PATTERNS = {
    "gpt2": GPT2_PATTERN,
    "r50k": GPT2_PATTERN,
    "cl100k": CL100K_PATTERN,
    "o200k": O200K_PATTERN,
}
# The patterns the GPU pre-tokenizer implements (by canonical name).
GPU_PATTERNS = tuple(GPU_PATTERN_REGEXES)

ENDOFTEXT = "<|endoftext|>"
FIM_PREFIX = "<|fim_prefix|>"
FIM_MIDDLE = "<|fim_middle|>"
FIM_SUFFIX = "<|fim_suffix|>"
ENDOFPROMPT = "<|endofprompt|>"


@dataclass(frozen=True)
class KnownVocabulary:
    name: str
    pattern: str  # key of PATTERNS
    special_tokens: dict = field(default_factory=dict)
    filename: str = ""
    url: str = ""  # tiktoken's download URL: its cache file is named by sha1(url)
    sha256: str = ""  # tiktoken's published hash of the file
    explicit_n_vocab: int | None = None


KNOWN_VOCABULARIES = {
    "gpt2": KnownVocabulary(
        "gpt2", "gpt2", {ENDOFTEXT: 50256}, "gpt2.tiktoken",
        "https://openaipublic.blob.core.windows.net/encodings/r50k_base.tiktoken",
        "306cd27f03c1a714eca7108e03d66b7dc042abe8c258b44c199a7ed9838dd930", 50257),
    "r50k_base": KnownVocabulary(
        "r50k_base", "gpt2", {ENDOFTEXT: 50256}, "r50k_base.tiktoken",
        "https://openaipublic.blob.core.windows.net/encodings/r50k_base.tiktoken",
        "306cd27f03c1a714eca7108e03d66b7dc042abe8c258b44c199a7ed9838dd930", 50257),
    "cl100k_base": KnownVocabulary(
        "cl100k_base", "cl100k",
        {ENDOFTEXT: 100257, FIM_PREFIX: 100258, FIM_MIDDLE: 100259, FIM_SUFFIX: 100260,
         ENDOFPROMPT: 100276},
        "cl100k_base.tiktoken",
        "https://openaipublic.blob.core.windows.net/encodings/cl100k_base.tiktoken",
        "223921b76ee99bde995b7ff738513eef100fb51d18c93597a113bcffe865b2a7"),
    "o200k_base": KnownVocabulary(
        "o200k_base", "o200k", {ENDOFTEXT: 199999, ENDOFPROMPT: 200018},
        "o200k_base.tiktoken",
        "https://openaipublic.blob.core.windows.net/encodings/o200k_base.tiktoken",
        "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d"),
}


def pattern_name_for(regex: str) -> str | None:
    """The canonical name of a pattern given as a regex, or None if it is not one of ours."""
    for name in GPU_PATTERNS:
        if PATTERNS[name] == regex:
            return name
    return None
