"""The WGSL engine: one wgpu device, its kernels, buffers, and recorded dispatches.

    dev = Device()                                   # or Device(adapter="1"), Device("H200")
    scale = dev.kernel("infra.wgsl", "scale")        # compiled once, cached
    x = dev.upload(np.arange(10, dtype=np.float32))
    y = dev.empty(10, np.float32)
    params = dev.uniform("If", 10, 2.0)              # struct layout, padded to 16 bytes
    with dev.record() as rec:                        # one compute pass, one submit
        rec.dispatch(scale, [x, y, params], workgroups=1)
    dev.download(y)                                  # -> numpy

Binding order is the project's convention: read-only inputs first, then read_write outputs,
then uniforms; binding i of group 0 is the i-th resource in the list. A resource is a `Buffer`
or a `BufferView` (a sub-range of one, for multi-tensor kernels over one parameter buffer).

Dispatch grids above the device's per-dimension limit (65,535 workgroups) are folded into 2-D;
kernels recover the linear workgroup index with `workgroup_index()` from 00_shared.wgsl and
bounds-check it.

The device comes from one WebGPU backend (`Device(backend="dawn")`, `--backend`,
$ISTANBUL_BACKEND; see backends.py). wgpu-native does not check WebGPU's binding rules
and Dawn does, so the engine checks them itself, on both, when it makes a bind group: two
writable bindings of one buffer must not overlap, and a buffer bound writable may not also
be bound read-only or as a uniform in the same dispatch (BindingHazardError).
"""

from __future__ import annotations

import itertools
import re
import struct
import time
import weakref
from collections import OrderedDict
from dataclasses import dataclass, field

import numpy as np
import wgpu

from . import backends, settings, sgmat_emulation, source
from .adapters import AdapterInfo, NoAdapterError, choose_adapter

# WebGPU's flag values: the same numbers in wgpu-native and Dawn.
BufferUsage = wgpu.BufferUsage

# Features we ask for whenever the adapter has them.
WANTED_FEATURES = (
    "shader-f16",
    "subgroup",
    "subgroup-barrier",
    "timestamp-query",
    "timestamp-query-inside-passes",
    "timestamp-query-inside-encoders",
    "shader-float32-atomic",
    "subgroup-matrix",  # Dawn's chromium-experimental-subgroup-matrix (tensor cores)
)

STORAGE = BufferUsage.STORAGE | BufferUsage.COPY_SRC | BufferUsage.COPY_DST
INDIRECT_STORAGE = STORAGE | BufferUsage.INDIRECT  # a storage buffer kernels size dispatches with
_serials = itertools.count(1)


class ShaderCompileError(RuntimeError):
    """The shader compiler (naga or Tint) or the driver refused a kernel; the message names
    the file and kernel."""


class WorkgroupMemoryError(ShaderCompileError):
    """A kernel needs more workgroup memory than the device offers (the ladder skips such a
    kernel on a device that emulates subgroup matrices: a limit of the test device, not a
    fault of the kernel; elsewhere it is an error like any other)."""


WORKGROUP_LIMIT = re.compile(r"workgroup (storage|memory).*(maximum|limit)", re.I | re.S)


class BindingHazardError(ValueError):
    """A bind group that WebGPU forbids: overlapping writable ranges of one buffer, or one
    buffer bound both writable and read-only in one dispatch."""


def fold_grid(workgroups: int, max_per_dim: int = 65535) -> tuple[int, int, int]:
    """Fold a 1-D workgroup count into (x, y, 1) with x, y <= max_per_dim and x*y >= count.

    The kernel computes `wg.x + wg.y * num_wg.x` and ignores indices >= count.
    """
    if workgroups < 1:
        raise ValueError(f"workgroup count must be >= 1, got {workgroups}")
    if workgroups <= max_per_dim:
        return (workgroups, 1, 1)
    rows = -(-workgroups // max_per_dim)
    if rows > max_per_dim:
        raise ValueError(f"{workgroups} workgroups exceed a {max_per_dim}x{max_per_dim} grid")
    cols = -(-workgroups // rows)
    return (cols, rows, 1)


def _padded_bytes(array) -> np.ndarray:
    """The array's bytes, zero-padded to a multiple of 4 (wgpu's copy alignment)."""
    raw = np.ascontiguousarray(array).reshape(-1).view(np.uint8)
    if raw.size % 4:
        raw = np.concatenate([raw, np.zeros(4 - raw.size % 4, np.uint8)])
    return raw


@dataclass(eq=False)
class Buffer:
    """A device buffer with an optional numpy view of its contents (dtype and shape)."""

    device: "Device"
    raw: object
    nbytes: int
    dtype: np.dtype | None = None
    shape: tuple | None = None
    label: str = ""
    serial: int = field(default_factory=lambda: next(_serials))

    def view(self, offset_bytes: int, nbytes: int, dtype=None, shape=None) -> "BufferView":
        return BufferView(self, offset_bytes, nbytes, dtype or self.dtype, shape)

    def elements(self, start: int, count: int, shape=None) -> "BufferView":
        """A sub-range in elements of this buffer's dtype."""
        size = np.dtype(self.dtype).itemsize
        return BufferView(self, start * size, count * size, self.dtype, shape or (count,))

    def write(self, array, offset_bytes: int = 0) -> None:
        data = _padded_bytes(array)
        if offset_bytes + data.nbytes > self.nbytes:
            raise ValueError(f"write of {data.nbytes} bytes at {offset_bytes} overflows "
                             f"buffer {self.label or self.serial} of {self.nbytes} bytes")
        self.device.queue.write_buffer(self.raw, offset_bytes, data)

    def read(self) -> np.ndarray:
        return self.device.download(self)

    def destroy(self) -> None:
        self.raw.destroy()
        release = getattr(self, "_untrack", None)
        if release is not None:
            release()   # once: a weakref.finalize runs at most one time


@dataclass(eq=False)
class BufferView:
    """A sub-range of a buffer, bindable on its own (offset aligned to the device's rule)."""

    buffer: Buffer
    offset: int
    nbytes: int
    dtype: np.dtype | None = None
    shape: tuple | None = None

    def __post_init__(self):
        align = self.buffer.device.limits.get("min-storage-buffer-offset-alignment", 256)
        if self.offset % align:
            raise ValueError(f"sub-range offset {self.offset} is not a multiple of the device's "
                             f"storage offset alignment {align}")
        if self.offset < 0 or self.offset + self.nbytes > self.buffer.nbytes:
            raise ValueError(f"sub-range [{self.offset}, {self.offset + self.nbytes}) lies "
                             f"outside buffer of {self.buffer.nbytes} bytes")

    def read(self) -> np.ndarray:
        return self.buffer.device.download(self)


class Kernel:
    """One compiled compute pipeline plus a cache of its bind groups."""

    def __init__(self, device: "Device", file: str, name: str, constants: dict, pipeline,
                 access: dict | None = None):
        self.device, self.file, self.name, self.constants = device, file, name, constants
        self.pipeline = pipeline
        self.access = access or {}  # binding -> source.Binding (name, read_write or not)
        self.layout = pipeline.get_bind_group_layout(0)
        self._groups: OrderedDict = OrderedDict()

    def __repr__(self) -> str:
        extra = f" {self.constants}" if self.constants else ""
        return f"<Kernel {self.file}:{self.name}{extra}>"

    def bind_group(self, resources) -> object:
        """Bind group for these resources (cached: reusing it costs nothing)."""
        key = []
        for i, res in enumerate(resources):
            if isinstance(res, BufferView):
                key.append((res.buffer.serial, res.offset, res.nbytes))
            elif isinstance(res, Buffer):
                key.append((res.serial, 0, res.nbytes))
            else:
                raise TypeError(f"{self}: binding {i} is {type(res).__name__}, "
                                "expected Buffer or BufferView")
        key = tuple(key)
        group = self._groups.get(key)
        if group is None:   # the entries only for a new group: a hit builds no dicts
            self._check_hazards(key)
            entries = [{"binding": i, "resource": {
                "buffer": (res.buffer if isinstance(res, BufferView) else res).raw,
                "offset": offset, "size": size}}
                for i, (res, (_, offset, size)) in enumerate(zip(resources, key))]
            group = self.device.raw.create_bind_group(layout=self.layout, entries=entries)
            self._groups[key] = group
            if len(self._groups) > 4096:
                self._groups.popitem(last=False)
        else:
            self._groups.move_to_end(key)
        return group

    def _check_hazards(self, ranges) -> None:
        """WebGPU's usage rules within one dispatch, for (buffer serial, offset, size) per
        binding: wgpu-native lets these through, Dawn and browsers refuse them, so code that
        passes on one backend must not break on the other."""
        for i, (buf_i, off_i, size_i) in enumerate(ranges):
            for j in range(i + 1, len(ranges)):
                buf_j, off_j, size_j = ranges[j]
                if buf_i != buf_j:
                    continue
                a, b = self.access.get(i), self.access.get(j)
                if a is None or b is None or not (a.writable or b.writable):
                    continue
                where = (f"{self}: bindings {i} ({a.name}, [{off_i}, {off_i + size_i})) and "
                         f"{j} ({b.name}, [{off_j}, {off_j + size_j})) are views of one buffer")
                if a.writable and b.writable:
                    if off_i < off_j + size_j and off_j < off_i + size_i:
                        raise BindingHazardError(
                            f"{where} with overlapping writable ranges; WebGPU forbids "
                            "writable aliasing (Dawn and browsers refuse it): bind disjoint "
                            "ranges or separate buffers")
                else:
                    raise BindingHazardError(
                        f"{where}, one writable and one read-only; WebGPU forbids a buffer "
                        "bound writable and read-only in the same dispatch, even for disjoint "
                        "ranges: pass the inputs in another buffer")


def _extent(res) -> tuple[int, int, int]:
    """(buffer serial, first byte, end byte) of a Buffer or BufferView."""
    if isinstance(res, BufferView):
        return res.buffer.serial, res.offset, res.offset + res.nbytes
    return res.serial, 0, res.nbytes


def views_overlap(a, b) -> bool:
    """Whether two Buffers/BufferViews share bytes of one buffer."""
    (buf_a, start_a, end_a), (buf_b, start_b, end_b) = _extent(a), _extent(b)
    return buf_a == buf_b and start_a < end_b and start_b < end_a


def _group(kernel: Kernel, resources):
    """A bind group as given, or the kernel's (cached) group for a list of resources."""
    if isinstance(resources, (list, tuple)):
        return kernel.bind_group(list(resources))
    return resources  # a bind group made earlier with kernel.bind_group


class Recorder:
    """Records dispatches into one command encoder and compute pass; submits on exit.

    With `timing=True` each dispatch gets its own pass with GPU timestamps at its start and
    end; after the block, `gpu_times` holds (label, seconds) per dispatch.
    """

    def __init__(self, device: "Device", label: str = "", timing: bool = False):
        self.device = device
        self.label = label
        self.timing = timing and device.has("timestamp-query")
        self.encoder = device.raw.create_command_encoder(label=label)
        self._pass = None
        self._stamps: list[str] = []
        self._query_set = None
        self.gpu_times: list[tuple[str, float]] = []
        self.dispatch_count = 0

    def _compute_pass(self, label: str):
        if self.timing:
            self._end_pass()
            index = 2 * len(self._stamps)
            self._stamps.append(label)
            self._pass = self.encoder.begin_compute_pass(
                label=label, timestamp_writes={"query_set": self._timing_set(),
                                               "beginning_of_pass_write_index": index,
                                               "end_of_pass_write_index": index + 1})
        elif self._pass is None:
            self._pass = self.encoder.begin_compute_pass(label=self.label)
        return self._pass

    def _timing_set(self):
        if self._query_set is None:
            self._query_set = self.device.raw.create_query_set(type="timestamp", count=4096)
        if 2 * len(self._stamps) > 4096:
            raise RuntimeError("more than 2048 timed dispatches in one recording")
        return self._query_set

    def _end_pass(self):
        if self._pass is not None:
            self._pass.end()
            self._pass = None

    def dispatch(self, kernel: Kernel, resources, workgroups, label: str = "") -> None:
        """Dispatch `kernel` over `workgroups` (an int, folded into 2-D if large, or x,y,z).

        `resources` is the list of buffers/views, or a bind group made once with
        `kernel.bind_group(resources)` (hot loops: saves the cache lookup per dispatch).
        """
        if isinstance(workgroups, (int, np.integer)):
            grid = fold_grid(int(workgroups), self.device.max_workgroups_per_dim)
        else:
            grid = tuple(int(g) for g in workgroups) + (1,) * (3 - len(workgroups))
        cpass = self._compute_pass(label or kernel.name)
        cpass.set_pipeline(kernel.pipeline)
        cpass.set_bind_group(0, _group(kernel, resources))
        cpass.dispatch_workgroups(*grid)
        self.dispatch_count += 1

    def dispatch_sequence(self, resources, steps, label: str = "") -> None:
        """Dispatch each (kernel, grid (x, y, z)) of `steps` in order with one bind group: the
        kernels must share their layout (`Device.kernels_sharing_layout`) unless there is one
        kernel. The bind group is set once and the pipeline only when it changes (hot loops:
        each wgpu-py call costs Python time, dev/vocab_train_speed/README.md), so a merge step
        of two kernels is two set_pipeline and two dispatch calls. Timed recordings give each
        dispatch its own pass, as `dispatch`."""
        steps = list(steps)
        if not steps:
            return
        if self.timing:
            for kernel, grid in steps:
                self.dispatch(kernel, resources, grid, label)
            return
        cpass = self._compute_pass(label or steps[0][0].name)
        cpass.set_bind_group(0, _group(steps[0][0], resources))
        set_pipeline, dispatch = cpass.set_pipeline, cpass.dispatch_workgroups
        current = None
        for kernel, grid in steps:
            if kernel is not current:
                set_pipeline(kernel.pipeline)
                current = kernel
            dispatch(*grid)
        self.dispatch_count += len(steps)

    def dispatch_indirect(self, kernel: Kernel, resources, indirect, offset: int = 0,
                          label: str = "") -> None:
        """Dispatch `kernel` with the workgroup counts (x, y, z: u32) that the GPU reads from
        `indirect` at byte `offset` when the dispatch runs, so an earlier kernel can size a
        later one without a host round trip. `indirect` needs INDIRECT usage
        (`device.buffer(..., usage=INDIRECT_STORAGE)`); each count must stay <= 65,535.
        """
        buf, off = (indirect.buffer, indirect.offset + offset) \
            if isinstance(indirect, BufferView) else (indirect, offset)
        cpass = self._compute_pass(label or kernel.name)
        cpass.set_pipeline(kernel.pipeline)
        cpass.set_bind_group(0, _group(kernel, resources))
        cpass.dispatch_workgroups_indirect(buf.raw, off)
        self.dispatch_count += 1

    def copy(self, src, dst, nbytes: int | None = None, *, src_offset: int = 0,
             dst_offset: int = 0) -> None:
        """Buffer-to-buffer copy (ends the current compute pass).

        `src_offset`/`dst_offset` are extra byte offsets (multiples of 4, no binding
        alignment needed), e.g. to append a row to a KV cache.
        """
        self._end_pass()
        s_buf, s_off = (src.buffer, src.offset) if isinstance(src, BufferView) else (src, 0)
        d_buf, d_off = (dst.buffer, dst.offset) if isinstance(dst, BufferView) else (dst, 0)
        size = nbytes if nbytes is not None else min(src.nbytes - src_offset,
                                                     dst.nbytes - dst_offset)
        self.encoder.copy_buffer_to_buffer(s_buf.raw, s_off + src_offset, d_buf.raw,
                                           d_off + dst_offset, size)

    def finish(self):
        """The recorded commands as a command buffer, not submitted (`Device.submit` it later,
        once). Buffer writes made before that submit are visible to it, so a caller can record
        the next piece of work while the GPU is busy and supply its inputs afterwards."""
        if self.timing:
            raise RuntimeError("a timed recording resolves its timestamps on submit(); "
                               "finish() is for untimed recordings")
        self._end_pass()
        return self.encoder.finish()

    def submit(self) -> None:
        self._end_pass()
        resolve = None
        if self._stamps:
            n = 2 * len(self._stamps)
            resolve = self.device.raw.create_buffer(
                size=8 * n, usage=BufferUsage.QUERY_RESOLVE | BufferUsage.COPY_SRC)
            self.encoder.resolve_query_set(self._query_set, 0, n, resolve, 0)
        self.device.queue.submit([self.encoder.finish()])
        if resolve is not None:
            ticks = np.frombuffer(self.device.queue.read_buffer(resolve), dtype=np.uint64)
            for i, label in enumerate(self._stamps):   # WebGPU timestamps count nanoseconds
                delta = int(ticks[2 * i + 1]) - int(ticks[2 * i])
                self.gpu_times.append((label, max(delta, 0) * 1e-9))
            resolve.destroy()

    def __enter__(self) -> "Recorder":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.submit()


class AllocationTracker:
    """Bytes of device buffers alive now and at most since `reset_peak()` (every buffer the
    engine creates counts until it is destroyed or garbage-collected)."""

    def __init__(self):
        self.allocated = 0
        self.peak = 0

    def add(self, nbytes: int) -> None:
        self.allocated += nbytes
        self.peak = max(self.peak, self.allocated)

    def remove(self, nbytes: int) -> None:
        self.allocated -= nbytes

    def reset_peak(self) -> None:
        self.peak = self.allocated


class Device:
    """A WebGPU device with every useful feature and the adapter's maximum limits.

    `adapter`: index or name substring (else $ISTANBUL_ADAPTER); `backend`: wgpu, dawn or
    auto (else $ISTANBUL_BACKEND). `features` uses the engine's names on both backends;
    `subgroup_matrix_configs` lists Dawn's tensor-core shapes when `subgroup-matrix` is on.
    `robustness`: Dawn's bounds-checking transform (default on; the trainer and the tokenizer pass False,
    $ISTANBUL_DAWN_ROBUSTNESS=on|off overrides: backends.dawn_robustness); `self.robustness`
    says what the device got (always True under wgpu-native, whose naga clamps anyway).
    `emulate_subgroup_matrix` (else $ISTANBUL_EMULATE_SUBGROUP_MATRIX=1): on a device with
    `shader-f16` but no subgroup matrices, offer them anyway, rewritten into plain WGSL by
    shaders/sgmat_emulation.py (slow and exact: for checking the tensor-core kernels on a
    CPU); `emulated_features` then holds "subgroup-matrix".
    """

    def __init__(self, adapter: str | int | None = None, backend: str | None = None,
                 robustness: bool = True, emulate_subgroup_matrix: bool | None = None):
        self.info, self._adapter = choose_adapter(adapter, backend)
        self.backend = backends.load(self.info.webgpu)
        self.robustness = (self.backend.name != "dawn"
                           or (backends.dawn_robustness(robustness)
                               and "disable_robustness" not in self.backend.device_toggles))
        self.raw, self.features = self._request(
            self._adapter, self.backend, self.robustness)
        self.subgroup_matrix_configs = (self.info.subgroup_matrix_configs
                                        if "subgroup-matrix" in self.features else ())
        if emulate_subgroup_matrix is None:
            emulate_subgroup_matrix = settings.read("ISTANBUL_EMULATE_SUBGROUP_MATRIX")
        self.emulated_features: frozenset = frozenset()
        if (emulate_subgroup_matrix and "subgroup-matrix" not in self.features
                and "shader-f16" in self.features):
            self.emulated_features = frozenset({"subgroup-matrix"})
            self.features = self.features | self.emulated_features
            self.subgroup_matrix_configs = (dict(sgmat_emulation.CONFIG),)
        self.queue = self.raw.queue
        self.limits = dict(self.raw.limits)
        self.max_workgroups_per_dim = int(self.limits.get("max-compute-workgroups-per-dimension",
                                                          65535))
        self._kernels: dict = {}
        self._params: dict = {}
        self._fences: list = []   # work_done's fence buffers not in use
        self.memory = AllocationTracker()

    @staticmethod
    def _request(adapter, backend, robustness: bool = True):
        """(device, its features): every WANTED_FEATURES feature the adapter has, and the
        adapter's maximum limits."""
        have = backend.canonical(adapter.features)
        wanted = [f for f in WANTED_FEATURES if f in have]
        dev = backend.request_device(adapter, wanted, dict(adapter.limits), robustness)
        return dev, backend.canonical(dev.features)

    def __repr__(self) -> str:
        return f"<Device {self.info.summary()}>"

    @property
    def name(self) -> str:
        return self.info.name

    def has(self, feature: str) -> bool:
        return feature in self.features

    # ---- kernels -------------------------------------------------------------------------

    def kernel(self, file: str, name: str, constants: dict | None = None,
               params: dict | None = None) -> Kernel:
        """The compiled kernel `name` of kernel file `file` (a file name or `family/file.wgsl`;
        shaders/source.py finds it) with override `constants`; `params`: template parameters
        of a template file (shaders/wgsl_expand.py)."""
        constants = dict(constants or {})
        key = (file, name, tuple(sorted(constants.items())),
               None if params is None else tuple(sorted(params.items())))
        cached = self._kernels.get(key)
        if cached is not None:
            return cached
        code = self._compose(source.load_file(file), name, params)
        pipeline = self._compile(file, name, code, constants, "auto")
        kernel = Kernel(self, file, name, constants, pipeline, source.bindings(code))
        self._kernels[key] = kernel
        return kernel

    def kernel_from_source(self, label: str, code: str, name: str,
                           constants: dict | None = None) -> Kernel:
        """Entry point `name` of the WGSL module `code` (written without enable lines: this
        device's go first, emulated features are rewritten), for probes and tests."""
        real = self.features - self.emulated_features
        code = self._emulated(source.enable_lines(real, self.backend.compiler) + code)
        pipeline = self._compile(label, name, code, dict(constants or {}), "auto")
        return Kernel(self, label, name, dict(constants or {}), pipeline, source.bindings(code))

    def _compose(self, wgsl, name: str, params: dict | None = None) -> str:
        """Kernel `name`'s module source for this device (emulated features rewritten)."""
        real = self.features - self.emulated_features
        return self._emulated(source.compose(real, wgsl, name, params=params,
                                             compiler=self.backend.compiler))

    def _emulated(self, code: str) -> str:
        if "subgroup-matrix" in self.emulated_features and \
                sgmat_emulation.uses_subgroup_matrix(code):
            return sgmat_emulation.emulate(code)
        return code

    def _compile(self, file: str, name: str, code: str, constants: dict, layout):
        """The compute pipeline of entry point `name` in `code` (layout "auto" or explicit)."""
        try:
            module = self.raw.create_shader_module(label=f"{file}:{name}", code=code)
            return self.raw.create_compute_pipeline(
                label=f"{file}:{name}", layout=layout,
                compute={"module": module, "entry_point": name, "constants": constants})
        except Exception as exc:
            kind = WorkgroupMemoryError if WORKGROUP_LIMIT.search(str(exc)) else \
                ShaderCompileError
            raise kind(f"{file}:{name} failed to compile on {self.name}: {exc}") from exc

    def kernels_sharing_layout(self, file: str, specs) -> list[Kernel]:
        """Kernels of one file compiled with one explicit bind group layout, so a bind group
        made through any of them binds for all, and a pass can switch between them with
        set_pipeline alone (`Recorder.dispatch_sequence`). `specs`: kernel names or
        (name, constants). Their sections must agree on each binding they both declare
        (the same index, read-only or read_write; the WGSL types may differ, e.g. atomic in
        one kernel and plain in another); the layout holds the union of their bindings."""
        specs = [(s, {}) if isinstance(s, str) else (s[0], dict(s[1])) for s in specs]
        key = ("shared layout", file, tuple((n, tuple(sorted(c.items()))) for n, c in specs))
        cached = self._kernels.get(key)
        if cached is not None:
            return cached
        wgsl = source.load_file(file)
        codes = [self._compose(wgsl, name) for name, _ in specs]
        union: dict = {}
        for (name, _), code in zip(specs, codes):
            for index, binding in source.bindings(code).items():
                other = union.setdefault(index, (name, binding))
                if other[1].writable != binding.writable or other[1].space != binding.space:
                    raise ShaderCompileError(
                        f"{file}: binding {index} is {binding.name} "
                        f"({'read_write' if binding.writable else 'read'}) in {name} but "
                        f"{other[1].name} ({'read_write' if other[1].writable else 'read'}) "
                        f"in {other[0]}; kernels sharing a layout must agree on every binding")
        kinds = {True: wgpu.BufferBindingType.storage,
                 False: wgpu.BufferBindingType.read_only_storage}
        entries = [{"binding": i, "visibility": wgpu.ShaderStage.COMPUTE,
                    "buffer": {"type": (wgpu.BufferBindingType.uniform if b.space == "uniform"
                                        else kinds[b.writable])}}
                   for i, (_, b) in sorted(union.items())]
        try:
            group_layout = self.raw.create_bind_group_layout(label=f"{file} shared",
                                                             entries=entries)
            layout = self.raw.create_pipeline_layout(bind_group_layouts=[group_layout])
        except Exception as exc:
            raise ShaderCompileError(f"{file}: the shared layout of "
                                     f"{', '.join(n for n, _ in specs)} was refused on "
                                     f"{self.name}: {exc}") from exc
        access = {i: b for i, (_, b) in union.items()}
        kernels = []
        for (name, constants), code in zip(specs, codes):
            kernel = Kernel(self, file, name, constants,
                            self._compile(file, name, code, constants, layout), access)
            kernel.layout = group_layout   # the one layout every bind group is made for
            kernels.append(kernel)
        self._kernels[key] = kernels
        return kernels

    # ---- buffers -------------------------------------------------------------------------

    def buffer(self, nbytes: int, dtype=None, shape=None, label: str = "",
               usage=STORAGE) -> Buffer:
        nbytes = max(int(nbytes), 4)
        nbytes = (nbytes + 3) // 4 * 4  # copies and mapping need 4-byte sizes
        limit = self.limits.get("max-buffer-size", 1 << 30)
        if nbytes > limit:
            raise MemoryError(f"buffer {label!r} of {nbytes} bytes exceeds the device's "
                              f"max-buffer-size {limit}")
        raw = self.raw.create_buffer(size=nbytes, usage=usage, label=label)
        buf = Buffer(self, raw, nbytes, np.dtype(dtype) if dtype is not None else None,
                     tuple(shape) if shape is not None else None, label)
        self.memory.add(nbytes)
        buf._untrack = weakref.finalize(buf, self.memory.remove, nbytes)
        return buf

    def empty(self, shape, dtype=np.float32, label: str = "") -> Buffer:
        shape = (shape,) if isinstance(shape, (int, np.integer)) else tuple(shape)
        nbytes = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
        return self.buffer(nbytes, dtype, shape, label)

    def zeros(self, shape, dtype=np.float32, label: str = "") -> Buffer:
        buf = self.empty(shape, dtype, label)  # wgpu zero-initialises new buffers
        return buf

    def upload(self, array, label: str = "", dtype=None) -> Buffer:
        data = np.ascontiguousarray(array if dtype is None else np.asarray(array, dtype=dtype))
        buf = self.buffer(data.nbytes, data.dtype, data.shape, label)
        if data.nbytes:
            self.queue.write_buffer(buf.raw, 0, _padded_bytes(data))
        return buf

    def zero(self, target) -> None:
        """Fill a buffer or sub-range with zero bytes."""
        buf, off = (target.buffer, target.offset) if isinstance(target, BufferView) else (target, 0)
        encoder = self.raw.create_command_encoder()
        encoder.clear_buffer(buf.raw, off, target.nbytes)
        self.queue.submit([encoder.finish()])

    def download(self, target, dtype=None, shape=None) -> np.ndarray:
        """Copy a buffer or sub-range back into a numpy array (one host round trip)."""
        if isinstance(target, BufferView):
            buf, off, size = target.buffer, target.offset, target.nbytes
        else:
            buf, off, size = target, 0, target.nbytes
        dtype = np.dtype(dtype or target.dtype or np.uint8)
        shape = shape or target.shape
        raw = self.queue.read_buffer(buf.raw, off, size)
        array = np.frombuffer(raw, dtype=dtype)
        if shape is not None:
            count = int(np.prod(shape, dtype=np.int64))
            array = array[:count].reshape(shape)
        return array.copy()

    def uniform(self, fmt: str, *values, label: str = "") -> Buffer:
        """A uniform buffer from a `struct` format (`I` u32, `i` i32, `f` f32), 16-byte padded."""
        data = struct.pack("<" + fmt, *values)
        data += b"\0" * (-len(data) % 16)
        buf = self.buffer(len(data), label=label or "uniform",
                          usage=BufferUsage.UNIFORM | BufferUsage.COPY_DST)
        self.queue.write_buffer(buf.raw, 0, data)
        return buf

    def params(self, fmt: str, *values) -> Buffer:
        """Like `uniform`, but cached by value: the same parameters reuse one buffer.

        Training steps dispatch the same kernels with the same shapes every step; caching
        keeps their bind groups stable and avoids a buffer per dispatch. Never write into
        a buffer returned here.
        """
        key = (fmt, values)
        buf = self._params.get(key)
        if buf is None:
            buf = self.uniform(fmt, *values, label=f"params {fmt}")
            self._params[key] = buf
            if len(self._params) > 65536:
                self._params.pop(next(iter(self._params)))
        return buf

    # ---- recording -----------------------------------------------------------------------

    def record(self, label: str = "", timing: bool = False) -> Recorder:
        return Recorder(self, label, timing)

    def submit(self, command_buffer) -> None:
        """Submit a command buffer from `Recorder.finish()`."""
        self.queue.submit([command_buffer])

    def run(self, kernel: Kernel, resources, workgroups, label: str = "") -> None:
        """One dispatch, one submit: handy for tests and one-off work."""
        with self.record(label) as rec:
            rec.dispatch(kernel, resources, workgroups)

    def sync(self) -> None:
        """Block until all submitted work has finished."""
        self.raw._poll_wait()  # wgpuDevicePoll(wait=true): returns once the queue is empty

    def wait_for(self, promise, poll_s: float = 0.0):
        """`promise.sync_wait()`, after polling the device for up to `poll_s` seconds (not on
        a software adapter, whose work runs on the CPU cores a poll would take). A poll sees
        a short call's result sooner than the driver's blocking wait wakes up
        (dev/lone_request/README.md)."""
        if poll_s > 0 and not self.info.is_software:
            deadline = time.perf_counter() + poll_s
            while not self._settled(promise) and time.perf_counter() < deadline:
                pass
        return promise.sync_wait()

    def _settled(self, promise) -> bool:
        """Whether a wgpu-py promise has its result, after one poll that never blocks
        (wgpuDevicePoll(wait=false) / wgpuInstanceProcessEvents fire finished callbacks,
        which set the state)."""
        if promise._state == "pending":
            self.raw._poll()
        return promise._state != "pending"

    def work_done(self):
        """A check that never blocks: `done()` says whether the work submitted before this
        call has finished. For a thread that must keep answering its sockets while the GPU
        works (the service's clock keeper). A 4-byte fence buffer is cleared in a submit of
        its own and mapped; the map completes once that submit, and every one before it, has
        (queue.on_submitted_work_done_async would do, but wgpu-py 0.32's wgpu-native backend
        builds its callback with the wrong C type)."""
        fences = self._fences
        fence = fences.pop() if fences else self.raw.create_buffer(
            size=4, usage=BufferUsage.MAP_READ | BufferUsage.COPY_DST, label="work-done fence")
        encoder = self.raw.create_command_encoder()
        encoder.clear_buffer(fence, 0, 4)
        self.queue.submit([encoder.finish()])
        # READ_NOSYNC: wgpu-py's "READ" on wgpu-native adds an empty submit first (kernels/bpe/
        # scan.py: map_staging says why that is not needed here)
        mode = "READ_NOSYNC" if type(fence).__module__.startswith("wgpu.backends.wgpu_native") \
            else "READ"
        promise, state = fence.map_async(mode, 0, 4), {"back": False}

        def done() -> bool:
            if state["back"]:
                return True
            if not self._settled(promise):
                return False
            promise.sync_wait()               # resolved already: returns at once
            fence.unmap()
            fences.append(fence)
            state["back"] = True
            return True
        return done

    def time_gpu(self, encode, repeats: int = 10, warmup: int = 2,
                 min_warmup_s: float | None = None) -> float:
        """Median GPU seconds of one call of `encode(recorder)`, timed with timestamps.

        Each repetition is its own pass bracketed by timestamps; falls back to wall time
        (after a sync) on devices without timestamp queries. The warm-up runs `encode` at
        least `warmup` times and, after the first run (which may compile pipelines), for at
        least `min_warmup_s` (default 0.25 s on hardware GPUs, 0 on software adapters): with
        only a few warm-up runs the same kernel timed several times slower right after other
        work (shaders/NOTES.md).
        """
        if min_warmup_s is None:
            min_warmup_s = 0.0 if self.info.is_software else 0.25
        start, runs = time.perf_counter(), 0
        while runs < warmup or (time.perf_counter() - start < min_warmup_s and runs < 10_000):
            with self.record() as rec:
                encode(rec)
            runs += 1
            if min_warmup_s:
                self.sync()
                if runs == 1:   # the first run may have compiled pipelines: not GPU time
                    start = time.perf_counter()
        self.sync()
        samples = []
        for _ in range(repeats):
            if self.has("timestamp-query"):
                with self.record(timing=True) as rec:
                    encode(rec)
                samples.append(sum(t for _, t in rec.gpu_times))
            else:
                start = time.perf_counter()
                with self.record() as rec:
                    encode(rec)
                self.sync()
                samples.append(time.perf_counter() - start)
        return float(np.median(samples))


_default_devices: dict = {}


def default_device(adapter: str | int | None = None, backend: str | None = None,
                   robustness: bool = True) -> Device:
    """A process-wide device per adapter, backend choice and robustness (tests and CLIs share
    one; training and the tokenizer ask for robustness=False, see Device), one for both
    robustness values where the backend is not Dawn."""
    key = (adapter if adapter is not None else settings.read("ISTANBUL_ADAPTER") or "",
           backends.requested(backend), bool(robustness))
    if key not in _default_devices:
        # robustness is a Dawn switch: elsewhere the device asked for with the other value
        # serves both (the tokenizer asks for it off, tests and CLIs for it on)
        other = _default_devices.get(key[:2] + (not key[2],))
        _default_devices[key] = other if other is not None and other.backend.name != "dawn" \
            else Device(adapter, backend, robustness)
    return _default_devices[key]


__all__ = ["BindingHazardError", "Buffer", "BufferView", "Device", "Kernel", "NoAdapterError",
           "Recorder", "ShaderCompileError", "default_device", "fold_grid", "views_overlap",
           "AdapterInfo"]
