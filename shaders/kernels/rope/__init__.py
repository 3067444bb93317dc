"""RoPE: rotate-half rotary embedding, in place, forward and backward, position offset.

04_rope.wgsl, reference.py, ops.py (forward, backward, rope_table), cases.py.
"""
