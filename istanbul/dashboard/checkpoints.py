"""A job's checkpoints as the dashboard lists them: step, size and whether they verify.

    inspector = CheckpointInspector()
    inspector.describe("/ckpt/JOB/step_00000100")
    # {'path': ..., 'step': 100, 'bytes': 1234567, 'verified': True, 'problem': None}

The job hash holds the paths the daemon wrote, on the daemon's disk. Where the dashboard can
read them, `bytes` is the manifest's total and `verified` the result of
`trainer_svc.training.checkpoint.verify_checkpoint` (the manifest, then every file's size and
sha256): computed once per checkpoint on one background thread, remembered by path and the
manifest's modification time, `None` until it is known. Elsewhere `readable` is False and
only the step (from the directory name) is shown.
"""

from __future__ import annotations

import json
import logging
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from trainer_svc.training.checkpoint import MANIFEST_FILE, STEP_DIR, CheckpointError, verify_checkpoint

log = logging.getLogger(__name__)


class CheckpointInspector:
    def __init__(self):
        self._verdicts: dict[tuple[str, int], tuple[bool, str | None]] = {}
        self._started: set[tuple[str, int]] = set()
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="verify-checkpoint")

    def describe(self, path: str) -> dict:
        match = STEP_DIR.match(Path(path).name)
        out = {"path": path, "step": int(match.group(1)) if match else None, "bytes": None,
               "readable": False, "verified": None, "problem": None}
        manifest = Path(path) / MANIFEST_FILE
        try:
            stamp = manifest.stat().st_mtime_ns
            files = json.loads(manifest.read_text(encoding="utf-8"))["files"]
            out["bytes"] = sum(int(entry.get("bytes", 0)) for entry in files.values())
        except FileNotFoundError:
            if Path(path).is_dir():    # the folder is here but its manifest is not
                out.update(readable=True, verified=False, problem="manifest missing")
            else:
                out["problem"] = "not on this machine (or pruned since)"
            return out
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            out.update(readable=True, verified=False, problem=f"unreadable manifest ({exc})")
            return out
        out["readable"] = True
        key = (str(path), stamp)
        with self._lock:
            verdict = self._verdicts.get(key)
            if verdict is None and key not in self._started:
                self._started.add(key)
                self._pool.submit(self._verify, key)
        if verdict is not None:
            out["verified"], out["problem"] = verdict
        return out

    def _verify(self, key: tuple[str, int]) -> None:
        try:
            verify_checkpoint(key[0])
            verdict = (True, None)
        except CheckpointError as exc:
            verdict = (False, str(exc))
        except OSError as exc:
            verdict = (False, f"cannot read it ({exc})")
        with self._lock:
            self._verdicts[key] = verdict

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
