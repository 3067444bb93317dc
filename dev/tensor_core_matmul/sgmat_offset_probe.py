"""Which subgroup-matrix offsets the H200 (Dawn, real subgroup matrices) gets right: the
emulation test's kernel (tests/test_sgmat_emulation.py) with the accumulator's storage offset
per subgroup (`sg * C`) and the store's offset varied; per subgroup, the max error against
numpy. Session 19 saw subgroup 1 wrong with the accumulator at sg * 3 (the test then used
2); this probe found the odd accumulator offsets wrong on the H200.

    python dev/tensor_core_matmul/sgmat_offset_probe.py      (needs a device with subgroup matrices)
"""
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from istanbul.shaders.engine import Device  # noqa: E402
from tests import test_sgmat_emulation as t  # noqa: E402


def main():
    dev = Device(None)
    rng = np.random.default_rng(3)
    ab = rng.standard_normal(1024).astype(np.float32)
    c_in = rng.standard_normal(400).astype(np.float32)
    out0 = np.full(800, -7.0, np.float32)
    print(dev)
    for coff in (3, 0, 1, 2, 4, 8, 16, 20):
        for soff in (1, 0, 4):
            src = t.KERNEL.replace("sg * 2u, false, 20u", f"sg * {coff}u, false, 20u") \
                          .replace("sg * 400u + 1u", f"sg * 400u + {soff}u")
            kernel = dev.kernel_from_source(f"probe_{coff}_{soff}", src, "main")
            bufs = [dev.upload(ab), dev.upload(c_in), dev.upload(out0), dev.zeros(64)]
            with dev.record() as rec:
                rec.dispatch(kernel, bufs, 1)
            out = dev.download(bufs[2])
            want = t._expected(ab, c_in, out0, coff, soff)[0]
            err = [float(np.abs(out[k * 400:(k + 1) * 400] - want[k * 400:(k + 1) * 400]).max())
                   for k in range(2)]
            print(f"acc offset sg*{coff:2d} store offset sg*400+{soff}: max error subgroup 0 "
                  f"{err[0]:.2e}, subgroup 1 {err[1]:.2e}", flush=True)


if __name__ == "__main__":
    main()
