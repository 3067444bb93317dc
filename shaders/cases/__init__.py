"""Ladder entries: each module registers its kernels' cases (reference, inputs, counts).

Every module in this package is imported by `shaders.ladder.load_cases()`.
"""
