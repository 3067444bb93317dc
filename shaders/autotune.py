"""The autotuner: times the tunable kernels' configurations at given shapes and stores the
fastest per adapter in the tuning cache (shaders/tuned_cache.py, which the ops read).

    dims = dict(d=768, kv=768, ffn=2048, vocab=50304, tokens=8192, fused_qkv=True)
    attention = dict(B=8, T=1024, H=12, Hkv=12, D=64)
    rows = tune_model(device, dims, attention)     # every matmul and attention kernel of a step
    tuned_cache.save(device, rows_to_entries(rows))

Each candidate runs with GPU timestamps on real buffers of that shape. The shapes are the
caller's: a model's come from its preset (trainer_svc/model/tuning_shapes.py), which
`istanbul kernels tune` and bench/autotune.py pass in.
"""

from __future__ import annotations

import math
import time

import numpy as np

from .kernels.attention import ops as attention
from .kernels.matmul import ops as linear
from .tuned_cache import shape_key


def time_candidates(device, candidates, encode_for, repeats: int = 10, warmup: int = 2,
                    budget_s: float | None = None) -> dict:
    """{candidate: median GPU seconds} for each candidate string; failures map to inf.

    `encode_for(candidate)` returns the `encode(recorder)` function of that configuration
    (compiling its pipelines); a candidate that fails to compile or run is skipped with inf.
    `budget_s` stops early (remaining candidates get inf) so a sweep stays within its time.
    """
    start = time.perf_counter()
    times = {}
    skipped = 0
    for i, cand in enumerate(candidates):
        if budget_s is not None and time.perf_counter() - start > budget_s:
            times[cand] = math.inf
            skipped += 1
            continue
        try:
            encode = encode_for(cand)
            # candidates run back to back on the same buffers: the first one warms the GPU
            # up for a second (after host work a GPU can run matmuls several times slower for
            # a few seconds; shaders/NOTES.md), then the counted warm-up runs suffice
            times[cand] = device.time_gpu(encode, repeats=repeats, warmup=warmup,
                                          min_warmup_s=0.0 if i or device.info.is_software
                                          else 1.0)
        except Exception as exc:  # a config the device refuses is simply not a winner
            times[cand] = math.inf
            print(f"#   {cand}: {type(exc).__name__}: {str(exc).splitlines()[0][:160]}",
                  flush=True)
    if skipped:
        print(f"#   time budget of {budget_s:.0f}s spent: {skipped} candidate(s) not timed",
              flush=True)
    return times


def entry_from_times(times: dict, flops: float = 0.0) -> dict:
    finite = {c: t for c, t in times.items() if math.isfinite(t)}
    if not finite:
        raise RuntimeError("no candidate configuration ran")
    best = min(finite, key=finite.get)
    entry = {"config": best, "us": round(finite[best] * 1e6, 2),
             "candidates": {c: (round(t * 1e6, 2) if math.isfinite(t) else None)
                            for c, t in sorted(times.items(), key=lambda ct: ct[1])}}
    if flops:
        entry["tflops"] = round(flops / finite[best] / 1e12, 3)
    return entry


# ---- matmuls ---------------------------------------------------------------------------------

def linear_shapes(d: int, kv: int, ffn: int, vocab: int, tokens: int,
                  fused_qkv: bool = False) -> list[tuple]:
    """Every (layout, M, N, K, mode) product of one training step of the Llama-style model:
    the q|k|v projection (one product when `fused_qkv`, else q and k/v apart), o, the fused
    gate|up projection, the down projection, the head."""
    qkv = {(tokens, d + 2 * kv, d)} if fused_qkv else {(tokens, d, d), (tokens, kv, d)}
    fwd = qkv | {(tokens, d, d), (tokens, 2 * ffn, d), (tokens, d, ffn), (tokens, vocab, d)}
    shapes = []
    for M, N, K in sorted(fwd):
        shapes.append(("nt", M, N, K, "store"))
        shapes.append(("nn", M, K, N, "store"))          # dX = dY[M,N] @ W[N,K]
        shapes.append(("tn", N, K, M, "accumulate"))     # dW[N,K] += dY^T @ X
    return shapes


def matmul_host_operands(layout, b16, M, N, K, rng) -> tuple[np.ndarray, np.ndarray]:
    """Random host A and B (f16 when `b16`) for one product of this layout."""
    a_shape = (K, M) if layout == "tn" else (M, K)
    b_shape = (N, K) if layout == "nt" else (K, N)
    a = rng.standard_normal(a_shape, dtype=np.float32)
    b = (0.02 * rng.standard_normal(b_shape, dtype=np.float32)).astype(
        np.float16 if b16 else np.float32)
    return a, b


def matmul_operands(device, layout, b16, M, N, K, rng):
    """Random A, B (f16 when `b16`) and a zeroed C for one product of this layout."""
    a, b = matmul_host_operands(layout, b16, M, N, K, rng)
    return device.upload(a), device.upload(b), device.zeros((M, N), np.float32)


CHECK_ROWS = 8          # output rows a tuned winner is checked on (first, last, random)


def check_matmul(device, encode, a: np.ndarray, b: np.ndarray, out, layout: str, M: int,
                 N: int, *, f16_operands: bool, rows=None, rng=None) -> dict:
    """Run `encode` (one product into `out`, which it stores or accumulates into) once on a
    zeroed C and compare output `rows` (default: CHECK_ROWS of them, the first, the last and
    random ones) with numpy in f64: {"ok", "max_abs", "max_rel_to_bound", "rows"}. A row
    fails where |got - want| > 2e-4 (|A| @ |B|) + 1e-6 anywhere: f32 accumulation over K
    stays far inside that, a wrong tile, a lost K slice or split, or a misplaced edge does
    not. `f16_operands`: both operands are rounded to f16 first, as the tensor-core kernels
    stage them; otherwise they are compared as given (an f16 B is exact in f64)."""
    if rows is None:
        rng = rng or np.random.default_rng(1)
        rows = np.unique(np.concatenate([[0, M - 1], rng.integers(0, M, CHECK_ROWS - 2)]))
    device.zero(out)
    with device.record() as rec:
        encode(rec)
    got = np.stack([device.download(out.elements(int(r) * N, N)) for r in rows])

    def operand(x):
        x = np.asarray(x, dtype=np.float64)
        return np.clip(x, -65504, 65504).astype(np.float16).astype(np.float64) \
            if f16_operands else x
    a_rows = operand(a[:, rows].T if layout == "tn" else a[rows])    # [rows, K]
    b_kn = operand(b.T if layout == "nt" else b)                     # [K, N]
    want = a_rows @ b_kn
    bound = 2e-4 * (np.abs(a_rows) @ np.abs(b_kn)) + 1e-6
    err = np.abs(got.astype(np.float64) - want)
    return {"ok": bool(np.all(err <= bound)), "max_abs": float(err.max()),
            "max_rel_to_bound": float((err / bound).max()), "rows": [int(r) for r in rows]}


def tune_matmul(device, key: str, M: int, N: int, K: int, *, mode: str = "store",
                wide: bool = False, budget_s: float | None = None, rng=None) -> dict:
    """Time every candidate configuration of matmul kernel `key` (nt, nn, tn, nt_w16,
    nn_w16, nt_h16, and the tensor-core nt_w16_sgmat, nn_w16_sgmat, tn_sgmat) at (M, N, K);
    the cache entry of the winner (plus every time)."""
    layout = key[:2]
    sgmat = key.endswith("_sgmat")
    base = key.removesuffix("_sgmat")
    b16 = base.endswith(("w16", "h16"))
    f16_math = base.endswith("h16")
    rng = rng or np.random.default_rng(0)
    a_host, b_host = matmul_host_operands(layout, b16, M, N, K, rng)
    a, b, out = device.upload(a_host), device.upload(b_host), device.zeros((M, N), np.float32)
    flops = 2.0 * M * N * K
    guess_s = flops / (2e11 if device.info.is_software else 1e13)
    repeats = int(min(10, max(3, 0.1 / max(guess_s, 1e-9))))

    def encode_for(text):
        cfg = text if sgmat else linear.MatmulConfig.parse(text)   # "sg..." pins the kernel

        def encode(rec):
            linear.matmul(rec, a, b, out, M, N, K, layout=layout, f16_math=f16_math,
                          accumulate=mode == "accumulate", config=cfg)
        return encode

    if sgmat:
        default = str(linear.default_sgmat_config(device, layout, M, N, K))
        offered = linear.sgmat_candidate_configs(device, layout, M, N, K, wide=wide)
    else:
        default = str(linear.default_config(device, key, M, N, K))
        offered = linear.candidate_configs(device, key, M, N, K, wide=wide)
    # the default is always timed
    candidates = [default] + [c for c in map(str, offered) if c != default]
    times = time_candidates(device, candidates, encode_for, repeats=repeats, warmup=1,
                            budget_s=budget_s)
    failed = {}
    if not f16_math:   # f16 arithmetic (the _h16 kernels) is outside check_matmul's bound
        failed = _drop_wrong_winners(device, times, encode_for, a_host, b_host, out, layout,
                                     M, N, f16_operands=sgmat)
    for buf in (a, b, out):
        buf.destroy()
    entry = entry_from_times(times, flops)
    if failed:
        entry["failed_check"] = failed
    entry["default"] = default
    dflt = times.get(default)
    if dflt is not None and math.isfinite(dflt):
        entry["default_us"] = round(dflt * 1e6, 2)
    return entry


def _drop_wrong_winners(device, times: dict, encode_for, a, b, out, layout: str, M: int,
                        N: int, *, f16_operands: bool) -> dict:
    """Check the fastest candidate against numpy (check_matmul); one that computes a wrong
    product is timed as inf and the next fastest is checked, until one passes or none is
    left. {config: check result} of the ones dropped (each also printed)."""
    failed = {}
    while True:
        finite = {c: t for c, t in times.items() if math.isfinite(t)}
        if not finite:
            return failed
        best = min(finite, key=finite.get)
        result = check_matmul(device, encode_for(best), a, b, out, layout, M, N,
                              f16_operands=f16_operands)
        if result["ok"]:
            return failed
        print(f"#   {best}: wrong product (max error {result['max_rel_to_bound']:.3g}x the "
              "bound): not a winner", flush=True)
        failed[best] = result
        times[best] = math.inf


# ---- attention ------------------------------------------------------------------------------

def tune_attention(device, kernel: str, B: int, T: int, H: int, Hkv: int, D: int, *,
                   budget_s: float | None = None, rng=None) -> dict:
    """Time every tile shape of the tiled attention kernel `kernel` (forward, dq, dkv) at
    this shape (see ops.attention.candidate_configs); the cache entry of the winner. dq and
    dkv are timed inside the whole backward (prep + dq + dkv) with the other kernel at its default (or
    tuned) config."""
    rng = rng or np.random.default_rng(0)
    q = device.upload(rng.standard_normal((B, T, H, D), dtype=np.float32))
    k = device.upload(rng.standard_normal((B, T, Hkv, D), dtype=np.float32))
    v = device.upload(rng.standard_normal((B, T, Hkv, D), dtype=np.float32))
    do = device.upload(rng.standard_normal((B, T, H, D), dtype=np.float32))
    o, lse = device.empty((B, T, H, D)), device.empty((B, H, T))
    dq, dk, dv = device.empty((B, T, H, D)), device.empty((B, T, Hkv, D)), \
        device.empty((B, T, Hkv, D))
    with device.record() as rec:
        attention.forward(rec, q, k, v, o, lse, B, T, H, Hkv, D)
    defaults = {}
    for name in ("forward", "dq", "dkv"):
        chosen = attention.choose_config(device, name, T, D)
        defaults[name] = attention.format_config(*chosen) if chosen else None

    def encode_for(text):
        if kernel == "forward":
            return lambda rec: attention.forward(rec, q, k, v, o, lse, B, T, H, Hkv, D,
                                                 config=text)
        pins = {"config_dq": defaults["dq"], "config_dkv": defaults["dkv"]}
        pins["config_" + kernel] = text
        return lambda rec: attention.backward(rec, q, k, v, o, do, lse, dq, dk, dv, B, T, H,
                                              Hkv, D, **pins)

    candidates = attention.candidate_configs(device, kernel, D)
    if defaults[kernel] in candidates:   # the default is always timed
        candidates.remove(defaults[kernel])
        candidates.insert(0, defaults[kernel])
    times = time_candidates(device, candidates, encode_for, repeats=5, warmup=1,
                            budget_s=budget_s)
    for buf in (q, k, v, do, o, lse, dq, dk, dv):
        buf.destroy()
    causal = B * H * T * T * D          # multiply-adds of one causal T x T x D product, x2
    flops = {"forward": 2.0, "dq": 9.0, "dkv": 9.0}[kernel] * causal
    entry = entry_from_times(times, flops)
    entry["default"] = defaults[kernel]
    dflt = times.get(defaults[kernel]) if defaults[kernel] else None
    if dflt is not None and math.isfinite(dflt):
        entry["default_us"] = round(dflt * 1e6, 2)
    return entry


def tune_attention_width(device, kernel: str, B: int, T: int, H: int, Hkv: int, D: int, *,
                         budget_s: float | None = None, rng=None) -> dict:
    """Time the widths of the tensor-core backward kernel `kernel` ("dq_sgmat" or
    "dkv_sgmat": 64 or 128 rows a workgroup, ops.attention.wide_candidates) as the trainer
    runs it (f16 head-major q, k, v; the whole backward, the other kernel at its current
    width); the cache entry of the winner. Every width computes the same bits."""
    name = kernel.removesuffix("_sgmat")
    rng = rng or np.random.default_rng(0)
    strides = {"q_stride": attention.head_major(T, H, D),
               "kv_stride": attention.head_major(T, Hkv, D)}
    q = device.upload(rng.standard_normal((B, H, T, D), dtype=np.float32), dtype=np.float16)
    k, v = (device.upload(rng.standard_normal((B, Hkv, T, D), dtype=np.float32),
                          dtype=np.float16) for _ in range(2))
    do = device.upload(rng.standard_normal((B, T, H, D), dtype=np.float32))
    o, lse = device.empty((B, T, H, D)), device.empty((B, H, T))
    dq, dk, dv = device.empty((B, H, T, D)), device.empty((B, Hkv, T, D)), \
        device.empty((B, Hkv, T, D))
    with device.record() as rec:
        attention.forward(rec, q, k, v, o, lse, B, T, H, Hkv, D, config="sgmat", **strides)
    current = attention.chosen_widths(device, T, D, {})
    default = attention.default_wide(name)

    def encode_for(width):
        knobs = {**current, name: width}
        return lambda rec: attention.backward(rec, q, k, v, o, do, lse, dq, dk, dv, B, T, H,
                                              Hkv, D, tensor_cores=True, sgmat_tiles=knobs,
                                              **strides)

    candidates = attention.wide_candidates(device, D, name)
    if default in candidates:   # the default is always timed, first
        candidates.remove(default)
        candidates.insert(0, default)
    times = time_candidates(device, candidates, encode_for, repeats=5, warmup=1,
                            budget_s=budget_s)
    for buf in (q, k, v, do, o, lse, dq, dk, dv):
        buf.destroy()
    entry = entry_from_times(times, 9.0 * B * H * T * T * D)
    entry["default"] = default
    dflt = times.get(default)
    if dflt is not None and math.isfinite(dflt):
        entry["default_us"] = round(dflt * 1e6, 2)
    return entry


def attention_keys(device) -> list[str]:
    """The attention kernel keys worth tuning here: the f32 tiled kernels' tiles, and where
    f16 subgroup matrices run the tensor-core backward's widths."""
    keys = ["forward", "dq", "dkv"]
    if linear.has_tensor_cores(device):
        keys += list(attention.SGMAT2_WIDE_KEYS.values())
    return keys


def matmul_keys(device) -> list[str]:
    """The matmul kernel keys worth tuning on this device (the f16 ones need shader-f16 for
    the f16-math kernel; f16 weights with f32 math run anywhere; the tensor-core keys,
    `*_sgmat`, need f16 subgroup matrices: the products the f16 training step runs)."""
    keys = ["nt", "nn", "tn", "nt_w16", "nn_w16"]
    if device.has("shader-f16"):
        keys.append("nt_h16")
    if linear.has_tensor_cores(device):
        keys += linear.SGMAT_KEYS
    return keys


def tune_model(device, dims: dict, attention_shape: dict | None = None, keys=None,
               wide: bool = False, budget_s: float | None = None, log=print,
               total_s: float | None = None, matmul: bool = True) -> list[dict]:
    """Tune every matmul of `linear_shapes(**dims)` (unless `matmul` is False) and the
    attention kernels at `attention_shape` (B, T, H, Hkv, D; None: no attention);
    rows of (op, key, shape, entry). `budget_s` caps the timing of one shape's candidates,
    `total_s` the whole run (each shape then gets a fair share of what is left)."""
    keys = list(keys or matmul_keys(device))
    jobs = [("matmul", key, (layout, M, N, K, mode))
            for layout, M, N, K, mode in linear_shapes(**dims)
            for key in keys if key[:2] == layout] if matmul else []
    if attention_shape is not None:
        jobs += [("attention", kernel, None) for kernel in attention_keys(device)]
    run_start = time.perf_counter()
    rows = []
    for i, (op, key, spec) in enumerate(jobs):
        budget = budget_s
        if total_s is not None:
            share = max(total_s - (time.perf_counter() - run_start), 1.0) / (len(jobs) - i)
            budget = share if budget is None else min(budget, share)
        start = time.perf_counter()
        if op == "matmul":
            layout, M, N, K, mode = spec
            entry = tune_matmul(device, key, M, N, K, mode=mode, wide=wide, budget_s=budget)
            rows.append({"op": "matmul", "key": key, "shape": (M, N, K), "entry": entry})
            log(f"# matmul {key:<7} {shape_key((M, N, K)):<18} best {entry['config']:<22} "
                f"{entry['us']:>10.1f} us {entry.get('tflops', 0):7.2f} TFLOP/s  (default "
                f"{entry['default']} {entry.get('default_us', float('nan')):.1f} us; "
                f"{len(entry['candidates'])} candidates, {time.perf_counter() - start:.1f}s)")
        else:
            a = attention_shape
            tune = tune_attention_width if key.endswith("_sgmat") else tune_attention
            entry = tune(device, key, **a, budget_s=budget)
            rows.append({"op": "attention", "key": key, "shape": (a["T"], a["D"]),
                         "entry": entry})
            log(f"# attention {key:<7} T={a['T']} D={a['D']}: best {entry['config']} "
                f"{entry['us']:.1f} us (default {entry['default']} "
                f"{entry.get('default_us', float('nan')):.1f} us; "
                f"{time.perf_counter() - start:.1f}s)")
    return rows


def rows_to_entries(rows) -> dict:
    return {f"{r['op']}/{r['key']}/{shape_key(r['shape'])}": r["entry"] for r in rows}


def markdown_table(device, rows) -> str:
    lines = [f"# autotune — {device.info.name} ({device.info.backend}, {device.info.driver})",
             "", "| op | kernel | shape (M x N x K) | best config | us | TFLOP/s | default | "
             "default us | gain | runner-up |", "|---|---|---|---|---:|---:|---|---:|---:|---|"]
    for r in rows:
        e = r["entry"]
        ranked = [c for c, t in e["candidates"].items() if t is not None]
        second = f"{ranked[1]} ({e['candidates'][ranked[1]]:.1f})" if len(ranked) > 1 else ""
        gain = (e.get("default_us") or 0) / e["us"] if e.get("default_us") else float("nan")
        lines.append(f"| {r['op']} | {r['key']} | {shape_key(r['shape'])} | {e['config']} | "
                     f"{e['us']:.1f} | {e.get('tflops', 0):.2f} | {e.get('default', '')} | "
                     f"{e.get('default_us', float('nan')):.1f} | {gain:.2f}x | {second} |")
    return "\n".join(lines) + "\n"
