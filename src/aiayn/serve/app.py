"""`aiayn serve`: a trained model behind HTTP, and the live glass box in the browser.

Endpoints (docs/serving.md has examples; /openapi.json describes every body):
    GET  /                 the glass box page (static/serve.html: one file, no network; a
                           language model's server serves static/lm.html)
    POST /translate        LibreTranslate's shape: {"q": str | [str], "source", "target",
                           "alternatives": N} -> {"translatedText", "alternatives"}
    GET  /languages        LibreTranslate's language list; POST /detect names the source
    POST /v1/translate     aiayn's own: beam, alpha, nbest, sampling; hypotheses with scores
    POST /v1/explain       one sentence traced: what `aiayn explain --format json` prints
    POST /v1/generate      a language model's server only (aiayn.serve.generate_handler):
                           {"prompt": str | [str], "max_tokens", sampling or beam, "stream"}
                           -> {"completions"}, or server-sent events with "stream": true
    POST /v1/explain/lm    a language model's server only: one prompt traced for the page
                           (aiayn.glassbox.lm_page: causal attention, the next-token
                           distribution under temperature / top-k / top-p, the tensors)
    POST /v1/classify      a classifier's server only (aiayn.serve.classify_handler):
                           {"texts": [str], "top_k"} -> {"results": [{"label",
                           "probabilities" | "top"}], "model"}; its page is
                           static/classify.html, when the install has one
    POST /v1/explain/classify  a classifier's server only: one text traced for the page
                           (aiayn.glassbox.classify_page: attention, pooled vector,
                           probabilities, saliency of a class, rollout)
    GET  /v1/explain/seed  the tutorials' worked example: `aiayn explain --seed-example
                           --format json` (no model needed; the page opens it)
    GET  /v1/model         configuration, languages, sizes, limits, example sentences
    GET  /health           liveness and the kind of model (never needs the API key)
    GET  /metrics          Prometheus text format
    GET  /docs, /openapi.json   the API, described

A server holds a translator, a language model (`aiayn.nn.variants.DecoderLM`) or a classifier
(`aiayn.nn.encoder_only.EncoderClassifier`): the endpoints of the other kinds answer 404 with a
line naming the right one, and are not in its schema.

Before any handler runs, `Guard` checks the Host header against an allowlist (DNS
rebinding), the API key (every path but /health), the content type of a POST (JSON; forms
only where LibreTranslate takes them, so a cross-site page cannot post without a CORS
preflight), and reads the body with a cap (a chunked body too). Bodies are pydantic models
(`aiayn.serve.requests`) whose bounds are this server's limits. Concurrent requests share the
model through `aiayn.serve.batcher`, which bounds each turn's work and stops abandoned work
within a decoding step. Every error is JSON `{"error": "..."}`: 400 unreadable body,
unsupported language or Host, 401/403 API key, 404/405, 413 over a size limit, 415 content
type, 422 invalid value, 503 busy, shutting down or timed out. The key never reaches a log:
the access log is written here, without query strings.
"""

from __future__ import annotations

import contextlib
import functools
import logging
from collections.abc import AsyncIterator, Callable
from importlib import resources
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import HTMLResponse, JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, Gauge, generate_latest
from pydantic import BaseModel
from starlette.exceptions import HTTPException

from aiayn import __version__
from aiayn.classify.classifier import Classifier
from aiayn.generate.generator import Generator
from aiayn.serve.classify_handler import (
    ON_CLASSIFIER_SERVER,
    ON_LM_SERVER_CLS,
    ON_LM_SERVER_CLS_EXPLAIN,
    ON_TRANSLATOR_SERVER_CLS,
    ON_TRANSLATOR_SERVER_CLS_EXPLAIN,
    ClassifyServer,
    V1ClassifyResponse,
)
from aiayn.serve.generate_handler import (
    ON_LM_SERVER,
    ON_TRANSLATOR_SERVER,
    ON_TRANSLATOR_SERVER_LM,
    LMServer,
)
from aiayn.serve.guard import Accounting, Guard, error_response
from aiayn.serve.handlers import BaseServer, ServeOptions, Server
from aiayn.serve.requests import (
    ApiError,
    ErrorBody,
    HealthResponse,
    LibreTranslateResponse,
    V1GenerateResponse,
    V1TranslateResponse,
    language_name,
    validation_message,
)
from aiayn.store.directory import ModelDir
from aiayn.translate.translator import Translator

log = logging.getLogger(__name__)

ERRORS: dict[int | str, dict[str, Any]] = {
    status: {"model": ErrorBody, "description": what}
    for status, what in [
        (400, "unreadable body, unsupported language pair or Host"),
        (401, "an API key is required"),
        (403, "invalid API key"),
        (413, "over a size limit (body, characters, sentences, rows or trace size)"),
        (415, "the body is not JSON (or, for LibreTranslate's endpoints, a form)"),
        (409, "an exported model has nothing to trace (/v1/explain)"),
        (422, "an invalid field"),
        (503, "busy, shutting down or timed out"),
    ]
}


@functools.cache
def _seed_example() -> dict[str, Any]:
    """The seeds' replay (a few small float64 products, computed once per process)."""
    from aiayn.glassbox.seed_example import seed_example_json

    return seed_example_json()


def _form_body(model: type[BaseModel]) -> dict[str, Any]:
    """OpenAPI for a body that is JSON or a form, both described by `model`."""
    schema = model.model_json_schema()
    return {
        "requestBody": {
            "required": True,
            "content": {
                "application/json": {"schema": schema},
                "application/x-www-form-urlencoded": {"schema": schema},
            },
        }
    }


def _with_body(handler: Callable[..., Any], model: type[BaseModel]) -> Callable[..., Any]:
    """FastAPI reads a body's model from the handler's annotation; ours are built per server
    (their bounds are its limits), so the annotation is set here."""

    async def endpoint(request: Request, body: Any) -> Any:
        return await handler(request, body)

    endpoint.__annotations__ = {"request": Request, "body": model, "return": Any}
    endpoint.__name__ = handler.__name__
    return endpoint


def _elsewhere(message: str) -> Callable[..., Any]:
    """A handler for an endpoint of the other kind of model: 404 with `message`."""

    async def elsewhere(_request: Request) -> None:
        raise ApiError(404, message)

    return elsewhere


# The endpoints a language model's server does not have (a translator's: a 404 there).
TRANSLATION_ENDPOINTS = [
    ("/languages", "GET"),
    ("/detect", "POST"),
    ("/translate", "POST"),
    ("/v1/translate", "POST"),
    ("/v1/explain", "POST"),
]
LM_ENDPOINTS = [("/v1/generate", "POST"), ("/v1/explain/lm", "POST")]
# The streamed answer, besides the JSON one: its `schema` describes one event (OpenAPI 3.1).
SSE_EVENT = {
    "type": "object",
    "required": ["event", "data"],
    "properties": {
        "event": {"type": "string", "enum": ["token", "done", "error"]},
        "data": {
            "type": "string",
            "description": 'one line of JSON: token {"prompt", "sample", "text"} (new text of '
            'one completion), done (the whole reply, as without "stream"), error {"error", '
            '"status"}',
        },
    },
}
GENERATE_OPENAPI: dict[str, Any] = {
    "responses": {"200": {"content": {"text/event-stream": {"schema": SSE_EVENT}}}}
}


def create_app(
    served: Translator | Generator | Classifier, model_dir: Path | ModelDir, opts: ServeOptions
) -> FastAPI:
    """The FastAPI app for a translator, a language model or a classifier; its lifespan stops
    the model worker after the last answer."""
    server: BaseServer | None = None

    @contextlib.asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        yield
        assert server is not None
        server.batcher.close()  # uvicorn has answered every request it accepted by now

    app = FastAPI(
        title="aiayn serve",
        version=__version__,
        lifespan=lifespan,
        docs_url="/docs",
        redoc_url=None,
    )
    if isinstance(served, Generator):
        server = LMServer(served, model_dir, opts)
    elif isinstance(served, Classifier):
        server = ClassifyServer(served, model_dir, opts)
    else:
        server = Server(served, model_dir, opts)
    app.state.server = server
    # /metrics says what is served as /health does: one series, labelled with the kind
    Gauge(
        "aiayn_model_kind",
        "the kind of model served (its label; always 1)",
        ["kind"],
        registry=server.metrics.registry,
    ).labels(server.kind).set(1)
    pages = {LMServer: "static/lm.html", ClassifyServer: "static/classify.html"}
    page_file = resources.files("aiayn.serve").joinpath(
        pages.get(type(server), "static/serve.html")
    )
    # a classifier's page may be missing from an install: "/" then names the endpoint
    page = page_file.read_text(encoding="utf-8") if page_file.is_file() else None
    task = "classify" if isinstance(server, ClassifyServer) else "translate"  # (empty texts)

    @app.exception_handler(ApiError)
    async def api_error(_r: Request, e: ApiError) -> JSONResponse:
        return error_response(e.status, str(e))

    @app.exception_handler(HTTPException)
    async def http_error(_r: Request, e: HTTPException) -> JSONResponse:
        return error_response(e.status_code, str(e.detail), e.headers)  # a 405 keeps its Allow

    @app.exception_handler(RequestValidationError)
    async def validation_error(_r: Request, e: RequestValidationError) -> JSONResponse:
        errors = list(e.errors())
        if errors and errors[0].get("type") == "json_invalid":
            return error_response(400, f"invalid JSON: {errors[0].get('ctx', {}).get('error', '')}")
        return error_response(422, validation_message(errors, task))

    @app.exception_handler(Exception)
    async def internal_error(_r: Request, e: Exception) -> JSONResponse:
        log.exception("unexpected error")
        return error_response(500, f"internal error: {type(e).__name__}")

    @app.get("/", response_class=HTMLResponse, include_in_schema=False)
    async def index() -> HTMLResponse:
        if page is None:
            raise ApiError(404, f"{ON_CLASSIFIER_SERVER} (this install has no page for it)")
        return HTMLResponse(page)

    @app.get("/health", response_model=HealthResponse)
    async def health() -> dict[str, Any]:
        # in_flight: other requests accepted and not yet answered (this one is not counted)
        in_flight = server.accepted - server.answered - 1
        queued = server.queued() if isinstance(server, ClassifyServer) else server.batcher.queued()
        return {"status": "ok", "queued": queued, "in_flight": in_flight, "kind": server.kind}

    @app.get("/metrics", include_in_schema=False)
    async def metrics() -> Response:
        return Response(generate_latest(server.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/model", responses=ERRORS)
    async def model() -> dict[str, Any]:
        return server.model_info()

    @app.get("/v1/explain/seed", responses=ERRORS)
    async def seed_example() -> dict[str, Any]:
        return _seed_example()

    if isinstance(server, LMServer):
        app.post(
            "/v1/generate",
            response_model=V1GenerateResponse,
            responses=ERRORS,
            openapi_extra=GENERATE_OPENAPI,
        )(_with_body(server.v1_generate, server.body))
        app.post("/v1/explain/lm", responses=ERRORS)(
            _with_body(server.v1_explain_lm, server.explain_body)
        )
        for path, method in TRANSLATION_ENDPOINTS:
            app.api_route(path, methods=[method], include_in_schema=False)(_elsewhere(ON_LM_SERVER))
        app.post("/v1/classify", include_in_schema=False)(_elsewhere(ON_LM_SERVER_CLS))
        app.post("/v1/explain/classify", include_in_schema=False)(
            _elsewhere(ON_LM_SERVER_CLS_EXPLAIN)
        )
    elif isinstance(server, ClassifyServer):
        app.post(
            "/v1/classify",
            response_model=V1ClassifyResponse,
            response_model_exclude_none=True,
            responses=ERRORS,
        )(_with_body(server.v1_classify, server.body))
        app.post("/v1/explain/classify", responses=ERRORS)(
            _with_body(server.v1_explain_classify, server.explain_body)
        )
        for path, method in TRANSLATION_ENDPOINTS + LM_ENDPOINTS:
            app.api_route(path, methods=[method], include_in_schema=False)(
                _elsewhere(ON_CLASSIFIER_SERVER)
            )
    else:
        assert isinstance(server, Server)
        _translation_endpoints(app, server)
        app.post("/v1/generate", include_in_schema=False)(_elsewhere(ON_TRANSLATOR_SERVER))
        app.post("/v1/explain/lm", include_in_schema=False)(_elsewhere(ON_TRANSLATOR_SERVER_LM))
        app.post("/v1/classify", include_in_schema=False)(_elsewhere(ON_TRANSLATOR_SERVER_CLS))
        app.post("/v1/explain/classify", include_in_schema=False)(
            _elsewhere(ON_TRANSLATOR_SERVER_CLS_EXPLAIN)
        )

    app.add_middleware(Guard, server=server)  # type: ignore[arg-type]
    if opts.cors_origins:  # outside the Guard: preflights carry no key
        app.add_middleware(
            CORSMiddleware,
            allow_origins=list(opts.cors_origins),
            allow_methods=["GET", "POST"],
            allow_headers=["Authorization", "Content-Type"],
        )
    app.add_middleware(Accounting, server=server)  # type: ignore[arg-type]
    return app


def _translation_endpoints(app: FastAPI, server: Server) -> None:
    """LibreTranslate's endpoints and aiayn's /v1/translate and /v1/explain."""
    models = server.models

    @app.get("/languages", responses=ERRORS)
    async def languages() -> list[dict[str, Any]]:
        if not server.languages:
            return []
        src, tgt = server.languages
        return [
            {"code": src, "name": language_name(src), "targets": [tgt]},
            {"code": tgt, "name": language_name(tgt), "targets": []},
        ]

    @app.post("/detect", responses=ERRORS, openapi_extra=_form_body(models.detect))
    async def detect(request: Request) -> list[dict[str, Any]]:
        await server.form(request, models.detect)
        langs = server.languages
        return [{"confidence": 100.0, "language": langs[0]}] if langs else []

    app.post(
        "/translate",
        response_model=LibreTranslateResponse,
        responses=ERRORS,
        response_model_exclude_none=True,
        openapi_extra=_form_body(models.libre_translate),
    )(server.libre_translate)
    app.post("/v1/translate", response_model=V1TranslateResponse, responses=ERRORS)(
        _with_body(server.v1_translate, models.v1_translate)
    )
    app.post("/v1/explain", responses=ERRORS)(_with_body(server.v1_explain, models.v1_explain))
