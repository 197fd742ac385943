# The request body is built at run time from the server's limits and the model's labels
# (bounds a static type cannot hold), as aiayn.serve.requests builds its own: mypy sees its
# field types as variables.
# mypy: disable-error-code="valid-type"
"""`POST /v1/classify`: a classifier (`aiayn.nn.encoder_only.EncoderClassifier`, through
`aiayn.classify.classifier.Classifier`) gives each text its class probabilities.

The forward passes run on the model worker (`aiayn.serve.batcher`), never on the event loop,
with the translator's guarantees: a typed body bounded by the server's limits
(`classify_model`: texts per request, characters per text; the characters of a whole request
checked after it), the --timeout deadline, a bounded queue (--max-queue requests waiting, then
503), and a request whose client has left skipped before its pass.

Coalescing. The batcher merges translations, not calls: each `call` job runs alone. So
requests do not go to it one by one: they wait in `Coalescer`'s list, and one call job (a
"pass") is queued whenever the list has requests and none is queued or running. When it
runs, it takes the requests waiting then (whole requests, up to --chunk-rows texts, one
request at least) into one `Classifier.probabilities` call, which batches the texts by length
and keeps their order. Requests that arrive while a pass waits for the worker (its --window-ms,
other work ahead of it) join that pass; those that arrive while it runs join the next, queued
as it ends. /metrics' `aiayn_batch_requests` shows how many shared a pass.

`POST /v1/explain/classify` is the live page's (static/classify.html): one text traced
(aiayn.glassbox.classify_page: attention, the pooled vector, probabilities, saliency of a
class, rollout), run on the model worker as a call of its own, as /v1/explain/lm is.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import Annotated, Any, Literal

from fastapi import Request
from pydantic import BaseModel, Field

from aiayn import __version__
from aiayn.classify.classifier import Classifier
from aiayn.config_files import read_run_config, to_dict
from aiayn.glassbox.classify_page import classify_page_json
from aiayn.serve.batcher import Batcher
from aiayn.serve.guard import Metrics
from aiayn.serve.handlers import BaseServer, ServeOptions
from aiayn.serve.jobs import BatchStats, ClosedError, Job, QueueFullError, drop, settle
from aiayn.serve.requests import ApiError, Key, Limits, StrictBody, _int, _text, check_sizes
from aiayn.store.directory import ModelDir, open_model_dir

log = logging.getLogger(__name__)

# What a server answers (404 and this line) on the endpoints of another kind of model.
ON_CLASSIFIER_SERVER = "this server holds a classifier: POST /v1/classify"
ON_TRANSLATOR_SERVER_CLS = (
    "this server holds a translation model: POST /v1/translate (or /translate); "
    "/v1/classify needs a classifier (an EncoderClassifier)"
)
ON_LM_SERVER_CLS = (
    "this server holds a language model: POST /v1/generate; "
    "/v1/classify needs a classifier (an EncoderClassifier)"
)
ON_TRANSLATOR_SERVER_CLS_EXPLAIN = (
    "this server holds a translation model: POST /v1/explain traces a sentence; "
    "/v1/explain/classify needs a classifier (an EncoderClassifier)"
)
ON_LM_SERVER_CLS_EXPLAIN = (
    "this server holds a language model: POST /v1/explain/lm traces a prompt; "
    "/v1/explain/classify needs a classifier (an EncoderClassifier)"
)


def classify_model(limits: Limits, labels: Sequence[str]) -> type[StrictBody]:
    """The body of /v1/classify, bounded by this server's limits and this model's labels."""
    Text = _text(limits.max_chars_per_sentence, required=True)

    class V1ClassifyRequest(StrictBody):
        """Texts to classify, answered in their order: each text's most probable label and
        every label's probability, or with `top_k` its k most probable labels, best first.
        A text longer than the model's positions is cut, as in training."""

        texts: Annotated[list[Text], Field(min_length=1, max_length=limits.max_sentences)]
        top_k: _int(1, len(labels)) | None = None
        api_key: Key = None

    return V1ClassifyRequest


def explain_classify_model(limits: Limits, labels: Sequence[str]) -> type[StrictBody]:
    """The body of /v1/explain/classify (the page's): one text, and the class whose logit the
    saliency explains (default the predicted one)."""
    Label: Any = Literal[tuple(labels)]

    class V1ExplainClassifyRequest(StrictBody):
        """One text traced for the live page (aiayn.glassbox.classify_page): what the model
        read, its attention per layer and head, the pooled vector, the probabilities, the
        gradient x input saliency of `class`'s logit and the attention rollout."""

        text: _text(limits.max_chars_per_sentence, required=True)
        class_: Label | None = Field(
            None, alias="class", description="the label whose logit the saliency explains"
        )
        api_key: Key = None

    return V1ExplainClassifyRequest


class LabelProbability(BaseModel):
    label: str
    probability: float


class ClassifyResult(BaseModel):
    label: str = Field(description="the most probable label")
    probabilities: dict[str, float] | None = Field(
        None, description="every label's probability, in the model's label order (no top_k)"
    )
    top: list[LabelProbability] | None = Field(
        None, description="the top_k most probable labels, best first (with top_k)"
    )


class V1ClassifyResponse(BaseModel):
    results: list[ClassifyResult] = Field(description="one per text, in the request's order")
    model: str = Field(description="the model directory's name")


class Coalescer:
    """Requests waiting for the next forward pass, and the one call job that runs it (the
    module docstring). Thread-safe: requests join from the event loop, passes run on the
    model worker."""

    def __init__(
        self,
        batcher: Batcher,
        forward: Callable[[list[str]], tuple[list[list[float]], int]],
        *,
        max_rows: int,
        max_waiting: int,
        timeout_s: float,
        on_pass: Callable[[BatchStats], None],
    ) -> None:
        self.batcher, self.forward, self.on_pass = batcher, forward, on_pass
        self.max_rows, self.max_waiting, self.timeout_s = max_rows, max_waiting, timeout_s
        self._lock = threading.Lock()
        self._waiting: deque[Job] = deque()
        self._pass: Job | None = None  # queued or running; None only when nothing waits

    def waiting(self) -> int:
        return len(self._waiting)

    def submit(self, texts: list[str]) -> Job:
        """A request's job, answered with its texts' probabilities; QueueFullError past
        --max-queue waiting requests, ClosedError once the worker stops taking jobs."""
        job = Job(texts, None, time.monotonic() + self.timeout_s)
        with self._lock:
            if len(self._waiting) >= self.max_waiting:
                raise QueueFullError(f"{self.max_waiting} requests are already waiting")
            if self._pass is None:
                self._schedule()  # (raises before the job is added: nothing else waits)
            self._waiting.append(job)
        return job

    def _schedule(self) -> None:
        """Queue a pass (the lock held)."""
        self._pass = self.batcher.call(self._run, self.timeout_s)
        self._pass.future.add_done_callback(self._passed)

    def _passed(self, _future: Future) -> None:
        """A pass has ended (run, or dropped unrun past its deadline): the next one is queued
        for whoever is waiting; if the worker takes no more, they are answered 503."""
        with self._lock:
            self._pass = None
            if not self._waiting:
                return
            try:
                self._schedule()
            except (QueueFullError, ClosedError) as e:
                for job in self._waiting:
                    settle(job.future, error=ApiError(503, f"server busy: {e}; retry later"))
                self._waiting.clear()

    def _take(self) -> list[Job]:
        """Whole waiting requests, up to `max_rows` texts (one request at least); the gone
        ones dropped."""
        taken: list[Job] = []
        rows, now = 0, time.monotonic()
        with self._lock:
            while self._waiting:
                job = self._waiting[0]
                if job.gone(now):
                    drop(self._waiting.popleft())
                    continue
                if taken and rows + len(job.lines) > self.max_rows:
                    break
                taken.append(self._waiting.popleft())
                rows += len(job.lines)
        return taken

    def _run(self) -> None:
        """One forward pass over the waiting requests' texts (on the model worker)."""
        jobs = self._take()
        if not jobs:
            return
        texts = [t for job in jobs for t in job.lines]
        t0 = time.monotonic()
        try:
            rows, tokens = self.forward(texts)
        except Exception as e:  # answer the requests; the worker goes on
            log.exception("model worker: classifying")
            for job in jobs:
                settle(job.future, error=e)
            return
        start = 0
        for job in jobs:
            settle(job.future, result=rows[start : start + len(job.lines)])
            start += len(job.lines)
        self.on_pass(BatchStats(len(jobs), len(texts), tokens, 0, time.monotonic() - t0))


def run_examples(directory: Path, n: int = 12) -> list[str]:
    """Texts for the page's picker: the run's validation (else training) texts, as recorded
    in its run_config.json, if they are still there; none otherwise."""
    from aiayn.text.labelled import read_labelled

    train = read_run_config(directory).get("train", {})
    if not isinstance(train, dict):
        return []
    for key in ("valid_data", "data"):
        path = str(train.get(key) or "")
        if not path or not Path(path).is_file():
            continue
        try:
            label = str(train.get("label_column") or "label")
            pairs = read_labelled(
                path, label, str(train.get("text_column") or "text"), strict=False
            )
        except Exception:  # a file changed since training: no examples, not a failed start
            log.warning("no example texts from %s", path)
            return []
        return [t for _, t in pairs if t.strip() and len(t) <= 200][:n]
    return []


class ClassifyServer(BaseServer):
    """The state of a classifier's server: its `Classifier`, the model worker, options."""

    kind = "classifier"

    def __init__(
        self, classifier: Classifier, model_dir: Path | ModelDir, opts: ServeOptions
    ) -> None:
        super().__init__(None, opts, classifier.tok.vocab_size)
        opened = open_model_dir(model_dir)
        self.classifier, self.model_dir = classifier, opened.path
        self.model_cfg, self.engine = opened.model_cfg, opened.engine  # engine: None for aiayn's
        self.labels = list(classifier.labels)
        self.body = classify_model(self.limits, self.labels)
        self.explain_body = explain_classify_model(self.limits, self.labels)
        self.coalescer = Coalescer(
            self.batcher,
            self.forward,
            max_rows=opts.chunk_rows,
            max_waiting=opts.max_queue,
            timeout_s=self.limits.timeout_s,
            on_pass=lambda s: self.metrics.batch(s),
        )
        # The queue gauge counts the requests waiting for a pass, not the one pass queued.
        self.metrics = Metrics(self.queued)
        self.batcher.on_batch = self.metrics.batch
        # An export records no training files: its examples are its source model's.
        self.examples = run_examples(self.model_dir) or run_examples(opened.source)
        self.traceable = self.engine is None  # an export has no torch model to trace

    def queued(self) -> int:
        """Requests waiting for the model: for the next pass, or other work (an explanation)."""
        return self.coalescer.waiting() + self.batcher.queued()

    def forward(self, texts: list[str]) -> tuple[list[list[float]], int]:
        """The texts' (N, C) probabilities as lists, and the tokens the model read (on the
        model worker)."""
        probs_NC = self.classifier.probabilities(texts)
        # for /metrics' source tokens: tokenizing again costs microseconds a text
        tokens = sum(len(ids) for ids in self.classifier.ids(texts))
        return probs_NC.tolist(), tokens

    # --- the endpoint ---------------------------------------------------------------------------

    async def v1_classify(self, request: Request, body: Any) -> dict[str, Any]:
        texts = list(body.texts)
        check_sizes(texts, self.limits)  # the request's characters in all
        rows = await self.run(request, lambda: self.coalescer.submit(texts))
        return {"results": [self.result(p, body.top_k) for p in rows], "model": self.name}

    async def v1_explain_classify(self, request: Request, body: Any) -> dict[str, Any]:
        """The live page's JSON (aiayn.glassbox.classify_page), computed on the model worker
        (`traced`: an unknown class 422, a trace over --max-trace-numbers 413)."""
        if not self.traceable:
            raise ApiError(
                409,
                f"this server runs a {self.engine} export, which has nothing to trace: serve "
                "the aiayn model directory it was exported from to see inside it",
            )
        return await self.traced(
            request,
            lambda: classify_page_json(
                self.classifier, body.text, body.class_, max_numel=self.limits.max_trace_numbers
            ),
        )

    def result(self, probs: list[float], top_k: int | None) -> dict[str, Any]:
        """One text's answer: its best label, and every label's probability or the top k."""
        order = sorted(range(len(probs)), key=lambda c: -probs[c])
        best = self.labels[order[0]]
        if top_k is None:
            return {"label": best, "probabilities": dict(zip(self.labels, probs, strict=True))}
        top = [{"label": self.labels[c], "probability": probs[c]} for c in order[:top_k]]
        return {"label": best, "top": top}

    @property
    def name(self) -> str:
        return self.model_dir.resolve().name

    def model_info(self) -> dict[str, Any]:
        c = self.classifier
        torch_model = c.model  # None: an ONNX export (aiayn.interop.export_cls)
        return {
            "name": self.name,
            "aiayn": __version__,
            "kind": self.kind,
            "labels": self.labels,
            "languages": None,
            "engine": self.engine or "aiayn",
            "traceable": self.traceable,
            "model": to_dict(self.model_cfg),
            "parameters": None
            if torch_model is None
            else sum(p.numel() for p in torch_model.parameters()),
            "vocab_size": c.tok.vocab_size,
            "precision": c.precision.to_json(),
            "limits": _limits(self.limits),
            "examples": self.examples,
        }


def _limits(limits: Limits) -> dict[str, Any]:
    """The limits a classifier's requests meet (the others are for searches)."""
    keep = ("max_chars_per_request", "max_chars_per_sentence", "max_sentences", "timeout_s")
    return {k: getattr(limits, k) for k in keep}
