"""Optimizer: global grad norm / clip scale / NaN flag, multi-tensor AdamW + f16 mirror.

12_optim.wgsl, reference.py, ops.py, cases.py.
"""
