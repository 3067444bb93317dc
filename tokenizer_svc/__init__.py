"""The tokenizer: tiktoken's API (and Hugging Face tokenizer.json vocabularies) computed on the
GPU with exact ids, and the gRPC service that serves it.

- the library, at the top: `encoding` (`Encoding`, `get_encoding`), `vocab` / `vocabulary`
  (loading vocabularies), `reference` (the CPU reference tokenizer), `patterns`,
  `gpu_backend` (the GPU side of an Encoding), `forked`, `chunking`, `model_names`,
  `vocab_fetch`, `corpus_files`, `settings`, the `istanbul encode/decode/vocab` commands;
- `hf/`: what a tokenizer.json means (loading, normalizers, Oniguruma regexes, the pipeline
  around BPE, chat templates);
- `training/`: learning a BPE vocabulary from a corpus on the GPU;
- `service/`: the gRPC service (server, client, generated code, the GPU process).
"""
