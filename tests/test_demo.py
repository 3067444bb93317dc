"""`istanbul demo`, shortened: every real step runs (GPU vocab training, the gRPC service,
prepare into embedded Redis, submit, the daemon, watch, the loss curve, generation)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_short_demo_runs_the_whole_pipeline(tmp_path):
    out = tmp_path / "demo"
    env = dict(os.environ, XDG_RUNTIME_DIR=os.environ.get("XDG_RUNTIME_DIR", "/tmp"))
    proc = subprocess.run(
        [sys.executable, "-m", "istanbul", "demo", "--out", str(out), "--corpus-mb", "0.4",
         "--vocab-size", "400", "--steps", "12", "--batch", "2", "--seq", "32",
         "--checkpoint-every", "5", "--eval-every", "6", "--max-tokens", "12"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    for step in range(1, 9):
        assert f"[{step}/8]" in proc.stdout
    vocab = out / "vocab" / "demo.tiktoken"
    assert len(vocab.read_text().splitlines()) == 399  # 400 ids: 399 tokens + <|endoftext|>
    png = (out / "loss_curve.png").read_bytes()
    assert png.startswith(b"\x89PNG") and len(png) > 10_000
    sample = (out / "sample.txt").read_text()
    assert sample.startswith("def main(") and len(sample) > len("def main(")
    jobs = [d for d in (out / "checkpoints").iterdir() if d.is_dir()]
    assert len(jobs) == 1
    steps = sorted(p.name for p in jobs[0].glob("step_*"))
    assert steps[-1] == "step_00000012"
    assert "loss" in proc.stdout and "Done in" in proc.stdout
    assert "eval loss" in proc.stdout and "evaluations on held-out documents" in proc.stdout
    # while it trained, a live dashboard (the extra is installed for the tests), then stopped
    assert "live dashboard: http://127.0.0.1:" in proc.stdout
    assert "dashboard on http://127.0.0.1:" in (out / "logs" / "dashboard.log").read_text()
    # the service was stopped gracefully and the daemon exited on an idle queue
    assert "stopped" in (out / "logs" / "tokenizer.log").read_text()
