"""Which variant of 05_attention_sgmat2.wgsl is right on the H200 with Dawn's robustness off,
and how fast it is (issue 21; suspects S1/S2 of dev/results/h200/sgmat/round4_sgmat2_review.md).

    source .device/setup.sh && ISTANBUL_BACKEND=dawn python dev/attention_sgmat2_variants.py \\
        --out $OUT [--variants current,pad0] [--robustness off,on] [--repeats 10] [--rounds 3]

VARIANTS (ops.sgmat2_params knobs; default tiles BKF 64, BK 32, BQ2 32):
  current       rows of the f32 score/result tiles padded by 4 words (4 mod 32), spread order
  pad0          E1: the first tensor-core kernels' strides (64 / 32 floats)
  pad8, pad16   rows of 8 / 16 mod 32 words (at head dim 64 dK/dV stages k and v in its p/ds
                array, KV_IN_P, to stay within 48 KiB)
  contig        E2: pad 4, each lane reads a contiguous half row (the first kernels' order)
  pad0-contig   both: the first kernels' tile layout and read order
  pad0-swizzle  pad 0 with the spread order rotated 2 columns per row (conflict-free there)
  fold-every    pad 4, spread, the forward folding at every key tile (no flag /
                workgroupUniformLoad / barrier under a branch): the round-5 bisection of the
                forward (wrong at one key tile in every variant above)

1. Correctness: on the first Dawn adapter with f16 subgroup matrices, one device with
   robustness off and one with it on (`--robustness`), each variant runs the ladder's sg_*
   inputs (shaders/kernels/attention/cases.py: same shapes and seeds as `istanbul kernels
   check`): the forward alone (o, lse), and dQ and dK/dV on the f32 tiled forward's o and lse
   (so a wrong forward does not hide a right backward). Each output is compared with the
   numpy reference (PSNR, max abs error, cosine) and judged with the ladder's thresholds
   (f16: PSNR >= 50 dB, cos >= 0.9999). ops.SGMAT2_ALLOW_WITHOUT_ROBUSTNESS is set True here
   (ops._sgmat2_kernel otherwise refuses devices without robustness); nothing else sets it.
2. Timing: every kernel that passed with robustness off is timed at the 124M step's shape
   (B 8, T 1024, H 12, Hkv 12, D 64, q/k/v and dq/dk/dv as views of fused qkv rows, as the
   model binds them) with GPU timestamps (dev/attention_sgmat_probe.py's per_kernel: median
   of --repeats, interleaved --rounds), beside the shipped path (f32 tiled forward +
   05_attention_sgmat.wgsl dQ and dK/dV) and the first tensor-core forward, in the same
   process; outputs there are compared with the shipped path's (cosine, max abs error).
   One extra family, "<variant>+bkf32": the first variant whose forward passed, with 32-key
   forward tiles (less workgroup memory, more workgroups per SM), checked on the ladder's
   inputs first and timed if right (--no-bkf32 skips it).

Writes OUT/attention_sgmat2_variants.json after every variant and round, and
OUT/attention_sgmat2_variants.md (OUT: --out, else $OUT). One variant failing (an exception,
a lost device) is recorded and the others go on; a lost device is made again. Work stops
starting after --time-limit seconds (default 200; correctness checks stop --timing-reserve
seconds earlier, default 35) and what was done is written. On an
adapter without f16 subgroup matrices (lavapipe) it says so and exits 0. `--expand-only`
expands every variant's kernels at head dims 16/32/64 and lists their workgroup bytes,
without a device. $ISTANBUL_DAWN_ROBUSTNESS is ignored (it would override both devices).
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import sys
import time
import traceback
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

import numpy as np  # noqa: E402

VARIANTS = {
    "current": {},
    "pad0": {"pad": 0},
    "pad8": {"pad": 8},
    "pad16": {"pad": 16},
    "contig": {"order": "contig"},
    "pad0-contig": {"pad": 0, "order": "contig"},
    "pad0-swizzle": {"pad": 0, "order": "swizzle"},
    "fold-every": {"fold": "every"},
}
KERNELS = ("forward", "dq", "dkv")
OUTPUTS = {"forward": ("o", "lse"), "dq": ("dq",), "dkv": ("dk", "dv")}
HEAD_DIMS = (16, 32, 64)
B, T, H, HKV, D = 8, 1024, 12, 12, 64          # the 124M step
NAME = "attention_sgmat2_variants"


def log(*parts) -> None:
    print(*parts, flush=True)


def finite(x):
    """JSON-safe: non-finite floats as strings."""
    if isinstance(x, float) and not math.isfinite(x):
        return str(x)
    if isinstance(x, dict):
        return {k: finite(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [finite(v) for v in x]
    if isinstance(x, (np.floating, np.integer, np.bool_)):
        return finite(x.item())
    return x


def knob_text(knobs: dict) -> str:
    from istanbul.shaders.kernels.attention import ops
    fold = knobs.get("fold", ops.SGMAT2_FOLD)
    return (f"pad {knobs.get('pad', ops.SGMAT2_PAD)}, {knobs.get('order', ops.SGMAT2_ORDER)}"
            + ("" if fold == ops.SGMAT2_FOLD else f", fold {fold}"))


def layout_hd64(knobs: dict) -> dict:
    """Template parameters, f32 row strides and workgroup bytes of a variant at head dim 64."""
    from istanbul.shaders.kernels.attention import ops
    p = ops.sgmat2_params(64, **knobs)
    return {"params": p,
            "f32_strides": {"forward": max(64, p["BKF"]) + p["SPAD"], "dq": p["BK"] + p["SPAD"],
                            "dkv": p["BQ2"] + p["SPAD"]},
            "bytes": {k: ops.sgmat2_bytes(k, p) for k in KERNELS}}


def expand_all(names) -> dict:
    """Expand every variant's three kernels at HEAD_DIMS (Tint's enable lines, subgroup
    matrices on): {variant: {"ok", "error", "bytes": {"D": {kernel: bytes}}}}."""
    from istanbul.shaders import source
    from istanbul.shaders.kernels.attention import ops
    wgsl = source.load_file(ops.FILE_SGMAT2)
    features = {"shader-f16", "subgroup", "subgroup-matrix"}
    out = {}
    for name in names:
        res = {"ok": True, "bytes": {}}
        try:
            for hd in HEAD_DIMS:
                params = ops.sgmat2_params(hd, **VARIANTS[name])
                for kernel in KERNELS:
                    source.compose(features, wgsl, ops.SGMAT2_KERNELS[kernel], params=params,
                                   compiler="tint")
                res["bytes"][str(hd)] = {k: ops.sgmat2_bytes(k, params) for k in KERNELS}
                if max(res["bytes"][str(hd)].values()) > ops.SGMAT2_WORKGROUP_BYTES:
                    raise ValueError(f"head dim {hd}: workgroup bytes {res['bytes'][str(hd)]} "
                                     f"> {ops.SGMAT2_WORKGROUP_BYTES}")
        except Exception as exc:
            res.update(ok=False, error=f"{type(exc).__name__}: {exc}")
        out[name] = res
    return out


# ---- devices --------------------------------------------------------------------------------

def tensor_core_adapter(spec):
    """(index, info, None) of the first Dawn adapter with f16 subgroup matrices (or the one
    `spec` names), else (None, None, why)."""
    from istanbul.shaders import adapters, backends
    if not backends.dawn_installed():
        return None, None, "Dawn (the wgpudawn package) is not installed"
    try:
        found = adapters.enumerate_adapters("dawn")
    except Exception as exc:
        return None, None, f"Dawn lists no adapter ({type(exc).__name__}: {exc})"
    names = "; ".join(info.summary() for info, _ in found) or "none"
    for info, _ in found:
        if spec is not None and str(spec) not in (str(info.index),) \
                and str(spec).lower() not in info.name.lower():
            continue
        if backends.has_f16_subgroup_matrices(info.subgroup_matrix_configs):
            return info.index, info, None
    return None, None, f"Dawn adapters: {names}"


def open_device(index: int, robust: bool):
    from istanbul.shaders.engine import Device
    return Device(str(index), backend="dawn", robustness=robust)


def alive(dev) -> bool:
    try:
        x = np.arange(8, dtype=np.float32)
        return bool(np.array_equal(dev.download(dev.upload(x)), x))
    except Exception:
        return False


# ---- correctness ----------------------------------------------------------------------------

class Ladder:
    """The ladder's sg_* inputs and float64 references, made once."""

    def __init__(self, names=None, seed: int = 0):
        from istanbul.shaders.kernels.attention import cases, reference
        self.cases = cases
        self.items = []
        for i, case in enumerate(cases.VARIANTS_SGMAT):   # the ladder's seeds: seed + index
            if names and case not in names:
                continue
            inp = cases.make_inputs(np.random.default_rng(seed + i), case)
            ref = {**reference.forward_reference(inp), **reference.backward_reference(inp)}
            self.items.append((case, inp, ref))


def judge(out, ref) -> dict:
    from istanbul.shaders import metrics as M
    from istanbul.shaders.kernels.attention import cases
    m = M.compare(np.asarray(out), np.asarray(ref))
    ok, why = M.passes(m, "f16", cases._SGMAT2["thresholds"])
    return {"ok": bool(ok), "why": why, "psnr": m.get("psnr"), "max_abs": m.get("max_abs"),
            "cos": m.get("cos"), "rmse": m.get("rmse")}


def check_variant(dev, ladder: Ladder, knobs: dict) -> dict:
    """{kernel: {"ok", "cases": {case: {output: metrics} | {"error"}}}, "seconds", ...}."""
    from istanbul.shaders.kernels.case_support import run_launch
    cases = ladder.cases
    start = time.perf_counter()
    res = {k: {"ok": True, "cases": {}} for k in KERNELS}
    for case, inp, ref in ladder.items:
        for stage, kernels in (("forward", ("forward",)), ("backward", ("dq", "dkv"))):
            try:
                if stage == "forward":
                    got = run_launch(dev, cases.sgmat2_forward_launch(dev, inp, sgmat_tiles=knobs))
                else:   # dQ and dK/dV on the f32 tiled forward's o and lse
                    got = run_launch(dev, cases._backward_launch(
                        dev, inp, {}, {"tensor_cores": "sgmat2", "sgmat_tiles": knobs}))
            except Exception as exc:
                err = f"{type(exc).__name__}: {str(exc)[:1500]}"
                log(f"    {case} {stage}: ERROR {err[:300]}")
                for k in kernels:
                    res[k]["cases"][case] = {"error": err}
                    res[k]["ok"] = False
                if not alive(dev):
                    res["device_lost"] = True
                    break
                continue
            for k in kernels:
                per = {key: judge(got[key], ref[key]) for key in OUTPUTS[k]}
                res[k]["cases"][case] = per
                res[k]["ok"] = res[k]["ok"] and all(v["ok"] for v in per.values())
        if res.get("device_lost"):
            break
    for k in KERNELS:   # a kernel is right only where every case ran and passed
        missing = [c for c, _, _ in ladder.items if c not in res[k]["cases"]]
        if missing:
            res[k].update(ok=False, not_run=missing)
    res["seconds"] = time.perf_counter() - start
    return res


def worst(kres: dict) -> dict:
    """Worst PSNR and cosine of a kernel over its cases and outputs (None if it never ran)."""
    psnrs, coss, errors = [], [], 0
    for per in kres.get("cases", {}).values():
        if "error" in per:
            errors += 1
            continue
        for v in per.values():
            p = v["psnr"]
            psnrs.append(p if isinstance(p, float) else float(p))
            coss.append(v["cos"])
    return {"psnr": min(psnrs) if psnrs else None, "cos": min(coss) if coss else None,
            "errors": errors}


# ---- timing at the 124M step's shape --------------------------------------------------------

class Step:
    """The step's attention buffers as the model binds them (probe layout, same seed)."""

    def __init__(self, dev):
        rng = np.random.default_rng(0)
        self.width = (H + 2 * HKV) * D
        n = B * T * self.width
        self.qkv = dev.upload(rng.standard_normal((B * T, self.width), dtype=np.float32))
        offs = (0, H * D, (H + HKV) * D)
        self.q, self.k, self.v = (self.qkv.elements(o, n - o) for o in offs)
        self.do = dev.upload(rng.standard_normal((B, T, H, D), dtype=np.float32))
        self.o, self.lse = dev.empty((B, T, H, D)), dev.empty((B, H, T))
        self.grads = dev.zeros((B * T, self.width))
        self.dq, self.dk, self.dv = (self.grads.elements(o, n - o) for o in offs)
        self.strides = {"q_stride": self.width, "kv_stride": self.width}
        self.dev = dev

    def encoders(self, fwd_kw, bwd_kw):
        from istanbul.shaders.kernels.attention import ops as attention
        s = self

        def fwd(rec):
            attention.forward(rec, s.q, s.k, s.v, s.o, s.lse, B, T, H, HKV, D, **s.strides,
                              **fwd_kw)

        def bwd(rec):
            attention.backward(rec, s.q, s.k, s.v, s.o, s.do, s.lse, s.dq, s.dk, s.dv, B, T, H,
                               HKV, D, **s.strides, **bwd_kw)
        return fwd if fwd_kw is not None else None, bwd if bwd_kw is not None else None

    def outputs(self, fwd, bwd, shipped_fwd):
        """Run once; o/lse from `fwd`, gradients from `bwd` on the shipped forward's o/lse."""
        dev, out = self.dev, {}
        if fwd is not None:
            with dev.record() as rec:
                fwd(rec)
            out.update(o=dev.download(self.o), lse=dev.download(self.lse))
        if bwd is not None:
            with dev.record() as rec:
                shipped_fwd(rec)
                bwd(rec)
            g = dev.download(self.grads).reshape(B * T, self.width)
            out.update(dq=g[:, :H * D].copy(), dk=g[:, H * D:(H + HKV) * D].copy(),
                       dv=g[:, (H + HKV) * D:].copy())
        return out


def bkf32_forward(dev, ladder: Ladder, results: dict, step, args):
    """The first variant whose forward passed with robustness off, once more with 32-key
    forward tiles (36 KiB of workgroup memory at D 64, not 45: 6 workgroups per SM, not 5):
    checked on the ladder's inputs like the others; (name, encoder) to time if it passes."""
    from istanbul.shaders.kernels.case_support import run_launch
    off = results["correctness"].get("off", {}).get("variants", {})
    base = next((n for n, r in off.items() if r.get("forward", {}).get("ok")), None)
    if base is None or args.no_bkf32:
        return None, None
    name, knobs = f"{base}+bkf32", {**VARIANTS[base], "BKF": 32}
    res = {"knobs": knobs, "ok": True, "cases": {}}
    results["timing"]["bkf32_forward_check"] = res
    for case, inp, ref in ladder.items:
        try:
            got = run_launch(dev, ladder.cases.sgmat2_forward_launch(dev, inp, sgmat_tiles=knobs))
        except Exception as exc:
            res.update(ok=False, error=f"{type(exc).__name__}: {str(exc)[:1500]}")
            log(f"  {name}: ERROR {res['error'][:300]}")
            return None, None
        res["cases"][case] = {key: judge(got[key], ref[key]) for key in OUTPUTS["forward"]}
        res["ok"] = res["ok"] and all(v["ok"] for v in res["cases"][case].values())
    log(f"  {name} forward on the ladder: {'pass' if res['ok'] else 'FAIL'} psnr>="
        f"{fmt(worst(res)['psnr'])}")
    if not res["ok"] and not args.time_all:
        return None, None
    return name, step.encoders({"tensor_cores": "sgmat2", "sgmat_tiles": knobs}, None)[0]


def timing(dev, results: dict, args, deadline: float, save, ladder: Ladder) -> None:
    from attention_sgmat_probe import compare, per_kernel
    step = Step(dev)
    shipped_fwd, shipped_bwd = step.encoders({}, {"tensor_cores": "staged"})
    families = {"shipped": (shipped_fwd, shipped_bwd, ("forward", "dq", "dkv")),
                "staged-forward": (step.encoders({"config": "sgmat"}, None)[0], None,
                                   ("forward",))}
    off = results["correctness"].get("off", {}).get("variants", {})
    for name, res in off.items():
        passed = [k for k in KERNELS if res.get(k, {}).get("ok")]
        if args.time_all:
            passed = [k for k in KERNELS if k in res]
        if not passed:
            continue
        knobs = VARIANTS[name]
        want_fwd = "forward" in passed
        want_bwd = "dq" in passed or "dkv" in passed
        fwd, bwd = step.encoders(
            {"tensor_cores": "sgmat2", "sgmat_tiles": knobs} if want_fwd else None,
            {"tensor_cores": "sgmat2", "sgmat_tiles": knobs} if want_bwd else None)
        families[name] = (fwd, bwd, tuple(passed))
    tres = results["timing"] = {"shape": {"B": B, "T": T, "H": H, "Hkv": HKV, "D": D,
                                          "fused_qkv": True},
                                "repeats": args.repeats, "rounds": args.rounds, "families": {}}
    try:
        extra, fwd32 = bkf32_forward(dev, ladder, results, step, args)
        if extra is not None:
            families[extra] = (fwd32, None, ("forward",))
    except Exception as exc:
        tres["bkf32_forward_check"] = {"error": f"{type(exc).__name__}: {str(exc)[:1500]}"}
        log(f"  bkf32 check: ERROR {type(exc).__name__}: {str(exc)[:300]}")
    ref = None
    for name, (fwd, bwd, timed) in list(families.items()):
        entry = tres["families"].setdefault(name, {"timed": list(timed)})
        try:
            outs = step.outputs(fwd, bwd, shipped_fwd)
            if name == "shipped":
                ref = outs
            elif ref is not None:
                entry["vs_shipped"] = {k: compare(v, ref[k]) for k, v in outs.items()}
        except Exception as exc:
            entry["error"] = f"{type(exc).__name__}: {str(exc)[:1500]}"
            log(f"  {name}: ERROR {entry['error'][:300]}")
            families.pop(name)
            if not alive(dev):
                log("  device lost: timing stops")
                save()
                return
    samples = {name: {"forward": [], "backward": []} for name in families}
    for rnd in range(args.rounds):
        if time.monotonic() > deadline:
            tres["stopped"] = f"time limit before round {rnd + 1}"
            log(f"  time limit: timing stops before round {rnd + 1}")
            break
        for name, (fwd, bwd, _) in list(families.items()):
            try:
                if fwd is not None:
                    samples[name]["forward"].append(per_kernel(dev, fwd, args.repeats))
                if bwd is not None:   # on whatever o/lse the last forward left: same work
                    samples[name]["backward"].append(per_kernel(dev, bwd, args.repeats))
            except Exception as exc:
                tres["families"][name]["error"] = f"{type(exc).__name__}: {str(exc)[:1500]}"
                log(f"  {name}: ERROR {tres['families'][name]['error'][:300]}")
                families.pop(name)
                if not alive(dev):
                    log("  device lost: timing stops")
                    break
        for name, passes in samples.items():
            entry = tres["families"][name]
            for pass_, runs in passes.items():
                if runs:
                    entry[pass_] = {lab: float(np.median([r[lab] for r in runs]))
                                    for lab in runs[0]}
                    entry[pass_ + "_round_totals"] = [r["total"] for r in runs]
        log(f"  round {rnd + 1}/{args.rounds} done")
        save()
        if not alive(dev):
            break


def kernel_ms(entry: dict) -> dict:
    """forward / dq / dkv / other ms of a timing entry (labels of ops.py's dispatches)."""
    out = {"forward": None, "dq": None, "dkv": None, "other": 0.0}
    for label, ms in entry.get("forward", {}).items():
        if label != "total":
            out["forward"] = (out["forward"] or 0.0) + ms
    for label, ms in entry.get("backward", {}).items():
        if label == "total":
            continue
        if "_dq" in label:
            out["dq"] = ms
        elif "_dkv" in label:
            out["dkv"] = ms
        else:
            out["other"] += ms
    return out


# ---- report ---------------------------------------------------------------------------------

def fmt(x, spec=".1f"):
    if x is None:
        return "-"
    if isinstance(x, str):
        return x
    return format(x, spec) if math.isfinite(x) else str(x)


def markdown(results: dict) -> str:
    meta = results["meta"]
    lines = [f"# sgmat2 attention variants (issue 21), {meta.get('adapter', '?')}, Dawn", "",
             f"{meta.get('started')}, git {meta.get('git', '?')}, "
             f"{meta.get('elapsed_s', 0):.0f} s. `{meta.get('command')}`", ""]
    if meta.get("status"):
        lines += [f"**{meta['status']}**", ""]
    lines += ["Correctness: the ladder's sg_* inputs (cases.py), f16 thresholds (PSNR >= 50 dB, "
              "cos >= 0.9999); forward alone, dQ and dK/dV on the f32 tiled forward's o and lse. "
              "Cells: pass/FAIL, worst PSNR (dB) / worst cosine over the cases and outputs.", "",
              "| variant | knobs | f32 row strides HD64 fwd/dq/dkv (floats) | bytes HD64 "
              "fwd/dq/dkv | robustness | forward | dq | dkv |",
              "|---|---|---|---|---|---|---|---|"]
    for rb, block in results["correctness"].items():
        for name, res in block.get("variants", {}).items():
            lay = results["variants"][name]
            st, by = lay["f32_strides"], lay["bytes"]
            cells = []
            for k in KERNELS:
                if k not in res:
                    cells.append(res.get("skipped") or res.get("error", "-")[:60])
                    continue
                w = worst(res[k])
                cell = ("pass" if res[k]["ok"] else "FAIL") + \
                    f" {fmt(w['psnr'])} / {fmt(w['cos'], '.6f')}"
                if w["errors"]:
                    cell += f" ({w['errors']} errors)"
                cells.append(cell)
            kv = " KV_IN_P" if lay["params"]["KV_IN_P"] else ""
            lines.append(f"| {name} | {knob_text(VARIANTS[name])}{kv} | {st['forward']}/"
                         f"{st['dq']}/{st['dkv']} | {by['forward']}/{by['dq']}/{by['dkv']} | "
                         f"{rb} (got {block.get('robustness')}) | " + " | ".join(cells) + " |")
    tim = results.get("timing")
    if tim and tim.get("families"):
        lines += ["", f"Timing: B {B}, T {T}, H {H}, Hkv {HKV}, D {D}, fused qkv views, robustness "
                  f"off; GPU timestamps, median of {tim['repeats']} repeats, median of "
                  f"{tim['rounds']} interleaved rounds; ms per call (x12 layers per step). "
                  "Only kernels that passed with robustness off are timed (`timed`); "
                  "'other': the backward's prep and dv copy.", "",
                  "| family | timed | forward | dq | dkv | other | fwd+dq+dkv x12 | cos vs shipped "
                  "(worst of o, lse, dq, dk, dv) |", "|---|---|---:|---:|---:|---:|---:|---:|"]
        ship = kernel_ms(tim["families"].get("shipped", {}))
        for name, entry in tim["families"].items():
            ms = kernel_ms(entry)
            timed = entry.get("timed", [])
            vals = [ms[k] if k in timed else None for k in KERNELS]
            tot = None
            if entry.get("error"):
                pass
            elif all(v is not None for v in vals):
                tot = 12 * sum(vals)
            elif name != "shipped":   # fill the untimed kernels with the shipped ones
                fill = [v if v is not None else ship[k] for v, k in zip(vals, KERNELS)]
                if all(v is not None for v in fill):
                    tot = 12 * sum(fill)
            cos = entry.get("vs_shipped")
            wc = min(c["cos"] for c in cos.values()) if cos else None
            err = f" ERROR {entry['error'][:80]}" if entry.get("error") else ""
            lines.append(f"| {name}{err} | {','.join(timed)} | " + " | ".join(
                fmt(v, ".3f") for v in vals) + f" | {fmt(ms['other'], '.3f')} | "
                f"{fmt(tot, '.2f')} | {fmt(wc, '.7f')} |")
        lines += ["", "(fwd+dq+dkv x12 of a variant that is timed only in part adds the shipped "
                  "kernels for the rest.)"]
    lines += ["", "Per case (worst PSNR over the outputs of each kernel; `err`: an exception):", "",
              "| robustness | variant | case | o | lse | dq | dk | dv | min cos |",
              "|---|---|---|---:|---:|---:|---:|---:|---:|"]
    for rb, block in results["correctness"].items():
        for name, res in block.get("variants", {}).items():
            cases = []
            for k in KERNELS:
                for case in res.get(k, {}).get("cases", {}):
                    if case not in cases:
                        cases.append(case)
            for case in cases:
                cells, coss = [], []
                for k in KERNELS:
                    per = res.get(k, {}).get("cases", {}).get(case)
                    for key in OUTPUTS[k]:
                        if per is None:
                            cells.append("-")
                        elif "error" in per:
                            cells.append("err")
                        else:
                            v = per[key]
                            cells.append(fmt(v["psnr"]) + ("" if v["ok"] else "!"))
                            coss.append(v["cos"])
                lines.append(f"| {rb} | {name} | {case} | " + " | ".join(cells)
                             + f" | {fmt(min(coss) if coss else None, '.6f')} |")
    lines += ["", "(`!`: that output fails the thresholds.)"]
    return "\n".join(lines) + "\n"


def git_head() -> str:
    try:
        import subprocess
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=HERE.parent,
                              capture_output=True, text=True, timeout=10).stdout.strip() or "?"
    except Exception:
        return "?"


# ---- main -----------------------------------------------------------------------------------

def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="\n".join(__doc__.splitlines()[1:]))
    ap.add_argument("--out", type=Path, default=None,
                    help="output folder (default $OUT)")
    ap.add_argument("--variants", default=",".join(VARIANTS),
                    help=f"comma-separated, from: {', '.join(VARIANTS)}")
    ap.add_argument("--robustness", default="off,on",
                    help="devices to check on, in order: off, on or both (default off,on)")
    ap.add_argument("--cases", default="",
                    help="ladder cases to use (default all sg_*: sg_random, sg_gqa4, sg_fused, "
                         "sg_peaked, sg_long)")
    ap.add_argument("--repeats", type=int, default=10, help="timed recordings per family and "
                    "round (default 10)")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved timing rounds (default 3)")
    ap.add_argument("--no-timing", action="store_true", help="correctness only")
    ap.add_argument("--time-all", action="store_true",
                    help="time every variant's kernels, right or wrong")
    ap.add_argument("--no-bkf32", action="store_true",
                    help="skip the extra family: the first variant whose forward passed, with "
                         "32-key forward tiles (checked on the ladder first)")
    ap.add_argument("--time-limit", type=float, default=200.0,
                    help="seconds after which no new variant or timing round starts "
                         "(default 200)")
    ap.add_argument("--timing-reserve", type=float, default=35.0,
                    help="seconds of --time-limit kept for the timing: no new correctness "
                         "check starts after time-limit minus this (default 35)")
    ap.add_argument("--adapter", default=None,
                    help="Dawn adapter index or name substring (default: the first with f16 "
                         "subgroup matrices)")
    ap.add_argument("--expand-only", action="store_true",
                    help="expand every variant's kernels (head dims 16/32/64) and list their "
                         "workgroup bytes; no device")
    args = ap.parse_args(argv)
    args.out = args.out or (Path(os.environ["OUT"]) if os.environ.get("OUT") else None)
    if args.out is None:
        ap.error("no output folder: pass --out DIR or set $OUT")
    names = [v.strip() for v in args.variants.split(",") if v.strip()]
    unknown = [v for v in names if v not in VARIANTS]
    if unknown or not names:
        ap.error(f"--variants: unknown {unknown}; known: {', '.join(VARIANTS)}")
    args.variant_names = names
    rbs = [r.strip().lower() for r in args.robustness.split(",") if r.strip()]
    if not rbs or any(r not in ("off", "on") for r in rbs) or len(set(rbs)) != len(rbs):
        ap.error(f"--robustness {args.robustness!r}: use off, on or off,on")
    args.robustness_list = rbs
    from istanbul.shaders.kernels.attention import cases
    args.case_names = [c.strip() for c in args.cases.split(",") if c.strip()]
    bad = [c for c in args.case_names if c not in cases.VARIANTS_SGMAT]
    if bad:
        ap.error(f"--cases: unknown {bad}; known: {', '.join(cases.VARIANTS_SGMAT)}")
    if args.repeats < 1 or args.rounds < 1:
        ap.error("--repeats and --rounds must be >= 1")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    t0 = time.monotonic()
    deadline = t0 + args.time_limit
    check_deadline = deadline - (0.0 if args.no_timing else args.timing_reserve)
    args.out.mkdir(parents=True, exist_ok=True)
    from istanbul.shaders.kernels.attention import ops as attention
    results = {"meta": {"started": datetime.datetime.now().isoformat(timespec="seconds"),
                        "git": git_head(), "command": " ".join(sys.argv),
                        "variants": {n: VARIANTS[n] for n in args.variant_names}},
               "variants": {n: layout_hd64(VARIANTS[n]) for n in args.variant_names},
               "expansion": expand_all(args.variant_names), "correctness": {}}
    json_path = args.out / f"{NAME}.json"
    md_path = args.out / f"{NAME}.md"

    def save():
        results["meta"]["elapsed_s"] = time.monotonic() - t0
        json_path.write_text(json.dumps(finite(results), indent=1))
        md_path.write_text(markdown(results))

    for name, res in results["expansion"].items():
        log(f"expand {name:13s} {'ok' if res['ok'] else 'FAILED ' + res['error']} "
            f"bytes fwd/dq/dkv by head dim: "
            + " ".join(f"D{d}:{'/'.join(str(b[k]) for k in KERNELS)}"
                       for d, b in res["bytes"].items()))
    names = [n for n in args.variant_names if results["expansion"][n]["ok"]]
    if args.expand_only:
        results["meta"]["status"] = "expand only: no device"
        save()
        return 0 if len(names) == len(args.variant_names) else 1

    if os.environ.pop("ISTANBUL_DAWN_ROBUSTNESS", None) is not None:
        log("note: $ISTANBUL_DAWN_ROBUSTNESS ignored (it would override both devices)")
    index, info, why = tensor_core_adapter(args.adapter)
    if index is None:
        msg = f"no f16 subgroup matrices on this adapter: nothing to run ({why})"
        log(msg)
        results["meta"]["status"] = msg
        save()
        return 0
    results["meta"]["adapter"] = info.summary()
    log(f"adapter {info.summary()}")
    attention.SGMAT2_ALLOW_WITHOUT_ROBUSTNESS = True   # the experiment: see the docstring
    ladder = Ladder(args.case_names)
    log(f"ladder inputs {[c for c, _, _ in ladder.items]} ready "
        f"({time.monotonic() - t0:.1f} s)")
    devices = {}
    for rb in args.robustness_list:
        robust = rb == "on"
        block = results["correctness"][rb] = {"variants": {}}
        try:
            dev = open_device(index, robust)
        except Exception as exc:
            block["error"] = f"{type(exc).__name__}: {str(exc)[:1500]}"
            log(f"robustness {rb}: no device: {block['error'][:300]}")
            save()
            continue
        block["robustness"] = dev.robustness
        if dev.robustness != robust:
            block["note"] = (f"asked for robustness {rb}, got {dev.robustness} "
                             "($ISTANBUL_DAWN_TOGGLES?)")
            log("WARNING " + block["note"])
        log(f"robustness {rb}: device {dev.name}, robustness {dev.robustness}")
        for name in args.variant_names:
            if name not in names:
                block["variants"][name] = {"skipped": "expansion failed"}
                continue
            if time.monotonic() > check_deadline:
                block["variants"][name] = {"skipped": "time limit"}
                log(f"  {name}: skipped (time limit)")
                continue
            if dev is None:
                block["variants"][name] = {"skipped": "no device"}
                continue
            log(f"  {name} ({knob_text(VARIANTS[name])}) ...")
            try:
                res = check_variant(dev, ladder, VARIANTS[name])
            except Exception as exc:
                res = {"error": f"{type(exc).__name__}: {str(exc)[:1500]}",
                       "traceback": traceback.format_exc()[-3000:]}
                res["device_lost"] = not alive(dev)
            block["variants"][name] = res
            summary = " ".join(
                f"{k} {'pass' if res[k]['ok'] else 'FAIL'} psnr>={fmt(worst(res[k])['psnr'])}"
                for k in KERNELS if k in res)
            log(f"  {name}: {summary or res.get('error', '')[:300]} "
                f"({res.get('seconds', 0):.1f} s)")
            if res.get("device_lost"):
                log(f"  {name}: the device was lost; making a new one")
                try:
                    dev = open_device(index, robust)
                except Exception as exc:
                    log(f"  no new device: {type(exc).__name__}: {exc}")
                    dev = None
            save()
        devices[rb] = dev
    dev = devices.get("off")
    if args.no_timing:
        results["meta"]["status"] = "correctness only (--no-timing)"
    elif dev is None:
        results["meta"]["status"] = "no timing: no robustness-off device"
    elif time.monotonic() > deadline:
        results["meta"]["status"] = "no timing: time limit"
    else:
        log(f"timing at B {B} T {T} H {H} D {D} ({time.monotonic() - t0:.1f} s)")
        try:
            timing(dev, results, args, deadline, save, ladder)
        except Exception as exc:
            results.setdefault("timing", {})["error"] = f"{type(exc).__name__}: {exc}"
            log(f"timing: ERROR {type(exc).__name__}: {str(exc)[:300]}")
    save()
    log("")
    log(md_path.read_text())
    log(f"wrote {json_path} and {md_path} ({time.monotonic() - t0:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
