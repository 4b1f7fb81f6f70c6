"""The admin HTTP API (FastAPI): read-only endpoints now; mutating ones check the bearer token."""

from fastapi import FastAPI, Query, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST

ENDPOINTS = ["/healthz", "/harvest/stats", "/harvest/steps", "/metrics"]


def create_admin_app(runtime) -> FastAPI:
    app = FastAPI(title="harvest admin", docs_url=None, redoc_url=None, openapi_url=None)

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

    @app.get("/metrics")
    def metrics():
        return Response(runtime.render_metrics(), media_type=CONTENT_TYPE_LATEST)

    @app.exception_handler(404)
    async def not_found(request: Request, exc):
        detail = getattr(exc, "detail", None)
        if detail and detail != "Not Found":
            return JSONResponse({"detail": detail}, status_code=404)
        return JSONResponse(
            {"detail": f"no admin endpoint {request.url.path}; endpoints: {', '.join(ENDPOINTS)}"}, status_code=404
        )

    return app
