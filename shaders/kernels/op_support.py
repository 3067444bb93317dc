"""Helpers shared by the op modules: size checks with clear errors, grids, dummy bindings."""

from __future__ import annotations

import numpy as np

from ..engine import Buffer, BufferView

F32 = np.dtype(np.float32)
F16 = np.dtype(np.float16)
U32 = np.dtype(np.uint32)

# How the tensor-core kernels read f16 rows from storage (f16 weights, A, q, k, v, do): as
# their bits, vec2<u32> elements bitcast to vec4<f16> (8-byte loads), faster than reading
# vec4<f16> elements (dev/tensor_core_attention/README.md).
# Template parameters: F16_ROW, the binding's element type, and F16_READ, the function that
# turns one element into a vec4<f16>.
F16_READ_PARAMS = {"F16_ROW": "vec2<u32>", "F16_READ": "bitcast<vec4<f16>>"}


def elements_view(buf, start: int, count: int):
    """buf.elements(start, count), with the byte size rounded up to a multiple of 4.

    WebGPU binds storage ranges in multiples of 4 bytes: an odd count of f16 elements needs
    its range padded by one element (buffers are padded to 4 bytes, so the padding exists);
    kernels never touch elements past their count.
    """
    itemsize = np.dtype(buf.dtype).itemsize
    nbytes = -(-count * itemsize // 4) * 4
    if start * itemsize + nbytes > buf.nbytes:
        nbytes = count * itemsize
    return BufferView(buf, start * itemsize, nbytes, buf.dtype, (count,))


def dtype_of(res) -> np.dtype:
    """The element type a Buffer/BufferView was created with (float32 when unknown)."""
    if not isinstance(res, (Buffer, BufferView)):
        raise TypeError(f"expected a Buffer or BufferView, got {type(res).__name__}")
    return np.dtype(res.dtype) if res.dtype is not None else F32


def check(op: str, name: str, res, count: int, dtypes=(F32,)) -> np.dtype:
    """Raise a ValueError naming the op and operand unless `res` holds >= count elements."""
    dtype = dtype_of(res)
    if dtype not in dtypes:   # np.dtype == numpy scalar type, so either form matches
        allowed = tuple(np.dtype(d) for d in dtypes)
        raise ValueError(f"{op}: {name} has dtype {dtype}, expected "
                         f"{' or '.join(str(d) for d in allowed)}")
    have = res.nbytes // dtype.itemsize
    if have < count:
        raise ValueError(f"{op}: {name} holds {have} {dtype} elements, the shapes need {count}")
    return dtype


def f16_output(op: str, name: str, device, vec: bool, needs: str, views) -> None:
    """Raise a clear ValueError unless the f16 output `name` can be written here: f16
    outputs have vec4 kernels only (`vec`: the layout allows them; `needs` says what they
    need, with the caller's values) and need a device with shader-f16."""
    if not vec:
        offsets = [getattr(v, "offset", 0) for v in views]
        raise ValueError(f"{op}: an f16 {name} is written by the vec4 kernel only, which needs "
                         f"{needs} and 16-byte-aligned views (at byte offsets {offsets}); use "
                         f"an f32 {name} for other layouts")
    if not device.has("shader-f16"):
        raise ValueError(f"{op}: an f16 {name} needs a device with shader-f16; {device.name} "
                         f"lacks it: use an f32 {name}")


def positive(op: str, **dims) -> None:
    for key, value in dims.items():
        if int(value) < 1:
            raise ValueError(f"{op}: {key} must be >= 1, got {value}")


def ceil_div(a: int, b: int) -> int:
    return -(-int(a) // int(b))


def grid2d(device, op: str, x: int, y: int) -> tuple[int, int, int]:
    return grid3d(device, op, x, y, 1)


def grid3d(device, op: str, x: int, y: int, z: int) -> tuple[int, int, int]:
    limit = device.max_workgroups_per_dim
    if max(x, y, z) > limit:
        dims = f"{x}x{y}" + (f"x{z}" if z != 1 else "")
        raise ValueError(f"{op}: grid {dims} exceeds the device's {limit} workgroups per "
                         "dimension; split the call")
    return (int(x), int(y), int(z))


_DUMMIES: dict = {}


def dummy(device, nbytes: int = 16) -> Buffer:
    """A buffer of `nbytes` (16 by default) bound where a kernel's optional operand is unused
    (bigger where the binding's minimum size is: a subgroup-matrix load of 16 x 16 f32 needs
    1 KiB)."""
    key = (id(device), int(nbytes))
    buf = _DUMMIES.get(key)
    if buf is None or buf.device is not device:
        buf = device.zeros(max(int(nbytes) // 4, 4), np.float32, label="unused operand")
        _DUMMIES[key] = buf
    return buf


def workgroup_storage(device) -> int:
    return int(device.limits.get("max-compute-workgroup-storage-size", 16384))


_SCRATCH: dict = {}


def scratch(device, name: str, nbytes: int, dtype=np.float32):
    """A device-wide scratch buffer for intermediate results inside one op's dispatches.

    Dispatches of one recording run in order, so ops may share a scratch buffer as long as
    its contents are consumed by the op's own later dispatch. Grows as needed; old buffers are
    left to the garbage collector (recorded commands keep what they reference alive).
    """
    key = (id(device), name)
    buf = _SCRATCH.get(key)
    if buf is None or buf.device is not device or buf.nbytes < nbytes:
        buf = device.buffer(max(int(nbytes), 16), dtype, label=f"scratch {name}")
        _SCRATCH[key] = buf
    return buf


def row_grid(device, rows: int):
    """One workgroup per row, folded into 2-D past the per-dimension limit."""
    from ..engine import fold_grid
    return fold_grid(int(rows), device.max_workgroups_per_dim)


def vec_width(n: int, *views) -> int:
    """4 when rows of length n can be read as vec4 (n % 4 == 0, 16-byte aligned views)."""
    if n % 4:
        return 1
    if any(getattr(v, "offset", 0) % 16 for v in views):
        return 1
    return 4


def row_workgroup(elems: int) -> int:
    """Invocations per workgroup for a one-row-per-workgroup kernel over `elems` elements."""
    return 64 if elems <= 1024 else 256


def has_tensor_cores(device) -> bool:
    """Whether `device` offers the 16x16x16 f16 -> f32 subgroup matrices at subgroup size 32."""
    if not device.has("subgroup-matrix") or not device.has("shader-f16"):
        return False
    return any(c.get("component_type") == "f16" and c.get("result_component_type") == "f32"
               and (c.get("m"), c.get("n"), c.get("k")) == (16, 16, 16)
               and c.get("min_subgroup_size", 0) <= 32 <= c.get("max_subgroup_size", 0)
               for c in getattr(device, "subgroup_matrix_configs", ()) or ())
