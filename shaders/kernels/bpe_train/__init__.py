"""BPE vocabulary training kernels: pair count, best pair, merge, compaction.

bpe_train.wgsl, reference.py, cases.py. The op functions are the trainer's own
(tokenizer_svc.training.gpu_trainer), which the ladder cases drive.
"""
