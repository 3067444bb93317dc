#!/usr/bin/env python
"""Regenerate the Unicode class tables by probing the installed tiktoken and tokenizers.

    python scripts/gen_unicode_table.py                      # both families
    python scripts/gen_unicode_table.py --family tokenizers  # one of them

Run it when tiktoken's or tokenizers' Unicode version changes (tests/test_tokenizer_unicode.py
fails then). Writes shaders/kernels/bpe/data/unicode_classes*.json, and for tokenizers also
tokenizer_svc/hf/data/hf_normalization.json (its normalizers' Unicode data, see
tokenizer_svc/hf/normalize.py).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tokenizer_svc.hf.normalize import DATA_FILE as NORM_FILE  # noqa: E402
from tokenizer_svc.hf.normalize import write_normalization_table  # noqa: E402
from istanbul.shaders.kernels.bpe.unicode_table import (DATA_FILES, FAMILIES,  # noqa: E402
                                                    write_table)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--family", choices=FAMILIES, action="append",
                        help="which table to regenerate (repeatable; default: all)")
    args = parser.parse_args()
    for family in args.family or FAMILIES:
        data = write_table(family)
        counts = ", ".join(f"{c}={sum(b - a + 1 for a, b in r)}"
                           for c, r in data["classes"].items())
        print(f"wrote {DATA_FILES[family]} ({data['source']}): {counts}")
        if family == "tokenizers":
            norm = write_normalization_table()
            print(f"wrote {NORM_FILE} ({norm['source']}): {len(norm['unknown'])} code points "
                  f"unknown, {len(norm['no_compose'])} compositions not made, "
                  f"{len(norm['lowercase'])} lowercase differences")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
