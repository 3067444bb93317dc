"""BPE vocabulary training kernels: pair count, best pair, merge, compaction (bpe_train.wgsl),
one chunk's unique pieces (piece_count.wgsl) and the corpus's, kept on the device across
chunks (piece_store.wgsl).

    merges.py        the contract every trainer implements (the merge rules, the result)
    trainer.py       the GPU trainer (bpe_train.wgsl): pieces + counts -> merges
    piece_count.py   GpuPieceCounter (piece_count.wgsl, with the encoder's pre-tokenizer of
                     ../bpe): one chunk of documents -> its unique pieces
    piece_store.py   PieceStore (piece_store.wgsl): the corpus's unique pieces on the device
    reference.py, cases.py

The ladder cases drive the state layouts trainer.py, piece_count.py and piece_store.py use;
tokenizer_svc.training reads corpus files into them and turns the merges into a vocabulary.
"""
