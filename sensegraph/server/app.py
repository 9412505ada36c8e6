"""The FastAPI app behind `sensegraph serve`: the JSON API, the OpenAI-compatible endpoint, the
web explorer's static files and the API docs, over one index loaded once.

    from sensegraph.server import create_app
    app = create_app("myproject/output", settings)      # uvicorn.run(app, host="127.0.0.1")

It serves its own index and its own static files, nothing else: no endpoint takes a path, and
static files are looked up inside the package's static folder only.
"""
from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from fastapi import FastAPI, HTTPException, Request
from fastapi.exceptions import RequestValidationError
from fastapi.middleware.cors import CORSMiddleware
from fastapi.middleware.gzip import GZipMiddleware
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import HTMLResponse, JSONResponse
from fastapi.staticfiles import StaticFiles

from ..config import Settings
from ..query import GraphIndex
from . import ask, browse, openai_compat
from .records import Explorer
from .security import BodyLimit, SecurityHeaders
from .state import Answers, ServerState

STATIC_DIR = Path(__file__).parent / "static"
MAX_BODY_BYTES = 1_000_000  # a question with its history is a few kilobytes; nothing else is posted


def _swagger_assets() -> Path | None:
    """Swagger UI from the `swagger-ui-bundle-v2` package (serve extra): /docs without a CDN."""
    try:
        from swagger_ui_bundle import swagger_ui_path  # type: ignore[import-not-found]
    except ImportError:
        return None
    path = Path(swagger_ui_path)
    return path if (path / "swagger-ui-bundle.js").is_file() else None


def create_app(
    index: GraphIndex | str | Path,
    settings: Settings | None = None,
    *,
    searcher: Answers | None = None,
    api_key: str | None = None,
    cors_origins: Sequence[str] = (),
    max_body_bytes: int = MAX_BODY_BYTES,
    max_concurrent_queries: int = 4,
    static_dir: Path | None = STATIC_DIR,
) -> FastAPI:
    """An app over `index` (a loaded GraphIndex or its folder). Questions are answered with
    `searcher`, or with a `Searcher` opened from `settings` on the first question."""
    graph = index if isinstance(index, GraphIndex) else GraphIndex.load(index)
    state = ServerState(settings, graph, Explorer(graph), searcher, max_concurrent_queries)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        yield
        await state.aclose()

    app = FastAPI(
        title="sensegraph", version=_version(), lifespan=lifespan,
        description="Browse a GraphRAG index (communities, reports, entities, relationships, claims, source "
                    "text) and ask it questions. Citations such as `[Data: Reports (3); Entities (5)]` name "
                    "records: reports by community number (`/api/reports/3`), the others by "
                    "human_readable_id (`/api/entities/5`, `/api/relationships/n`, `/api/claims/n`, "
                    "`/api/text_units/n` for Sources).",
        docs_url=None, redoc_url=None,  # /docs is served below from local files, never from a CDN
    )
    app.state.sg = state
    app.state.api_key = api_key or None
    app.include_router(browse.router)
    app.include_router(ask.router)
    app.include_router(openai_compat.router)

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException) -> JSONResponse:
        # OpenAI clients read {"error": {...}}; everything else gets FastAPI's {"detail": ...}.
        if request.url.path.startswith("/v1/"):
            etype = "authentication_error" if exc.status_code == 401 else "invalid_request_error"
            return JSONResponse({"error": {"message": str(exc.detail), "type": etype, "param": None,
                                           "code": exc.status_code}}, exc.status_code, headers=exc.headers)
        return JSONResponse({"detail": exc.detail}, exc.status_code, headers=exc.headers)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        if request.url.path.startswith("/v1/"):
            first = exc.errors()[0] if exc.errors() else {}
            where = ".".join(str(p) for p in first.get("loc", ()) if p != "body")
            return JSONResponse({"error": {"message": f"{where}: {first.get('msg', 'invalid request')}",
                                           "type": "invalid_request_error", "param": where or None,
                                           "code": None}}, 400)
        return JSONResponse({"detail": _plain(exc.errors())}, 422)

    @app.get("/healthz", include_in_schema=False)
    def healthz() -> dict[str, str]:
        return {"status": "ok"}

    assets = _swagger_assets()
    if assets is not None:
        app.mount("/docs-assets", StaticFiles(directory=assets), name="docs-assets")

    @app.get("/docs", include_in_schema=False)
    def docs() -> HTMLResponse:
        if assets is None:
            return HTMLResponse("<p>The interactive API docs need Swagger UI: <code>pip install "
                                "'sensegraph[serve]'</code>. The API description is at "
                                "<a href='/openapi.json'>/openapi.json</a>.</p>")
        return get_swagger_ui_html(openapi_url="/openapi.json", title="sensegraph API",
                                   swagger_js_url="/docs-assets/swagger-ui-bundle.js",
                                   swagger_css_url="/docs-assets/swagger-ui.css",
                                   swagger_favicon_url="/docs-assets/favicon-32x32.png")

    if static_dir is not None and (static_dir / "index.html").is_file():
        # Mounted last: the API routes above win. StaticFiles resolves every path inside
        # static_dir and refuses anything outside it (no traversal, no symlinks out).
        app.mount("/", StaticFiles(directory=static_dir, html=True), name="explorer")
    else:
        @app.get("/", include_in_schema=False)
        def no_page() -> HTMLResponse:
            return HTMLResponse("<p>The web explorer is not built (sensegraph/server/static is empty); the "
                                "API works: see <a href='/docs'>/docs</a>.</p>")

    # Outermost last: the size limit sees the request before anything reads its body.
    if cors_origins:
        app.add_middleware(CORSMiddleware, allow_origins=list(cors_origins), allow_methods=["GET", "POST"],
                           allow_headers=["Authorization", "X-API-Key", "Content-Type"])
    app.add_middleware(SecurityHeaders)
    app.add_middleware(NoGzipForStreams, gzip=GZipMiddleware)
    app.add_middleware(BodyLimit, max_bytes=max_body_bytes)
    return app


class NoGzipForStreams:
    """Compress JSON and the page's scripts (the graph chunk shrinks ~3x), but never the
    answer streams: a compressor buffers, and tokens must reach the reader as they come."""

    STREAMS = ("/api/query", "/v1/chat/completions")

    def __init__(self, app: Any, gzip: Any):
        self.plain = app
        self.zipped = gzip(app, minimum_size=1024)

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope.get("path", "") not in self.STREAMS:
            await self.zipped(scope, receive, send)
        else:
            await self.plain(scope, receive, send)


def _plain(errors: Any) -> Any:
    """Validation errors without the raw input objects (which may not be JSON serialisable)."""
    return [{k: v for k, v in e.items() if k in ("type", "loc", "msg")} for e in errors]


def _version() -> str:
    try:
        from importlib.metadata import version

        return version("sensegraph")
    except Exception:
        return "0"
