"""`istanbul dashboard` without a browser: what it reads from a real Redis (jobs in every
status, made with the queue's own scripts and leases), its HTTP API and stream from the real
server process, the token rules, re-queueing a job that a real daemon then trains to the end,
a real tokenizer service's metrics registry read over HTTP, and the CLI's errors."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from istanbul.dashboard.actions import NoSuchJob, requeue
from istanbul.dashboard.reader import Reader, job_status
from istanbul.dashboard.tokenizer_metrics import TokenizerMetrics, quantile
from trainer_svc.jobs import keys
from trainer_svc.jobs.daemon import Daemon, DaemonConfig
from trainer_svc.jobs.queue import JobQueue, event
from trainer_svc.jobs.lease import Lease

from .daemon_helpers import make_dataset, submit, tiny_vocabulary
from .dashboard_helpers import Dashboard
from .redis_helpers import REPO, istanbul_env

TOKEN = "dashboard-test-token"


def _running(queue, job, owner, adapter="llvmpipe (software Vulkan)"):
    lease = Lease(queue.handle, job, owner, 30)
    assert lease.acquire()
    assert queue.fenced(job, owner, hset={"state": "running", "owner": owner, "step": 3,
                                          "adapter": adapter},
                        events=[event("progress", step=1, loss=5.0, lr=1e-3, grad_norm=2.0,
                                      tokens_per_s=100.0),
                                event("progress", step=2, loss=4.5, lr=2e-3, grad_norm=1.5,
                                      tokens_per_s=120.0),
                                event("loss_scale_backoff", step=3, scale=32768.0)],
                        curve=[1, 5.0, 2, 4.5, "eval:2", 4.8])
    return lease


@pytest.fixture
def jobs_in_every_status(handle, tmp_path):
    """queued, leased, running, stalled, dead-lettered, cancelled: one job each."""
    _, vocab = tiny_vocabulary(tmp_path / "vocab")
    make_dataset(handle, "docs", vocab, shard_tokens=2048)
    queue = JobQueue(handle)
    ids = {s: submit(handle, "docs", f"job-{s}", steps=10)
           for s in ("queued", "leased", "running", "stalled", "dead", "cancelled")}
    Lease(handle, ids["leased"], "host:1:aaaa", 30).acquire()
    _running(queue, ids["running"], "host:2:bbbb")
    _running(queue, ids["stalled"], "host:3:cccc").release()          # its daemon died
    owner = "host:4:dddd"
    Lease(handle, ids["dead"], owner, 30).acquire()
    assert queue.fenced(ids["dead"], owner, hset={"state": "failed", "error": "bad shard"},
                        dead={"job": ids["dead"], "error": "bad shard", "failures": 1,
                              "reason": "bad input", "at": 1.0}, release=True)
    assert queue.cancel(ids["cancelled"]) == "cancelled"
    for name in ("host:2:bbbb", "host:5:eeee"):      # two daemons reading the queue
        handle.text.xgroup_createconsumer(keys.JOBS_STREAM, keys.JOBS_GROUP, name)
    return ids


def test_the_snapshot_shows_every_status_the_daemons_and_the_datasets(handle,
                                                                      jobs_in_every_status):
    ids = jobs_in_every_status
    snap = Reader(handle).snapshot()
    assert snap["counts"] == {"queued": 1, "leased": 1, "running": 1, "stalled": 1, "done": 0,
                              "failed": 0, "dead-lettered": 1, "cancelled": 1}
    rows = {row["id"]: row for row in snap["jobs"]}
    assert {rows[job]["status"] for job in ids.values()} == {
        "queued", "leased", "running", "stalled", "dead-lettered", "cancelled"}
    assert rows[ids["dead"]]["status"] == "dead-lettered"
    assert rows[ids["dead"]]["error"] == "bad shard"
    assert rows[ids["running"]]["owner"] == "host:2:bbbb"
    assert 25 < rows[ids["running"]]["lease_ttl_s"] <= 30
    assert rows[ids["stalled"]]["lease_ttl_s"] is None
    assert [d["job"] for d in snap["dead_letters"]] == [ids["dead"]]
    [dataset] = snap["datasets"]
    assert dataset["name"] == "docs" and dataset["shards"] >= 2 and dataset["tokens"] > 0
    daemons = {d["name"]: d for d in snap["daemons"]}
    assert set(daemons) == {"host:2:bbbb", "host:5:eeee"}
    assert daemons["host:2:bbbb"]["jobs"] == [ids["running"]]
    assert daemons["host:2:bbbb"]["adapter"] == "llvmpipe (software Vulkan)"
    assert daemons["host:5:eeee"]["alive"] and daemons["host:5:eeee"]["jobs"] == []


def test_a_jobs_detail_and_its_updates(handle, jobs_in_every_status, tmp_path):
    job = jobs_in_every_status["running"]
    reader = Reader(handle)
    detail = reader.job_detail(job)
    assert detail["job"]["status"] == "running" and detail["spec"]["steps"] == 10
    assert detail["loss"] == [[1, 5.0], [2, 4.5]] and detail["eval_loss"] == [[2, 4.8]]
    assert detail["series"]["lr"] == [[1, 1e-3], [2, 2e-3]]
    assert detail["series"]["tokens_per_s"] == [[1, 100.0], [2, 120.0]]
    assert detail["loss_scale_backoffs"] == [{"step": 3, "scale": 32768.0}]
    assert [e["type"] for e in detail["events"]] == ["submitted", "loss_scale_backoff"]
    assert detail["job"]["lease"]["holder"] == "host:2:bbbb"

    queue = JobQueue(handle)
    queue.fenced(job, "host:2:bbbb", events=[event("progress", step=3, loss=4.0, lr=3e-3,
                                                   grad_norm=1.0, tokens_per_s=130.0),
                                             event("eval", step=3, loss=4.2)],
                 curve=[3, 4.0, "eval:3", 4.2])
    update = reader.job_update(job, detail["last_event_id"])
    assert update["loss"] == [[3, 4.0]] and update["eval_loss"] == [[3, 4.2]]
    assert update["series"]["grad_norm"] == [[3, 1.0]]
    assert [e["type"] for e in update["events"]] == ["eval"] and not update["reload"]
    assert reader.job_update(job, update["last_event_id"])["loss"] == []
    assert reader.job_detail("no-such-job") is None


def test_checkpoints_are_listed_with_step_size_and_verification(handle, device, tmp_path):
    from istanbul.dashboard.checkpoints import CheckpointInspector
    from .daemon_helpers import wait_for
    _, vocab = tiny_vocabulary(tmp_path / "vocab")
    make_dataset(handle, "docs", vocab, shard_tokens=2048)
    job = submit(handle, "docs", steps=4, checkpoint_every=2, keep_last=3)
    Daemon(handle, DaemonConfig(checkpoint_root=tmp_path / "ckpt", lease_ttl_s=5, poll_ms=100,
                                exit_when_idle=True), device=device).run()
    inspector = CheckpointInspector()
    reader = Reader(handle, inspector)
    wait_for(lambda: all(c["verified"] for c in reader.job_summary(job)["checkpoints"]), 60,
             what="the checkpoints' verification")
    listed = reader.job_summary(job)["checkpoints"]
    assert [c["step"] for c in listed] == [2, 4]
    assert all(c["readable"] and c["bytes"] > 10_000 for c in listed)
    # a corrupted file is found by the next look (the manifest's time changes with it)
    model = tmp_path / "ckpt" / job / "step_00000004" / "model.safetensors"
    data = bytearray(model.read_bytes())
    data[-1] ^= 0xFF
    model.write_bytes(bytes(data))
    manifest = model.parent / "MANIFEST.json"
    os.utime(manifest, ns=(manifest.stat().st_atime_ns, manifest.stat().st_mtime_ns + 10**9))
    wait_for(lambda: reader.job_summary(job)["checkpoints"][1]["verified"] is False, 60,
             what="the corrupted checkpoint's verdict")
    assert "sha256 does not match" in reader.job_summary(job)["checkpoints"][1]["problem"]
    gone = inspector.describe(str(tmp_path / "elsewhere" / "step_00000008"))
    assert gone["step"] == 8 and not gone["readable"] and gone["verified"] is None
    inspector.close()


def test_a_requeued_job_is_trained_to_the_end_by_a_real_daemon(handle, device, tmp_path):
    _, vocab = tiny_vocabulary(tmp_path / "vocab")
    make_dataset(handle, "docs", vocab, shard_tokens=2048)
    queue = JobQueue(handle)
    job = submit(handle, "docs", steps=3)
    assert queue.cancel(job) == "cancelled"     # its stream entry is still unread
    assert requeue(queue, job) == "queued"
    rec = queue.get(job)
    assert rec.state == "queued" and rec.raw.get("cancel_requested") is None
    assert [kind for _, kind, _ in queue.events(job)][-1] == "requeued"
    Daemon(handle, DaemonConfig(checkpoint_root=tmp_path / "ckpt", lease_ttl_s=5, poll_ms=100,
                                exit_when_idle=True), device=device).run()
    rec = queue.get(job)
    assert rec.state == "done" and rec.get_int("step") == 3, rec.raw
    assert rec.get_int("attempts") == 1        # the stale first entry was dropped, not run
    assert requeue(queue, job) == "done"       # nothing left to train
    with pytest.raises(NoSuchJob):
        requeue(queue, "no-such-job")


def test_job_status_rules():
    assert job_status("queued", False, False) == "queued"
    assert job_status("queued", True, False) == "leased"
    assert job_status("running", True, False) == "running"
    assert job_status("running", False, False) == "stalled"
    assert job_status("failed", False, True) == "dead-lettered"
    assert job_status("failed", False, False) == "failed"
    assert job_status("done", False, False) == "done"


# ---- the HTTP server ------------------------------------------------------------------------

@pytest.fixture
def dashboards(redis_server, handle, jobs_in_every_status, tmp_path):
    token_file = tmp_path / "tokens.txt"
    token_file.write_text(f"# dashboard tokens\n{TOKEN}\n")
    with_token = Dashboard(tmp_path, redis_server.url, "--auth-token-file", str(token_file),
                           "--refresh", "0.2", name="with-token")
    read_only = Dashboard(tmp_path, redis_server.url, "--refresh", "0.2", name="read-only")
    yield with_token, read_only
    codes = [dash.stop() for dash in (with_token, read_only)]     # both, whatever happens
    assert codes == [0, 0], with_token.output() + read_only.output()


def test_http_api_stream_and_the_token_rules(dashboards, jobs_in_every_status, handle):
    dash, read_only = dashboards
    ids = jobs_in_every_status
    status, page, _ = dash.get_text("/")
    assert status == 200 and "istanbul dashboard" in page and "cdn" not in page.lower()
    status, script, _ = dash.get_text("/static/vendor/uplot/uPlot.iife.min.js")
    assert script.startswith("/*! https://github.com/leeoniya/uPlot (v1.6.32) */")
    assert dash.call("/api/config")[1]["actions"] is True
    config = read_only.call("/api/config")[1]
    assert config["actions"] is False and "read-only" in config["read_only_reason"]
    snap = dash.call("/api/snapshot")[1]
    assert snap["counts"]["running"] == 1 and snap["tokenizer"] is None
    assert dash.call(f"/api/jobs/{ids['running']}")[1]["loss"] == [[1, 5.0], [2, 4.5]]
    assert dash.call("/api/jobs/nope")[0] == 404
    assert dash.call("/api/jobs/.hidden")[0] == 400

    events = dash.stream_events(f"/api/stream?job={ids['running']}", {"snapshot", "job"})
    assert events["job"]["job"]["id"] == ids["running"]
    assert events["snapshot"]["counts"]["stalled"] == 1

    queued = ids["queued"]
    status, body, headers = dash.call(f"/api/jobs/{queued}/cancel", "POST")
    assert status == 401 and "Bearer" in headers["WWW-Authenticate"]
    assert "missing credentials" in body["error"] and "token field" in body["error"]
    status, body, _ = dash.call(f"/api/jobs/{queued}/cancel", "POST", token="wrong")
    assert status == 401 and "invalid bearer token" in body["error"]
    status, body, _ = read_only.call(f"/api/jobs/{queued}/cancel", "POST", token=TOKEN)
    assert status == 403 and "--auth-token-file" in body["error"]
    assert JobQueue(handle).get(queued).state == "queued"          # nothing was changed

    status, body, _ = dash.call(f"/api/jobs/{queued}/cancel", "POST", token=TOKEN)
    assert status == 200 and body["result"] == "cancelled", body
    status, body, _ = dash.call(f"/api/jobs/{ids['running']}/cancel", "POST", token=TOKEN)
    assert body["result"] == "cancel_requested" and "after the current step" in body["message"]
    status, body, _ = dash.call(f"/api/jobs/{ids['dead']}/requeue", "POST", token=TOKEN)
    assert status == 200 and body["result"] == "queued"
    rec = JobQueue(handle).get(ids["dead"])
    assert rec.state == "queued" and rec.raw["last_error"] == "bad shard"
    status, body, _ = dash.call(f"/api/jobs/{ids['stalled']}/requeue", "POST", token=TOKEN)
    assert body["result"] == "running" and "only a failed or cancelled" in body["message"]
    assert dash.call("/api/jobs/nope/requeue", "POST", token=TOKEN)[0] == 404


# ---- a tokenizer service's metrics ----------------------------------------------------------

def test_tokenizer_metrics_from_a_real_service_registry():
    from tokenizer_svc.exposure import serve_metrics
    from tokenizer_svc.service.metrics import ServiceMetrics
    metrics = ServiceMetrics()
    server = serve_metrics(metrics.registry, "127.0.0.1", 0)
    guarded = serve_metrics(metrics.registry, "127.0.0.1", 0, tokens=("s3cret",))
    try:
        url = f"http://127.0.0.1:{server.server_port}/metrics"
        scrape = TokenizerMetrics(url)
        for _ in range(10):
            metrics.requests.labels(method="Encode", code="OK").inc()
            metrics.latency.labels(method="Encode").observe(0.004)
            metrics.batch_done(items=8, nbytes=4096, requests=2, seconds=0.003)
        first = scrape.read()
        assert first["ok"] and first["requests_per_s"] is None   # no rate from one read
        assert first["requests_total"] == 10
        assert first["batch_documents"]["mean"] == 8.0 and first["batch_requests"]["mean"] == 2
        for _ in range(90):
            metrics.requests.labels(method="Encode", code="OK").inc()
            metrics.latency.labels(method="Encode").observe(0.2)
        second = scrape.read()
        assert second["requests_per_s"] > 0 and second["window_s"] > 0
        lat = second["latency_s"]                     # the window's 90 calls, all at 0.2 s
        assert lat["count"] == 90 and 0.1 < lat["p50"] <= 0.25 and lat["p99"] <= 0.25
        refused = TokenizerMetrics(f"http://127.0.0.1:{guarded.server_port}/metrics").read()
        assert not refused["ok"] and "--metrics-auth" in refused["error"]
        nothing = TokenizerMetrics("http://127.0.0.1:9/metrics").read()
        assert not nothing["ok"] and "cannot read it" in nothing["error"]
    finally:
        for srv in (server, guarded):
            srv.shutdown()
            srv.server_close()


def test_quantiles_interpolate_inside_buckets():
    buckets = {0.1: 10.0, 0.2: 30.0, 0.5: 40.0, float("inf"): 40.0}
    assert quantile(0.25, buckets) == pytest.approx(0.1)
    assert quantile(0.5, buckets) == pytest.approx(0.15)
    assert quantile(1.0, buckets) == pytest.approx(0.5)
    assert quantile(0.5, {0.1: 0.0, float("inf"): 0.0}) is None
    assert quantile(0.99, {0.1: 1.0, float("inf"): 5.0}) == 0.1   # past the last bound


# ---- the command ----------------------------------------------------------------------------

def _run(code: str, *argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code, *argv], cwd=REPO, capture_output=True,
                          text=True, env=istanbul_env(), timeout=120)


def test_without_the_extra_the_command_names_it():
    done = _run("import sys; sys.modules['uvicorn'] = None\n"
                "from istanbul.cli import main; raise SystemExit(main(['dashboard']))")
    assert done.returncode == 1
    assert "istanbul dashboard needs uvicorn, an optional extra that is not installed: " \
           "pip install 'istanbul[dashboard]'" in done.stderr, done.stderr


def test_a_public_address_needs_listen_public(tmp_path):
    done = subprocess.run([sys.executable, "-m", "istanbul", "dashboard", "--host", "0.0.0.0",
                           "--data-dir", str(tmp_path)], cwd=REPO, capture_output=True,
                          text=True, env=istanbul_env(), timeout=120)
    assert done.returncode == 1 and "--host 0.0.0.0 is not a loopback address; add " \
                                    "--listen-public" in done.stderr, done.stderr


def test_building_the_parser_loads_no_web_stack():
    done = _run("import sys; from istanbul.cli import build_parser; build_parser()\n"
                "print([m for m in ('starlette', 'uvicorn', 'tensorboardX', 'tensorboard', "
                "'istanbul.dashboard.app') if m in sys.modules])")
    assert done.stdout.strip() == "[]", done.stdout + done.stderr
