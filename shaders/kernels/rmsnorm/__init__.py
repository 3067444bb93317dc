"""RMSNorm: forward (saves rstd), backward dx (= or +=) and a two-stage dw.

02_rmsnorm.wgsl (any row length), 02_rmsnorm_forward.wgsl (the vec4 forwards, y f32 or
f16), 02_rmsnorm_rows.wgsl (the backward over several rows per workgroup, the default for
n % 4 == 0), reference.py, ops.py, cases.py.
"""
