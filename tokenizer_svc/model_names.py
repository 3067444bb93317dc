"""Which tiktoken encoding an OpenAI model name uses, answered from local vocabulary files.

    encoding_name_for_model("gpt-4o-mini")      # 'o200k_base'
    encoding_for_model("gpt-4")                 # get_encoding("cl100k_base"), no download

The table states tiktoken's (tiktoken/model.py); tests compare the two entry by entry.
Models of encodings istanbul has no vocabulary for (p50k_base, p50k_edit, o200k_harmony) raise
KeyError naming the encoding.
"""

from __future__ import annotations

# exact names, grouped by encoding
_EXACT = {
    "o200k_base": ("o1", "o3", "o4-mini", "gpt-5", "gpt-4.1", "gpt-4o"),
    "cl100k_base": ("gpt-4", "gpt-3.5-turbo", "gpt-3.5", "gpt-35-turbo", "davinci-002",
                    "babbage-002", "text-embedding-ada-002", "text-embedding-3-small",
                    "text-embedding-3-large"),
    "p50k_base": ("text-davinci-003", "text-davinci-002", "code-davinci-002", "code-davinci-001",
                  "code-cushman-002", "code-cushman-001", "davinci-codex", "cushman-codex"),
    "p50k_edit": ("text-davinci-edit-001", "code-davinci-edit-001"),
    "r50k_base": ("text-davinci-001", "text-curie-001", "text-babbage-001", "text-ada-001",
                  "davinci", "curie", "babbage", "ada", "text-similarity-davinci-001",
                  "text-similarity-curie-001", "text-similarity-babbage-001",
                  "text-similarity-ada-001", "text-search-davinci-doc-001",
                  "text-search-curie-doc-001", "text-search-babbage-doc-001",
                  "text-search-ada-doc-001", "code-search-babbage-code-001",
                  "code-search-ada-code-001"),
    "gpt2": ("gpt2", "gpt-2"),
}
MODEL_TO_ENCODING = {model: enc for enc, models in _EXACT.items() for model in models}
# prefixes, tried in this order (tiktoken's) when the exact name is unknown
MODEL_PREFIX_TO_ENCODING = {
    "o1-": "o200k_base", "o3-": "o200k_base", "o4-mini-": "o200k_base", "gpt-5": "o200k_base",
    "gpt-4.5-": "o200k_base", "gpt-4.1-": "o200k_base", "chatgpt-4o-": "o200k_base",
    "gpt-4o-": "o200k_base", "gpt-4-": "cl100k_base", "gpt-3.5-turbo-": "cl100k_base",
    "gpt-35-turbo-": "cl100k_base", "gpt-oss-": "o200k_harmony", "ft:gpt-4o": "o200k_base",
    "ft:gpt-4": "cl100k_base", "ft:gpt-3.5-turbo": "cl100k_base",
    "ft:davinci-002": "cl100k_base", "ft:babbage-002": "cl100k_base",
}


def encoding_name_for_model(model_name: str) -> str:
    """tiktoken's `encoding_name_for_model`: KeyError for an unknown model."""
    if model_name in MODEL_TO_ENCODING:
        return MODEL_TO_ENCODING[model_name]
    for prefix, name in MODEL_PREFIX_TO_ENCODING.items():
        if model_name.startswith(prefix):
            return name
    raise KeyError(f"Could not automatically map {model_name} to a tokeniser. Please use "
                   "`tokenizer_svc.encoding.get_encoding` to explicitly get the tokeniser you "
                   "expect.")
