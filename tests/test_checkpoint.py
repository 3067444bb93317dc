"""Checkpoints: the export format, atomic writes, retention, verification and bad inputs.

These tests need no training step: a Trainer with seeded weights, a fake step count and
moments written by hand is enough to check that everything round-trips bit for bit.
"""

import json
import logging
import os

import numpy as np
import pytest
from safetensors import safe_open
from safetensors.numpy import load_file, save_file

from tests.model_helpers import byte_vocabulary, tiny_config
from trainer_svc.training.checkpoint import (MANIFEST_FILE, MODEL_FILE, OPTIMIZER_FILE, STATE_FILE,
                                    CheckpointError, CheckpointManager, load_checkpoint,
                                    prune_debris, sha256_file, verify_checkpoint,
                                    vocab_content_hash)
from trainer_svc.training.trainer import TrainConfig, Trainer


@pytest.fixture(scope="module")
def vocab_file(tmp_path_factory):
    return byte_vocabulary(tmp_path_factory.mktemp("vocab") / "bytes.tiktoken", extra=20)


def _trainer(device, step=7, seed=3):
    tr = Trainer(tiny_config(), TrainConfig(batch=2, seq=16, precision="fp32", seed=seed),
                 device)
    rng = np.random.default_rng(seed)
    shapes = {t.name: t.shape for t in tr.layout}  # gaps between tensors stay zero
    tr.load_optimizer_state(
        tr.layout.pack({n: rng.standard_normal(s) for n, s in shapes.items()}),
        tr.layout.pack({n: rng.random(s) for n, s in shapes.items()}))
    tr.step_count, tr.tokens_seen = step, step * 32
    tr.recent_losses.extend([5.0, 4.5, 4.25])
    tr.rng.random(5)
    return tr


def _files(path):
    return {p.relative_to(path).as_posix(): p.read_bytes() for p in path.rglob("*")
            if p.is_file()}


def test_save_writes_the_export_format_and_loads_back_exactly(device, tmp_path, vocab_file):
    tr = _trainer(device)
    mgr = CheckpointManager(tmp_path / "run", keep_last=3)
    path = mgr.save(tr, {"data_position": {"epoch": 0, "shard": 1, "offset": 64},
                         "job": "abc"}, vocab_file=vocab_file)
    assert path.name == "step_00000007"
    assert (tmp_path / "run" / "latest").resolve() == path.resolve()
    assert sorted(p.name for p in path.iterdir()) == sorted(
        [MANIFEST_FILE, MODEL_FILE, OPTIMIZER_FILE, STATE_FILE, "vocab"])
    manifest = json.loads((path / MANIFEST_FILE).read_text())
    assert set(manifest["files"]) == {MODEL_FILE, OPTIMIZER_FILE, STATE_FILE,
                                      "vocab/bytes.tiktoken", "vocab/bytes.tiktoken.json"}
    for rel, entry in manifest["files"].items():
        assert sha256_file(path / rel) == entry["sha256"]
    with safe_open(str(path / MODEL_FILE), framework="numpy") as fh:
        meta = fh.metadata()
    assert meta["format"] == "istanbul-checkpoint" and meta["format_version"] == "1"
    assert meta["layout_hash"] == tr.layout.hash and meta["step"] == "7"
    assert json.loads(meta["config"]) == tr.model_config.to_dict()
    assert meta["vocab_hash"] == vocab_content_hash(vocab_file)
    weights = load_file(str(path / MODEL_FILE))
    assert all(w.dtype == np.float32 for w in weights.values())
    assert not any(p.name.startswith(".tmp") for p in (tmp_path / "run").iterdir())

    loaded, state = load_checkpoint(tmp_path / "run" / "latest", device,
                                    expected_vocab_hash=vocab_content_hash(vocab_file))
    np.testing.assert_array_equal(loaded.parameters(), tr.parameters())
    for key in ("m", "v"):
        np.testing.assert_array_equal(loaded.optimizer_state()[key], tr.optimizer_state()[key])
    assert (loaded.step_count, loaded.tokens_seen) == (7, 224)
    assert list(loaded.recent_losses) == [5.0, 4.5, 4.25]
    assert loaded.rng.random() == tr.rng.random()
    assert state["data_position"] == {"epoch": 0, "shard": 1, "offset": 64}
    assert state["job"] == "abc" and state["vocab_file"].endswith("vocab/bytes.tiktoken")
    assert state["vocab_hash"] == vocab_content_hash(vocab_file)
    # the caller's own keys come back untouched, even where they share a name with ours
    path2 = CheckpointManager(tmp_path / "run2").save(tr, {"vocab_hash": "mine"})
    assert load_checkpoint(path2, device)[1]["vocab_hash"] == "mine"
    # a run directory resolves to its newest valid checkpoint
    again, _ = load_checkpoint(tmp_path / "run", device)
    assert again.step_count == 7


def _corrupt(path, how):
    model = path / MODEL_FILE
    if how == "truncated":
        data = model.read_bytes()
        model.write_bytes(data[: len(data) // 2])
    elif how == "flipped":
        data = bytearray(model.read_bytes())
        data[len(data) - 100] ^= 0x01
        model.write_bytes(bytes(data))
    elif how == "no_manifest":
        (path / MANIFEST_FILE).unlink()
    elif how == "wrong_layout":
        # a consistent checkpoint (manifest re-signed) whose layout is not this build's
        with safe_open(str(model), framework="numpy") as fh:
            meta = dict(fh.metadata())
        weights = load_file(str(model))
        meta["layout_hash"] = "0123456789abcdef"
        save_file(weights, str(model), metadata=meta)
        manifest = json.loads((path / MANIFEST_FILE).read_text())
        manifest["files"][MODEL_FILE] = {"sha256": sha256_file(model),
                                         "bytes": model.stat().st_size}
        (path / MANIFEST_FILE).write_text(json.dumps(manifest))


@pytest.mark.parametrize("how,message", [
    ("truncated", r"model\.safetensors: \d+ bytes, manifest says"),
    ("flipped", r"model\.safetensors: sha256 does not match"),
    ("no_manifest", r"MANIFEST\.json: manifest missing"),
    ("wrong_layout", r"model\.safetensors: layout hash 0123456789abcdef does not match"),
])
def test_bad_checkpoints_are_refused_naming_the_file(device, tmp_path, how, message):
    tr = _trainer(device)
    path = CheckpointManager(tmp_path / "run").save(tr, {})
    _corrupt(path, how)
    before = _files(tmp_path)
    with pytest.raises(CheckpointError, match=message):
        load_checkpoint(path, device)
    assert _files(tmp_path) == before  # refusing loses and changes nothing


def test_other_vocabulary_is_refused(device, tmp_path, vocab_file):
    path = CheckpointManager(tmp_path / "run").save(_trainer(device), {}, vocab_file=vocab_file)
    other = byte_vocabulary(tmp_path / "other.tiktoken", extra=30, name="other")
    with pytest.raises(CheckpointError, match="another vocabulary"):
        load_checkpoint(path, device, expected_vocab_hash=vocab_content_hash(other))


def test_latest_valid_falls_back_and_logs_why(device, tmp_path, caplog):
    mgr = CheckpointManager(tmp_path / "run", keep_last=5)
    tr = _trainer(device, step=1)
    paths = []
    for step in (1, 2, 3):
        tr.step_count = step
        paths.append(mgr.save(tr, {"n": step}))
    _corrupt(paths[2], "flipped")
    _corrupt(paths[1], "no_manifest")
    with caplog.at_level(logging.WARNING):
        assert mgr.latest_valid() == paths[0]
    assert "step_00000003" in caplog.text and "sha256" in caplog.text
    assert "manifest missing" in caplog.text
    verify_checkpoint(paths[0])
    # saving the same step again replaces the unusable one and leaves nothing else behind;
    # the unusable step 2, now behind the run, goes too
    tr.step_count = 3
    new = mgr.save(tr, {})
    verify_checkpoint(new)
    assert sorted(p.name for p in mgr.run_dir.iterdir()) == \
        ["latest", "step_00000001", "step_00000003"]
    assert CheckpointManager(tmp_path / "empty").latest_valid() is None


def test_load_newest_falls_back_past_one_that_verifies_but_does_not_load(device, tmp_path):
    mgr = CheckpointManager(tmp_path / "run", keep_last=5)
    tr = _trainer(device, step=1)
    paths = []
    for step in (1, 2, 3):
        tr.step_count = step
        paths.append(mgr.save(tr, {"n": step}))
    _corrupt(paths[2], "wrong_layout")           # matches its manifest, cannot be loaded
    verify_checkpoint(paths[2])
    assert mgr.latest_valid() == paths[2]         # verification alone would pick it
    trainer, state, path = mgr.load_newest(device)
    assert path == paths[1] and trainer.step_count == 2 and state["n"] == 2
    [(skipped, reason)] = mgr.skipped
    assert skipped == paths[2] and "layout hash 0123456789abcdef does not match" in reason
    # a verified checkpoint whose state is malformed is skipped the same way
    state_file = paths[1] / STATE_FILE
    bad = json.loads(state_file.read_text())
    bad["rng"] = {"bit_generator": "nonsense"}
    state_file.write_text(json.dumps(bad))
    manifest = json.loads((paths[1] / MANIFEST_FILE).read_text())
    manifest["files"][STATE_FILE] = {"sha256": sha256_file(state_file),
                                     "bytes": state_file.stat().st_size}
    (paths[1] / MANIFEST_FILE).write_text(json.dumps(manifest))
    assert mgr.load_newest(device)[2] == paths[0]
    assert [p for p, _ in mgr.skipped] == [paths[2], paths[1]]
    for path in paths:
        _corrupt(path, "no_manifest")
    assert mgr.load_newest(device) is None


def test_prune_debris_removes_only_what_killed_writers_leave(device, tmp_path):
    mgr = CheckpointManager(tmp_path / "run", keep_last=5)
    tr = _trainer(device, step=4)
    good = mgr.save(tr, {})
    run = tmp_path / "run"
    debris = [".tmp-step_00000005-123-456", "step_00000003.superseded-1700000000",
              ".latest.tmp-99"]
    (run / debris[0]).mkdir()
    (run / debris[0] / MODEL_FILE).write_bytes(b"half")
    (run / debris[1]).mkdir()
    os.symlink("step_00000004", run / debris[2])
    kept = ["notes.txt", "vocab", "step_00000004", "latest"]
    (run / "notes.txt").write_text("mine")
    (run / "vocab").mkdir()
    assert sorted(prune_debris(run)) == sorted(debris)
    assert sorted(p.name for p in run.iterdir()) == sorted(kept)
    verify_checkpoint(good)
    assert prune_debris(run) == [] and prune_debris(tmp_path / "absent") == []


def test_a_refusing_fence_leaves_no_checkpoint_and_no_debris(device, tmp_path):
    def lost():
        raise RuntimeError("the lease is someone else's")
    mgr = CheckpointManager(tmp_path / "run")
    tr = _trainer(device, step=1)
    first = mgr.save(tr, {})
    mgr.fence = lost
    tr.step_count = 2
    with pytest.raises(RuntimeError, match="someone else's"):
        mgr.save(tr, {})
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == ["latest", first.name]
    assert os.readlink(tmp_path / "run" / "latest") == first.name


def test_retention_keeps_last_k_and_every_mth(device, tmp_path):
    mgr = CheckpointManager(tmp_path / "run", keep_last=2, keep_every=2)
    tr = _trainer(device)
    for step in range(1, 8):
        tr.step_count = step
        mgr.save(tr, {})
    assert [s for s, _ in mgr.checkpoints()] == [2, 4, 6, 7]
    assert os.readlink(tmp_path / "run" / "latest") == "step_00000007"


def test_resolve_errors_are_clear(device, tmp_path):
    with pytest.raises(CheckpointError, match="no such checkpoint"):
        load_checkpoint(tmp_path / "nope", device)
    (tmp_path / "emptyrun").mkdir()
    with pytest.raises(CheckpointError, match="no valid checkpoint"):
        load_checkpoint(tmp_path / "emptyrun", device)


# ---- retention after a resume that skipped unusable checkpoints --------------------------------

def _train_and_save(mgr, trainer, until, every, run):
    """A job's loop: real training steps, a checkpoint every `every` steps up to `until`."""
    rng = np.random.default_rng(trainer.step_count)
    tc = trainer.train_config
    while trainer.step_count < until:
        batch = rng.integers(0, trainer.model_config.vocab_size, size=(tc.batch, tc.seq + 1),
                             dtype=np.uint32)
        assert not trainer.step(batch).skipped
        if trainer.step_count % every == 0:
            mgr.save(trainer, {"run": run})


def _resume(device, run_dir, keep_last, keep_every):
    """What a (re)started job does (bridge.open_run, then the daemon): the newest usable
    checkpoint or a fresh trainer, then retention."""
    mgr = CheckpointManager(run_dir, keep_last=keep_last, keep_every=keep_every)
    loaded = mgr.load_newest(device)
    trainer = loaded[0] if loaded is not None else \
        Trainer(tiny_config(), TrainConfig(batch=2, seq=16, precision="fp32", seed=5), device)
    mgr.apply_retention()
    return mgr, trainer


@pytest.mark.parametrize("corrupt,keep_last,keep_every,every,resumed_at,kept", [
    ([6], 3, 0, 2, 4, [6, 8, 10]),         # the newest: resumed from the one before
    ([2, 6], 3, 0, 2, 4, [6, 8, 10]),      # and an old one (counted until retention drops it)
    ([2, 4, 6], 3, 0, 2, 0, [6, 8, 10]),   # every one: from scratch
    ([4, 6], 3, 4, 2, 2, [4, 6, 8, 10]),   # keep_every keeps the rewritten multiple
    ([6], 3, 0, 5, 4, [4, 5, 10]),         # resumed with another interval: 6 is never
])                                         # rewritten, and goes once the run passes it
def test_a_resume_past_unusable_checkpoints_still_keeps_only_keep_last(
        device, tmp_path, corrupt, keep_last, keep_every, every, resumed_at, kept):
    run_dir = tmp_path / "run"
    first, trainer = _resume(device, run_dir, keep_last, keep_every)
    _train_and_save(first, trainer, 6, 2, run=1)
    assert [s for s, _ in first.checkpoints()] == [2, 4, 6]
    for step in corrupt:
        _corrupt(run_dir / f"step_{step:08d}", "flipped")   # fails the manifest's sha256

    mgr, trainer = _resume(device, run_dir, keep_last, keep_every)
    assert trainer.step_count == resumed_at
    assert [p.name for p, _ in mgr.skipped] == \
        [f"step_{s:08d}" for s in reversed(corrupt) if s > resumed_at]
    assert [s for s, _ in mgr.checkpoints()] == [2, 4, 6]   # unusable ones ahead stay
    _train_and_save(mgr, trainer, 10, every, run=2)

    assert [s for s, _ in mgr.checkpoints()] == kept
    assert sorted(p.name for p in run_dir.iterdir()) == \
        ["latest"] + [f"step_{s:08d}" for s in kept]      # and no debris
    assert os.readlink(run_dir / "latest") == "step_00000010"
    for step, path in mgr.checkpoints():
        verify_checkpoint(path)
        state = json.loads((path / STATE_FILE).read_text())
        assert state["caller"]["run"] == (2 if step > resumed_at else 1)
    # the next resume finds every one usable and removes nothing
    again, _ = _resume(device, run_dir, keep_last, keep_every)
    assert again.skipped == [] and [s for s, _ in again.checkpoints()] == kept
