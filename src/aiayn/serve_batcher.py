"""Micro-batching for `aiayn serve`: one worker thread owns the model, requests queue for it.

A request handler submits a job (its sentences and search settings) and waits on the job's
future. The worker takes the first queued job, waits a short window (`window_s`, 10 ms by
default) for more, and merges the jobs that share the same search settings into one
`Translator.translate_hyps` call, which sorts their sentences by length and cuts token-budget
batches. Each job's future then gets its own results, in its own order. Concurrent requests
thus share batches (what makes serving nearly as fast as translating a file in one call),
while a lone request waits only the window.

Before decoding, jobs whose client went away (`Job.cancel()`) or whose deadline passed are
dropped: nobody would read their results. Sampling jobs are never merged with others: a
sampled sentence's random stream is seeded by its line number within its request
(`aiayn.decode.sample_seed`), so a request draws what `aiayn translate` draws for the same
lines. Other work for the model (an explanation) runs on the same thread as a `call` job.

`close()` stops taking jobs and returns once every job queued before it has been answered.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from aiayn.config import DecodeConfig
from aiayn.translate import Translation, Translator

log = logging.getLogger(__name__)


class QueueFullError(Exception):
    """More jobs are waiting than the server accepts (it answers 503)."""


class ClosedError(Exception):
    """The batcher has stopped taking jobs (the server is shutting down)."""


class ExpiredError(Exception):
    """The job's deadline passed before the model got to it."""


@dataclass
class Job:
    """Sentences to translate with one set of search settings, or a function to call."""

    lines: list[str]
    cfg: DecodeConfig | None  # None: `call` is run instead
    deadline: float  # time.monotonic() after which nobody waits for the result
    call: Callable[[], Any] | None = None
    future: Future = field(default_factory=Future)
    cancelled: bool = False

    def cancel(self) -> None:
        """The client went away: skip this job if the worker has not started it."""
        self.cancelled = True


@dataclass
class BatchStats:
    """What one merged batch held: for the server's metrics."""

    requests: int
    sentences: int
    src_tokens: int
    tgt_tokens: int
    seconds: float


_STOP = object()


class Batcher:
    """One model worker thread fed by a queue of `Job`s (see the module docstring)."""

    def __init__(
        self,
        translator: Translator,
        *,
        window_s: float = 0.01,
        batch_tokens: int = 2048,
        max_batch_sentences: int = 256,
        max_queue: int = 1000,
        on_batch: Callable[[BatchStats], None] | None = None,
    ) -> None:
        self.translator = translator
        self.window_s = window_s
        self.batch_tokens = batch_tokens
        self.max_batch_sentences = max_batch_sentences
        self.max_queue = max_queue
        self.on_batch = on_batch
        self._queue: queue.Queue[Job | object] = queue.Queue()
        self._lock = threading.Lock()  # guards _closed against submit/close races
        self._closed = False
        self._worker = threading.Thread(target=self._run, name="aiayn-model", daemon=True)
        self._worker.start()

    def queued(self) -> int:
        return self._queue.qsize()

    def submit(self, job: Job) -> Job:
        """Queue `job`; raises ClosedError after `close()` and QueueFullError past `max_queue`."""
        with self._lock:
            if self._closed:
                raise ClosedError("the server is shutting down")
            if self._queue.qsize() >= self.max_queue:
                raise QueueFullError(f"{self.max_queue} requests are already waiting")
            self._queue.put(job)
        return job

    def translate(self, lines: list[str], cfg: DecodeConfig, timeout_s: float) -> Job:
        return self.submit(Job(list(lines), cfg, time.monotonic() + timeout_s))

    def call(self, fn: Callable[[], Any], timeout_s: float) -> Job:
        return self.submit(Job([], None, time.monotonic() + timeout_s, call=fn))

    def close(self, timeout_s: float | None = None) -> None:
        """Take no more jobs; return when every queued job has been answered."""
        with self._lock:
            if not self._closed:
                self._closed = True
                self._queue.put(_STOP)
        self._worker.join(timeout_s)

    # --- the worker ----------------------------------------------------------------------------

    def _run(self) -> None:
        stopping = False
        while not stopping:
            first = self._queue.get()
            if first is _STOP:
                break
            assert isinstance(first, Job)
            jobs, stopping = self._gather(first)
            for group in self._groups(jobs):
                self._serve(group)

    def _gather(self, first: Job) -> tuple[list[Job], bool]:
        """`first` plus what arrives within the window (or until the batch is full)."""
        jobs, n = [first], len(first.lines)
        end = time.monotonic() + self.window_s
        while n < self.max_batch_sentences:
            try:
                wait = end - time.monotonic()
                item = self._queue.get(timeout=wait) if wait > 0 else self._queue.get_nowait()
            except queue.Empty:
                break
            if item is _STOP:
                return jobs, True
            assert isinstance(item, Job)
            jobs.append(item)
            n += len(item.lines)
        return jobs, False

    @staticmethod
    def _groups(jobs: list[Job]) -> list[list[Job]]:
        """Jobs with equal (non-sampling) settings together, in order of first arrival."""
        groups: dict[object, list[Job]] = {}
        for i, job in enumerate(jobs):
            alone = job.cfg is None or job.cfg.sample
            groups.setdefault(("alone", i) if alone else job.cfg, []).append(job)
        return list(groups.values())

    def _serve(self, group: list[Job]) -> None:
        now = time.monotonic()
        live = []
        for job in group:
            if job.cancelled:
                job.future.cancel()
            elif now > job.deadline:
                job.future.set_exception(ExpiredError("timed out waiting for the model"))
            elif job.future.set_running_or_notify_cancel():
                live.append(job)
        if not live:
            return
        try:
            if live[0].cfg is None:
                assert live[0].call is not None
                live[0].future.set_result(live[0].call())
                return
            self._translate(live, live[0].cfg)
        except Exception as e:  # answer the waiting requests, keep the worker alive
            log.exception("model worker")
            for job in live:
                if not job.future.done():
                    job.future.set_exception(e)

    def _translate(self, jobs: list[Job], cfg: DecodeConfig) -> None:
        t0 = time.monotonic()
        lines = [line for job in jobs for line in job.lines]
        results = self.translator.translate_hyps(lines, cfg, batch_tokens=self.batch_tokens)
        start = 0
        for job in jobs:
            job.future.set_result(results[start : start + len(job.lines)])
            start += len(job.lines)
        if self.on_batch is not None:
            self.on_batch(_stats(jobs, lines, results, self.translator, time.monotonic() - t0))


def _stats(
    jobs: list[Job],
    lines: list[str],
    results: list[list[Translation]],
    translator: Translator,
    seconds: float,
) -> BatchStats:
    src_tokens = sum(len(ids) for ids in translator.tokenizer.encode_batch(lines))
    tgt_tokens = sum(len(r[0].hyp.tokens) for r in results)
    return BatchStats(len(jobs), len(lines), src_tokens, tgt_tokens, seconds)
