"""A tuning cache for an A/B of the whole step: this adapter's shipped tuned file with
suffixes added to every tensor-core entry (issue 49: does a knob the ablation liked help the
step?).

    ISTANBUL_BACKEND=dawn python dev/tensor_core_matmul/suffix_cache.py --out DIR --suffix g8-v16

Writes DIR/<adapter key>.json: every `*_sgmat` entry of the shipped file with the suffixes
applied (sgmat_ablation.with_suffix: aN, gN, v16, joined by "-"), the other entries as
shipped. `ISTANBUL_AUTOTUNE_DIR=DIR` then runs them: the user cache wins over the shipped
file at every exact shape.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from istanbul.shaders import tuned_cache  # noqa: E402
from istanbul.shaders.engine import Device  # noqa: E402
from istanbul.shaders.kernels.matmul import ops as linear  # noqa: E402
from sgmat_ablation import with_suffix  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--suffix", required=True, help="e.g. g8, v16, g8-v16")
    args = ap.parse_args()
    dev = Device(None, robustness=False)
    name = tuned_cache.adapter_key(dev) + ".json"
    shipped = tuned_cache.SHIPPED_DIR / name
    if not shipped.is_file():
        print(f"no shipped tuned file for {dev.name}: {shipped}")
        return 1
    data = json.loads(shipped.read_text(encoding="utf-8"))
    changed = 0
    for key, entry in data["entries"].items():
        if key.split("/")[1].endswith("_sgmat") and isinstance(entry.get("config"), str):
            entry["config"] = str(with_suffix(linear.SgmatConfig.parse(entry["config"]),
                                              args.suffix))
            changed += 1
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / name).write_text(json.dumps(data, indent=1), encoding="utf-8")
    print(f"{out / name}: {changed} tensor-core entries with -{args.suffix}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
