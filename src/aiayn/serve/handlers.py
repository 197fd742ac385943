"""What the endpoints of `aiayn serve` do, apart from HTTP: the `Server` (translator, model
worker, options, metrics, the model's languages and examples) and its handlers' logic, each
body already a pydantic model bounded by this server's limits (aiayn.serve.requests).
"""

from __future__ import annotations

import asyncio
import dataclasses
import hmac
import json
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

import torch
from fastapi import Request
from pydantic import BaseModel, ValidationError
from starlette.types import Receive

from aiayn import __version__
from aiayn.config import MAX_ROWS, DecodeConfig, search_rows
from aiayn.config_files import to_dict
from aiayn.errors import AiaynError
from aiayn.glassbox.explain_report import trace_sentence, trace_settings
from aiayn.glassbox.render import View, to_json
from aiayn.nn.tracing import TraceTooLargeError
from aiayn.serve.batcher import Batcher
from aiayn.serve.guard import Metrics, allowed_hosts, media_type
from aiayn.serve.jobs import ClosedError, ExpiredError, Job, QueueFullError
from aiayn.serve.requests import (
    ApiError,
    Limits,
    check_sizes,
    example_sentences,
    language_name,
    model_languages,
    request_models,
    validation_message,
)
from aiayn.store.directory import ModelDir, open_model_dir
from aiayn.translate.translator import Translation, Translator


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
    allowed_hosts: tuple[str, ...] = ()  # Host names accepted besides loopback and the bound one
    cors_origins: tuple[str, ...] = ()  # origins a browser may call the API from (none: no CORS)
    chunk_rows: int = 128  # search rows in one turn of the model worker, at most
    continuous: bool = True  # greedy and beam requests join a running search (serve.streams)
    turn_tokens: int = 8192  # rows x their output-length limit in one turn, at most
    max_connections: int = 1024  # open connections and requests at once (then 503)


def _hypothesis(t: Translation) -> dict[str, Any]:
    h = t.hyp
    return {
        "text": t.text,
        "tokens": h.tokens,
        "log_prob": h.log_prob,
        "score": h.score,
        "eos": h.eos,
    }


EXPLAIN_SEARCH = ("alpha", "length_penalty", "min_len", "sample", "temperature", "top_p", "seed")


class BaseServer:
    """What every server shares, whatever its model: options, limits, the model worker, metrics,
    the Host and key checks, and `run` (a job for the worker, answered or abandoned)."""

    kind: str  # "translator" or "language_model": what /health and /v1/model say

    def __init__(self, translator: Translator | None, opts: ServeOptions, vocab_size: int) -> None:
        self.opts, self.limits = opts, opts.limits
        if self.limits.max_beam > vocab_size:  # a request could ask for more beams than tokens
            raise AiaynError(
                f"--max-beam {self.limits.max_beam} exceeds the model's vocabulary "
                f"of {vocab_size} tokens"
            )
        if self.limits.max_beam > MAX_ROWS:  # nor more beams or samples than a search takes
            raise AiaynError(f"--max-beam {self.limits.max_beam} is more than {MAX_ROWS:,}")
        self.batcher = Batcher(
            translator,
            window_s=opts.window_ms / 1000,
            batch_tokens=opts.batch_tokens,
            chunk_rows=opts.chunk_rows,
            turn_tokens=opts.turn_tokens,
            continuous=opts.continuous,
            max_queue=opts.max_queue,
        )
        self.metrics = Metrics(self.batcher.queued)
        self.batcher.on_batch = self.metrics.batch
        self.accepted = self.answered = 0  # counted by `Accounting`
        self.max_body = self.limits.max_body_bytes
        self.allowed_hosts = allowed_hosts(opts.host, opts.allowed_hosts)

    def model_info(self) -> dict[str, Any]:
        """What GET /v1/model says: the model, its settings, the server's limits."""
        raise NotImplementedError

    # --- per request ----------------------------------------------------------------------------

    def check_host(self, host_header: str) -> None:
        """DNS rebinding: a page on another site that resolves its name to 127.0.0.1 sends
        its own name as Host. None = any Host (a wildcard bind without --allowed-host)."""
        if self.allowed_hosts is None:
            return
        host = host_header.strip().lower()
        name = host.rpartition("]")[0] + "]" if host.startswith("[") else host.partition(":")[0]
        if name not in self.allowed_hosts:
            raise ApiError(
                400, f"Host {host_header[:100]!r} is not served here; add it with --allowed-host"
            )

    def check_key(self, given: str | None) -> None:
        if self.opts.api_key is None:
            return
        if not given:
            raise ApiError(
                401,
                "an API key is required: send 'Authorization: Bearer KEY' "
                'or "api_key" in the body',
            )
        if not hmac.compare_digest(given.encode(), self.opts.api_key.encode()):
            raise ApiError(403, "invalid API key")

    def output_cap(self, max_tokens: int | None = None) -> int:
        """Output tokens per sentence within the server's budget (--max-output-tokens)."""
        limit = self.limits.max_output_tokens
        return min(max_tokens or limit, limit)

    def capped(self, cfg: DecodeConfig) -> DecodeConfig:
        """`cfg` within the server's output budget per sentence."""
        return dataclasses.replace(cfg, max_tokens=self.output_cap())

    async def run(self, request: Request, submit: Callable[[], Job]) -> Any:
        """Queue a job for the model and wait for it: 503 when it cannot be answered in time;
        the job is abandoned (within one decoding step) if the client goes away first.

        One wait per request, for whichever comes first: the answer, the client leaving, the
        deadline. (Polling the connection every 50 ms instead took 42% of the event loop's
        samples at 128 clients: a wait with a timer and a cancel scope per poll.)"""
        try:
            job = submit()
        except QueueFullError as e:
            raise ApiError(503, f"server busy: {e}; retry later") from None
        except ClosedError as e:
            raise ApiError(503, str(e)) from None
        waiting = asyncio.wrap_future(job.future)
        gone = asyncio.ensure_future(client_gone(request.receive))
        try:
            left = max(job.deadline - time.monotonic(), 0.0)
            done, _ = await asyncio.wait(
                {waiting, gone}, timeout=left, return_when=asyncio.FIRST_COMPLETED
            )
            if waiting in done:  # answered (even if the client left at the same moment)
                return self._result(waiting)
            if gone in done:
                self.metrics.dropped.labels("disconnected").inc()
                raise ApiError(499, "client closed the request")
            self.metrics.dropped.labels("timeout").inc()
            raise ApiError(503, f"timed out after {self.limits.timeout_s:g} s (--timeout)")
        finally:
            gone.cancel()
            job.cancel()  # a no-op once answered; else the worker drops what is left

    async def traced(self, request: Request, trace: Callable[[], dict[str, Any]]) -> dict[str, Any]:
        """A page's trace (`trace()`, a glass-box function) computed on the model worker. A
        trace over --max-trace-numbers is 413 and a bad setting 422, as /v1/explain answers:
        they come back as values, so the worker does not log them as its own failures."""

        def work() -> dict[str, Any] | Exception:
            try:
                return trace()
            except TraceTooLargeError as e:
                return ApiError(413, f"{e} (--max-trace-numbers)")
            except AiaynError as e:
                return ApiError(422, str(e))

        timeout = self.limits.timeout_s
        found = await self.run(request, lambda: self.batcher.call(work, timeout))
        if isinstance(found, Exception):
            raise found
        return found  # type: ignore[no-any-return]

    def _result(self, waiting: asyncio.Future | Future) -> Any:
        try:
            return waiting.result()
        except ExpiredError as e:
            self.metrics.dropped.labels("timeout").inc()
            raise ApiError(503, f"{e} (--timeout {self.limits.timeout_s:g} s)") from None
        except TraceTooLargeError as e:
            raise ApiError(413, f"{e} (--max-trace-numbers)") from None
        except AiaynError as e:
            raise ApiError(422, str(e)) from None


class Server(BaseServer):
    """The state the translation endpoints share: the translator, its batcher, options and
    metrics."""

    kind = "translator"

    def __init__(
        self, translator: Translator, model_dir: Path | ModelDir, opts: ServeOptions
    ) -> None:
        opened = open_model_dir(model_dir)
        super().__init__(translator, opts, translator.model.cfg.vocab_size)
        self.translator, self.model_dir = translator, opened.path
        self.engine = opened.engine  # None: aiayn's own model, which can be traced
        # An export records no training files: its languages and examples are its source's.
        source = opened.source
        model_dir = opened.path
        self.languages: tuple[str, str] | None = model_languages(model_dir) or model_languages(
            source
        )
        if opts.source_lang and opts.target_lang:
            self.languages = (opts.source_lang, opts.target_lang)
        self.examples = example_sentences(model_dir, opts.examples) or example_sentences(
            source, None
        )
        cfg = translator.model.cfg
        self.models = request_models(self.limits, self.languages, cfg.n_layers, cfg.n_heads)

    def translate(self, request: Request, lines: list[str], cfg: DecodeConfig) -> Awaitable[Any]:
        timeout = self.limits.timeout_s
        return self.run(request, lambda: self.batcher.translate(lines, cfg, timeout))

    async def form(self, request: Request, model: type[BaseModel]) -> Any:
        """A LibreTranslate body (JSON or a form; `Guard` has read and capped it) as `model`."""
        raw = await request.body()
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise ApiError(400, f"the body is not valid UTF-8 (byte {e.start})") from None
        strict = media_type(request.headers.get("content-type", "")) == "application/json"
        if strict:  # JSON has types: only a form's strings are converted
            try:
                data = json.loads(text)
            except ValueError as e:
                raise ApiError(400, f"invalid JSON: {e}") from None
            except RecursionError:  # "[[[[..." deeper than Python's stack
                raise ApiError(400, "invalid JSON: nested too deeply") from None
        else:
            fields = parse_qs(text, keep_blank_values=True)
            data = {k: (v if k == "q" and len(v) > 1 else v[0]) for k, v in fields.items()}
        if not isinstance(data, dict):
            raise ApiError(400, f"the body must be a JSON object, not {type(data).__name__}")
        try:
            return model.model_validate(data, strict=strict)
        except ValidationError as e:
            first = e.errors()[0]
            if self.languages and first["loc"][:1] in (("source",), ("target",)):
                src, tgt = self.languages  # LibreTranslate answers 400 for a pair it lacks
                raise ApiError(
                    400,
                    f"this model translates {src} -> {tgt} ({language_name(src)} "
                    f"to {language_name(tgt)}); got {data.get('source')} -> "
                    f"{data.get('target')}",
                ) from None
            raise ApiError(422, validation_message(e.errors())) from None

    # --- endpoints ------------------------------------------------------------------------------

    async def libre_translate(self, request: Request) -> dict[str, Any]:
        body = await self.form(request, self.models.libre_translate)
        single = isinstance(body.q, str)
        items = [body.q] if single else body.q
        n_alt = body.alternatives
        # LibreTranslate translates text: each line is a sentence, line breaks are kept.
        split = [s.split("\n") for s in items]
        lines = [line for parts in split for line in parts]
        cfg = self.capped(self.translator.cfg)
        if n_alt:
            beam = max(cfg.beam_size, n_alt + 1)
            cfg = dataclasses.replace(cfg, beam_size=beam, nbest=n_alt + 1, sample=False)
        check_sizes(lines, self.limits, search_rows(cfg))
        results = await self.translate(request, lines, cfg)
        out, alts, start = [], [], 0
        for parts in split:
            mine = results[start : start + len(parts)]
            start += len(parts)
            out.append("\n".join(r[0].text for r in mine))
            alts.append(
                ["\n".join(r[min(k, len(r) - 1)].text for r in mine) for k in range(1, n_alt + 1)]
            )
        reply: dict[str, Any] = {"translatedText": out[0] if single else out}
        if n_alt:
            reply["alternatives"] = alts[0] if single else alts
        if body.source == "auto" and self.languages:
            detected = {"confidence": 100.0, "language": self.languages[0]}
            reply["detectedLanguage"] = detected if single else [detected] * len(items)
        return reply

    async def v1_translate(self, request: Request, body: Any) -> dict[str, Any]:
        items = [body.q] if isinstance(body.q, str) else body.q
        given = body.model_dump(exclude_none=True, exclude={"q", "api_key"})
        fields = {"beam": "beam_size"}
        given = {fields.get(k, k): v for k, v in given.items()}
        given["max_tokens"] = self.output_cap(given.get("max_tokens"))
        default = self.translator.cfg
        sample = given.get("sample", default.sample)
        if "nbest" in given and not sample:  # n-best of a beam search needs a beam that wide
            given["beam_size"] = max(given.get("beam_size", default.beam_size), given["nbest"])
        try:
            cfg = self.translator.settings(**given)
        except AiaynError as e:
            raise ApiError(422, str(e)) from None
        check_sizes(items, self.limits, search_rows(cfg))
        results = await self.translate(request, items, cfg)
        translations = [
            {"text": r[0].text, "hypotheses": [_hypothesis(t) for t in r]} for r in results
        ]
        # A shallow copy, not dataclasses.asdict: the fields are numbers, nothing to copy deeply.
        return {"translations": translations, "settings": dict(vars(cfg))}

    async def v1_explain(self, request: Request, body: Any) -> dict[str, Any]:
        if self.engine is not None:
            raise ApiError(
                409,
                f"this server runs a {self.engine} export, which has nothing to "
                "trace: serve the aiayn model directory it was exported from "
                "to see inside it",
            )
        overrides: dict[str, object] = {
            k: v for k in EXPLAIN_SEARCH if (v := getattr(body, k)) is not None
        }
        if body.sample_top_k is not None:
            overrides["top_k"] = body.sample_top_k  # sampling's top-k (`top_k`: shown candidates)
        t = self.translator
        cfg = self.capped(t.cfg)
        try:
            trace_settings(cfg, body.top_k, body.max_len, body.beam, overrides)
        except AiaynError as e:
            raise ApiError(422, str(e)) from None
        tuple_or_none = lambda xs: None if xs is None else tuple(xs)  # noqa: E731
        view = View(
            tuple_or_none(body.layers),
            tuple_or_none(body.heads),
            tuple_or_none(body.steps),
            body.dims,
            body.precision,
        )
        attention_only = body.tensors == "attention"

        def want(name: str) -> bool:  # what is returned is all that is recorded
            decoder = name.startswith("step")  # the decoder's names are its steps' (`step{t}.`)
            if body.stack is not None and decoder != (body.stack == "decoder"):
                return False
            return view.shows(name) and (not attention_only or name.endswith(".weights"))

        def work() -> dict[str, Any]:
            trace = trace_sentence(
                t.model,
                t.tokenizer,
                body.q,
                cfg,
                top_k=body.top_k,
                max_len=body.max_len,
                beam=body.beam,
                overrides=overrides,
                want=want,
                max_numel=self.limits.max_trace_numbers,
            )
            return to_json(trace, view)

        timeout = self.limits.timeout_s
        return await self.run(request, lambda: self.batcher.call(work, timeout))

    def model_info(self) -> dict[str, Any]:
        t = self.translator
        langs = self.languages
        return {
            "name": self.model_dir.resolve().name,
            "aiayn": __version__,
            "kind": self.kind,
            "languages": {"source": langs[0], "target": langs[1]} if langs else None,
            "engine": self.engine or "aiayn",
            "traceable": self.engine is None,
            "model": to_dict(t.model.cfg),
            "parameters": sum(p.numel() for p in t.model.parameters())
            if isinstance(t.model, torch.nn.Module)
            else None,
            "vocab_size": t.tokenizer.vocab_size,
            "decode": dataclasses.asdict(t.cfg),
            "precision": t.precision.to_json(),
            "limits": dataclasses.asdict(self.limits),
            "examples": self.examples,
        }


async def client_gone(receive: Receive) -> None:
    """Return when the client has gone. Once a request's body is read, an ASGI server answers
    `receive()` only with `http.disconnect`: when the connection closes (or the response has
    been sent), not before, so waiting on it costs nothing while the model works."""
    while (await receive())["type"] != "http.disconnect":
        pass
