"""The admin HTTP API (FastAPI), served on its own port from a daemon thread of the scheduler process.

Reads are open; mutating endpoints need the bearer token when one is set.
"""

import datetime
import logging
import math
import secrets
import socket
import threading

import uvicorn
from fastapi import Depends, FastAPI, HTTPException, Query, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST

from base.errors import HarvestError
from base.ports import bind_port
from harvest.config import AdminConfig
from harvest.jobs.job_spec import MAX_YAML_BYTES, JobConflictError
from harvest.jobs.worker_jobs import UnknownJobError

logger = logging.getLogger(__name__)

ENDPOINTS = ["/healthz", "/harvest/stats", "/harvest/steps", "/metrics",
             "GET|POST /harvest/jobs", "GET|DELETE /harvest/jobs/{name}", "POST /harvest/jobs/{name}/pause|resume",
             "POST /harvest/finetune/pause", "POST /harvest/finetune/resume", "POST /harvest/finetune/stop",
             "POST /harvest/finetune/publish",
             "POST /harvest/partition?infer=I&ft=F", "POST /harvest/partition (unpin)"]


class AdminServer:
    def __init__(self, runtime, config: AdminConfig):
        self._config = config
        self._server = uvicorn.Server(
            uvicorn.Config(create_admin_app(runtime), host=config.host, port=config.port, log_level="warning",
                           access_log=False)
        )
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Bind now, in the scheduler's start-up: a port taken since `harvest serve` checked it fails the worker
        with that reason, rather than leaving a worker whose admin URL answers for another process."""
        try:
            sock = bind_port(self._config.host, self._config.port, "--admin-port")
        except HarvestError as e:
            raise HarvestError(f"{e} (taken since harvest serve checked it)") from None
        sock.listen(128)
        self._thread = threading.Thread(target=self._serve, args=(sock,), name="harvest-admin", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._server.should_exit = True

    def _serve(self, sock: socket.socket) -> None:
        try:
            self._server.run(sockets=[sock])
        except Exception:  # a dead admin port must not take serving down with it
            logger.exception("harvest admin server on %s:%d stopped", self._config.host, self._config.port)


class FiniteJSONResponse(JSONResponse):
    """JSON has no NaN or infinity: a job whose loss went NaN must still show its stats (the value as null),
    not answer 500 to every read."""

    def render(self, content) -> bytes:
        return super().render(_finite(content))


def _finite(value):
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value


def _job_call(verb, *args, **kwargs):
    """A job verb's errors as HTTP: an unknown job 404, a deadline the measured rate cannot meet or a job in
    the wrong state (duplicate, finished) 409, anything else wrong with the submission 422."""
    try:
        return verb(*args, **kwargs)
    except UnknownJobError as e:
        raise HTTPException(404, str(e)) from None
    except JobConflictError as e:
        raise HTTPException(409, str(e)) from None
    except HarvestError as e:
        raise HTTPException(422, str(e)) from None


def _deadline(value: str | None) -> float | None:
    """A deadline as UNIX seconds or an ISO 8601 time (with its zone; none: UTC)."""
    if value is None:
        return None
    try:
        return float(value)
    except ValueError:
        pass
    try:
        moment = datetime.datetime.fromisoformat(value)
    except ValueError:
        raise HTTPException(422, f"deadline: {value!r} is neither UNIX seconds nor an ISO 8601 time") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=datetime.UTC)
    return moment.timestamp()


def create_admin_app(runtime) -> FastAPI:
    app = FastAPI(title="harvest admin", docs_url=None, redoc_url=None, openapi_url=None,
                  default_response_class=FiniteJSONResponse)
    token = runtime.config.admin.token

    def require_token(request: Request) -> None:
        if token is None:
            return
        scheme, _, given = request.headers.get("authorization", "").partition(" ")
        given = given.strip()
        if scheme.lower() != "bearer" or not given or not secrets.compare_digest(given.encode(), token.encode()):
            raise HTTPException(401, "this endpoint needs the header `Authorization: Bearer <admin token>`",
                                headers={"WWW-Authenticate": "Bearer"})

    @app.get("/healthz")
    def healthz():
        return {"status": "ok"}

    @app.get("/harvest/stats")
    def stats(window_steps: int | None = Query(None, ge=1, le=runtime.config.stats_window_steps)):
        return runtime.stats_snapshot(window_steps)

    @app.get("/harvest/steps")
    def steps(since: int = Query(0, ge=0), limit: int = Query(1000, ge=1, le=10_000)):
        """Per-step records after sequence number `since`: what a live replay polls."""
        records = runtime.steps_since(since, limit)
        return {"steps": records, "next": records[-1]["seq"] if records else since}

    @app.post("/harvest/finetune/{action}", dependencies=[Depends(require_token)])
    def finetune(action: str):
        if action not in ("pause", "resume", "stop", "publish"):
            raise HTTPException(404, f"no finetune action {action!r}; actions: pause, resume, stop, publish")
        try:
            return runtime.finetune_action(action)
        except HarvestError as e:
            raise HTTPException(409, str(e)) from None

    def worker_jobs():
        if runtime.jobs is None:
            raise HTTPException(409, "this worker takes no finetune jobs: start it with --tpot-slo-ms (the decode "
                                "target jobs run under)")
        return runtime.jobs

    @app.get("/harvest/jobs")
    def list_jobs():
        return {"jobs": worker_jobs().list()}

    @app.get("/harvest/jobs/{name}")
    def show_job(name: str):
        return _job_call(worker_jobs().show, name)

    @app.post("/harvest/jobs", dependencies=[Depends(require_token)], status_code=201)
    async def submit_job(request: Request, name: str = Query(...), priority: int = Query(0),
                         deadline: str | None = Query(None), deadline_tokens: float | None = Query(None, gt=0),
                         best_effort: bool = Query(False), publish_name: str | None = Query(None)):
        """The body is the job's LlamaFactory YAML; the rest are query parameters."""
        jobs = worker_jobs()
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > MAX_YAML_BYTES:
            raise HTTPException(413, f"the job YAML is {declared} bytes, more than {MAX_YAML_BYTES}")
        body = await request.body()
        if len(body) > MAX_YAML_BYTES:
            raise HTTPException(413, f"the job YAML is {len(body)} bytes, more than {MAX_YAML_BYTES}")
        try:
            text = body.decode()
        except UnicodeDecodeError:
            raise HTTPException(422, "yaml: the body is not UTF-8 text") from None
        fields = {"priority": priority, "deadline_s": _deadline(deadline), "deadline_tokens": deadline_tokens,
                  "is_best_effort": best_effort, "publish_name": publish_name}
        # The check parses the YAML with LlamaFactory (milliseconds to seconds): off the event loop.
        return await run_in_threadpool(_job_call, jobs.submit, name, text, **fields)

    @app.post("/harvest/jobs/{name}/{action}", dependencies=[Depends(require_token)])
    def job_action(name: str, action: str):
        jobs = worker_jobs()
        verbs = {"pause": jobs.pause, "resume": jobs.resume}
        if action not in verbs:
            raise HTTPException(404, f"no job action {action!r}; actions: pause, resume (DELETE cancels)")
        return _job_call(verbs[action], name)

    @app.delete("/harvest/jobs/{name}", dependencies=[Depends(require_token)])
    def cancel_job(name: str):
        return _job_call(worker_jobs().cancel, name)

    @app.post("/harvest/partition", dependencies=[Depends(require_token)])
    def partition(infer: int | None = Query(None, ge=1), ft: int = Query(0, ge=0)):
        """Pin a spatial worker's partition (what `harvest profile --co-run` measures on); no infer: unpin,
        the planner chooses again."""
        try:
            return runtime.pin_partition(None if infer is None else (infer, ft))
        except HarvestError as e:
            raise HTTPException(409, str(e)) from None

    @app.get("/metrics")
    def metrics():
        return Response(runtime.render_metrics(), media_type=CONTENT_TYPE_LATEST)

    @app.exception_handler(404)
    async def not_found(request: Request, exc):
        detail = getattr(exc, "detail", None)
        if detail and detail != "Not Found":
            return JSONResponse({"detail": detail}, status_code=404)
        return JSONResponse(
            {"detail": f"no admin endpoint {request.method} {request.url.path}; endpoints: {', '.join(ENDPOINTS)}"},
            status_code=404,
        )

    @app.exception_handler(405)
    async def wrong_method(request: Request, exc):
        return JSONResponse({"detail": f"{request.method} is not allowed on {request.url.path}; endpoints: "
                             f"{', '.join(ENDPOINTS)}"}, status_code=405)

    @app.exception_handler(Exception)
    async def unexpected(request: Request, exc: Exception):
        # A bug in a stats path must not look like a dead worker: the log keeps the traceback, the caller
        # gets the reason in one line.
        logger.exception("harvest admin: %s %s failed", request.method, request.url.path)
        return JSONResponse({"detail": f"{request.method} {request.url.path} failed: {type(exc).__name__}: {exc}"},
                            status_code=500)

    return app
