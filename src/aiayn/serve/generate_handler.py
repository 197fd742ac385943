# The body of /v1/explain/lm is built at run time from the model's layers and heads (bounds a
# static type cannot hold), as aiayn.serve.requests builds its own: mypy sees its field types
# as variables.
# mypy: disable-error-code="valid-type"
"""`POST /v1/generate`: a language model (`aiayn.nn.variants.DecoderLM`, through
`aiayn.generate.generator.Generator`) continues prompts, answered whole or streamed as
server-sent events.

The generation runs on the model worker (`aiayn.serve.batcher`) as `call` jobs, never on the
event loop, with the translator's guarantees: a typed body bounded by the server's limits
(`aiayn.serve.requests.generate_model`), rows (prompts x samples or beams) within --max-rows,
the --timeout deadline, and a search that stops within one step when its client leaves
(`aiayn.search.step.stop_when`, asked by the worker).

No continuous batching here: a translator's sentences join a running search between two steps
(aiayn.serve.streams) because each row's encoder output is computed once and the decoder's
cache starts empty; a DecoderLM's prompt must first be run into its row's KV cache (the
prefill, of the prompt's length) and a sampled row may restart from the last half of its
context, which the running search's step-at-a-time rows cannot take in. So each request runs
its own searches: it is cut into parts of at most --turn-tokens (rows x max_tokens, one prompt
at least), one call job each, queued one after the other, so that one large request holds the
model for a part at a time, as a translation's turns do.

`POST /v1/explain/lm` is the live page's (static/lm.html): one traced forward pass over the
prompt (aiayn.glassbox.lm_page), run on the model worker as /v1/explain is on a translator's.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import json
import logging
import time
from collections.abc import AsyncIterator, Callable, Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import Annotated, Any, Literal

import torch
from fastapi import Request
from fastapi.responses import StreamingResponse
from pydantic import Field

from aiayn import __version__
from aiayn.config import DecodeConfig, search_rows
from aiayn.config_files import to_dict
from aiayn.errors import AiaynError
from aiayn.generate.generator import Generation, Generator
from aiayn.glassbox.lm_page import lm_page_data
from aiayn.nn.variants import DecoderLM
from aiayn.serve.handlers import BaseServer, ServeOptions
from aiayn.serve.jobs import BatchStats, ClosedError, QueueFullError
from aiayn.serve.requests import (
    ApiError,
    Key,
    Limits,
    StrictBody,
    _int,
    _text,
    check_sizes,
    generate_model,
)
from aiayn.store.directory import ModelDir, open_model_dir

log = logging.getLogger(__name__)

# What a server answers (404 and this line) on the endpoints of the other kind of model.
ON_LM_SERVER = "this server holds a language model: POST /v1/generate"
ON_TRANSLATOR_SERVER = (
    "this server holds a translation model: POST /v1/translate (or /translate); "
    "/v1/generate needs a language model (a DecoderLM)"
)
ON_TRANSLATOR_SERVER_LM = (
    "this server holds a translation model: POST /v1/explain traces a sentence; "
    "/v1/explain/lm needs a language model (a DecoderLM)"
)


def lm_explain_model(limits: Limits, n_layers: int, n_heads: int) -> type[StrictBody]:
    """The body of /v1/explain/lm: aiayn.glassbox.lm_page's arguments, bounded by this
    server's limits and this model's layers and heads."""
    Layer, Head = _int(0, max(n_layers - 1, 0)), _int(1, n_heads)

    class V1ExplainLMRequest(StrictBody):
        """One forward pass over BOS + `q` (the prompt, "" too): its causal self-attention,
        the next-token distribution as temperature, top-k (0: off) and top-p reshape it
        (`show`: the most probable listed), and the forward-pass tensors of `layers` and
        `heads` (default all; `tensors: "attention"`: the weights only). The live page's."""

        q: _text(limits.max_chars_per_sentence)
        temperature: Annotated[float, Field(gt=0, le=100)] = 1.0
        top_k: _int(0, 1_000_000) = 0
        top_p: Annotated[float, Field(gt=0, le=1)] = 1.0
        show: _int(1, 100) = 10
        tensors: Literal["all", "attention", "none"] = "all"
        layers: Annotated[list[Layer], Field(max_length=n_layers)] | None = None
        heads: Annotated[list[Head], Field(max_length=n_heads)] | None = None
        precision: _int(0, 12) = 4
        api_key: Key = None

    return V1ExplainLMRequest


def completion(g: Generation) -> dict[str, Any]:
    return {
        "text": g.text,
        "tokens": g.tokens,
        "log_prob": g.log_prob,
        "prompt_tokens": g.prompt_tokens,
        "finish_reason": "eos" if g.eos else "length",
    }


def sse(event: str, data: object) -> str:
    """One server-sent event (its data one line of JSON)."""
    return f"event: {event}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n"


class LMServer(BaseServer):
    """The state of a language model's server: its generator, the model worker, options."""

    kind = "language_model"

    def __init__(
        self, generator: Generator, model_dir: Path | ModelDir, opts: ServeOptions
    ) -> None:
        super().__init__(None, opts, generator.model.cfg.vocab_size)
        self.generator, self.model_dir = generator, open_model_dir(model_dir).path
        self.body = generate_model(self.limits)
        cfg = generator.model.cfg
        self.explain_body = lm_explain_model(self.limits, cfg.n_layers, cfg.n_heads)

    # --- what a request asks for ----------------------------------------------------------------

    def settings(self, body: Any) -> DecodeConfig:
        """The request's search settings: unset fields take the generator's, a `beam`
        without `sample` searches, `num_samples` over a beam widens it (as /v1/translate)."""
        default = self.generator.cfg
        keep = ("temperature", "top_k", "top_p", "seed", "min_len", "alpha", "length_penalty")
        given: dict[str, object] = {k: v for k in keep if (v := getattr(body, k)) is not None}
        sample = body.sample if body.sample is not None else default.sample and body.beam is None
        given["sample"] = sample
        if body.beam is not None:
            given["beam_size"] = body.beam
        if body.num_samples is not None:
            given["nbest"] = body.num_samples
            if not sample:  # n-best of a beam search needs a beam that wide
                beam = int(given.get("beam_size", default.beam_size))  # type: ignore[call-overload]
                given["beam_size"] = max(beam, body.num_samples)
        saved = default.max_len_b if default.max_tokens <= 0 else default.max_tokens
        tokens = body.max_tokens or max(1, min(saved, self.limits.max_output_tokens))
        try:
            cfg = self.generator.settings(tokens, **given)
        except AiaynError as e:
            raise ApiError(422, str(e)) from None
        return dataclasses.replace(cfg, max_tokens=tokens)

    def parts(self, n_prompts: int, cfg: DecodeConfig) -> list[tuple[int, int]]:
        """The prompts cut into runs of rows x max_tokens within --turn-tokens (module
        docstring), one prompt at least each."""
        per = max(1, self.opts.turn_tokens // max(1, search_rows(cfg) * cfg.max_tokens))
        return [(a, min(a + per, n_prompts)) for a in range(0, n_prompts, per)]

    def work(
        self,
        prompts: Sequence[str],
        cfg: DecodeConfig,
        first: int,
        on_token: Callable[[int, str], None] | None = None,
    ) -> Callable[[], list[list[Generation]]]:
        """What the model worker runs for prompts `first`, `first + 1`, ... (seeded by their
        line numbers in the request, as `Generator.generate_all` of the whole request)."""

        def run() -> list[list[Generation]]:
            t0 = time.monotonic()
            found = self.generator.generate_all(
                prompts, cfg, first_line_no=first + 1, on_token=on_token
            )
            # the metrics' sentences and source/target tokens: prompts, their tokens, new ones
            prompt_tokens = sum(g[0].prompt_tokens for g in found if g)
            made = sum(len(x.tokens) for g in found for x in g)
            self.metrics.batch(
                BatchStats(1, len(found), prompt_tokens, made, time.monotonic() - t0)
            )
            return found

        return run

    # --- the endpoint ---------------------------------------------------------------------------

    async def v1_generate(self, request: Request, body: Any) -> Any:
        prompts = [body.prompt] if isinstance(body.prompt, str) else list(body.prompt)
        cfg = self.settings(body)
        check_sizes(prompts, self.limits, search_rows(cfg))
        deadline = time.monotonic() + self.limits.timeout_s
        if body.stream:
            return StreamingResponse(
                self.stream(prompts, cfg, deadline),
                media_type="text/event-stream",
                headers={"Cache-Control": "no-cache"},
            )
        found: list[list[Generation]] = []
        for a, b in self.parts(len(prompts), cfg):
            job = functools.partial(
                self.batcher.call, self.work(prompts[a:b], cfg, a), deadline - time.monotonic()
            )
            found += await self.run(request, job)
        return self.reply(found, cfg)

    async def v1_explain_lm(self, request: Request, body: Any) -> dict[str, Any]:
        """The live page's JSON (aiayn.glassbox.lm_page), computed on the model worker
        (`traced`: a bad setting 422, a trace over --max-trace-numbers 413)."""
        g = self.generator
        model = g.model
        assert isinstance(model, DecoderLM)  # the server loads aiayn's own (launch.py)
        return await self.traced(
            request,
            lambda: lm_page_data(
                model,
                g.tokenizer,
                body.q,
                temperature=body.temperature,
                top_k=body.top_k,
                top_p=body.top_p,
                show=body.show,
                tensors=body.tensors,
                layers=body.layers,
                heads=body.heads,
                precision=body.precision,
                max_numel=self.limits.max_trace_numbers,
            ),
        )

    def reply(self, found: list[list[Generation]], cfg: DecodeConfig) -> dict[str, Any]:
        return {
            "completions": [[completion(g) for g in gs] for gs in found],
            "model": self.model_dir.resolve().name,
            "settings": dict(vars(cfg)),
        }

    async def stream(
        self, prompts: list[str], cfg: DecodeConfig, deadline: float
    ) -> AsyncIterator[str]:
        """`token` events ({"prompt", "sample", "text"}: new text of one completion) as the
        worker produces them (a beam's at its end), then `done` (the whole reply), or `error`
        ({"error", "status"}) instead.
        A client that leaves cancels this generator (Starlette listens for the disconnect):
        its job is cancelled, and the worker's search stops within a step."""
        loop = asyncio.get_running_loop()
        heard: asyncio.Queue[tuple[int, str] | None] = asyncio.Queue()
        n = cfg.nbest if cfg.sample else 1  # rows per prompt that report tokens
        found: list[list[Generation]] = []
        streamed: dict[tuple[int, int], int] = {}  # (prompt, sample): characters sent
        job = None
        try:
            for a, b in self.parts(len(prompts), cfg):

                def hear(row: int, text: str, first_row: int = a * n) -> None:  # worker thread
                    loop.call_soon_threadsafe(heard.put_nowait, (first_row + row, text))

                try:
                    fn = self.work(prompts[a:b], cfg, a, hear)
                    job = self.batcher.call(fn, deadline - time.monotonic())
                except (QueueFullError, ClosedError) as e:
                    yield sse("error", {"error": f"server busy: {e}", "status": 503})
                    return
                # after every token the worker reported: the callbacks run in order
                job.future.add_done_callback(
                    lambda _f: loop.call_soon_threadsafe(heard.put_nowait, None)
                )
                while True:
                    try:
                        left = max(deadline - time.monotonic(), 0.0)
                        item = await asyncio.wait_for(heard.get(), timeout=left)
                    except TimeoutError:
                        self.metrics.dropped.labels("timeout").inc()
                        timeout = self.limits.timeout_s
                        message = f"timed out after {timeout:g} s (--timeout)"
                        yield sse("error", {"error": message, "status": 503})
                        return
                    if item is None:
                        break
                    row, text = item
                    where = (row // n, row % n)
                    streamed[where] = streamed.get(where, 0) + len(text)
                    yield sse("token", {"prompt": where[0], "sample": where[1], "text": text})
                try:
                    found += self.result(job.future)
                except ApiError as e:
                    yield sse("error", {"error": str(e), "status": e.status})
                    return
            # What was not heard as it was made: a beam's completions (ranked at the end), and
            # a last character the generator held back as cut (U+FFFD): the events of each
            # completion add up to its text.
            for p, gs in enumerate(found):
                for k, g in enumerate(gs):
                    if rest := g.text[streamed.get((p, k), 0) :]:
                        yield sse("token", {"prompt": p, "sample": k, "text": rest})
            yield sse("done", self.reply(found, cfg))
        except asyncio.CancelledError:  # the client went away
            self.metrics.dropped.labels("disconnected").inc()
            raise
        finally:
            if job is not None:
                job.cancel()  # a no-op once answered; else the worker stops the search

    def result(self, future: Future) -> Any:
        """A finished job's result, its error as the ApiError the whole reply would raise."""
        try:
            return self._result(future)
        except ApiError:
            raise
        except Exception as e:  # the whole reply's 500 (`internal error`), as an event
            log.exception("unexpected error")
            raise ApiError(500, f"internal error: {type(e).__name__}") from None

    def model_info(self) -> dict[str, Any]:
        g = self.generator
        return {
            "name": self.model_dir.resolve().name,
            "aiayn": __version__,
            "kind": self.kind,
            "languages": None,
            "engine": "aiayn",
            "traceable": True,  # POST /v1/explain/lm
            "model": to_dict(g.model.cfg),
            "parameters": sum(p.numel() for p in g.model.parameters())
            if isinstance(g.model, torch.nn.Module)
            else None,
            "vocab_size": g.tokenizer.vocab_size,
            "decode": dataclasses.asdict(g.cfg),
            "precision": g.precision.to_json(),
            "limits": dataclasses.asdict(self.limits),
            "examples": [],
        }
