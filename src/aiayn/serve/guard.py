"""What runs around every handler of `aiayn serve`: `Guard` (Host allowlist, API key, the body
read with a cap, content types) and `Accounting` (Prometheus metrics, the access log without
query strings, the count of requests accepted and answered), and the one error shape.

Both are pure ASGI middleware: they see every request before FastAPI does, so a hostile one
(an oversized or chunked body, a foreign Host, a cross-site form) is refused before any
handler, model or parser runs. `aiayn.serve.app` owns the server they guard (`Guarded`).
"""

from __future__ import annotations

import contextlib
import gc
import itertools
import json
import logging
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping
from typing import Protocol
from urllib.parse import parse_qs

from fastapi.responses import JSONResponse
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics
from prometheus_client.core import GaugeMetricFamily, HistogramMetricFamily, Metric

from aiayn.runtime.gc_pauses import BUCKETS, GENERATIONS, GcPauses, gc_pauses
from aiayn.serve.jobs import BatchStats
from aiayn.serve.requests import ApiError

access_log = logging.getLogger("aiayn.serve.access")


class GuardOptions(Protocol):
    """The server options the middleware reads (`aiayn.serve.app.ServeOptions`)."""

    @property
    def api_key(self) -> str | None: ...

    @property
    def access_log(self) -> bool: ...


class Guarded(Protocol):
    """What the middleware needs of the server (`aiayn.serve.app.Server`)."""

    metrics: Metrics
    accepted: int
    answered: int
    max_body: int

    @property
    def opts(self) -> GuardOptions: ...

    def check_host(self, host_header: str) -> None: ...

    def check_key(self, given: str | None) -> None: ...


# --- metrics --------------------------------------------------------------------------------------

PATHS = (
    "/",
    "/translate",
    "/languages",
    "/detect",
    "/v1/translate",
    "/v1/explain",
    "/v1/explain/seed",
    "/v1/explain/lm",
    "/v1/generate",
    "/v1/classify",
    "/v1/explain/classify",
    "/v1/model",
    "/health",
    "/metrics",
)


class Metrics:
    """The server's Prometheus metrics, in a registry of its own (one per app)."""

    def __init__(self, batcher_queue: Callable[[], int]) -> None:
        disable_created_metrics()  # no `_created` series: counters and histograms only
        self.registry = r = CollectorRegistry()
        self.requests = Counter(
            "aiayn_requests", "HTTP requests answered", ["endpoint", "status"], registry=r
        )
        self.latency = Histogram(
            "aiayn_request_seconds",
            "time from request to response",
            ["endpoint"],
            registry=r,
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
        )
        self.sentences = Counter("aiayn_sentences", "sentences translated", registry=r)
        self.src_tokens = Counter("aiayn_source_tokens", "source tokens read", registry=r)
        self.tgt_tokens = Counter("aiayn_target_tokens", "target tokens written", registry=r)
        self.batch_sentences = Histogram(
            "aiayn_batch_sentences",
            "sentences per merged model batch",
            registry=r,
            buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256, 512),
        )
        self.batch_requests = Histogram(
            "aiayn_batch_requests",
            "requests per merged model batch",
            registry=r,
            buckets=(1, 2, 4, 8, 16, 32, 64),
        )
        self.batch_seconds = Histogram(
            "aiayn_batch_seconds", "model time per merged batch", registry=r
        )
        self.dropped = Counter(
            "aiayn_dropped_requests", "requests dropped before decoding", ["reason"], registry=r
        )
        Gauge("aiayn_queued_jobs", "jobs waiting for the model", registry=r).set_function(
            batcher_queue
        )
        r.register(GcMetrics(gc_pauses()))

    def batch(self, s: BatchStats) -> None:
        self.sentences.inc(s.sentences)
        self.src_tokens.inc(s.src_tokens)
        self.tgt_tokens.inc(s.tgt_tokens)
        self.batch_sentences.observe(s.sentences)
        self.batch_requests.observe(s.requests)
        self.batch_seconds.observe(s.seconds)


class GcMetrics:
    """The garbage collector's pauses (aiayn.runtime.gc_pauses) as Prometheus families, built
    at each scrape from the counts the collector's callback keeps."""

    def __init__(self, pauses: GcPauses) -> None:
        self.pauses = pauses

    def collect(self) -> Iterator[Metric]:
        p = self.pauses
        hist = HistogramMetricFamily(
            "aiayn_gc_pause_seconds",
            "time the garbage collector stopped the server, by generation (2: a full collection)",
            labels=["generation"],
        )
        longest = GaugeMetricFamily(
            "aiayn_gc_pause_max_seconds",
            "the longest collection so far, by generation",
            labels=["generation"],
        )
        for g in range(GENERATIONS):
            buckets = list(
                zip((*map(str, BUCKETS), "+Inf"), itertools.accumulate(p.counts[g]), strict=True)
            )
            hist.add_metric([str(g)], buckets, p.sums[g])
            longest.add_metric([str(g)], p.longest[g])
        yield hist
        yield longest
        yield GaugeMetricFamily(
            "aiayn_gc_frozen_objects",
            "objects frozen out of garbage collection as the server started",
            gc.get_freeze_count(),
        )

    describe = collect  # the registry reads the names from it


class Accounting:
    """Pure ASGI middleware, outermost: metrics and the access log for every response (the
    path only: a query string can hold the API key), and the count of requests accepted and
    answered (logged at shutdown: nothing accepted is lost on SIGTERM)."""

    def __init__(self, app: Callable[..., Awaitable[None]], server: Guarded) -> None:
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
                message = {**message, "headers": [*message.get("headers", []), *SAFE_HEADERS]}
            await send(message)
            if message["type"] == "http.response.body" and not message.get("more_body"):
                self.server.answered += 1

        try:
            await self.app(scope, receive, counted)
        finally:
            seconds = time.perf_counter() - t0
            endpoint = scope["path"] if scope["path"] in PATHS else "other"
            self.metrics.requests.labels(endpoint, str(status)).inc()
            self.metrics.latency.labels(endpoint).observe(seconds)
            if self.server.opts.access_log:
                client = scope.get("client") or ("-", 0)
                access_log.info(
                    '%s "%s %s" %d %.1f ms',
                    client[0],
                    scope["method"],
                    scope["path"],
                    status,
                    1000 * seconds,
                )


# On every response: no MIME sniffing, the page never framed by another site (clickjacking),
# and no Referer (the page's address may hold ?api_key=).
SAFE_HEADERS = [
    (b"x-content-type-options", b"nosniff"),
    (b"x-frame-options", b"DENY"),
    (b"referrer-policy", b"no-referrer"),
]

JSON_ONLY = (
    "/v1/translate",
    "/v1/explain",
    "/v1/explain/lm",
    "/v1/generate",
    "/v1/classify",
    "/v1/explain/classify",
)
JSON_OR_FORM = ("/translate", "/detect")  # LibreTranslate's clients send forms too
NO_KEY = ("/health",)


class Guard:
    """Pure ASGI middleware in front of every handler (module docstring): Host, content type,
    API key and the body, read with a cap; the handlers then read the body it kept."""

    def __init__(self, app: Callable[..., Awaitable[None]], server: Guarded) -> None:
        self.app, self.server = app, server

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        try:
            body = await self.check(scope, receive)
        except ApiError as e:
            await error_response(e.status, str(e))(scope, receive, send)
            return
        if body is None:
            await self.app(scope, receive, send)
            return
        replayed = False

        async def replay() -> dict:
            nonlocal replayed
            if not replayed:  # the body once, then the connection's own messages (disconnect)
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)

    async def check(self, scope: dict, receive: Callable) -> bytes | None:
        """The body of a POST (None for other methods), once every check has passed."""
        server, path = self.server, scope["path"]
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        server.check_host(headers.get("host", ""))
        key = server.opts.api_key is not None and path not in NO_KEY
        given = _key_in(headers, scope.get("query_string", b"")) if key else None
        if given is not None:
            server.check_key(given)  # a wrong key is refused before the body is read
        if scope["method"] != "POST":
            if key and given is None:
                server.check_key(None)
            return None
        body = await _read_body(receive, headers.get("content-length"), server.max_body)
        if key and given is None:  # before anything is said about the body
            server.check_key(_key_in_body(body, headers.get("content-type", "")))
        _check_content_type(path, headers.get("content-type", ""))
        return body


def _key_in(headers: dict[str, str], query: bytes) -> str | None:
    """The key of a Bearer header, or of `?api_key=` (how the page is opened)."""
    auth = headers.get("authorization", "")
    if auth.lower().startswith("bearer ") and auth[7:].strip():
        return auth[7:].strip()
    values = parse_qs(query.decode("latin-1")).get("api_key")
    return values[0] if values else None


def _key_in_body(body: bytes, content_type: str) -> str | None:
    """LibreTranslate's clients send the key as `api_key` in the JSON body or the form."""
    # RecursionError: json's answer to "[[[[..." nested deeper than Python's stack allows
    with contextlib.suppress(ValueError, UnicodeDecodeError, RecursionError):
        if media_type(content_type) == "application/x-www-form-urlencoded":
            return parse_qs(body.decode("utf-8")).get("api_key", [None])[0]
        data = json.loads(body)
        value = data.get("api_key") if isinstance(data, dict) else None  # `[...]` has no key
        return value if isinstance(value, str) else None
    return None


def media_type(content_type: str) -> str:
    return content_type.split(";", 1)[0].strip().lower()


def _check_content_type(path: str, content_type: str) -> None:
    media = media_type(content_type)
    if path in JSON_ONLY and media != "application/json":
        raise ApiError(
            415,
            f"send the body as JSON (Content-Type: application/json), not "
            f"{media or 'no content type'}",
        )
    if path in JSON_OR_FORM and media not in (
        "application/json",
        "application/x-www-form-urlencoded",
    ):
        raise ApiError(
            415,
            "send the body as JSON (application/json) or a form "
            f"(application/x-www-form-urlencoded), not "
            f"{media or 'no content type'}",
        )


async def _read_body(receive: Callable, length: str | None, cap: int) -> bytes:
    """The whole body, refused (413) as soon as it passes `cap` bytes: by its Content-Length
    when it has one, else while it streams in (chunked)."""
    if length is not None:
        if not length.strip().isdigit():
            raise ApiError(400, f"invalid Content-Length {length[:20]!r}")
        if int(length) > cap:
            raise ApiError(413, f"the body has {int(length)} bytes; the limit is {cap}")
    parts, size = [], 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ApiError(499, "client closed the request")
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > cap:
            raise ApiError(413, f"the body has more than {cap} bytes; the limit is {cap}")
        parts.append(chunk)
        if not message.get("more_body"):
            return b"".join(parts)


def error_response(
    status: int, message: str, headers: Mapping[str, str] | None = None
) -> JSONResponse:
    headers = {**(headers or {}), **({"WWW-Authenticate": "Bearer"} if status == 401 else {})}
    return JSONResponse({"error": message}, status_code=status, headers=headers or None)


def allowed_hosts(bound: str, extra: tuple[str, ...]) -> frozenset[str] | None:
    """The Host names served: loopback names, the bound address and `extra`; None (any) for
    `--allowed-host '*'`, or a wildcard bind (0.0.0.0, ::) without --allowed-host, which is
    only allowed with an API key, and whose clients use names this process cannot know."""
    if "*" in extra or (not extra and bound in ("0.0.0.0", "::", "")):
        return None
    names = {"localhost", "127.0.0.1", "[::1]", *(h.lower() for h in extra)}
    names.add(f"[{bound}]" if ":" in bound else bound.lower())
    return frozenset(names)
