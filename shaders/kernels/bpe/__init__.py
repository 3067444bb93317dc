"""BPE tokenizer kernels: pre-tokenize + merge, prefix sums, compaction, decode.

    bpe_encode.wgsl, bpe_compact.wgsl   encode.py   GpuEncoder: documents -> ids + offsets
    bpe_scan.wgsl                       scan.py     GpuScan, and the buffer pool, uniform
                                                    slots and staging the launches share
    bpe_decode.wgsl                     decode.py   GpuDecoder: ids -> bytes
    tables.py          a vocabulary as the kernels' flat u32 tables (VocabTables)
    patterns.py        the three pre-tokenizer patterns the kernels implement
    unicode_table.py   the Unicode class table the pre-tokenizer reads (data/)
    cuts.py            where a document may be cut without changing its ids (the GPU's is_cut)
    packed_text.py     documents joined range by range as they are uploaded
    reference.py, cases.py

The tokenizer service (tokenizer_svc) builds on these: it passes its vocabularies in
(tables.TableVocabulary) and runs the same classes the ladder cases drive.
"""
