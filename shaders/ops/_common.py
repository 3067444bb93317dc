"""Helpers shared by the op modules: size checks with clear errors, grids, dummy bindings."""

from __future__ import annotations

import numpy as np

from ..engine import Buffer, BufferView

F32 = np.dtype(np.float32)
F16 = np.dtype(np.float16)
U32 = np.dtype(np.uint32)


def dtype_of(res) -> np.dtype:
    """The element type a Buffer/BufferView was created with (float32 when unknown)."""
    if not isinstance(res, (Buffer, BufferView)):
        raise TypeError(f"expected a Buffer or BufferView, got {type(res).__name__}")
    return np.dtype(res.dtype) if res.dtype is not None else F32


def check(op: str, name: str, res, count: int, dtypes=(F32,)) -> np.dtype:
    """Raise a ValueError naming the op and operand unless `res` holds >= count elements."""
    dtype = dtype_of(res)
    allowed = tuple(np.dtype(d) for d in dtypes)
    if dtype not in allowed:
        raise ValueError(f"{op}: {name} has dtype {dtype}, expected "
                         f"{' or '.join(str(d) for d in allowed)}")
    have = res.nbytes // dtype.itemsize
    if have < count:
        raise ValueError(f"{op}: {name} holds {have} {dtype} elements, the shapes need {count}")
    return dtype


def positive(op: str, **dims) -> None:
    for key, value in dims.items():
        if int(value) < 1:
            raise ValueError(f"{op}: {key} must be >= 1, got {value}")


def ceil_div(a: int, b: int) -> int:
    return -(-int(a) // int(b))


def grid2d(device, op: str, x: int, y: int) -> tuple[int, int, int]:
    limit = device.max_workgroups_per_dim
    if x > limit or y > limit:
        raise ValueError(f"{op}: grid {x}x{y} exceeds the device's {limit} workgroups per "
                         "dimension; split the call")
    return (int(x), int(y), 1)


_DUMMIES: dict = {}


def dummy(device) -> Buffer:
    """A 16-byte buffer bound where a kernel's optional operand is unused."""
    buf = _DUMMIES.get(id(device))
    if buf is None or buf.device is not device:
        buf = device.zeros(4, np.float32, label="unused operand")
        _DUMMIES[id(device)] = buf
    return buf


def workgroup_storage(device) -> int:
    return int(device.limits.get("max-compute-workgroup-storage-size", 16384))
