"""Cross-entropy: fused softmax + loss + dlogits; label smoothing, z-loss, ignore index.

07_cross_entropy.wgsl (per-row kernels), 07_cross_entropy_reduce.wgsl (the mean loss),
reference.py, ops.py, cases.py.
"""
