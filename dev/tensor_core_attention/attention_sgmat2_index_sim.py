"""(dev) Index / hazard simulation of 05_attention_sgmat2.wgsl's 64-row dQ and dK/dV kernels.

Every access of a workgroup array is recorded per barrier epoch with its actor:
  ("t", lid)  a scalar access by one invocation
  ("m", sg)   a subgroup-matrix load/store of subgroup sg (any lane may touch any element)
Checks: index bounds (matrix footprint offset + r*stride + c, r,c < 16), 16-byte alignment of
matrix offset and stride, reads of never-written elements (no zero-init assumed), and
conflicts inside one epoch (a write and another access of the same element by different
actors; a matrix op of subgroup s and a scalar access by a lane of s also conflict).
Storage indices: checked against the bound views' lengths (ops._layout), guards transcribed.

Assumption (as in the kernel and its predecessor): subgroup size 32, 4 subgroups,
sg = lid / 32, lane = lid % 32. Only the staging loops use lid; every consumer uses (sg, lane),
and consumer/producer pairs are separated by barriers, so the sg<->lid mapping does not matter
for the results reported (checked with a permuted mapping too: PERMUTE=1).

The experiment variants (VARIANTS: f32 row pads 0/4/8/16, the spread, contiguous and swizzled
read orders, dK/dV's KV_IN_P staging where ops.sgmat2_params sets it) are simulated with the
template parameters ops.sgmat2_params gives them. (The file's forward was simulated here too
until it was retired, wrong on the H100 and the H200: git history; the round-5 run of every
variant, dev/tensor_core_attention/attention_sgmat2_index_sim_variants.txt, includes it.)

    .venv/bin/python dev/tensor_core_attention/attention_sgmat2_index_sim.py [--variants current,pad0] [--jobs 2]
                                                      [--quick]
"""
from __future__ import annotations

import argparse
import os
import sys
from collections import defaultdict
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

WG = 128
# ops.sgmat2_params knobs of each experiment variant (issue 21, round 5)
VARIANTS = {
    "current": {},
    "pad0": {"pad": 0},
    "pad8": {"pad": 8},
    "pad16": {"pad": 16},
    "contig": {"order": "contig"},
    "pad0-contig": {"pad": 0, "order": "contig"},
    "pad0-swizzle": {"pad": 0, "order": "swizzle"},
}
PERMUTE = os.environ.get("PERMUTE") == "1"


def sg_lane(lid):
    if PERMUTE:   # an arbitrary but fixed bijection lid -> (sg, lane)
        x = (lid * 37 + 11) % WG
        return x % 4, x // 4
    return lid // 32, lid % 32


class WGMem:
    def __init__(self, arrays, name):
        self.size = {a: n for a, (n, _) in arrays.items()}
        self.esize = {a: e for a, (_, e) in arrays.items()}
        self.name = name
        self.written = {a: set() for a in arrays}
        self.epoch = 0
        self.cur = defaultdict(lambda: defaultdict(lambda: [set(), set()]))  # a->i->[W,R]
        self.problems = defaultdict(list)
        self.ranges = defaultdict(lambda: [10**12, -1])
        self.label = ""

    def _actor_key(self, actor):
        return actor

    def access(self, arr, idx, write, actor, where):
        n = self.size[arr]
        r = self.ranges[(arr, where)]
        r[0] = min(r[0], idx); r[1] = max(r[1], idx)
        if not (0 <= idx < n):
            self.problems["OOB"].append((self.label, where, arr, idx, n, actor))
            return
        if not write and idx not in self.written[arr]:
            self.problems["UNINIT"].append((self.label, where, arr, idx, actor))
        slot = self.cur[arr][idx]
        slot[0 if write else 1].add((actor, where))
        if write:
            self.written[arr].add(idx)

    def mat(self, arr, off, stride, write, sg, where):
        e = self.esize[arr]
        if (off * e) % 16 or (stride * e) % 16:
            self.problems["ALIGN"].append((self.label, where, arr, off, stride))
        for r in range(16):
            for c in range(16):
                self.access(arr, off + r * stride + c, write, ("m", sg), where)

    def barrier(self):
        # conflicts of the epoch just ended
        for arr, d in self.cur.items():
            for idx, (W, R) in d.items():
                if not W:
                    continue
                allacc = W | R
                for (a1, w1) in W:
                    for (a2, w2) in allacc:
                        if conflict(a1, a2):
                            self.problems["RACE"].append((self.label, arr, idx, (a1, w1), (a2, w2)))
                            break
                    else:
                        continue
                    break
        self.cur = defaultdict(lambda: defaultdict(lambda: [set(), set()]))
        self.epoch += 1


def lane_col(P, c, half, r, W):
    """The score column lane (r, half) of a subgroup reads at step c of a W-wide row."""
    if P["SPREAD"]:
        rot = 2 * r if P["SWIZZLE"] else 2 * (r // 8)
        return (2 * c + half + rot) % W
    return W // 2 * half + c


def conflict(a, b):
    if a == b:
        return False
    if a[0] == "m" and b[0] == "m":
        return a[1] != b[1]
    if a[0] == "t" and b[0] == "t":
        return True      # two different invocations
    m, t = (a, b) if a[0] == "m" else (b, a)
    return True          # a matrix op vs a scalar access (even of its own subgroup): needs a barrier


class Storage:
    def __init__(self, lengths):
        self.len = lengths
        self.problems = []

    def access(self, buf, idx, where):
        if not (0 <= idx < self.len[buf]):
            self.problems.append((buf, idx, self.len[buf], where))


# ---------------------------------------------------------------------------------------------
def shapes():
    # ops._layout: view lengths in floats; fused qkv: the token stride is (H + 2 Hkv) D
    # (cases.SGMAT_SHAPES: B, T, H, Hkv, D, fused, peak)
    return {"sg_random": (2, 37, 4, 2, 16, False), "sg_gqa4": (2, 19, 4, 1, 32, False),
            "sg_fused": (2, 150, 2, 1, 64, True), "sg_peaked": (1, 40, 2, 1, 16, False),
            "sg_long": (1, 1024, 2, 2, 64, False), "T65": (1, 65, 2, 1, 64, False),
            "T97": (1, 97, 2, 2, 32, True), "T16": (1, 16, 1, 1, 16, False)}


def layout(B, T, H, Hkv, D, fused):
    sq = (H + 2 * Hkv) * D if fused else H * D
    skv = sq if fused else Hkv * D
    so = H * D
    rows = B * T - 1
    nq, nkv, no = rows * sq + H * D, rows * skv + Hkv * D, rows * so + H * D
    return sq, skv, so, nq // 4, nkv // 4, no // 4


class P:
    pass


def params(B, T, H, Hkv, D, fused):
    p = P()
    p.batch, p.seq, p.heads, p.kv_heads = B, T, H, Hkv
    p.sq, p.skv, p.so, nq4, nkv4, no4 = layout(B, T, H, Hkv, D, fused)
    lens = {"q_in": nq4, "k_in": nkv4, "v_in": nkv4, "do_in": no4,
            "dq_out": nq4, "dk_out": nkv4, "dv_out": nkv4,
            "lse_in": B * H * T, "dvec_in": B * H * T}
    return p, lens


def q_row(p, HD, b, t, h): return ((b * p.seq + t) * p.sq + h * HD) // 4
def kv_row(p, HD, b, t, hk): return ((b * p.seq + t) * p.skv + hk * HD) // 4
def o_row(p, HD, b, t, h): return ((b * p.seq + t) * p.so + h * HD) // 4
def stat_index(p, b, h, t): return (b * p.heads + h) * p.seq + t


# ---- dq ----------------------------------------------------------------------------------------
def dq(P, p, st, wgx, wgy, nwgy):
    HD, BK = P["HD"], P["BK"]
    H4, DT = HD // 4, HD // 16
    SH, SPQ, SSQ = HD + 8, max(HD, BK) + 8, BK + P["SPAD"]
    M = WGMem({"QP": (64 * SPQ, 2), "Ks": (BK * SH, 2), "Vs": (BK * SH, 2),
               "Ss": (64 * SSQ, 4), "Sd": (64 * SSQ, 4)}, "dq")
    bh = wgx; b = bh // p.heads; h = bh % p.heads; hk = h // (p.heads // p.kv_heads)
    qt = nwgy - 1 - wgy; q0 = qt * 64
    for which, buf, rowf, line in (("q", "q_in", q_row, "271"), ("do", "do_in", o_row, "283")):
        for lid in range(WG):
            for i in range(lid, 64 * H4, WG):
                r = i // H4
                if q0 + r < p.seq:
                    st.access(buf, rowf(p, HD, b, q0 + r, h) + i % H4, f"dq:{line}")
                for e in range(4):
                    M.access("QP", r * SPQ + 4 * (i % H4) + e, True, ("t", lid), f"dq:{line} put4 {which}")
        M.barrier()
        for sg in range(4):
            for d in range(DT):
                M.mat("QP", 16 * sg * SPQ + 16 * d, SPQ, False, sg, f"dq {which} load")
        if which == "q":
            M.barrier()
    for lid in range(WG):
        sg, lane = sg_lane(lid)
        qpos = q0 + 16 * sg + lane // 2
        if qpos < p.seq:
            st.access("lse_in", stat_index(p, b, h, qpos), "dq:300")
            st.access("dvec_in", stat_index(p, b, h, qpos), "dq:301")
    nkt = min((q0 + 64 + BK - 1) // BK, (p.seq + BK - 1) // BK)
    for kt in range(nkt):
        M.label = f"kt={kt}"
        k0 = kt * BK
        M.barrier()
        for lid in range(WG):
            for i in range(lid, BK * H4, WG):
                n = i // H4
                if k0 + n < p.seq:
                    st.access("k_in", kv_row(p, HD, b, k0 + n, hk) + i % H4, "dq:313")
                    st.access("v_in", kv_row(p, HD, b, k0 + n, hk) + i % H4, "dq:314")
                for e in range(4):
                    M.access("Ks", n * SH + 4 * (i % H4) + e, True, ("t", lid), "dq:316")
                    M.access("Vs", n * SH + 4 * (i % H4) + e, True, ("t", lid), "dq:317")
        M.barrier()
        for sg in range(4):
            for j in range(BK // 16):
                for d in range(DT):
                    M.mat("Ks", 16 * j * SH + 16 * d, SH, False, sg, "dq:324")
                    M.mat("Vs", 16 * j * SH + 16 * d, SH, False, sg, "dq:326")
                M.mat("Ss", 16 * sg * SSQ + 16 * j, SSQ, True, sg, "dq:329 s store")
                M.mat("Sd", 16 * sg * SSQ + 16 * j, SSQ, True, sg, "dq:330 t store")
        M.barrier()
        for lid in range(WG):
            sg, lane = sg_lane(lid)
            r, half = lane // 2, lane % 2; row = 16 * sg + r; srow = row * SSQ
            for c in range(BK // 2):
                col = lane_col(P, c, half, r, BK)
                M.access("Ss", srow + col, False, ("t", lid), "dq:336")
                M.access("Sd", srow + col, False, ("t", lid), "dq:338")
                M.access("QP", row * SPQ + col, True, ("t", lid), "dq:338 ds write")
        M.barrier()
        for sg in range(4):
            for ks in range(BK // 16):
                M.mat("QP", 16 * sg * SPQ + 16 * ks, SPQ, False, sg, "dq:342")
                for d in range(DT):
                    M.mat("Ks", 16 * ks * SH + 16 * d, SH, False, sg, "dq:344")
    M.label = "epilogue"
    for d in range(DT):
        M.barrier()
        for sg in range(4):
            M.mat("Ss", 16 * sg * SSQ, SSQ, True, sg, "dq:351")
        M.barrier()
        for lid in range(WG):
            sg, lane = sg_lane(lid)
            r, half = lane // 2, lane % 2; row = 16 * sg + r; srow = row * SSQ
            qpos = q0 + row
            if qpos < p.seq:
                s = srow + 8 * half
                at = q_row(p, HD, b, qpos, h) + 4 * d + 2 * half
                for e in range(8):
                    M.access("Ss", s + e, False, ("t", lid), "dq:356-357")
                st.access("dq_out", at, "dq:356"); st.access("dq_out", at + 1, "dq:357")
    M.barrier()
    return M


# ---- dkv ---------------------------------------------------------------------------------------
def dkv(P, p, st, wgx, wgy, nwgy):
    HD, BQ2 = P["HD"], P["BQ2"]
    H4, DT = HD // 4, HD // 16
    SH, SPK, SSK = HD + 8, BQ2 + 8, BQ2 + P["SPAD"]
    arrays = {"KV": (64 * SH, 2), "Qs": (BQ2 * SH, 2), "Ds": (BQ2 * SH, 2),
              "Ps": (64 * SPK, 2), "DSs": (64 * SPK, 2), "Ss": (64 * SSK, 4),
              "Sd": (64 * SSK, 4), "stats": (2 * BQ2, 4)}
    # KV_IN_P: p^T at 0 and ds^T at DS0 of KV, which is made big enough for both
    DS0 = 64 * SPK
    if P["KV_IN_P"]:
        arrays["KV"] = (max(64 * SH, 2 * DS0), 2)
        del arrays["Ps"], arrays["DSs"]
    PS, PS0, DSS, DSS0 = (("KV", 0, "KV", DS0) if P["KV_IN_P"] else ("Ps", 0, "DSs", 0))
    M = WGMem(arrays, "dkv")
    bhk = wgx; b = bhk // p.kv_heads; hk = bhk % p.kv_heads; group = p.heads // p.kv_heads
    k0 = wgy * 64
    for which, buf, line in (("k", "k_in", "407"), ("v", "v_in", "419")):
        for lid in range(WG):
            for i in range(lid, 64 * H4, WG):
                n = i // H4
                if k0 + n < p.seq:
                    st.access(buf, kv_row(p, HD, b, k0 + n, hk) + i % H4, f"dkv:{line}")
                for e in range(4):
                    M.access("KV", n * SH + 4 * (i % H4) + e, True, ("t", lid), f"dkv:{line} put4")
        M.barrier()
        for sg in range(4):
            for d in range(DT):
                M.mat("KV", 16 * sg * SH + 16 * d, SH, False, sg, f"dkv {which} load")
        if which == "k":
            M.barrier()
    first = k0 // BQ2
    tiles = (p.seq + BQ2 - 1) // BQ2
    for g in range(group):
        h = hk * group + g
        for qt in range(first, tiles):
            M.label = f"g={g} qt={qt}"
            q0 = qt * BQ2
            M.barrier()
            for lid in range(WG):
                for i in range(lid, BQ2 * H4, WG):
                    n = i // H4
                    if q0 + n < p.seq:
                        st.access("q_in", q_row(p, HD, b, q0 + n, h) + i % H4, "dkv:447")
                        st.access("do_in", o_row(p, HD, b, q0 + n, h) + i % H4, "dkv:448")
                    for e in range(4):
                        M.access("Qs", n * SH + 4 * (i % H4) + e, True, ("t", lid), "dkv:450")
                        M.access("Ds", n * SH + 4 * (i % H4) + e, True, ("t", lid), "dkv:451")
                if lid < 2 * BQ2:
                    qi = q0 + lid % BQ2
                    if qi < p.seq:
                        st.access("lse_in" if lid < BQ2 else "dvec_in", stat_index(p, b, h, qi), "dkv:458/460")
                    M.access("stats", lid, True, ("t", lid), "dkv:463")
            M.barrier()
            for sg in range(4):
                for j in range(BQ2 // 16):
                    for d in range(DT):
                        M.mat("Qs", 16 * j * SH + 16 * d, SH, False, sg, "dkv:470")
                        M.mat("Ds", 16 * j * SH + 16 * d, SH, False, sg, "dkv:472")
                    M.mat("Ss", 16 * sg * SSK + 16 * j, SSK, True, sg, "dkv:475")
                    M.mat("Sd", 16 * sg * SSK + 16 * j, SSK, True, sg, "dkv:476")
            M.barrier()
            for lid in range(WG):
                sg, lane = sg_lane(lid)
                r, half = lane // 2, lane % 2; row = 16 * sg + r; srow = row * SSK
                for c in range(BQ2 // 2):
                    col = lane_col(P, c, half, r, BQ2)
                    M.access("Ss", srow + col, False, ("t", lid), "dkv:482")
                    M.access("stats", col, False, ("t", lid), "dkv:482")
                    M.access(PS, PS0 + row * SPK + col, True, ("t", lid), "dkv:484")
                    M.access("Sd", srow + col, False, ("t", lid), "dkv:485")
                    M.access("stats", BQ2 + col, False, ("t", lid), "dkv:485")
                    M.access(DSS, DSS0 + row * SPK + col, True, ("t", lid), "dkv:485")
            M.barrier()
            for sg in range(4):
                for ks in range(BQ2 // 16):
                    M.mat(PS, PS0 + 16 * sg * SPK + 16 * ks, SPK, False, sg, "dkv:489")
                    M.mat(DSS, DSS0 + 16 * sg * SPK + 16 * ks, SPK, False, sg, "dkv:490")
                    for d in range(DT):
                        M.mat("Ds", 16 * ks * SH + 16 * d, SH, False, sg, "dkv:492")
                        M.mat("Qs", 16 * ks * SH + 16 * d, SH, False, sg, "dkv:494")
    M.label = "epilogue"
    for d in range(DT):
        M.barrier()
        for sg in range(4):
            M.mat("Ss", 16 * sg * SSK, SSK, True, sg, "dkv:503")
            M.mat("Sd", 16 * sg * SSK, SSK, True, sg, "dkv:504")
        M.barrier()
        for lid in range(WG):
            sg, lane = sg_lane(lid)
            r, half = lane // 2, lane % 2; row = 16 * sg + r; srow = row * SSK
            kpos = k0 + row
            if kpos < p.seq:
                s = srow + 8 * half
                at = kv_row(p, HD, b, kpos, hk) + 4 * d + 2 * half
                for e in range(8):
                    M.access("Ss", s + e, False, ("t", lid), "dkv:509-510")
                    M.access("Sd", s + e, False, ("t", lid), "dkv:511-512")
                for o in (at, at + 1):
                    st.access("dk_out", o, "dkv:509"); st.access("dv_out", o, "dkv:511")
    M.barrier()
    return M


def summarize(M, tag, out):
    probs = M.problems
    line = f"{tag}: " + ", ".join(f"{k}={len(v)}" for k, v in probs.items() if v) or "clean"
    if not any(probs.values()):
        line = f"{tag}: clean"
    out.append(line)
    for k, v in probs.items():
        for item in v[:3]:
            out.append(f"    {k}: {item}")
    return M


def coverage_and_banks(P):
    """Per read width W: does every row's lane pair read each column exactly once, and the
    worst bank multiplicity (32 banks of 4 bytes) of one read step over a subgroup's 32 lanes
    at the f32 row stride of that width."""
    HD, pad = P["HD"], P["SPAD"]
    out = {}
    for what, W, stride in (("dq scores", P["BK"], P["BK"] + pad),
                            ("dkv scores", P["BQ2"], P["BQ2"] + pad)):
        ok = all(sorted(lane_col(P, c, h, r, W) for h in (0, 1) for c in range(W // 2))
                 == list(range(W)) for r in range(16))
        worst = 0
        for c in range(W // 2):
            banks = defaultdict(set)
            for lane in range(32):
                r, h = lane // 2, lane % 2
                word = r * stride + lane_col(P, c, h, r, W)
                banks[word % 32].add(word)
            worst = max(worst, max(len(v) for v in banks.values()))
        out[what] = (ok, worst, stride)
    return out


def simulate(job):
    """All shapes and workgroups of one variant and tile set: (lines, ranges, tally)."""
    vname, knobs, tname, tiles, quick = job
    from istanbul.shaders.kernels.attention import ops
    out, ranges, tally = [], {}, defaultdict(int)
    for name, (B, T, H, Hkv, D, fused) in shapes().items():
        if quick and name not in ("sg_random", "sg_fused", "T65", "T97"):
            continue
        P = ops.sgmat2_params(D, **knobs, **tiles)
        p, lens = params(B, T, H, Hkv, D, fused)
        nwgy = (T + 63) // 64
        for wgy in range(nwgy):
            if T >= 512 and wgy not in (0, nwgy - 1, nwgy // 2):
                continue
            for wgx in sorted({0, B * H - 1}):
                st = Storage(lens)
                runs = [(f"dq wg=({wgx},{wgy})", "dq", lambda: dq(P, p, st, wgx, wgy, nwgy))]
                runs += [(f"dkv wg=({x},{wgy})", "dkv", lambda x=x: dkv(P, p, st, x, wgy, nwgy))
                         for x in sorted({0, B * Hkv - 1})]
                for tag, kernel, run in runs:
                    M = run()
                    summarize(M, f"{vname} {name} D{D} {tname} {tag}", out)
                    tally["runs"] += 1
                    kinds = {k for k, v in M.problems.items() if v}
                    tally["clean" if not kinds else "with findings"] += 1
                    for k in kinds:
                        tally[k] += 1
                    for k, v in M.ranges.items():
                        key = (vname, kernel, D, tname) + k
                        lo, hi, _ = ranges.get(key, (10**12, -1, 0))
                        ranges[key] = (min(lo, v[0]), max(hi, v[1]), M.size[k[0]])
                if st.problems:
                    tally["STORAGE_OOB"] += 1
                    out.append(f"  STORAGE OOB {vname} {name} {tname} wgy={wgy}: {st.problems[:3]}")
    return out, ranges, dict(tally)


def main(argv=None):
    from istanbul.shaders.kernels.attention import ops
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--variants", default=",".join(VARIANTS),
                    help="comma-separated names of VARIANTS")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--quick", action="store_true", help="4 of the 8 shapes")
    args = ap.parse_args(argv)
    names = [v for v in args.variants.split(",") if v]
    unknown = [v for v in names if v not in VARIANTS]
    if unknown:
        ap.error(f"unknown variants {unknown}; known: {', '.join(VARIANTS)}")
    tiles_sets = {"default": {}, "small": {"BK": 16, "BQ2": 16}}
    jobs = [(v, VARIANTS[v], t, tiles, args.quick)
            for v in names for t, tiles in tiles_sets.items()]
    with ProcessPoolExecutor(max(1, args.jobs)) as pool:
        results = list(pool.map(simulate, jobs))
    out, ranges, summary = [], {}, []
    for (vname, knobs, tname, tiles, _), (lines, rng, tally) in zip(jobs, results):
        out += lines
        ranges.update(rng)
        oob = sum(1 for k, (lo, hi, n) in rng.items() if hi >= n)
        summary.append(f"  {vname:14s} {tname:8s} {tally.get('runs', 0):4d} runs, "
                       f"{tally.get('clean', 0):4d} clean; findings: "
                       + (", ".join(f"{k} in {n}" for k, n in sorted(tally.items())
                                    if k not in ("runs", "clean", "with findings")) or "none")
                       + f"; index ranges past the end: {oob}")
    out.append("")
    out.append("index ranges (variant, kernel, HD, tiles, array, access site): min..max / size")
    for key in sorted(ranges, key=str):
        lo, hi, n = ranges[key]
        flag = "  <-- OOB" if hi >= n else ""
        out.append(f"  {key[0]:14s} {key[1]:8s} HD{key[2]:<3d} {key[3]:8s} {key[4]:6s} "
                   f"{key[5]:32s} {lo:6d}..{hi:6d} / {n}{flag}")
    out.append("")
    out.append("lane read order: every column once per row (cover) and the worst bank "
               "multiplicity of one read step at the f32 row stride (1 = conflict-free), HD 64")
    for v in names:
        for tname, tiles in tiles_sets.items():
            P = ops.sgmat2_params(64, **VARIANTS[v], **tiles)
            cb = coverage_and_banks(P)
            out.append(f"  {v:14s} {tname:8s} KV_IN_P={int(P['KV_IN_P'])} " + "; ".join(
                f"{what}: stride {stride} cover {'ok' if ok else 'FAIL'} {worst}-way"
                for what, (ok, worst, stride) in cb.items()))
    out.append("")
    out.append("summary")
    out += summary
    print("\n".join(out))


if __name__ == "__main__":
    main()
