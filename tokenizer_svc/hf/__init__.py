"""Hugging Face `tokenizers` compatibility: what a `tokenizer.json` vocabulary means, on the CPU.

- `tokenizer_json`: loading a tokenizer.json (byte-level BPE) into a `Vocabulary` (`HFConfig`);
- `normalize`: its normalizers, with `tokenizers`' own Unicode data (`data/`);
- `oniguruma`: its regexes with the meaning Oniguruma gives them;
- `pipeline`: what `tokenizers` does before and after BPE (`HFPipeline`);
- `chat_template`: transformers' `apply_chat_template` for a vocabulary's Jinja template.
"""
