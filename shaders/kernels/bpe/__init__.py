"""BPE tokenizer kernels: pre-tokenize + merge, prefix sums, compaction, decode.

bpe_encode.wgsl, bpe_scan.wgsl, bpe_compact.wgsl, bpe_decode.wgsl, reference.py, cases.py.
The op functions are the tokenizer's own: tokenizer_svc.gpu_encode.GpuEncoder,
tokenizer_svc.gpu_scan.GpuScan and tokenizer_svc.gpu_decode.GpuDecoder, and the ladder cases
run exactly those (their public entry points), so the checked path is the served path.
"""
