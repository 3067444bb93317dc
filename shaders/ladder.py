"""The verification ladder (SPEC §5): every kernel climbs the same rungs.

    compile  -> run (shapes, finite) -> correct (vs a slow numpy reference, per variant)
             -> grad (backward kernels) -> bench (GPU timestamps) -> roofline fraction

A kernel joins the ladder by registering a `KernelCase` in its family's
`shaders/kernels/<family>/cases.py` (`load_cases()` imports every family's):

    register(KernelCase(
        name="scale", family="elementwise", precision="f32",
        kernels=[("infra.wgsl", "scale")],
        inputs=lambda rng, variant: {"x": ..., "alpha": 1.5},   # variant: "random", "bench", ...
        launch=scale_launch,          # (device, inputs) -> Launch(encode, read)
        reference=lambda inp: {"y": inp["alpha"] * inp["x"]},
        bytes=lambda inp: 8 * inp["x"].size))

`Launch.encode(recorder)` records the kernel's dispatches (what the benchmark times) and
`Launch.read()` downloads the outputs by the same names as the reference's. A launch that
runs a class submitting its own work (GpuEncoder.encode_docs) also gives `gpu_seconds`.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import math
import pkgutil
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

from . import metrics as M
from .engine import Device, Recorder, WorkgroupMemoryError


@dataclass
class Launch:
    encode: Callable[[Recorder], None]
    read: Callable[[], dict]
    # Set by launches that submit their own work (the tokenizer's public entry points read
    # back between dispatches, so they cannot record into one pass): the GPU seconds of the
    # last `encode`, which the bench rung then times instead of the (empty) recording.
    gpu_seconds: Callable[[], float] | None = None


@dataclass
class KernelCase:
    name: str
    family: str
    precision: str  # key of metrics.THRESHOLDS
    # [(file, kernel[, constants[, template params]])] compiled by the compile rung, or a
    # function of the device giving that list
    kernels: list | Callable[[Device], list]
    inputs: Callable[[np.random.Generator, str], dict]
    launch: Callable[[Device, dict], Launch]
    reference: Callable[[dict], dict]
    variants: tuple = ("random",)
    bench_variant: str = "bench"
    # variant benchmarked on software adapters (lavapipe) when the full-sized one is too big
    bench_variant_software: str | None = None
    flops: Callable[[dict], float] = lambda inputs: 0.0
    bytes: Callable[[dict], float] = lambda inputs: 0.0
    grad: Callable[[Device, np.random.Generator], dict] | None = None
    requires: tuple = ()  # device features the kernel needs
    thresholds: dict = field(default_factory=dict)  # overrides of the precision's limits
    # which ceiling the roofline uses: f32 or f16 (FMA), subgroup-matrix (tensor cores)
    bench_precision: str = "f32"
    description: str = ""


_REGISTRY: dict[str, KernelCase] = {}


def register(case: KernelCase) -> KernelCase:
    if case.name in _REGISTRY:
        raise ValueError(f"kernel case {case.name!r} registered twice")
    if case.precision not in M.THRESHOLDS:
        raise ValueError(f"{case.name}: unknown precision {case.precision!r}")
    _REGISTRY[case.name] = case
    return case


def case_modules() -> list[str]:
    """The modules that register ladder cases: every family folder's `cases.py` (and
    `*_cases.py`, e.g. attention's decode_cases.py)."""
    from . import kernels
    names = []
    for family in pkgutil.iter_modules(kernels.__path__):
        if not family.ispkg:
            continue
        folder = f"{kernels.__name__}.{family.name}"
        path = [str(Path(kernels.__path__[0]) / family.name)]
        names += [f"{folder}.{m.name}" for m in sorted(pkgutil.iter_modules(path),
                                                       key=lambda m: m.name)
                  if m.name == "cases" or m.name.endswith("_cases")]
    return names


def load_cases() -> dict[str, KernelCase]:
    """Import every case module (each registers its kernels) and return all cases."""
    for name in case_modules():
        before = set(_REGISTRY)
        importlib.import_module(name)
        family = name.split(".")[-2]
        for case_name in set(_REGISTRY) - before:
            if family and _REGISTRY[case_name].family != family:
                raise ValueError(f"{name}: case {case_name!r} says family "
                                 f"{_REGISTRY[case_name].family!r}; a family folder's cases "
                                 f"belong to that family ({family!r})")
    return dict(_REGISTRY)


def select(names: list[str] | None) -> list[KernelCase]:
    """Cases by exact name, family name, or name prefix (all when `names` is empty)."""
    cases = load_cases()
    if not names:
        return list(cases.values())
    chosen = []
    for want in names:
        hit = [c for c in cases.values()
               if c.name == want or c.family == want or c.name.startswith(want)]
        if not hit:
            raise KeyError(f"no kernel case matches {want!r}; known: {', '.join(sorted(cases))}")
        chosen += [c for c in hit if c not in chosen]
    return chosen


@dataclass
class RungResult:
    kernel: str
    rung: str
    ok: bool | None  # None: skipped
    detail: str = ""
    metrics: dict = field(default_factory=dict)

    def line(self) -> str:
        status = {True: "ok", False: "FAIL", None: "skip"}[self.ok]
        return f"{self.kernel:<34} {self.rung:<8} {status:<5} {self.detail}"

    def as_json(self) -> dict:
        clean = {k: (v if not (isinstance(v, float) and not math.isfinite(v)) else str(v))
                 for k, v in self.metrics.items()}
        return {"kernel": self.kernel, "rung": self.rung, "ok": self.ok, "detail": self.detail,
                "metrics": clean}


AUTOGRAD_MISSING = ("skipped: the autograd reference needs PyTorch, which is not installed "
                    "(pip install 'istanbul[check]')")


def _missing(device: Device, case: KernelCase) -> list[str]:
    return [f for f in case.requires if not device.has(f)]


def kernel_specs(case: KernelCase, device: Device | None) -> list:
    """The case's kernels as compiled on `device` (None: as on a GPU that has every feature)."""
    return case.kernels(device) if callable(case.kernels) else case.kernels


def check_case(device: Device, case: KernelCase, seed: int = 0,
               max_variants: int | None = None) -> list[RungResult]:
    """Run the compile, run, correct and grad rungs of one case (on its first
    `max_variants` input variants; default all)."""
    results = []
    missing = _missing(device, case)
    if missing:
        return [RungResult(case.name, "compile", None, f"device lacks {', '.join(missing)}")]

    # On a device that emulates subgroup matrices (a CPU), a kernel or variant that needs more
    # workgroup memory than the device offers is skipped, not failed: the limit is the test
    # device's (lavapipe's 32 KiB), a hardware GPU checks every one.
    emulated = bool(getattr(device, "emulated_features", ()))
    start = time.perf_counter()
    too_big = []
    specs = kernel_specs(case, device)
    try:
        for spec in specs:
            file, kernel, constants, params = (tuple(spec) + ({}, None)[len(spec) - 2:])[:4]
            try:
                device.kernel(file, kernel, constants, params)
            except WorkgroupMemoryError:
                if not emulated:
                    raise
                too_big.append(kernel)
        note = f"; skipped (workgroup memory): {', '.join(too_big)}" if too_big else ""
        results.append(RungResult(case.name, "compile", True,
                                  f"{len(specs) - len(too_big)} pipeline(s) in "
                                  f"{time.perf_counter() - start:.2f}s{note}"))
    except Exception as exc:
        results.append(RungResult(case.name, "compile", False, _short(exc)))
        return results

    correct_ok, details, worst = True, [], {}
    variants = case.variants[:max_variants] if max_variants else case.variants
    skipped, checked = [], 0
    for i, variant in enumerate(variants):
        rng = np.random.default_rng(seed + i)
        try:
            inputs = case.inputs(rng, variant)
            launch = case.launch(device, inputs)
            with device.record(f"{case.name}:{variant}") as rec:
                launch.encode(rec)
            outputs = launch.read()
            expected = case.reference(inputs)
        except WorkgroupMemoryError as exc:
            if not emulated:
                results.append(RungResult(case.name, "run", False, f"{variant}: {_short(exc)}"))
                return results
            skipped.append(variant)
            continue
        except Exception as exc:
            results.append(RungResult(case.name, "run", False, f"{variant}: {_short(exc)}"))
            traceback.print_exc()
            return results
        checked += 1
        if checked == 1:
            problems = []
            for key, ref in expected.items():
                out = np.asarray(outputs.get(key))
                if key not in outputs:
                    problems.append(f"missing output {key}")
                elif out.shape != np.asarray(ref).shape:
                    problems.append(f"{key} shape {out.shape} != {np.asarray(ref).shape}")
            finite = all(np.isfinite(np.asarray(v, dtype=np.float64)).all()
                         or not np.isfinite(np.asarray(expected[k], dtype=np.float64)).all()
                         for k, v in outputs.items() if k in expected)
            shapes = " ".join(f"{k}{tuple(np.asarray(v).shape)}" for k, v in outputs.items())
            run_ok = not problems and finite
            results.append(RungResult(case.name, "run", run_ok,
                                      "; ".join(problems) or f"{shapes} finite={finite}"))
            if not run_ok:
                return results
        for key, ref in expected.items():
            out, ref = np.asarray(outputs.get(key)), np.asarray(ref)
            if key not in outputs or out.shape != ref.shape:
                correct_ok = False
                details.append(f"{variant}/{key}: shape {out.shape} != reference {ref.shape}")
                continue
            m = M.compare(out, ref)
            ok, why = M.passes(m, case.precision, case.thresholds)
            if not ok:
                correct_ok = False
                details.append(f"{variant}/{key}: {why}")
            if not worst or m.get("psnr", math.inf) < worst.get("psnr", math.inf) or \
                    m.get("max_abs", 0) > worst.get("max_abs", 0):
                worst = m
    if not checked:
        why = f"every variant ({', '.join(skipped)}) needs more workgroup memory than " \
              f"{device.name} offers (subgroup matrices emulated)"
        return results + [RungResult(case.name, "run", None, why),
                          RungResult(case.name, "correct", None, why)]
    summary = "; ".join(details) if details else \
        f"{checked} variant(s) [{case.precision}] {M.format_metrics(worst)}"
    if skipped:
        summary += f"; skipped (workgroup memory): {', '.join(skipped)}"
    results.append(RungResult(case.name, "correct", correct_ok, summary, worst))

    if case.grad is None:
        results.append(RungResult(case.name, "grad", None, "no backward"))
    else:
        try:
            g = case.grad(device, np.random.default_rng(seed + 1000))
            results.append(RungResult(case.name, "grad", bool(g.get("ok")), g.get("detail", ""),
                                      {k: v for k, v in g.items() if k not in ("ok", "detail")}))
        except Exception as exc:
            # the autograd reference is an optional extra: a plain install skips, never fails
            torch_missing = isinstance(exc, ModuleNotFoundError) and exc.name == "torch"
            results.append(RungResult(case.name, "grad", None, AUTOGRAD_MISSING) if torch_missing
                           else RungResult(case.name, "grad", False, _short(exc)))
    return results


def _short(exc: Exception) -> str:
    text = f"{type(exc).__name__}: {exc}"
    return text if len(text) < 400 else text[:400] + "..."


# ---- the roofline ----------------------------------------------------------------------------

@dataclass
class Roofline:
    copy_gbs: float  # read+write bytes per second / 1e9
    fma_tflops: dict  # {"f32": , "vec4f32": , "vec2f16": , "vec4f16": , "*_chains4": }
    # subgroup-matrix (tensor-core) ceilings by configuration, e.g. {"f16_f32_16x16x16": }
    matrix_tflops: dict = field(default_factory=dict)

    def peak(self, precision: str) -> float:
        if precision == "subgroup-matrix":
            return max(self.matrix_tflops.values(), default=0.0) or self.peak("f16")
        if precision == "f16":
            return max((v for k, v in self.fma_tflops.items() if "f16" in k), default=0.0) or \
                self.peak("f32")
        return max((v for k, v in self.fma_tflops.items() if "f32" in k), default=0.0)

    def fraction(self, gbs: float, tflops: float, precision: str) -> float:
        """Achieved / attainable, where attainable = min(peak, intensity * bandwidth)."""
        if tflops > 0 and gbs > 0:
            intensity = tflops * 1e12 / (gbs * 1e9)
            attainable = min(self.peak(precision), intensity * self.copy_gbs * 1e9 / 1e12)
            return tflops / attainable if attainable else 0.0
        if tflops > 0:
            return tflops / self.peak(precision)
        return gbs / self.copy_gbs if self.copy_gbs else 0.0


def measure_roofline(device: Device) -> Roofline:
    software = device.info.is_software
    # copy bandwidth: vec4 copy of a buffer well above the last-level cache
    max_binding = device.limits.get("max-storage-buffer-binding-size", 128 << 20)
    nbytes = min(16 << 20 if software else 1 << 30, max_binding)
    n4 = nbytes // 16
    src = device.empty(n4 * 4, np.float32)
    dst = device.empty(n4 * 4, np.float32)
    params = device.uniform("IIfI", n4, 0, 0.0, 0)
    kern = device.kernel("infra.wgsl", "copy_vec4")
    seconds = device.time_gpu(lambda rec: rec.dispatch(kern, [src, dst, params], -(-n4 // 256)),
                              repeats=5 if software else 20)
    copy_gbs = 2 * n4 * 16 / seconds / 1e9
    src.destroy(), dst.destroy()

    fma = {}
    groups = 64 if software else 132 * 64
    iters = 64 if software else 4096
    repeats = 3 if software else 10
    out = device.empty(groups * 256, np.float32)
    p = device.uniform("IfII", iters, 1.0, 0, 0)
    # (kernel, vector width, independent chains, bindings); the ceiling is the best of them
    probes = [("f32", 1, 8, [out, p]), ("vec4f32", 4, 8, [out, p]), ("vec2f16", 2, 8, [out, p]),
              ("vec4f16", 4, 8, [out, p]), ("vec4f32_chains4", 4, 4, [out]),
              ("vec4f16_chains4", 4, 4, [out])]
    for name, width, chains, resources in probes:
        if "f16" in name and not device.has("shader-f16"):
            continue
        constants = {"ITERS": iters} if "chains" in name else {}
        k = device.kernel("roofline.wgsl", f"fma_{name}", constants)
        seconds = device.time_gpu(lambda rec: rec.dispatch(k, resources, groups),
                                  repeats=repeats)
        fma[name] = groups * 256 * iters * chains * 2 * width / seconds / 1e12
    return Roofline(copy_gbs=copy_gbs, fma_tflops=fma,
                    matrix_tflops=measure_subgroup_matrix(device, repeats))


SGMAT_CEILINGS = {  # roofline_sgmat.wgsl kernel -> the configuration it needs
    "sgmat_f16_f32_16x16x16": {"component_type": "f16", "result_component_type": "f32",
                               "m": 16, "n": 16, "k": 16},
}


def measure_subgroup_matrix(device: Device, repeats: int = 10) -> dict:
    """Subgroup-matrix ceilings in TFLOP/s, {config name: TFLOP/s}, for the configurations
    the device offers that roofline_sgmat.wgsl has a kernel for ({} without the feature)."""
    found = {}
    for kernel, want in SGMAT_CEILINGS.items():
        config = next((c for c in device.subgroup_matrix_configs
                       if all(c.get(key) == value for key, value in want.items())), None)
        if config is None:
            continue
        groups, iters, invocations = 132 * 32, 1024, 128
        # the largest subgroup size gives the fewest subgroups: never an overstated ceiling
        subgroups = max(1, invocations // int(config.get("max_subgroup_size") or 32))
        out = device.empty(invocations * 8 * 256, np.float32)
        k = device.kernel("roofline_sgmat.wgsl", kernel, {"ITERS": iters})
        seconds = device.time_gpu(lambda rec: rec.dispatch(k, [out], groups), repeats=repeats)
        flops = groups * subgroups * iters * 8 * 2 * want["m"] * want["n"] * want["k"]
        found[kernel.removeprefix("sgmat_")] = flops / seconds / 1e12
        out.destroy()
    return found


def bench_case(device: Device, case: KernelCase, roof: Roofline, seed: int = 0,
               repeats: int | None = None) -> dict:
    missing = _missing(device, case)
    if missing:
        return {"kernel": case.name, "skipped": f"device lacks {', '.join(missing)}"}
    software = device.info.is_software
    variant = case.bench_variant_software if software and case.bench_variant_software \
        else case.bench_variant
    inputs = case.inputs(np.random.default_rng(seed), variant)
    launch = case.launch(device, inputs)
    if repeats is None:
        repeats = 3 if software else 20
    warmup = 1 if software else min(3, repeats)
    if launch.gpu_seconds is None:
        seconds = device.time_gpu(launch.encode, repeats=max(1, repeats), warmup=warmup)
    else:
        seconds = _time_self_submitting(device, launch, max(1, repeats), warmup)
    nbytes, flops = float(case.bytes(inputs)), float(case.flops(inputs))
    gbs = nbytes / seconds / 1e9 if seconds > 0 else 0.0
    tflops = flops / seconds / 1e12 if seconds > 0 else 0.0
    return {"kernel": case.name, "family": case.family, "precision": case.precision,
            "variant": variant, "us": seconds * 1e6, "bytes": nbytes, "flops": flops, "gbs": gbs, "tflops": tflops,
            "roofline": roof.fraction(gbs, tflops, case.bench_precision),
            "bound": "compute" if flops and (flops / max(nbytes, 1)) >
            (roof.peak(case.bench_precision) * 1e12 / (roof.copy_gbs * 1e9)) else "memory"}


def _time_self_submitting(device: Device, launch: Launch, repeats: int, warmup: int) -> float:
    """Median GPU seconds of a launch that submits its own work (wall time where the device
    has no timestamps, so its profile stays empty)."""
    samples = []
    for i in range(warmup + repeats):
        start = time.perf_counter()
        with device.record() as rec:
            launch.encode(rec)
        device.sync()
        wall = time.perf_counter() - start
        if i >= warmup:
            samples.append(launch.gpu_seconds() or wall)
    return float(np.median(samples))


def device_record(device: Device) -> dict:
    return {"adapter": device.info.name, "type": device.info.adapter_type,
            "webgpu": device.info.webgpu, "compiler": device.backend.compiler,
            "backend": device.info.backend, "driver": device.info.driver,
            "features": sorted(device.features),
            "subgroup_matrix_configs": list(device.subgroup_matrix_configs)}


def write_json(path: str, payload: dict) -> None:
    with open(path, "w", encoding="utf-8") as fh:
        json.dump(payload, fh, indent=2, default=str)
        fh.write("\n")
