"""The kernel house: one folder per kernel family.

    shaders/kernels/00_shared.wgsl     the preamble every kernel is compiled with
    shaders/kernels/<family>/
        *.wgsl        the kernels (`// --- KERNEL: name ---` sections; the header says what
                      they compute, their bindings and their dispatch shape)
        reference.py  the slow, obviously right numpy reference
        ops.py        the op functions that record the kernels' dispatches (what the model and
                      the services call; bpe and bpe_train name theirs after what they launch:
                      encode.py, scan.py, decode.py, trainer.py, piece_count.py, ...)
        cases.py      the ladder entries: inputs (random and adversarial), the launch through
                      ops.py, the reference, FLOP and byte counts (`istanbul kernels check`)
    op_support.py, case_support.py     helpers shared by every family's ops and cases

`device.kernel("02_rmsnorm.wgsl", name)` finds a file by its name (unique across the
families) or as `"rmsnorm/02_rmsnorm.wgsl"` (shaders/source.py). The fast matmul and attention
kernels are templates (`{{NAME}}` placeholders, `// @unroll` loops, `// @if` branches)
expanded when a kernel is made (shaders/wgsl_expand.py).
"""
