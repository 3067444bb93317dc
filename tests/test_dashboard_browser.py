"""The dashboard in a real browser (headless Chromium, driven by Playwright) while a real
daemon trains a real job on the GPU adapter (lavapipe here) through a real Redis server:

- the page loads without console errors and lists the job;
- the job's loss curve gains points while it trains (the page never reloads: server-sent
  events), held-out points and verified checkpoints appear;
- cancel is refused without the token (401, the page says why) and works with it; re-queue
  brings the job back, the daemon resumes it from its checkpoint and the curve goes on;
- a dashboard started without --auth-token-file says it is read-only and its buttons get 403.

ISTANBUL_DASHBOARD_SCREENSHOT=PATH saves a screenshot of the page with the job's curves (the
committed one: bench/results/dashboard/dashboard.png).
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from trainer_svc.jobs.queue import JobQueue
from trainer_svc.jobs.redis_conn import connect

from .daemon_helpers import DaemonProcess, make_dataset, submit, tiny_vocabulary, wait_for
from .dashboard_helpers import Dashboard, ConsoleLog, chromium, require_browser
from .redis_helpers import RedisServer

pytestmark = [pytest.mark.browser, pytest.mark.slow]

TOKEN = "browser-test-token"
WAIT_MS = 60_000


@pytest.fixture(scope="module")
def training(tmp_path_factory):
    """A Redis server, a dataset, a long job (cancelled by the test) and a daemon training it,
    and a dashboard with a token file. Redis is this module's own (the embedded default's
    binary): these tests are about the page, not about Redis versions."""
    require_browser()                   # skip before starting anything
    tmp = tmp_path_factory.mktemp("dashboard-browser")
    server = RedisServer(tmp / "redis").start()
    handle = connect(server.url)
    _, vocab = tiny_vocabulary(tmp / "vocab")
    make_dataset(handle, "docs", vocab, shard_tokens=2048)
    job = submit(handle, "docs", "tiny-demo", steps=5000, eval_every=20, eval_batches=1,
                 checkpoint_every=40, keep_last=3)
    token_file = tmp / "tokens.txt"
    token_file.write_text(TOKEN + "\n")
    dashboard = daemon = None
    try:
        dashboard = Dashboard(tmp, server.url, "--auth-token-file", str(token_file),
                              "--refresh", "0.5")
        daemon = DaemonProcess(server.url, tmp / "ckpt", tmp / "daemon.log", "--lease-ttl",
                               "10")
        yield {"tmp": tmp, "server": server, "queue": JobQueue(handle), "job": job,
               "dashboard": dashboard}
    finally:
        if daemon is not None:
            daemon.signal(signal.SIGTERM)
            daemon.wait(60)
            daemon.stop()
        if dashboard is not None:
            dashboard.stop()
        handle.close()
        server.stop()


def _points(page) -> int:
    return int(page.get_attribute("#loss-chart", "data-points"))


def test_a_training_job_live_in_the_browser_and_cancel_with_the_token(training):
    queue, job, dash = training["queue"], training["job"], training["dashboard"]
    with chromium(training["tmp"] / "profile") as browser:
        page = browser.new_page()
        console = ConsoleLog(page)
        page.goto(dash.url + "/")
        row = page.locator(f'tr.job-row[data-job="{job}"]')
        row.wait_for(timeout=WAIT_MS)
        page.wait_for_selector("#live[data-live='1']", timeout=WAIT_MS)
        assert console.unexpected() == []

        row.click()                                        # -> #job=ID, the job's panel
        page.wait_for_selector("#job-detail[data-status='running']", timeout=WAIT_MS)
        page.wait_for_function("Number(document.querySelector('#loss-chart').dataset.points)"
                               " > 0", timeout=WAIT_MS)
        before = _points(page)
        url_before = page.url
        page.wait_for_function("Number(document.querySelector('#loss-chart').dataset.points)"
                               f" >= {before + 30}", timeout=WAIT_MS)
        assert page.url == url_before                      # no reload: the stream did it
        page.wait_for_function("Number(document.querySelector('#loss-chart')"
                               ".dataset.evalPoints) >= 3", timeout=WAIT_MS)
        page.locator("#checkpoints td", has_text="✓ verified").first.wait_for(timeout=WAIT_MS)
        assert queue.get(job).raw["adapter"] in page.inner_text("#job-summary")
        assert page.locator("#daemons tbody tr").count() == 1
        assert "docs" in page.locator("#datasets").inner_text()
        assert console.unexpected() == []
        shot = os.environ.get("ISTANBUL_DASHBOARD_SCREENSHOT")
        if shot:      # a longer curve for the picture (about 25 s more)
            page.wait_for_function("Number(document.querySelector('#loss-chart')"
                                   ".dataset.lastStep) >= 400", timeout=120_000)
            page.wait_for_timeout(1500)    # the newest checkpoint's verification
            Path(shot).parent.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=shot, full_page=True)

        # without the token: refused, and the page says why; the job trains on
        page.click("#cancel")
        page.wait_for_selector("#action-message[data-status='401']", timeout=WAIT_MS)
        message = page.inner_text("#action-message")
        assert "refused (401)" in message and "token" in message
        assert queue.get(job).state == "running" and not queue.cancel_requested(job)

        page.fill("#token", TOKEN)
        page.click("#cancel")
        page.wait_for_selector("#action-message[data-status='200']", timeout=WAIT_MS)
        assert "cancel requested" in page.inner_text("#action-message")
        page.wait_for_selector("#job-detail[data-status='cancelled']", timeout=WAIT_MS)
        assert queue.get(job).state == "cancelled"
        stopped_at = queue.get(job).get_int("step")

        # re-queue: the daemon resumes it from its checkpoint and the curve goes on
        page.click("#requeue")
        page.wait_for_function("document.querySelector('#action-message').textContent"
                               ".includes('re-queued')", timeout=WAIT_MS)
        wait_for(lambda: queue.get(job).get_int("step") > stopped_at + 5, 120,
                 what="the re-queued job to train past where it stopped")
        page.wait_for_function("Number(document.querySelector('#loss-chart').dataset.lastStep)"
                               f" > {stopped_at + 5}", timeout=WAIT_MS)
        assert "resumed" in page.inner_text("#events")
        page.click("#cancel")
        page.wait_for_selector("#job-detail[data-status='cancelled']", timeout=WAIT_MS)

        # the one console error: the browser's note of the refused (401) request
        assert console.unexpected(allowed=("status of 401",)) == []


def test_a_dashboard_without_a_token_file_is_read_only(training):
    queue, job = training["queue"], training["job"]
    read_only = Dashboard(training["tmp"], training["server"].url, "--refresh", "0.5",
                          name="read-only")
    try:
        with chromium(training["tmp"] / "profile-read-only") as browser:
            page = browser.new_page()
            console = ConsoleLog(page)
            page.goto(f"{read_only.url}/#job={job}")
            page.wait_for_selector("#auth-banner:not([hidden])", timeout=WAIT_MS)
            assert "read-only" in page.inner_text("#auth-banner")
            page.wait_for_selector("#job-detail:not([hidden])", timeout=WAIT_MS)
            state = queue.get(job).state
            page.fill("#token", TOKEN)                  # a token does not help here
            page.click("#requeue")
            page.wait_for_selector("#action-message[data-status='403']", timeout=WAIT_MS)
            message = page.inner_text("#action-message")
            assert "refused (403)" in message and "--auth-token-file" in message
            assert queue.get(job).state == state
            assert console.unexpected(allowed=("status of 403",)) == []
    finally:
        assert read_only.stop() == 0, read_only.output()
