"""The dashboard's web app (Starlette): one page, a JSON API, a live stream and two actions.

    GET  /                         the page (static/index.html; its script draws everything)
    GET  /static/...               its script, style and the vendored uPlot (no CDN)
    GET  /api/config               Redis location, refresh, whether the buttons can work here
    GET  /api/snapshot             Reader.snapshot(), plus the tokenizer service's metrics
    GET  /api/jobs/{id}            Reader.job_detail()
    GET  /api/stream[?job=ID]      server-sent events: `snapshot` whenever it changes; with a
                                   job, `job` (its whole panel) first, then `update`s (new
                                   points and events, its summary) and a new `job` after a
                                   resume; `problem` while Redis cannot be read
    POST /api/jobs/{id}/cancel     actions.cancel       } bearer token from --auth-token-file:
    POST /api/jobs/{id}/requeue    actions.requeue      } 401 without a valid one, 403 when
                                                          the dashboard has no token file
Reading needs no token (the page is read-only without one); anything that changes a job does.
The token check is the tokenizer service's (tokenizer_svc/service/auth.py: the same file
format, every token compared in constant time). A browser does not attach an Authorization
header by itself, so another site cannot make a visitor's browser press the buttons.

Redis is read on worker threads (redis-py is blocking). One snapshot serves every open page
for `refresh_s`; each stream with a job reads that job's new events once per `refresh_s`.
"""

from __future__ import annotations

import json
import logging
import time
from functools import partial
from pathlib import Path

import anyio
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, StreamingResponse
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from trainer_svc.jobs.queue import check_job_id
from trainer_svc.jobs.redis_conn import REDIS_DOWN

from . import actions
from .reader import Reader

log = logging.getLogger(__name__)

STATIC = Path(__file__).resolve().parent / "static"
READ_ONLY = ("this dashboard is read-only: it was started without --auth-token-file. Restart "
             "it with --auth-token-file FILE to cancel or re-queue jobs here, or use `istanbul "
             "cancel JOB`")


class TokenCheck:
    """The service's bearer-token rule for the action endpoints."""

    def __init__(self, tokens: tuple[str, ...]):
        self.tokens = tuple(tokens)
        self._interceptor = None
        if self.tokens:
            from tokenizer_svc.service.auth import BearerAuthInterceptor
            self._interceptor = BearerAuthInterceptor(self.tokens)

    def refusal(self, request: Request) -> JSONResponse | None:
        """None when the request may act; else the 403 or 401 answer saying why."""
        if not self.tokens:
            return JSONResponse({"error": READ_ONLY, "status": 403}, status_code=403)
        header = request.headers.get("authorization")
        problem = self._interceptor.problem([("authorization", header)] if header else [])
        if problem is None:
            return None
        log.warning("dashboard: refused %s %s from %s: %s", request.method, request.url.path,
                    request.client.host if request.client else "?", problem)
        return JSONResponse(
            {"error": f"{problem.replace('metadata', 'header')}; enter a token from the "
                      "dashboard's --auth-token-file in the token field", "status": 401},
            status_code=401, headers={"WWW-Authenticate": 'Bearer realm="istanbul dashboard"'})


class Snapshots:
    """The overview, read at most once per `max_age_s` whoever asks."""

    def __init__(self, reader: Reader, tokenizer=None, max_age_s: float = 1.0):
        self.reader, self.tokenizer, self.max_age_s = reader, tokenizer, max_age_s
        self._lock = anyio.Lock()
        self._at = -1e9
        self._text = ""

    def _build(self) -> str:
        data = self.reader.snapshot()
        data["tokenizer"] = self.tokenizer.read() if self.tokenizer is not None else None
        return json.dumps(data)

    async def get(self) -> str:
        async with self._lock:
            if time.monotonic() - self._at >= self.max_age_s:
                self._text = await anyio.to_thread.run_sync(self._build)
                self._at = time.monotonic()
            return self._text


def _sse(kind: str, text: str) -> str:
    return f"event: {kind}\ndata: {text}\n\n"


def create_app(reader: Reader, *, tokens: tuple[str, ...] = (), tokenizer=None,
               refresh_s: float = 1.0) -> Starlette:
    check = TokenCheck(tokens)
    snapshots = Snapshots(reader, tokenizer, refresh_s)

    async def index(request: Request):
        return FileResponse(STATIC / "index.html", headers={"Cache-Control": "no-cache"})

    async def config(request: Request):
        return JSONResponse({
            "redis": reader.handle.location, "refresh_s": refresh_s,
            "actions": bool(check.tokens), "read_only_reason": None if check.tokens
            else READ_ONLY, "tokenizer_metrics": tokenizer.url if tokenizer else None})

    async def snapshot(request: Request):
        try:
            return JSONResponse(json.loads(await snapshots.get()))
        except REDIS_DOWN as exc:
            return JSONResponse({"error": f"Redis unreachable: {exc}"}, status_code=503)

    def _job_id(request: Request) -> str:
        return check_job_id(request.path_params["job"])

    async def job(request: Request):
        try:
            detail = await anyio.to_thread.run_sync(reader.job_detail, _job_id(request))
        except ValueError as exc:
            return JSONResponse({"error": str(exc)}, status_code=400)
        if detail is None:
            return JSONResponse({"error": f"no job {request.path_params['job']!r}"},
                                status_code=404)
        return JSONResponse(detail)

    async def stream(request: Request):
        job_id = request.query_params.get("job") or None
        if job_id is not None:
            try:
                check_job_id(job_id)
            except ValueError as exc:
                return JSONResponse({"error": str(exc)}, status_code=400)
        return StreamingResponse(_events(job_id), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache",
                                          "X-Accel-Buffering": "no"})

    async def _events(job_id: str | None):
        yield f"retry: {int(max(refresh_s, 1) * 2000)}\n\n"
        last_snapshot = last_summary = None
        after = None
        while True:
            try:
                text = await snapshots.get()
                if text != last_snapshot:
                    last_snapshot = text
                    yield _sse("snapshot", text)
                if job_id is not None:
                    if after is None:
                        detail = await anyio.to_thread.run_sync(reader.job_detail, job_id)
                        if detail is None:
                            yield _sse("problem", json.dumps({"error": f"no job {job_id!r}"}))
                        else:
                            after = detail["last_event_id"]
                            last_summary = json.dumps(detail["job"])
                            yield _sse("job", json.dumps(detail))
                    else:
                        update = await anyio.to_thread.run_sync(reader.job_update, job_id,
                                                                after)
                        if update is None:
                            after = None
                        elif update["reload"]:
                            after = None      # a resume rewrote the curve: the panel anew
                            continue
                        else:
                            summary = json.dumps(update["job"])
                            if update["last_event_id"] != after or summary != last_summary:
                                after, last_summary = update["last_event_id"], summary
                                yield _sse("update", json.dumps(update))
            except REDIS_DOWN as exc:
                yield _sse("problem", json.dumps({"error": f"Redis unreachable: {exc}"}))
            await anyio.sleep(refresh_s)

    async def act(request: Request, action: str, do):
        refused = check.refusal(request)
        if refused is not None:
            return refused
        try:
            job_id = _job_id(request)
            result = await anyio.to_thread.run_sync(do, reader.queue, job_id)
        except actions.NoSuchJob:
            return JSONResponse({"error": f"no job {request.path_params['job']!r}",
                                 "status": 404}, status_code=404)
        except ValueError as exc:
            return JSONResponse({"error": str(exc), "status": 400}, status_code=400)
        except REDIS_DOWN as exc:
            return JSONResponse({"error": f"Redis unreachable: {exc}", "status": 503},
                                status_code=503)
        log.info("dashboard: %s %s -> %s", action, job_id, result)
        return JSONResponse({"job": job_id, "action": action, "result": result,
                             "message": _action_message(action, job_id, result)})

    routes = [Route("/", index), Route("/api/config", config),
              Route("/api/snapshot", snapshot), Route("/api/jobs/{job}", job),
              Route("/api/stream", stream),
              Route("/api/jobs/{job}/cancel", partial(act, action="cancel", do=actions.cancel),
                    methods=["POST"]),
              Route("/api/jobs/{job}/requeue",
                    partial(act, action="requeue", do=actions.requeue), methods=["POST"]),
              Mount("/static", StaticFiles(directory=STATIC), name="static")]
    return Starlette(routes=routes)


def _action_message(action: str, job_id: str, result: str) -> str:
    if action == "cancel":
        return {"cancelled": f"job {job_id} cancelled",
                "cancel_requested": f"job {job_id}: cancel requested; its daemon stops it "
                                    "after the current step and a checkpoint"}.get(
            result, f"job {job_id} had already finished ({result})")
    if result == "queued":
        return f"job {job_id} re-queued; a daemon resumes it from its newest checkpoint"
    return (f"job {job_id} is {result}: only a failed or cancelled job can be re-queued"
            + (" (submit a new job to train more)" if result == "done" else ""))
