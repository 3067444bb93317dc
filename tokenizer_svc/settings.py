"""The tokenizer's environment variables: this module alone reads them.

    from tokenizer_svc import settings
    settings.read("TIKTOKEN_CACHE_DIR")          # a Path, or None when unset

Declared and read as istanbul.shaders.settings describes (kinds, call-time reads,
SettingError). The kernel layer declares the variables it reads too: the GPU device's
(ISTANBUL_ADAPTER, ISTANBUL_BACKEND, ...) and ISTANBUL_VOCAB_DIR, the first folder of known
vocabularies, which its BPE ladder searches as this library does (tokenizer_svc.vocab reads
it from there).
"""

from __future__ import annotations

from istanbul.shaders.settings import Settings, Variable

VARIABLES = (
    Variable("TIKTOKEN_CACHE_DIR", "path", None,
             "tiktoken's download cache, searched last for known vocabularies (sha256 "
             "checked) and read by `istanbul vocab fetch`",
             shown_default="$DATA_GYM_CACHE_DIR, else /tmp/data-gym-cache"),
    Variable("DATA_GYM_CACHE_DIR", "path", None,
             "tiktoken's older name for TIKTOKEN_CACHE_DIR"),
    Variable("XDG_CACHE_HOME", "path", None,
             "the user's cache folder: the Hugging Face normalization table of this Python's "
             "unicodedata is cached in its istanbul/", user_facing=False,
             shown_default="~/.cache"),
)

SETTINGS = Settings("tokenizer_svc", VARIABLES)
read = SETTINGS.read
