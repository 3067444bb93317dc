#!/usr/bin/env python
"""Issue 50: `bytes` input's UTF-8 check on the GPU instead of the host. What does
`Encoding.encode_batch_flat(list of bytes)` spend on the host before its device call, the old
way (`_pack_valid_utf8`: `bytes.decode` of every non-ASCII document) and the new one (the
documents as they are, `_joined`; the encoder's bpe_utf8_check in the call)?

    python dev/tokenizer_throughput/bytes_check_probe.py [--mb 16] [--vocab o200k_base]
                                                          [--repeats 5] [--no-device]

Prints the median host time of each over --repeats on the UTF-8 of
bench/tokenize_corpus.py's build_corpus(mb).docs_of("all"); then (unless --no-device) one
cProfile each of the old path (`_pack_valid_utf8` + `encode_packed`) and of
`encode_batch_flat(bytes)` on the default device: wall, own time of `bytes.decode`, and the
new call's `utf8_check` GPU time from the encoder's profile. The two calls' ids must be equal.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from bench import tokenize_corpus  # noqa: E402
from tokenizer_svc import encoding  # noqa: E402


def median_s(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def profiled(fn):
    prof = cProfile.Profile()
    start = time.perf_counter()
    prof.enable()
    result = fn()
    prof.disable()
    wall = time.perf_counter() - start
    stats = pstats.Stats(prof).stats
    decode = sum(tt for (_, _, name), (_, _, tt, _, _) in stats.items()
                 if name == "<method 'decode' of 'bytes' objects>")
    return result, wall, decode


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mb", type=float, default=16)
    ap.add_argument("--vocab", default="o200k_base")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--no-device", action="store_true")
    args = ap.parse_args()
    docs = [d.encode() for d in tokenize_corpus.build_corpus(args.mb).docs_of("all")]
    mb = sum(map(len, docs)) / 1e6
    print(f"{len(docs)} documents, {mb:.1f} MB, {sum(not d.isascii() for d in docs)} non-ASCII")
    old = median_s(lambda: encoding._pack_valid_utf8(docs), args.repeats)
    new = median_s(lambda: encoding._joined(docs), args.repeats)
    print(f"host before the device call: old (_pack_valid_utf8) {old * 1e3:.2f} ms, "
          f"new (_joined) {new * 1e3:.2f} ms")
    if args.no_device:
        return
    enc = encoding.get_encoding(args.vocab)
    enc.encode_batch_flat([b"warm-up \xc3\xa9"])
    encoder = enc.backend.encoder
    (ids_old, off_old), wall_old, dec_old = profiled(
        lambda: enc.backend.encode_packed(*encoding._pack_valid_utf8(docs)))
    encoder.profile = True
    try:
        (ids_new, off_new), wall_new, dec_new = profiled(lambda: enc.encode_batch_flat(docs))
    finally:
        encoder.profile = False
    assert ids_old.tolist() == ids_new.tolist() and off_old.tolist() == off_new.tolist()
    gpu = encoder.last_profile.gpu.get("utf8_check", 0.0)
    print(f"{enc.backend.device.name}: old path {wall_old:.3f} s (bytes.decode "
          f"{dec_old * 1e3:.2f} ms), encode_batch_flat(bytes) {wall_new:.3f} s (bytes.decode "
          f"{dec_new * 1e3:.2f} ms, utf8_check GPU {gpu * 1e3:.2f} ms); ids equal")


if __name__ == "__main__":
    main()
