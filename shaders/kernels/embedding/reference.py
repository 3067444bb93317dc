"""Numpy references of the embedding kernels (float64, rounded to f32 at the end).

    forward:  out[t] = table[ids[t]]            (rows of ids >= vocab stay zero)
    backward: dtable[v] += sum of dout[t] over the t with ids[t] == v
"""

from __future__ import annotations

import numpy as np

from ..case_support import f64


def forward_reference(inp):
    ids, table = inp["ids"], inp["table"]
    out = np.zeros((ids.size, inp["dim"]), np.float32)
    ok = ids < inp["vocab"]
    out[ok] = table[ids[ok]]
    return {"out": out}


def backward_reference(inp):
    ids = inp["ids"]
    dtable = f64(inp["dtable0"]).copy()
    ok = ids < inp["vocab"]
    np.add.at(dtable, ids[ok], f64(inp["dout"])[ok])
    return {"dtable": dtable.astype(np.float32)}
