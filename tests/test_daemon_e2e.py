"""prepare -> submit -> train (tiny) -> checkpoints -> done, through the real CLI, the real gRPC
tokenizer service and the embedded Redis server (no URL anywhere: the default path)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from istanbul.cli import main
from trainer_svc.training.checkpoint import load_checkpoint, verify_checkpoint

from .daemon_helpers import training_texts
from .redis_helpers import REPO, istanbul_cmd, istanbul_env
from .service_support import start_server, write_tiny_vocabulary

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def vocab_path(tmp_path_factory) -> Path:
    return write_tiny_vocabulary(tmp_path_factory.mktemp("vocab"))


@pytest.fixture(scope="module")
def service(device, vocab_path):
    from tokenizer_svc.encoding import get_encoding
    srv = start_server(get_encoding(str(vocab_path), device=device), device)
    yield srv
    srv.stop()


def run_cli(capsys, *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_prepare_submit_train_checkpoints_done(service, vocab_path, tmp_path, capsys,
                                              monkeypatch, device):
    monkeypatch.delenv("REDIS_URL", raising=False)
    data = tmp_path / "data"
    store = ["--data-dir", str(data)]
    docs = tmp_path / "docs"
    docs.mkdir()
    for k, text in enumerate(training_texts()):
        (docs / f"{k}.txt").write_text(text, encoding="utf-8")

    code, out, err = run_cli(capsys, "prepare", str(docs), "--tokenizer", service.target,
                             "--dataset", "docs", "--shard-tokens", "2048", "--vocab",
                             str(vocab_path), "--no-progress", *store)
    assert code == 0, err
    code, out, _ = run_cli(capsys, "datasets", "--json", *store)
    [info] = json.loads(out)
    assert info["name"] == "docs" and info["shards"] >= 2

    spec = tmp_path / "job.toml"
    spec.write_text('dataset = "docs"\nmodel = "tiny"\nsteps = 99\nbatch = 4\nseq = 32\n'
                    'lr = 3e-3\nwarmup = 2\ncheckpoint_every = 5\nkeep_last = 2\n'
                    'eval_every = 6\neval_batches = 2\n')
    code, out, err = run_cli(capsys, "submit", "--spec", str(spec), "--steps", "12", *store)
    assert code == 0, err
    job = out.strip()

    env = istanbul_env()
    watcher = subprocess.Popen(istanbul_cmd("watch", job, *store), cwd=REPO, env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    trainer = subprocess.run(istanbul_cmd("trainer", "--checkpoints", str(tmp_path / "ckpt"),
                                          "--exit-when-idle", *store),
                             cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert trainer.returncode == 0, trainer.stderr[-3000:]
    watched_out, watched_err = watcher.communicate(timeout=60)
    assert watcher.returncode == 0, watched_err[-2000:]
    assert f"job {job} done: 12 steps" in watched_out

    code, out, _ = run_cli(capsys, "status", job, "--json", "--events", "50", *store)
    status = json.loads(out)
    assert status["state"] == "done" and status["step"] == 12 and status["total_steps"] == 12
    assert status["spec"]["steps"] == 12 and status["spec"]["checkpoint_every"] == 5
    assert status["loss"] is not None and status["eval_loss"] is not None
    assert status["tokens"] == 12 * 4 * 32
    from istanbul.shaders.engine import default_device     # the daemon names the adapter it trains on
    info = default_device().info
    assert status["adapter"] == (f"{info.name} (software Vulkan)" if info.is_software
                                 else f"{info.name} ({info.adapter_type})")
    names = [Path(p).name for p in status["checkpoints"]]
    assert names == ["step_00000010", "step_00000012"]     # keep_last 2 pruned step 5
    kinds = [e["type"] for e in status["events"]]
    assert kinds[0] == "submitted" and kinds[-1] == "done"
    assert kinds.count("checkpoint") == 3 and kinds.count("eval") == 2

    ckpt = Path(status["checkpoint"])
    assert ckpt == tmp_path / "ckpt" / job / "step_00000012"
    verify_checkpoint(ckpt)
    assert (ckpt / "vocab" / "tiny.tiktoken").read_bytes() == vocab_path.read_bytes()
    trainer_obj, state = load_checkpoint(ckpt, device)
    assert trainer_obj.step_count == 12 and state["job_id"] == job
    assert state["data_position"]["window"] > 0            # shuffled (the default) position

    code, out, _ = run_cli(capsys, "status", job, *store)
    assert f"job {job}: done  step 12/12 (100.0%)" in out
    code, out, _ = run_cli(capsys, "jobs", *store)
    assert job in out and "done" in out
    code, out, _ = run_cli(capsys, "cancel", job, *store)
    assert "already finished (done)" in out
    code, _, err = run_cli(capsys, "status", "nope", *store)
    assert code == 1 and "no job 'nope'" in err
    code, _, err = run_cli(capsys, "submit", "--dataset", "missing", "--steps", "3", *store)
    assert code == 1 and "no dataset 'missing'" in err
    code, _, err = run_cli(capsys, "submit", "--dataset", "docs", "--steps", "3", "--seq",
                           "999", *store)
    assert code == 1 and "exceeds the model's max_seq" in err
    stop_embedded(data)


def stop_embedded(data_dir: Path) -> None:
    """The CLI calls above left the embedded server to this process's exit; stop it now."""
    import redis
    from trainer_svc.jobs.redis_conn import connect
    handle = connect(data_dir=data_dir)
    path = handle.binary.connection_pool.connection_kwargs["path"]
    handle.close()
    try:
        redis.Redis(unix_socket_path=path).shutdown(nosave=True)
    except redis.ConnectionError:
        pass                                             # already stopped by close()


def test_bench_end_to_end_script_passes_its_checks_at_tiny_size(vocab_path, tmp_path):
    """bench/daemon_e2e.py is what runs on the H200; here at the tiny size on this machine."""
    import sys
    docs = tmp_path / "docs"
    docs.mkdir()
    for k, text in enumerate(training_texts()):
        (docs / f"{k}.txt").write_text(text, encoding="utf-8")
    out = tmp_path / "out"
    done = subprocess.run(
        [sys.executable, "bench/daemon_e2e.py", "--out", str(out), "--vocab", str(vocab_path),
         "--model", "tiny", "--steps", "24", "--batch", "4", "--seq", "32",
         "--checkpoint-every", "10", "--kill-at", "13", "--lease-ttl", "2", "--corpus",
         str(docs), "--include", "*.txt", "--timeout", "500"],
        cwd=REPO, env=istanbul_env(), capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert all(summary["checks"].values()), summary["checks"]
    assert summary["resumed_from_step"] == 10 and summary["attempts"] == 2
    assert summary["recomputed_steps"] >= 3 and summary["max_recomputed_loss_rel_diff"] < 1e-6
    assert len(json.loads((out / "loss_curve.json").read_text())) == 24
