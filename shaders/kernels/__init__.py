"""Kernel families, one folder each: its WGSL, op functions (ops.py), numpy references
(reference.py) and ladder cases (cases.py) side by side."""
