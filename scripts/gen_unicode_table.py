#!/usr/bin/env python
"""Regenerate tokenizer_svc/data/unicode_classes.json by probing the installed tiktoken.

    python scripts/gen_unicode_table.py

Run it when tiktoken's Unicode version changes (tests/test_tokenizer_unicode.py fails then).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tokenizer_svc.unicode_table import CLASSES, DATA_FILE, write_table  # noqa: E402


def main() -> int:
    data = write_table(DATA_FILE)
    counts = ", ".join(f"{c}={sum(b - a + 1 for a, b in data['classes'][c])}" for c in CLASSES)
    print(f"wrote {DATA_FILE} ({data['source']}): {counts}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
