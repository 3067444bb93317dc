"""Element-wise kernels: fill, scale, axpy, copy, casts f32 <-> f16, row reductions.

infra.wgsl (one element per invocation, any size), infra_vec4.wgsl (16 elements per
invocation, the default for n % 4 == 0), reference.py, ops.py, cases.py.
"""
