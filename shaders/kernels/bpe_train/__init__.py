"""BPE vocabulary training kernels: pair count, best pair, merge, compaction (bpe_train.wgsl),
one chunk's unique pieces (piece_count.wgsl) and the corpus's, kept on the device across
chunks (piece_store.wgsl).

reference.py, cases.py. The op functions are the trainer's own
(tokenizer_svc.training.gpu_trainer, gpu_corpus, gpu_piece_store), which the ladder cases drive.
"""
