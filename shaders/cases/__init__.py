"""Ladder entries of the matmul, attention and decoding families until they move into
shaders/kernels/<family>/cases.py like every other family's: each module registers its
kernels' cases (reference, inputs, counts).

Every module in this package is imported by `shaders.ladder.load_cases()`.
"""
