"""Activations: SwiGLU and GELU (tanh), forward and backward.

06_activations.wgsl, reference.py, ops.py, cases.py.
"""
