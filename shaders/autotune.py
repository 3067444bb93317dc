"""Per-adapter tuning cache: which kernel configuration won for a (kernel, shape).

Ops with tunable kernels (matmuls, attention) ask `lookup(device, op, key, shape)` for a
configuration string before falling back to their own per-device-class default. The tuner
(`tune(device, op, key, shape, candidates, encode_for)`, driven by `bench/autotune.py` or
`istanbul kernels tune`) times every candidate with GPU timestamps on real buffers of that
shape and stores the fastest.

Where the cache lives, per adapter (`adapter_key`: the adapter's name and backend, e.g.
`nvidia-h200-vulkan.json`):

    $ISTANBUL_AUTOTUNE_DIR/<key>.json      when the variable is set (read and written), else
    ~/.cache/istanbul/autotune/<key>.json  (read and written),
    shaders/tuned/<key>.json               the committed results (read only, consulted last)

An entry is {"config": "...", "us": best time, "candidates": {config: us, ...}}. A shape
that was not tuned takes the entry of the nearest tuned shape of the same op and key (by
log-distance of the dimensions, within a factor of 4 per dimension), else the op's default.
`ISTANBUL_AUTOTUNE=0` ignores every cache (defaults only).
"""

from __future__ import annotations

import json
import math
import os
import re
import time
from pathlib import Path

SHIPPED_DIR = Path(__file__).resolve().parent / "tuned"
NEAREST_FACTOR = 4.0
_memory: dict = {}
_answers: dict = {}   # (cache files, op, key, shape) -> config: ops call lookup every step


def adapter_key(device) -> str:
    """A file-name-safe key of the adapter (name and backend; the driver is recorded inside)."""
    text = f"{device.info.name}-{device.info.backend}".lower()
    return re.sub(r"[^a-z0-9]+", "-", text).strip("-") or "unknown-adapter"


def user_dir() -> Path:
    env = os.environ.get("ISTANBUL_AUTOTUNE_DIR")
    if env:
        return Path(env).expanduser()
    return Path.home() / ".cache" / "istanbul" / "autotune"


def cache_paths(device) -> list[Path]:
    """Files consulted for this adapter, first match wins: the user's cache, then shipped."""
    name = adapter_key(device) + ".json"
    return [user_dir() / name, SHIPPED_DIR / name]


def shape_key(shape) -> str:
    return "x".join(str(int(s)) for s in shape)


def _read(path: Path) -> dict:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    entries = data.get("entries") if isinstance(data, dict) else None
    return entries if isinstance(entries, dict) else {}


def _tables(device) -> list[dict]:
    paths = tuple(cache_paths(device))
    if paths not in _memory:
        _memory[paths] = [_read(p) for p in paths]
    return _memory[paths]


def forget(device=None) -> None:
    """Drop the in-memory copy of the cache files (after writing them, or in tests)."""
    _memory.clear()
    _answers.clear()


def lookup(device, op: str, key: str, shape) -> str | None:
    """The tuned configuration string for (op, key, shape), or None (use the default)."""
    if os.environ.get("ISTANBUL_AUTOTUNE", "1") == "0":
        return None
    memo = (tuple(cache_paths(device)), op, key, tuple(int(s) for s in shape))
    if memo not in _answers:
        _answers[memo] = _lookup(device, op, key, shape)
    return _answers[memo]


def _lookup(device, op: str, key: str, shape) -> str | None:
    prefix = f"{op}/{key}/"
    exact = prefix + shape_key(shape)
    for table in _tables(device):
        entry = table.get(exact)
        if isinstance(entry, dict) and isinstance(entry.get("config"), str):
            return entry["config"]
    best, best_dist = None, math.inf
    want = [max(int(s), 1) for s in shape]
    for table in _tables(device):
        for name, entry in table.items():
            if not name.startswith(prefix) or not isinstance(entry, dict):
                continue
            try:
                dims = [max(int(s), 1) for s in name[len(prefix):].split("x")]
            except ValueError:
                continue
            if len(dims) != len(want):
                continue
            gaps = [abs(math.log(a / b)) for a, b in zip(dims, want)]
            if max(gaps) > math.log(NEAREST_FACTOR):
                continue
            if sum(gaps) < best_dist and isinstance(entry.get("config"), str):
                best, best_dist = entry["config"], sum(gaps)
        if best is not None:
            return best
    return None


def save(device, results: dict, path: Path | None = None) -> Path:
    """Merge {"op/key/shape": entry} into the user's cache file for this adapter."""
    path = Path(path) if path is not None else cache_paths(device)[0]
    path.parent.mkdir(parents=True, exist_ok=True)
    entries = _read(path) if path.exists() else {}
    entries.update(results)
    payload = {"adapter": device.info.name, "backend": device.info.backend,
               "driver": device.info.driver, "adapter_key": adapter_key(device),
               "written": time.strftime("%Y-%m-%dT%H:%M:%S"), "entries": dict(sorted(entries.items()))}
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(payload, indent=1) + "\n", encoding="utf-8")
    tmp.replace(path)
    forget(device)
    return path


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
            # up for a second (after host work the H200 ran matmuls several times slower for
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

# The model's Linear shapes, per preset: d_model, kv_dim, ffn_hidden, vocab (padded), tokens
# per step (B*T). The 124M preset at 8 x 1024 tokens is the training benchmark's shape.
MODEL_DIMS = {
    "124m": dict(d=768, kv=768, ffn=2048, vocab=50304, tokens=8 * 1024),
    "small": dict(d=384, kv=384, ffn=1024, vocab=50304, tokens=8 * 512),
    "tiny": dict(d=64, kv=32, ffn=192, vocab=384, tokens=2 * 64),   # tests, software Vulkan
}
# attention per preset: batch, seq, heads, kv heads, head dim
MODEL_ATTENTION = {
    "124m": dict(B=8, T=1024, H=12, Hkv=12, D=64),
    "small": dict(B=8, T=512, H=6, Hkv=6, D=64),
    "tiny": dict(B=2, T=64, H=4, Hkv=2, D=16),
}


def linear_shapes(d: int, kv: int, ffn: int, vocab: int, tokens: int) -> list[tuple]:
    """Every (layout, M, N, K, mode) product of one training step of the Llama-style model:
    q/k/v/o projections, the fused gate|up projection, the down projection, the head."""
    fwd = {(tokens, d, d), (tokens, kv, d), (tokens, 2 * ffn, d), (tokens, d, ffn),
           (tokens, vocab, d)}
    shapes = []
    for M, N, K in sorted(fwd):
        shapes.append(("nt", M, N, K, "store"))
        shapes.append(("nn", M, K, N, "store"))          # dX = dY[M,N] @ W[N,K]
        shapes.append(("tn", N, K, M, "accumulate"))     # dW[N,K] += dY^T @ X
    return shapes


def matmul_operands(device, layout, b16, M, N, K, rng):
    """Random A, B (f16 when `b16`) and a zeroed C for one product of this layout."""
    import numpy as np
    a_shape = (K, M) if layout == "tn" else (M, K)
    b_shape = (N, K) if layout == "nt" else (K, N)
    a = device.upload(rng.standard_normal(a_shape, dtype=np.float32))
    b = device.upload((0.02 * rng.standard_normal(b_shape, dtype=np.float32))
                      .astype(np.float16 if b16 else np.float32))
    out = device.zeros((M, N), np.float32)
    return a, b, out


def tune_matmul(device, key: str, M: int, N: int, K: int, *, mode: str = "store",
                wide: bool = False, budget_s: float | None = None, rng=None) -> dict:
    """Time every candidate configuration of matmul kernel `key` (nt, nn, tn, nt_w16,
    nn_w16, nt_h16) at (M, N, K); the cache entry of the winner (plus every time)."""
    import numpy as np
    from .ops import linear
    layout = key[:2]
    b16 = key.endswith(("w16", "h16"))
    f16_math = key.endswith("h16")
    rng = rng or np.random.default_rng(0)
    a, b, out = matmul_operands(device, layout, b16, M, N, K, rng)
    flops = 2.0 * M * N * K
    guess_s = flops / (2e11 if device.info.is_software else 1e13)
    repeats = int(min(10, max(3, 0.1 / max(guess_s, 1e-9))))

    def encode_for(text):
        cfg = linear.MatmulConfig.parse(text)

        def encode(rec):
            linear.matmul(rec, a, b, out, M, N, K, layout=layout, f16_math=f16_math,
                          accumulate=mode == "accumulate", config=cfg)
        return encode

    default = str(linear.default_config(device, key, M, N, K))
    candidates = [default] + [c for c in map(str, linear.candidate_configs(
        device, key, M, N, K, wide=wide)) if c != default]   # the default is always timed
    times = time_candidates(device, candidates, encode_for, repeats=repeats, warmup=1,
                            budget_s=budget_s)
    for buf in (a, b, out):
        buf.destroy()
    entry = entry_from_times(times, flops)
    entry["default"] = default
    dflt = times.get(default)
    if dflt is not None and math.isfinite(dflt):
        entry["default_us"] = round(dflt * 1e6, 2)
    return entry


# ---- attention ------------------------------------------------------------------------------

def tune_attention(device, kernel: str, B: int, T: int, H: int, Hkv: int, D: int, *,
                   budget_s: float | None = None, rng=None) -> dict:
    """Time every tile shape of the tiled attention kernel `kernel` (forward, dq, dkv) at
    this shape (see ops.attention.candidate_configs); the cache entry of the winner. dq and
    dkv are timed inside the whole backward (prep + dq + dkv) with the other kernel at its default (or
    tuned) config."""
    import numpy as np
    from .ops import attention
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


def matmul_keys(device) -> list[str]:
    """The matmul kernel keys worth tuning on this device (the f16 ones need shader-f16 for
    the f16-math kernel; f16 weights with f32 math run anywhere)."""
    keys = ["nt", "nn", "tn", "nt_w16", "nn_w16"]
    if device.has("shader-f16"):
        keys.append("nt_h16")
    return keys


def tune_model(device, preset: str = "124m", tokens: int | None = None, keys=None,
               wide: bool = False, budget_s: float | None = None, log=print,
               attention: bool = True, total_s: float | None = None,
               matmul: bool = True) -> list[dict]:
    """Tune every matmul (unless `matmul` is False) and the attention kernels (unless
    `attention` is False) of one training step of `preset`;
    rows of (op, key, shape, entry). `budget_s` caps the timing of one shape's candidates,
    `total_s` the whole run (each shape then gets a fair share of what is left)."""
    if preset not in MODEL_DIMS:
        raise ValueError(f"unknown preset {preset!r}; choose one of {', '.join(MODEL_DIMS)}")
    dims = dict(MODEL_DIMS[preset])
    if tokens:
        dims["tokens"] = int(tokens)
    keys = list(keys or matmul_keys(device))
    jobs = [("matmul", key, (layout, M, N, K, mode))
            for layout, M, N, K, mode in linear_shapes(**dims)
            for key in keys if key[:2] == layout] if matmul else []
    if attention:
        jobs += [("attention", kernel, None) for kernel in ("forward", "dq", "dkv")]
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
            a = MODEL_ATTENTION[preset]
            entry = tune_attention(device, key, **a, budget_s=budget)
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
