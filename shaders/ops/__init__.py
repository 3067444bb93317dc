"""Op functions of the matmul (linear), attention and decoding families, until they move into
shaders/kernels/<family>/ops.py like every other family's. Each records one kernel family's
dispatches into a Recorder.

    from shaders.ops import linear
    with dev.record() as rec:
        linear.matmul_nt(rec, x, w, y, M=tokens, N=d_out, K=d_in)

One module per family; every function takes the recorder, Buffers/BufferViews and shapes,
checks sizes (ValueError naming the operand), and gets its kernels and cached uniform params
from `rec.device`. Each docstring states the layouts. The ladder cases (shaders/cases/) call
these same functions, so the checked path is the path the model runs.
"""
