"""Where a benchmark writes its results: bench/results/<machine>/<benchmark>.{md,json}.

Each run overwrites its machine's files (git keeps the old ones) and adds one row to
bench/results/HISTORY.md: date, machine, benchmark, commit, headline figure, file. The machine
is named from the GPU adapter: 'NVIDIA H100 80GB HBM3' -> h100, 'NVIDIA H200' -> h200, Mesa's
software Vulkan (llvmpipe) -> lavapipe.
"""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results"


def machine_name(adapter_line: str) -> str:
    """'[0] NVIDIA H100 80GB HBM3 (...)' -> 'h100'; software Vulkan -> 'lavapipe'."""
    m = re.search(r"\b([HAB]\d{2,3}|L\d{1,2}S?|RTX ?\w+)\b", adapter_line)
    if m:
        return m[1].lower().replace(" ", "")
    return "lavapipe" if "llvmpipe" in adapter_line or "CPU" in adapter_line else "gpu"


def default_dir(adapter: str | int | None = None) -> Path:
    """bench/results/<machine>/ for the adapter a run would pick (`--adapter`, else the
    engine's choice)."""
    from istanbul.shaders.adapters import choose_adapter
    info, _ = choose_adapter(adapter)
    return RESULTS / machine_name(info.name)
