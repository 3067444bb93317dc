"""bench/acceptance.py's report names the tree each step ran on: a run of some steps keeps the
others' last results, and the report must not present them as the new tree's."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_a_partial_run_keeps_each_steps_own_tree(tmp_path):
    old = {"meta": {"machine": "x", "adapter": "a", "cores": 1, "commit": "old1234",
                    "date": "2026-01-01", "python": "3"},
           "steps": [{"step": "demo", "command": "istanbul demo", "ok": True, "seconds": 5.0,
                      "summary": "an old demo", "details": {}}]}
    (tmp_path / "acceptance.json").write_text(json.dumps(old))
    run = subprocess.run([sys.executable, "bench/acceptance.py", "--steps", "devices",
                          "--commit", "new5678", "--results", str(tmp_path),
                          "--allow-software"], cwd=REPO, capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    report = json.loads((tmp_path / "acceptance.json").read_text())
    trees = {s["step"]: (s["commit"], s["date"]) for s in report["steps"]}
    assert trees["demo"] == ("old1234", "2026-01-01")
    assert trees["devices"][0] == "new5678"
    assert report["meta"]["commit"] == "new5678"
    md = (tmp_path / "acceptance.md").read_text()
    assert "| step | tree | result |" in md and "steps of 2 runs" in md
    assert "| demo | old1234 (2026-01-01) | ok |" in md


def test_one_runs_steps_name_the_tree_once(tmp_path):
    sys.path.insert(0, str(REPO))
    from bench.acceptance import write_report
    meta = {"machine": "x", "adapter": "a", "cores": 1, "commit": "abc", "date": "d"}
    steps = {n: {"step": n, "ok": True, "seconds": 1.0, "summary": "s", "command": "c",
                 "commit": "abc", "date": "d"} for n in ("devices", "demo")}
    write_report(tmp_path / "acceptance", steps, meta)
    md = (tmp_path / "acceptance.md").read_text()
    assert "tree abc; d." in md and "| step | result |" in md and "| tree |" not in md
