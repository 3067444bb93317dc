"""Token embedding: lookup forward, deterministic backward from a host-sorted plan.

01_embedding.wgsl, reference.py, ops.py (forward, backward, backward_plan), cases.py.
"""
