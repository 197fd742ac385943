"""`aiayn serve`: a trained model behind HTTP, and the live glass box in the browser (issue 13).

Endpoints (docs/serving.md has examples):
    GET  /                 the glass box page (static/serve.html: one file, no network)
    POST /translate        LibreTranslate's shape: {"q": str | [str], "source", "target",
                           "alternatives": N} -> {"translatedText", "alternatives"}
    GET  /languages        LibreTranslate's language list; POST /detect names the source
    POST /v1/translate     aiayn's own: beam, alpha, nbest, sampling; hypotheses with scores
    POST /v1/explain       one sentence traced: what `aiayn explain --format json` prints
    GET  /v1/model         configuration, languages, sizes, limits, example sentences
    GET  /health           liveness (never needs the API key)
    GET  /metrics          Prometheus text format

Concurrent requests share the model through `aiayn.serve_batcher` (micro-batching); request
bodies are read and checked by `aiayn.serve_requests`. Every
error is JSON `{"error": "..."}`: 400 unreadable body or unsupported language, 401/403 API
key, 404/405, 413 over a size limit, 422 invalid value, 503 busy, shutting down or timed out.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hmac
import ipaddress
import logging
import signal
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, Response
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
    generate_latest,
)
from starlette.exceptions import HTTPException

from aiayn import __version__
from aiayn.config import to_dict
from aiayn.errors import AiaynError
from aiayn.explain_render import View, parse_indices, to_json, trace_sentence
from aiayn.serve_batcher import Batcher, BatchStats, ClosedError, ExpiredError, Job, QueueFullError
from aiayn.serve_requests import (
    EXPLAIN_FIELDS,
    EXPLAIN_SEARCH,
    SEARCH_FIELDS,
    ApiError,
    Limits,
    check_sizes,
    example_sentences,
    field,
    indices,
    language_name,
    model_languages,
    parse_body,
    search_settings,
    texts,
    unknown_fields,
)
from aiayn.translate import Translation, Translator

log = logging.getLogger("aiayn.serve")


@dataclass(frozen=True)
class ServeOptions:
    host: str = "127.0.0.1"
    port: int = 8000
    api_key: str | None = None
    limits: Limits = dataclasses.field(default_factory=Limits)
    window_ms: float = 10.0  # how long the model worker waits to gather concurrent requests
    batch_tokens: int = 2048
    max_queue: int = 1000
    source_lang: str | None = None
    target_lang: str | None = None
    examples: Path | None = None
    access_log: bool = True


# --- metrics --------------------------------------------------------------------------------------

PATHS = ("/", "/translate", "/languages", "/detect", "/v1/translate", "/v1/explain",
         "/v1/model", "/health", "/metrics")  # fmt: skip


class Metrics:
    """The server's Prometheus metrics, in a registry of its own (one per app)."""

    def __init__(self, batcher_queue: Callable[[], int]) -> None:
        disable_created_metrics()  # no `_created` series: counters and histograms only
        self.registry = r = CollectorRegistry()
        self.requests = Counter("aiayn_requests", "HTTP requests answered",
                                ["endpoint", "status"], registry=r)  # fmt: skip
        self.latency = Histogram(
            "aiayn_request_seconds", "time from request to response", ["endpoint"], registry=r,
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
        )  # fmt: skip
        self.sentences = Counter("aiayn_sentences", "sentences translated", registry=r)
        self.src_tokens = Counter("aiayn_source_tokens", "source tokens read", registry=r)
        self.tgt_tokens = Counter("aiayn_target_tokens", "target tokens written", registry=r)
        self.batch_sentences = Histogram(
            "aiayn_batch_sentences", "sentences per merged model batch", registry=r,
            buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256, 512),
        )  # fmt: skip
        self.batch_requests = Histogram(
            "aiayn_batch_requests", "requests per merged model batch", registry=r,
            buckets=(1, 2, 4, 8, 16, 32, 64),
        )  # fmt: skip
        self.batch_seconds = Histogram("aiayn_batch_seconds", "model time per merged batch",
                                       registry=r)  # fmt: skip
        self.dropped = Counter("aiayn_dropped_requests", "requests dropped before decoding",
                               ["reason"], registry=r)  # fmt: skip
        Gauge("aiayn_queued_jobs", "jobs waiting for the model", registry=r).set_function(
            batcher_queue
        )

    def batch(self, s: BatchStats) -> None:
        self.sentences.inc(s.sentences)
        self.src_tokens.inc(s.src_tokens)
        self.tgt_tokens.inc(s.tgt_tokens)
        self.batch_sentences.observe(s.sentences)
        self.batch_requests.observe(s.requests)
        self.batch_seconds.observe(s.seconds)


class Accounting:
    """Pure ASGI middleware: metrics for every response, and the count of requests accepted
    and answered (logged at shutdown: nothing accepted is lost on SIGTERM)."""

    def __init__(self, app: Callable[..., Awaitable[None]], server: Server) -> None:
        self.app, self.server, self.metrics = app, server, server.metrics

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        self.server.accepted += 1
        t0, status = time.perf_counter(), 500

        async def counted(message: dict) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)
            if message["type"] == "http.response.body" and not message.get("more_body"):
                self.server.answered += 1

        try:
            await self.app(scope, receive, counted)
        finally:
            endpoint = scope["path"] if scope["path"] in PATHS else "other"
            self.metrics.requests.labels(endpoint, str(status)).inc()
            self.metrics.latency.labels(endpoint).observe(time.perf_counter() - t0)


# --- the app --------------------------------------------------------------------------------------


def _error(status: int, message: str) -> JSONResponse:
    headers = {"WWW-Authenticate": "Bearer"} if status == 401 else None
    return JSONResponse({"error": message}, status_code=status, headers=headers)


def _hypothesis(t: Translation) -> dict[str, Any]:
    h = t.hyp
    return {"text": t.text, "tokens": h.tokens, "log_prob": h.log_prob, "score": h.score,
            "eos": h.eos}  # fmt: skip


class Server:
    """The state the endpoints share: the translator, its batcher, options and metrics."""

    def __init__(self, translator: Translator, model_dir: Path, opts: ServeOptions) -> None:
        self.translator, self.model_dir, self.opts = translator, model_dir, opts
        self.limits = opts.limits
        self.languages: tuple[str, str] | None = model_languages(model_dir)
        if opts.source_lang and opts.target_lang:
            self.languages = (opts.source_lang, opts.target_lang)
        self.examples = example_sentences(model_dir, opts.examples)
        self.batcher = Batcher(
            translator, window_s=opts.window_ms / 1000, batch_tokens=opts.batch_tokens,
            max_queue=opts.max_queue,
        )  # fmt: skip
        self.metrics = Metrics(self.batcher.queued)
        self.batcher.on_batch = self.metrics.batch
        self.accepted = self.answered = 0  # counted by `Accounting`
        self.max_body = 4 * self.limits.max_chars_per_request + 65_536  # UTF-8 and JSON escapes

    # --- per request ----------------------------------------------------------------------------

    async def body(self, request: Request) -> dict[str, Any]:
        length = request.headers.get("content-length", "")
        if length.isdigit() and int(length) > self.max_body:
            raise ApiError(413, f"the body has {length} bytes; the limit is {self.max_body}")
        ctype = request.headers.get("content-type", "")
        try:
            body = parse_body(await request.body(), ctype, self.max_body)
        except ApiError:
            self.check_key(request)  # without a key, say that first (not what is wrong inside)
            raise
        self.check_key(request, body.get("api_key"))
        return body

    def check_key(self, request: Request, in_body: object = None) -> None:
        """The API key (when the server has one): a Bearer header, `api_key` in the JSON body
        (LibreTranslate's clients) or in the query string (the page's address)."""
        if self.opts.api_key is None:
            return
        auth = request.headers.get("authorization", "")
        given = auth[7:].strip() if auth.lower().startswith("bearer ") else None
        given = given or (in_body if isinstance(in_body, str) else None)
        given = given or request.query_params.get("api_key")
        if not given:
            raise ApiError(401, "an API key is required: send 'Authorization: Bearer KEY' "
                                "or \"api_key\" in the body")  # fmt: skip
        if not hmac.compare_digest(given.encode(), self.opts.api_key.encode()):
            raise ApiError(403, "invalid API key")

    async def run(self, request: Request, submit: Callable[[], Job]) -> Any:
        """Queue a job for the model and wait for it: 503 when it cannot be answered in time,
        and the job is dropped if the client goes away first."""
        try:
            job = submit()
        except QueueFullError as e:
            raise ApiError(503, f"server busy: {e}; retry later") from None
        except ClosedError as e:
            raise ApiError(503, str(e)) from None
        waiting = asyncio.wrap_future(job.future)
        while True:
            left = job.deadline - time.monotonic()
            if left <= 0:
                job.cancel()
                self.metrics.dropped.labels("timeout").inc()
                raise ApiError(503, f"timed out after {self.limits.timeout_s:g} s (--timeout)")
            done, _ = await asyncio.wait({waiting}, timeout=min(0.05, left))
            if done:
                try:
                    return waiting.result()
                except ExpiredError as e:
                    self.metrics.dropped.labels("timeout").inc()
                    raise ApiError(503, f"{e} (--timeout {self.limits.timeout_s:g} s)") from None
                except AiaynError as e:
                    raise ApiError(422, str(e)) from None
            if await request.is_disconnected():
                job.cancel()
                self.metrics.dropped.labels("disconnected").inc()
                raise ApiError(499, "client closed the request")

    def translate(self, request: Request, lines: list[str], cfg: Any) -> Awaitable[Any]:
        timeout = self.limits.timeout_s
        return self.run(request, lambda: self.batcher.translate(lines, cfg, timeout))

    def check_languages(self, body: dict[str, Any]) -> None:
        source, target = field(body, "source", str), field(body, "target", str)
        if not self.languages:
            return  # a model that records no languages accepts any pair
        src, tgt = self.languages
        if source not in (src, "auto", None) or target not in (tgt, None):
            raise ApiError(400, f"this model translates {src} -> {tgt} "
                                f"({language_name(src)} to {language_name(tgt)}); "
                                f"got {source} -> {target}")  # fmt: skip

    # --- endpoints ------------------------------------------------------------------------------

    async def libre_translate(self, request: Request) -> dict[str, Any]:
        body = await self.body(request)
        items, single = texts(body)
        self.check_languages(body)
        fmt = field(body, "format", str, "text")
        if fmt not in ("text", "html"):
            raise ApiError(422, f"'format' must be 'text', got {fmt!r}")
        if fmt == "html":
            raise ApiError(400, "format 'html' is not supported: send plain text")
        n_alt = field(body, "alternatives", int, 0)
        if not 0 <= n_alt < self.limits.max_beam:
            raise ApiError(422, f"'alternatives' must be between 0 and "
                                f"{self.limits.max_beam - 1} (--max-beam)")  # fmt: skip
        # LibreTranslate translates text: each line is a sentence, line breaks are kept.
        split = [s.split("\n") for s in items]
        lines = [line for parts in split for line in parts]
        check_sizes(lines, self.limits)
        cfg = self.translator.cfg
        if n_alt:
            beam = max(cfg.beam_size, n_alt + 1)
            cfg = dataclasses.replace(cfg, beam_size=beam, nbest=n_alt + 1, sample=False)
        results = await self.translate(request, lines, cfg)
        out, alts, start = [], [], 0
        for parts in split:
            mine = results[start : start + len(parts)]
            start += len(parts)
            out.append("\n".join(r[0].text for r in mine))
            alts.append(["\n".join(r[min(k, len(r) - 1)].text for r in mine)
                         for k in range(1, n_alt + 1)])  # fmt: skip
        reply: dict[str, Any] = {"translatedText": out[0] if single else out}
        if n_alt:
            reply["alternatives"] = alts[0] if single else alts
        if field(body, "source", str) == "auto" and self.languages:
            detected = {"confidence": 100.0, "language": self.languages[0]}
            reply["detectedLanguage"] = detected if single else [detected] * len(items)
        return reply

    async def v1_translate(self, request: Request) -> dict[str, Any]:
        body = await self.body(request)
        unknown_fields(body, {"q", "api_key", *SEARCH_FIELDS})
        items, _ = texts(body)
        check_sizes(items, self.limits)
        cfg = search_settings(body, self.translator, self.limits)
        results = await self.translate(request, items, cfg)
        translations = [{"text": r[0].text, "hypotheses": [_hypothesis(t) for t in r]}
                        for r in results]  # fmt: skip
        return {"translations": translations, "settings": dataclasses.asdict(cfg)}

    async def v1_explain(self, request: Request) -> dict[str, Any]:
        body = await self.body(request)
        unknown_fields(body, EXPLAIN_FIELDS)
        sentence = field(body, "q", str)
        if not sentence or not sentence.strip():
            raise ApiError(422, "'q' is missing or empty: give one sentence to explain")
        check_sizes([sentence], self.limits)
        beam = field(body, "beam", int, 0)
        if not 0 <= beam <= self.limits.max_beam:
            raise ApiError(422, f"'beam' must be between 0 and {self.limits.max_beam} "
                                "(--max-beam; 0 = no beam trace)")  # fmt: skip
        top_k = field(body, "top_k", int, 5)
        if not 1 <= top_k <= 100:
            raise ApiError(422, "'top_k' (next-token candidates shown) must be in 1..100")
        max_len = field(body, "max_len", int)
        if max_len is not None and max_len < 1:
            raise ApiError(422, f"'max_len' must be at least 1, got {max_len}")
        overrides = {}  # DecodeConfig fields; sampling's top_k is sent as sample_top_k
        for name, kind in EXPLAIN_SEARCH.items():
            value = field(body, "sample_top_k" if name == "top_k" else name, kind)
            if value is not None:
                overrides[name] = value
        try:
            layers, heads, steps = (parse_indices(indices(body, k))
                                    for k in ("layers", "heads", "steps"))  # fmt: skip
            view = View(layers, heads, steps, field(body, "dims", int, 8),
                        field(body, "precision", int, 4))  # fmt: skip
        except AiaynError as e:
            raise ApiError(422, str(e)) from None
        tensors = field(body, "tensors", str, "all")
        if tensors not in ("all", "attention"):
            raise ApiError(422, "'tensors' must be 'all' or 'attention' (the weights only)")
        t = self.translator

        def work() -> dict[str, Any]:
            trace = trace_sentence(t.model, t.tokenizer, sentence, t.cfg, top_k=top_k,
                                   max_len=max_len, beam=beam, overrides=overrides)  # fmt: skip
            out = to_json(trace, view)
            if tensors == "attention":
                out["tensors"] = [x for x in out["tensors"] if x["name"].endswith(".weights")]
            return out

        timeout = self.limits.timeout_s
        return await self.run(request, lambda: self.batcher.call(work, timeout))

    def model_info(self) -> dict[str, Any]:
        t = self.translator
        langs = self.languages
        return {
            "name": self.model_dir.resolve().name,
            "aiayn": __version__,
            "languages": {"source": langs[0], "target": langs[1]} if langs else None,
            "model": to_dict(t.model.cfg),
            "parameters": sum(p.numel() for p in t.model.parameters()),
            "vocab_size": t.tokenizer.vocab_size,
            "decode": dataclasses.asdict(t.cfg),
            "precision": t.precision.to_json(),
            "limits": dataclasses.asdict(self.limits),
            "examples": self.examples,
        }


def create_app(translator: Translator, model_dir: Path, opts: ServeOptions) -> FastAPI:
    """The FastAPI app; its lifespan stops the model worker after the last answer."""
    server: Server | None = None

    @contextlib.asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        yield
        assert server is not None
        server.batcher.close()  # uvicorn has answered every request it accepted by now

    app = FastAPI(title="aiayn serve", version=__version__, lifespan=lifespan,
                  docs_url="/docs", redoc_url=None)  # fmt: skip
    server = Server(translator, model_dir, opts)
    app.state.server = server
    page = resources.files("aiayn").joinpath("static/serve.html").read_text(encoding="utf-8")

    @app.exception_handler(ApiError)
    async def api_error(_r: Request, e: ApiError) -> JSONResponse:
        return _error(e.status, str(e))

    @app.exception_handler(HTTPException)
    async def http_error(_r: Request, e: HTTPException) -> JSONResponse:
        return _error(e.status_code, str(e.detail))

    @app.exception_handler(RequestValidationError)
    async def validation_error(_r: Request, e: RequestValidationError) -> JSONResponse:
        first = e.errors()[0] if e.errors() else {}
        return _error(422, f"{'.'.join(map(str, first.get('loc', ())))}: {first.get('msg', e)}")

    @app.exception_handler(Exception)
    async def internal_error(_r: Request, e: Exception) -> JSONResponse:
        log.exception("unexpected error")
        return _error(500, f"internal error: {type(e).__name__}")

    @app.get("/", response_class=HTMLResponse, include_in_schema=False)
    async def index(request: Request) -> HTMLResponse:
        server.check_key(request)
        return HTMLResponse(page)

    @app.get("/health")
    async def health() -> dict[str, Any]:
        # in_flight: other requests accepted and not yet answered (this one is not counted)
        in_flight = server.accepted - server.answered - 1
        return {"status": "ok", "queued": server.batcher.queued(), "in_flight": in_flight}

    @app.get("/metrics", include_in_schema=False)
    async def metrics(request: Request) -> Response:
        server.check_key(request)
        return Response(generate_latest(server.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/model")
    async def model(request: Request) -> dict[str, Any]:
        server.check_key(request)
        return server.model_info()

    @app.get("/languages")
    async def languages(request: Request) -> list[dict[str, Any]]:
        server.check_key(request)
        if not server.languages:
            return []
        src, tgt = server.languages
        return [{"code": src, "name": language_name(src), "targets": [tgt]},
                {"code": tgt, "name": language_name(tgt), "targets": []}]  # fmt: skip

    @app.post("/detect")
    async def detect(request: Request) -> list[dict[str, Any]]:
        body = await server.body(request)
        texts(body)
        langs = server.languages
        return [{"confidence": 100.0, "language": langs[0]}] if langs else []

    app.post("/translate")(server.libre_translate)
    app.post("/v1/translate")(server.v1_translate)
    app.post("/v1/explain")(server.v1_explain)
    app.add_middleware(Accounting, server=server)  # type: ignore[arg-type]
    return app


# --- running it -----------------------------------------------------------------------------------


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def listen(host: str, port: int) -> socket.socket:
    """A listening socket on host:port (port 0 = any free port): a clear error if taken."""
    try:
        family, _, _, _, addr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(addr)
    except OSError as e:
        raise AiaynError(f"cannot listen on {host}:{port}: {e.strerror or e}") from None
    sock.listen(2048)
    return sock


def serve(model_dir: Path, opts: ServeOptions, *, device: str = "auto", dtype: str = "auto",
          announce: Callable[[str], None] = print) -> dict[str, int]:  # fmt: skip
    """Load the model and serve until SIGTERM or Ctrl-C; a SIGTERM drains and returns the
    count of requests accepted and answered (equal unless a client went away mid-answer).

    On SIGTERM uvicorn stops accepting connections, answers every request it has accepted,
    then runs the app's shutdown (the model worker answers what is queued and stops).
    """
    import uvicorn

    if not is_loopback(opts.host) and not opts.api_key:
        raise AiaynError(f"--host {opts.host} is reachable from other machines: give --api-key "
                         "KEY (or set AIAYN_API_KEY), or serve on 127.0.0.1")  # fmt: skip
    translator = Translator.load(model_dir, device=device, dtype=dtype)
    app = create_app(translator, model_dir, opts)
    sock = listen(opts.host, opts.port)
    host, port = sock.getsockname()[:2]
    config = uvicorn.Config(app, log_level="info", access_log=opts.access_log,
                            timeout_keep_alive=5)  # fmt: skip
    server = uvicorn.Server(config)
    where = f"[{host}]" if ":" in host else host
    announce(f"aiayn serve: {model_dir} ({translator.device}) on http://{where}:{port}/")
    # uvicorn re-raises the SIGTERM it handled once it has drained; a handler that does
    # nothing turns that into a normal return, so the process exits 0.
    previous = signal.signal(signal.SIGTERM, lambda _sig, _frame: None)
    try:
        server.run(sockets=[sock])
    finally:
        signal.signal(signal.SIGTERM, previous)
        sock.close()
    return {"accepted": app.state.server.accepted, "answered": app.state.server.answered}
