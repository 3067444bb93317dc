"""Checkpoints in the export format (SPEC §8), written atomically and verified on load.

    ROOT/RUN/step_00001000/
        model.safetensors      fp32 weights by layout name; metadata: format, format_version,
                               config (JSON), layout_hash (FNV-1a), step, tokens_seen, vocab_hash
        optimizer.safetensors  AdamW moments m.<name>, v.<name>; metadata: layout_hash, step
        state.json             data position, RNG, schedule, recent losses, train config, the
                               caller's dict
        vocab/<file>           the vocabulary (and its sidecar), when one was given
        MANIFEST.json          sha256 and size of every other file; written LAST
    ROOT/RUN/latest -> step_00001000       (symlink, replaced atomically)

    mgr = CheckpointManager("ckpt/run1", keep_last=3, keep_every=1000)
    path = mgr.save(trainer, {"data_position": stream.position}, vocab_file="my.tiktoken")
    trainer, state = load_checkpoint(mgr.latest_valid(), device)

A checkpoint is written into a temporary directory next to its final place, every file and
the directory fsync'ed, then renamed; the `latest` link changes only after that. A writer
that may lose the right to write (the daemon: its lease) passes `fence`, called right before
the rename. Debris of a writer killed half-way (`.tmp-step_*`, `step_*.superseded-*`,
`.latest.tmp-*`) is never read; `prune_debris` removes it (the daemon does, holding the job's
lease), and retention keeps `keep_last` (+ `keep_every`) step directories. A checkpoint found
unusable on resume stays only while it is ahead of the run (the run rewrites it when it gets
there); once a checkpoint at its step or later is written it is pruned like any other. Loading
checks the manifest first (present, parseable, every hash), then the format, the layout hash
against the layout this build derives from the stored config, the tensor names and shapes,
and the vocabulary when the caller names the one it expects. Anything wrong raises
CheckpointError naming the file and the problem; nothing is ever overwritten. No pickle.
`CheckpointManager.load_newest` resumes from the newest checkpoint that verifies AND loads.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
import signal
import time
from pathlib import Path

from safetensors import SafetensorError
from safetensors.numpy import load_file, save_file

from .. import settings
from ..model.config import ModelConfig
from ..model.layout import ParameterLayout

log = logging.getLogger(__name__)

FORMAT = "istanbul-checkpoint"
FORMAT_VERSION = 1
MODEL_FILE = "model.safetensors"
OPTIMIZER_FILE = "optimizer.safetensors"
STATE_FILE = "state.json"
MANIFEST_FILE = "MANIFEST.json"
VOCAB_DIR = "vocab"
LATEST = "latest"
STEP_DIR = re.compile(r"^step_(\d{8,})$")
# What a killed writer leaves behind: its temporary directory, a checkpoint it had moved aside,
# a half-made `latest` link.
DEBRIS = re.compile(r"^(\.tmp-step_\d{8,}-.*|step_\d{8,}\.superseded-\d+|\.latest\.tmp-\d+)$")
# Tests only: "POINT@STEP[,POINT@STEP...]" kills this process (SIGKILL) when the checkpoint of
# STEP reaches POINT (files_written, manifest_written, renamed), like a crash at that moment.


class CheckpointError(ValueError):
    """A checkpoint that cannot be used; the message names the file and the problem."""


def step_dir_name(step: int) -> str:
    return f"step_{step:08d}"


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fault_point(point: str, step: int) -> None:
    if f"{point}@{step}" in settings.read("ISTANBUL_TEST_CHECKPOINT_FAULT"):
        log.warning("$ISTANBUL_TEST_CHECKPOINT_FAULT: killing this process at %s of step %d",
                    point, step)
        logging.shutdown()
        os.kill(os.getpid(), signal.SIGKILL)


def prune_debris(run_dir) -> list[str]:
    """Remove what killed writers left in `run_dir` (names matching DEBRIS); returns the names.

    Only for a caller that owns the run: a temporary directory may belong to a writer that is
    still going (the daemon calls this holding the job's lease, so any other writer has lost
    its lease and its rename is refused by its fence)."""
    run_dir = Path(run_dir)
    removed = []
    if not run_dir.is_dir():
        return removed
    for child in sorted(run_dir.iterdir()):
        if not DEBRIS.match(child.name):
            continue
        if child.is_dir() and not child.is_symlink():
            shutil.rmtree(child, ignore_errors=True)
        else:
            child.unlink(missing_ok=True)
        if not child.exists() and not child.is_symlink():
            removed.append(child.name)
    if removed:
        log.info("%s: removed debris of interrupted checkpoint writes: %s", run_dir,
                 ", ".join(removed))
    return removed


def vocab_content_hash(vocab_file) -> str:
    from tokenizer_svc.vocab import load_vocabulary
    return load_vocabulary(vocab_file).content_hash


# ---- writing ---------------------------------------------------------------------------------

class CheckpointManager:
    """Writes, prunes and finds the checkpoints of one run directory."""

    def __init__(self, run_dir, keep_last: int = 3, keep_every: int = 0, fence=None):
        if keep_last < 1:
            raise ValueError(f"keep_last must be >= 1, got {keep_last}")
        self.run_dir = Path(run_dir)
        self.keep_last = int(keep_last)
        self.keep_every = int(keep_every)  # steps; a multiple of it is kept forever (0: none)
        # Called right before a finished checkpoint is renamed into place; raises to refuse
        # (the daemon: the lease is no longer ours). The temporary directory is removed.
        self.fence = fence
        # Checkpoints the last load_newest / latest_valid could not use, less those this
        # manager has since rewritten: retention neither counts them nor keeps them once the
        # run has passed them (see _prune).
        self.skipped: list[tuple[Path, str]] = []

    def checkpoints(self) -> list[tuple[int, Path]]:
        """(step, path) of every step directory, oldest first (valid or not)."""
        if not self.run_dir.is_dir():
            return []
        found = []
        for child in self.run_dir.iterdir():
            m = STEP_DIR.match(child.name)
            if m and child.is_dir() and not child.is_symlink():
                found.append((int(m.group(1)), child))
        return sorted(found)

    def save(self, trainer, state: dict | None = None, vocab_file=None) -> Path:
        """Write the trainer's checkpoint at its current step; returns the directory."""
        state = dict(state or {})
        self.run_dir.mkdir(parents=True, exist_ok=True)
        step = int(trainer.step_count)
        final = self.run_dir / step_dir_name(step)
        tmp = self.run_dir / f".tmp-{final.name}-{os.getpid()}-{time.monotonic_ns()}"
        tmp.mkdir()
        aside = None
        try:
            self._write_files(tmp, trainer, state, vocab_file)
            _fsync_dir(tmp)
            _fault_point("manifest_written", step)
            if self.fence is not None:
                self.fence()
            if final.exists():
                # A checkpoint at this step exists: the run resumed from an older one because
                # this one failed to verify or load. Move it aside, then drop it once the new
                # one is in place (a crash in between leaves debris, never a gap).
                aside = final.with_name(f"{final.name}.superseded-{time.time_ns()}")
                log.warning("checkpoint %s exists but was not usable; replacing it", final)
                os.rename(final, aside)
            os.rename(tmp, final)
            _fsync_dir(self.run_dir)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        _fault_point("renamed", step)
        if aside is not None:
            shutil.rmtree(aside, ignore_errors=True)
        self._point_latest(final)
        # a rewritten step is a good checkpoint again, counted and pruned like the others
        self.skipped = [(path, why) for path, why in self.skipped if path != final]
        self._prune(keep=final)
        log.debug("checkpoint written: %s", final)
        return final

    def _write_files(self, tmp: Path, trainer, state: dict, vocab_file) -> None:
        cfg, layout = trainer.model_config, trainer.layout
        vocab_hash = ""
        vocab_entry = None
        if vocab_file is not None:
            vocab_file = Path(vocab_file)
            vocab_hash = vocab_content_hash(vocab_file)
            (tmp / VOCAB_DIR).mkdir()
            shutil.copyfile(vocab_file, tmp / VOCAB_DIR / vocab_file.name)
            sidecar = Path(str(vocab_file) + ".json")
            if sidecar.is_file():
                shutil.copyfile(sidecar, tmp / VOCAB_DIR / sidecar.name)
            vocab_entry = {"file": f"{VOCAB_DIR}/{vocab_file.name}", "hash": vocab_hash}
        meta = {"format": FORMAT, "format_version": str(FORMAT_VERSION),
                "config": cfg.to_json(), "layout_hash": layout.hash,
                "step": str(trainer.step_count), "tokens_seen": str(trainer.tokens_seen),
                "vocab_hash": vocab_hash}
        save_file(trainer.export_weights(), str(tmp / MODEL_FILE), metadata=meta)
        opt = trainer.optimizer_state()
        moments = {}
        for prefix in ("m", "v"):
            for name, value in layout.unpack(opt[prefix]).items():
                moments[f"{prefix}.{name}"] = value
        save_file(moments, str(tmp / OPTIMIZER_FILE),
                  metadata={"format": FORMAT, "layout_hash": layout.hash,
                            "step": str(trainer.step_count)})
        tc = trainer.train_config
        full_state = {
            "format": FORMAT, "format_version": FORMAT_VERSION,
            "step": trainer.step_count, "tokens_seen": trainer.tokens_seen,
            "train_config": tc.to_dict(),
            "schedule": {"step": trainer.step_count, "next_lr": tc.lr_at(trainer.step_count),
                         "warmup": tc.warmup, "total_steps": tc.steps},
            "rng": trainer.rng_state(),
            "recent_losses": [float(x) for x in trainer.recent_losses],
            "skipped_steps": trainer.skipped_steps,
            "loss_scale": trainer.loss_scale_state(),
            "vocab": vocab_entry,
            "data_position": state.pop("data_position", None),
            "caller": state,
        }
        (tmp / STATE_FILE).write_text(json.dumps(full_state, indent=2, sort_keys=True) + "\n",
                                      encoding="utf-8")
        _fault_point("files_written", trainer.step_count)
        files = sorted(p for p in tmp.rglob("*") if p.is_file())
        for path in files:
            _fsync_file(path)
        manifest = {"format": FORMAT, "format_version": FORMAT_VERSION,
                    "step": trainer.step_count,
                    "files": {p.relative_to(tmp).as_posix():
                              {"sha256": sha256_file(p), "bytes": p.stat().st_size}
                              for p in files}}
        man = tmp / MANIFEST_FILE
        man.write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n", encoding="utf-8")
        _fsync_file(man)

    def _point_latest(self, target: Path) -> None:
        link = self.run_dir / LATEST
        tmp = self.run_dir / f".{LATEST}.tmp-{os.getpid()}"
        if tmp.is_symlink() or tmp.exists():
            tmp.unlink()
        os.symlink(target.name, tmp)
        os.replace(tmp, link)
        _fsync_dir(self.run_dir)

    def apply_retention(self) -> None:
        """Keep the newest `keep_last` checkpoints (and multiples of `keep_every`); also run
        after every save. A checkpoint `load_newest` found unusable never counts; it stays
        while it is ahead of the newest usable checkpoint (the run replaces it when it gets
        there again) and goes once the run has passed it."""
        self._prune(keep=None)

    def _prune(self, keep: Path | None) -> None:
        unusable = {path for path, _ in self.skipped}
        ckpts = self.checkpoints()
        usable = [(step, path) for step, path in ckpts if path not in unusable]
        newest = usable[-1][0] if usable else None
        recent = {p for _, p in usable[-self.keep_last:]}
        for step, path in ckpts:
            if path in recent or path == keep:
                continue
            if path in unusable:
                if newest is None or step > newest:
                    continue        # ahead of the run: replaced when the run gets there
                log.info("retention: removing %s (unusable, and the run has passed it)", path)
            elif self.keep_every and step % self.keep_every == 0:
                continue
            else:
                log.info("retention: removing %s", path)
            shutil.rmtree(path, ignore_errors=True)

    def load_newest(self, device, *, train_config=None, expected_vocab_hash=None):
        """(Trainer, state, path) from the newest checkpoint that verifies and loads, falling
        back to older ones (each one skipped is logged and kept in `self.skipped`); None when
        no checkpoint can be used."""
        self.skipped = []
        for _, path in reversed(self.checkpoints()):
            try:
                trainer, state = load_checkpoint(path, device, train_config=train_config,
                                                 expected_vocab_hash=expected_vocab_hash)
            except (CheckpointError, KeyError, TypeError, ValueError) as exc:
                # verified, yet not loadable (e.g. written by an incompatible build, or its
                # state is malformed): an older checkpoint may still be good
                reason = str(exc) if isinstance(exc, CheckpointError) else \
                    f"{path}: cannot load ({type(exc).__name__}: {exc})"
                log.warning("skipping checkpoint %s: %s", path, reason)
                self.skipped.append((path, reason))
                continue
            return trainer, state, path
        return None

    def latest_valid(self) -> Path | None:
        """The newest checkpoint that passes verification, falling back to older ones (each
        one skipped is logged and kept in `self.skipped`, as by load_newest)."""
        self.skipped = []
        for step, path in reversed(self.checkpoints()):
            try:
                verify_checkpoint(path)
                return path
            except CheckpointError as exc:
                log.warning("skipping checkpoint %s: %s", path, exc)
                self.skipped.append((path, str(exc)))
        return None


# ---- reading and verifying ---------------------------------------------------------------------

def resolve(path) -> Path:
    """A checkpoint directory from a step directory, a `latest` link, or a run directory."""
    path = Path(path)
    if not path.exists():
        raise CheckpointError(f"{path}: no such checkpoint (give a step_XXXXXXXX directory, "
                              "its run directory, or the run's `latest` link)")
    path = path.resolve()
    if path.is_dir() and not (path / MANIFEST_FILE).exists() and \
            not (path / MODEL_FILE).exists():
        found = CheckpointManager(path).latest_valid()
        if found is None:
            raise CheckpointError(f"{path}: no valid checkpoint in this run directory")
        return found
    return path


def verify_checkpoint(path) -> dict:
    """Check the manifest and every file hash; returns the parsed manifest."""
    path = Path(path)
    man_path = path / MANIFEST_FILE
    if not man_path.is_file():
        raise CheckpointError(f"{man_path}: manifest missing (the checkpoint was never "
                              "completed or was tampered with)")
    try:
        manifest = json.loads(man_path.read_text(encoding="utf-8"))
        files = manifest["files"]
        if manifest.get("format") != FORMAT:
            raise CheckpointError(f"{man_path}: format {manifest.get('format')!r}, expected "
                                  f"{FORMAT!r}")
    except (json.JSONDecodeError, KeyError, TypeError, UnicodeDecodeError) as exc:
        raise CheckpointError(f"{man_path}: unreadable manifest ({exc})") from None
    for required in (MODEL_FILE, OPTIMIZER_FILE, STATE_FILE):
        if required not in files:
            raise CheckpointError(f"{man_path}: lists no {required}")
    for rel, entry in files.items():
        file = path / rel
        if not file.is_file():
            raise CheckpointError(f"{file}: listed in the manifest but missing")
        size = file.stat().st_size
        if size != entry.get("bytes"):
            raise CheckpointError(f"{file}: {size} bytes, manifest says {entry.get('bytes')} "
                                  "(truncated or replaced)")
        if sha256_file(file) != entry.get("sha256"):
            raise CheckpointError(f"{file}: sha256 does not match the manifest (corrupted)")
    return manifest


def read_checkpoint(path, expected_vocab_hash: str | None = None) -> dict:
    """Verify and read a checkpoint into host arrays: config, params, moments, state."""
    path = resolve(path)
    verify_checkpoint(path)
    model_path = path / MODEL_FILE
    try:
        from safetensors import safe_open
        with safe_open(str(model_path), framework="numpy") as fh:
            meta = fh.metadata() or {}
        weights = load_file(str(model_path))
        moments = load_file(str(path / OPTIMIZER_FILE))
        state = json.loads((path / STATE_FILE).read_text(encoding="utf-8"))
    except (SafetensorError, OSError, json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise CheckpointError(f"{path}: cannot read ({exc})") from None
    if meta.get("format") != FORMAT or meta.get("format_version") != str(FORMAT_VERSION):
        raise CheckpointError(f"{model_path}: format {meta.get('format')!r} version "
                              f"{meta.get('format_version')!r}; this build reads {FORMAT!r} "
                              f"version {FORMAT_VERSION}")
    try:
        cfg = ModelConfig.from_json(meta["config"])
    except (KeyError, ValueError, TypeError) as exc:
        raise CheckpointError(f"{model_path}: bad config metadata ({exc})") from None
    layout = ParameterLayout.for_config(cfg)
    if meta.get("layout_hash") != layout.hash:
        raise CheckpointError(f"{model_path}: layout hash {meta.get('layout_hash')} does not "
                              f"match this build's layout {layout.hash} for its config (written "
                              "by an incompatible version)")
    if set(weights) != set(layout.names):
        missing = sorted(set(layout.names) - set(weights))[:3]
        extra = sorted(set(weights) - set(layout.names))[:3]
        raise CheckpointError(f"{model_path}: tensors do not match the layout (missing "
                              f"{missing}, unexpected {extra})")
    try:
        params = layout.pack(weights)
        m = layout.pack({k[2:]: v for k, v in moments.items() if k.startswith("m.")})
        v = layout.pack({k[2:]: v for k, v in moments.items() if k.startswith("v.")})
    except ValueError as exc:
        raise CheckpointError(f"{path}: {exc}") from None
    vocab_hash = meta.get("vocab_hash", "")
    if expected_vocab_hash is not None and vocab_hash != expected_vocab_hash:
        raise CheckpointError(f"{model_path}: trained with vocabulary {vocab_hash[:16] or 'none'}"
                              f", not the expected {expected_vocab_hash[:16]} (another "
                              "vocabulary's checkpoint)")
    vocab = state.get("vocab") or None
    return {"path": path, "config": cfg, "layout": layout, "params": params, "m": m, "v": v,
            "state": state, "step": int(meta.get("step", 0)),
            "tokens_seen": int(meta.get("tokens_seen", 0)), "vocab_hash": vocab_hash,
            "vocab_file": (path / vocab["file"]) if vocab else None}


def load_checkpoint(path, device, *, expected_vocab_hash: str | None = None,
                    train_config=None):
    """(Trainer, state) from a checkpoint; the Trainer continues exactly where it stopped.

    `train_config` overrides the stored one (e.g. more steps); batch and seq may change.
    """
    from .trainer import TrainConfig, Trainer
    ck = read_checkpoint(path, expected_vocab_hash)
    state = ck["state"]
    try:
        tc = train_config or TrainConfig.from_dict(state["train_config"])
    except (KeyError, ValueError, TypeError) as exc:
        raise CheckpointError(f"{ck['path'] / STATE_FILE}: bad train_config ({exc})") from None
    trainer = Trainer(ck["config"], tc, device, parameters=ck["params"])
    trainer.load_optimizer_state(ck["m"], ck["v"])
    trainer.step_count = ck["step"]
    trainer.tokens_seen = ck["tokens_seen"]
    trainer.skipped_steps = int(state.get("skipped_steps", 0))
    trainer.set_loss_scale_state(state.get("loss_scale"))
    trainer.recent_losses.extend(state.get("recent_losses", []))
    if state.get("rng"):
        trainer.set_rng_state(state["rng"])
    # the caller's dict as saved, plus where things are (never overriding the caller's keys)
    out = dict(state.get("caller") or {})
    out["data_position"] = state.get("data_position")
    out.setdefault("checkpoint", str(ck["path"]))
    out.setdefault("vocab_file", str(ck["vocab_file"]) if ck["vocab_file"] else None)
    out.setdefault("vocab_hash", ck["vocab_hash"])
    return trainer, out
