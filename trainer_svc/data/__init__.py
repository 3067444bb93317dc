"""Training data: text -> token ids -> shards -> batches.

`text.py` (text <-> ids through the project's tokenizer), `prepare.py` (corpus files -> shards,
for `istanbul prepare`), `shards.py` (the binary shard format), `files.py` (shard files on
disk), `datasets.py` (shards and their metadata in Redis), `stream.py` (TokenStream: batches in
a deterministic order that resumes exactly).
"""
