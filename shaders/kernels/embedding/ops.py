"""Token embedding lookup and its gradient (01_embedding.wgsl).

Layouts (row-major, contiguous): ids u32[tokens] (tokens = B*T, batch-major), table and its
gradient f32[vocab, dim], activations f32[tokens, dim]. `table`/`dtable` may be views into
the parameter/gradient buffers.

    plan = embedding.backward_plan(ids_host)            # numpy u32, host side, per batch
    plan_buf.write(plan)                                # a buffer of plan_size(tokens) u32
    embedding.forward(rec, ids, table, out, tokens, dim, vocab)
    embedding.backward(rec, plan_buf, ids, dout, dtable, tokens, dim, vocab)   # dtable +=

Ids >= vocab give zero rows and no gradient (validate ids on the host: the shard reader does).
The backward is deterministic and atomic-free: the plan sorts token positions by id on the
host (the ids are host data anyway), and one workgroup per distinct id sums its rows.
"""

from __future__ import annotations

import numpy as np

from ..op_support import U32, ceil_div, check, positive, vec_width
from ...engine import fold_grid

FILE = "01_embedding.wgsl"
EW = 64


def plan_size(tokens: int) -> int:
    """u32 count of a backward plan for `tokens` token positions (fixed per batch shape)."""
    return 2 * int(tokens) + 2


def backward_plan(ids) -> np.ndarray:
    """The backward's token grouping for these ids (layout in 01_embedding.wgsl)."""
    ids = np.asarray(ids).reshape(-1)
    tokens = ids.size
    order = np.argsort(ids, kind="stable").astype(np.uint32)
    sorted_ids = ids[order]
    if tokens:
        starts = np.flatnonzero(np.concatenate([[True], sorted_ids[1:] != sorted_ids[:-1]]))
    else:
        starts = np.zeros(0, np.int64)
    plan = np.zeros(plan_size(tokens), np.uint32)
    plan[0] = starts.size
    plan[1:1 + tokens] = order
    plan[1 + tokens:1 + tokens + starts.size] = starts
    plan[1 + tokens + starts.size] = tokens
    return plan


def _grid(device, dim_elems: int, rows: int) -> tuple[int, int, int]:
    ys, zs, _ = fold_grid(rows, device.max_workgroups_per_dim)
    return (ceil_div(dim_elems, EW), ys, zs)


def forward(rec, ids, table, out, tokens: int, dim: int, vocab: int) -> None:
    """out[t, :] = table[ids[t], :] for t < tokens."""
    positive("embedding.forward", tokens=tokens, dim=dim, vocab=vocab)
    check("embedding.forward", "ids", ids, tokens, (U32,))
    check("embedding.forward", "table", table, vocab * dim)
    check("embedding.forward", "out", out, tokens * dim)
    width = vec_width(dim, table, out)
    dev = rec.device
    kern = dev.kernel(FILE, "embedding_forward_vec4" if width == 4 else "embedding_forward")
    params = dev.params("IIII", tokens, dim // width, vocab, 0)
    rec.dispatch(kern, [ids, table, out, params], _grid(dev, dim // width, tokens),
                 label=kern.name)


def backward(rec, plan, ids, dout, dtable, tokens: int, dim: int, vocab: int) -> None:
    """dtable[id, :] += sum of dout[t, :] over tokens t with ids[t] == id (plan from the ids)."""
    positive("embedding.backward", tokens=tokens, dim=dim, vocab=vocab)
    check("embedding.backward", "plan", plan, plan_size(tokens), (U32,))
    check("embedding.backward", "ids", ids, tokens, (U32,))
    check("embedding.backward", "dout", dout, tokens * dim)
    check("embedding.backward", "dtable", dtable, vocab * dim)
    width = vec_width(dim, dout, dtable)
    dev = rec.device
    kern = dev.kernel(FILE, "embedding_backward_vec4" if width == 4 else "embedding_backward")
    params = dev.params("IIII", tokens, dim // width, vocab, 0)
    rec.dispatch(kern, [plan, ids, dout, dtable, params], _grid(dev, dim // width, tokens),
                 label=kern.name)
