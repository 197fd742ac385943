"""Micro-batching for `aiayn serve`: one worker thread owns the model, requests queue for it.

A request handler submits a job (its sentences and search settings) and waits on the job's
future. The worker takes the first queued job, waits a short window (`window_s`, 10 ms by
default) for more, and merges the jobs that share the same search settings into one group. (A
greedy or beam job under continuous batching does not wait: later ones join its search at a
step.)
Concurrent requests thus share batches (what makes serving nearly as fast as translating a
file in one call), while a lone request waits only the window.

Bounded work per turn. A group is cut into chunks whose search rows (sentences x beam) times
their longest output-length limit fit `turn_tokens`, and of at most `chunk_rows` rows; the
worker runs one chunk of each active group in turn, taking newly
queued jobs in between. So a request never waits behind more than one chunk of each request
ahead of it: a client who sends the largest request the limits allow slows the others down,
but does not make them wait for all of it. A job is answered as soon as its last chunk is done.

Continuous batching for greedy and beam search (aiayn.serve.streams). Those jobs do not wait
for turns: they join their settings' running search between two of its steps, and leave it at
the step their sentences end. After each turn the running searches get as much model time as
the turn took (one step at least). Sampling (seeded per line of a request) and the exported
engines (not torch models whose cache rows can join) keep the turns.

Abandoned work stops within one decoding step. While a chunk is searched, the search asks
(`aiayn.search.step.stop_when`) once per step whether every job in the chunk is gone: its client
went away (`Job.cancel()`), its deadline passed, or the batcher is aborting. Those jobs'
remaining chunks are skipped.

Sampling jobs are never merged with others: a sampled sentence's random stream is seeded by its
line number within its request (`aiayn.search.sampling.sample_seed`), so a request draws what `aiayn
translate` draws for the same lines. Other work for the model (an explanation) runs on the
same thread as a `call` job, in its own turn.

`close()` stops taking jobs and returns once every job queued before it has been answered.
"""

from __future__ import annotations

import logging
import queue
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from aiayn.config import DecodeConfig
from aiayn.search.limits import max_output_lengths, output_cap
from aiayn.search.step import SearchStoppedError, stop_when
from aiayn.serve.jobs import BatchStats, ClosedError, Job, QueueFullError, batch_stats, drop, settle
from aiayn.serve.streams import Streams
from aiayn.text.batches import cut_batches
from aiayn.translate.translator import Translation, Translator

log = logging.getLogger(__name__)


@dataclass
class _Group:
    """Jobs merged for one set of settings (or one call), with the chunks still to run."""

    jobs: list[Job]
    cfg: DecodeConfig | None
    chunks: deque[list[tuple[int, int]]]  # (job, line) pairs, one list per turn
    results: list[list[list[Translation]]]  # per job, per line (filled as chunks finish)
    left: list[int]  # per job: lines not yet translated


_STOP = object()


class Batcher:
    """One model worker thread fed by a queue of `Job`s (see the module docstring)."""

    def __init__(
        self,
        translator: Translator | None,
        *,
        window_s: float = 0.01,
        batch_tokens: int = 2048,
        chunk_rows: int = 128,
        turn_tokens: int = 8192,
        max_batch_sentences: int = 256,
        max_queue: int = 1000,
        on_batch: Callable[[BatchStats], None] | None = None,
        continuous: bool = True,
    ) -> None:
        self.translator = translator
        self.window_s = window_s
        self.batch_tokens = batch_tokens
        self.chunk_rows = chunk_rows
        self.turn_tokens = turn_tokens
        self.max_batch_sentences = max_batch_sentences
        self.max_queue = max_queue
        self.on_batch = on_batch
        # Continuous batching needs a torch model's cache (not an exported engine's).
        # (None: a language model's server, whose jobs are all calls)
        torch_model = translator is not None and isinstance(translator.model, torch.nn.Module)
        self.continuous = continuous and torch_model
        self._streams: Streams | None = None
        if translator is not None:
            self._streams = Streams(translator, chunk_rows, self._report, turn_tokens)
        self._queue: queue.Queue[Job | object] = queue.Queue()
        self._lock = threading.Lock()  # guards _closed against submit/close races
        self._closed = False
        self._aborting = False  # set by close() when its timeout passes: running work stops
        self._worker = threading.Thread(target=self._run, name="aiayn-model", daemon=True)
        self._worker.start()

    def _report(self, stats: BatchStats) -> None:
        if self.on_batch is not None:  # (the server sets it after construction)
            self.on_batch(stats)

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
        if self.translator is None:
            raise ClosedError("this model worker has no translator (a language model's)")
        return self.submit(Job(list(lines), cfg, time.monotonic() + timeout_s))

    def call(self, fn: Callable[[], Any], timeout_s: float) -> Job:
        return self.submit(Job([], None, time.monotonic() + timeout_s, call=fn))

    def close(self, timeout_s: float | None = None) -> None:
        """Take no more jobs; return when every queued job has been answered (or, after
        `timeout_s`, stop the running search and return)."""
        with self._lock:
            if not self._closed:
                self._closed = True
                self._queue.put(_STOP)
        self._worker.join(timeout_s)
        if self._worker.is_alive():
            self._aborting = True
            self._worker.join(5.0)

    # --- the worker ----------------------------------------------------------------------------

    def _run(self) -> None:
        if self.continuous and self._streams is not None:  # measured while the server finishes
            try:  # starting; jobs queue meanwhile
                log.info("encoder parts' slack: %d positions", self._streams.calibrate())
            except Exception:  # a model that cannot be timed is served in one part
                log.exception("model worker: measuring the encoder parts' slack")
                self._streams.slack = sys.maxsize
        active: deque[_Group] = deque()
        stopping = False
        while True:
            if not active and not self._streams:  # (None: no translator, no searches)
                if stopping:
                    break
                first = self._queue.get()
                if first is _STOP:
                    break
                assert isinstance(first, Job)
                if self._joins(first):  # later arrivals join its search at the next step
                    jobs, stopping = self._take_queued()
                    jobs.insert(0, first)
                else:
                    jobs, stopping = self._gather(first)
                self._take(jobs, active)
            group = active.popleft() if active else None
            t0 = time.monotonic()
            if group is not None:
                self._turn(group)
            if not stopping:  # what arrived meanwhile goes before the group's next turn
                jobs, stopping = self._take_queued()
                self._take(jobs, active)
            # The running searches (requests that arrived meanwhile included) get as much model
            # time as the turn had, one step at least: a request is not held up a whole turn
            # per token.
            end = 2 * time.monotonic() - t0
            while self._streams:
                self._streams.step(self._aborting)
                if time.monotonic() >= end:
                    break
            if group is not None and group.chunks:
                active.append(group)  # round robin: the others go first

    def _take(self, jobs: list[Job], active: deque[_Group]) -> None:
        """Greedy and beam jobs join their settings' running search; the others are cut into
        turns."""
        turns = []
        for job in jobs:
            if self._joins(job):
                assert job.cfg is not None and self._streams is not None
                self._streams.take(job, job.cfg)
            else:
                turns.append(job)
        active.extend(self._groups(turns))

    def _joins(self, job: Job) -> bool:
        """Whether `job` goes to a running search (continuous batching): all but sampling."""
        cfg = job.cfg
        return self.continuous and cfg is not None and not cfg.sample

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

    def _take_queued(self) -> tuple[list[Job], bool]:
        """Whatever is queued now, without waiting (the worker is busy with other groups)."""
        jobs: list[Job] = []
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                return jobs, False
            if item is _STOP:
                return jobs, True
            assert isinstance(item, Job)
            jobs.append(item)

    def _groups(self, jobs: list[Job]) -> list[_Group]:
        """Jobs with equal (non-sampling) settings merged, in order of first arrival, each
        group cut into turn-sized chunks (module docstring)."""
        merged: dict[object, list[Job]] = {}
        for i, job in enumerate(jobs):
            alone = job.cfg is None or job.cfg.sample
            merged.setdefault(("alone", i) if alone else job.cfg, []).append(job)
        groups = []
        for js in merged.values():
            try:
                groups.append(self._group(js))
            except Exception as e:  # (tokenizing for the turn budget) answer, keep the worker
                log.exception("model worker")
                for job in js:
                    settle(job.future, error=e)
        return groups

    def _group(self, jobs: list[Job]) -> _Group:
        cfg = jobs[0].cfg
        pairs = [(j, i) for j, job in enumerate(jobs) for i in range(len(job.lines))]
        if cfg is None:  # a call: one turn
            chunks: deque[list[tuple[int, int]]] = deque([[]])
        else:
            if not cfg.sample:  # similar lengths share a chunk (less padding), shortest first
                pairs.sort(key=lambda p: len(jobs[p[0]].lines[p[1]]))
            rows = cfg.nbest if cfg.sample else cfg.beam_size
            limits = self._limits([jobs[j].lines[i] for j, i in pairs], cfg)
            # cut_batches' rule: a chunk's lines x rows x its longest limit fit the turn's
            # budget; no limit is counted below turn_tokens / chunk_rows, so a chunk also has
            # at most chunk_rows rows (a line over the budget alone gets a turn of its own)
            floor = max(1, self.turn_tokens // max(1, self.chunk_rows))
            sizes = [rows * max(n, floor) for n in limits]
            cut = cut_batches(range(len(pairs)), sizes, self.turn_tokens)
            chunks = deque([pairs[k] for k in batch] for batch in cut)
            chunks = chunks or deque([[]])  # a job without lines is answered in its first turn
        results: list[list[list[Translation]]] = [[[] for _ in job.lines] for job in jobs]
        return _Group(jobs, cfg, chunks, results, [len(job.lines) for job in jobs])

    def _limits(self, lines: list[str], cfg: DecodeConfig) -> list[int]:
        """Each line's output-length limit (`a * source tokens + b`, within max_tokens and
        max_len): what a turn may cost, not what it will, since a request may forbid EOS
        (min_len) up to the limit. Tokenizing here costs microseconds a line."""
        assert self.translator is not None  # (translate() refuses jobs without one)
        src = [len(ids) for ids in self.translator.tokenizer.encode_batch(lines)]
        cap = output_cap(cfg, self.translator.model.cfg.max_len)
        limits = max_output_lengths(torch.tensor(src), cfg.max_len_a, cfg.max_len_b, cap)
        return [int(n) for n in limits]

    def _turn(self, group: _Group) -> None:
        """Run the group's next chunk; answer every job that is now complete or gone."""
        chunk = group.chunks.popleft()
        now = time.monotonic()
        for job in group.jobs:
            if job.gone(now):
                drop(job)
        live = [(j, i) for j, i in chunk if not group.jobs[j].future.done()]
        owners = sorted({j for j, _ in live})
        try:
            if group.cfg is None:
                job = group.jobs[0]
                if not job.future.done():
                    with stop_when(lambda: self._aborting or job.gone(time.monotonic())):
                        settle(job.future, result=job.call())  # type: ignore[misc]
                return
            if not live:
                self._finish(group)
                return
            t0 = time.monotonic()
            lines = [group.jobs[j].lines[i] for j, i in live]
            first_line_no = live[0][1] + 1  # sampling groups hold one job, lines in order

            def all_gone() -> bool:
                now = time.monotonic()
                return self._aborting or all(group.jobs[j].gone(now) for j in owners)

            assert self.translator is not None
            with stop_when(all_gone):
                found = self.translator.translate_hyps(
                    lines, group.cfg, batch_tokens=self.batch_tokens, first_line_no=first_line_no
                )
            for (j, i), hyps in zip(live, found, strict=True):
                group.results[j][i] = hyps
                group.left[j] -= 1
            self._finish(group)
            self._report(batch_stats(len(owners), found, time.monotonic() - t0))
        except SearchStoppedError:
            for job in group.jobs:
                if job.gone(time.monotonic()) or self._aborting:
                    drop(job)
        except Exception as e:  # answer the waiting requests, keep the worker alive
            log.exception("model worker")
            for job in group.jobs:
                settle(job.future, error=e)
        finally:
            if all(job.future.done() for job in group.jobs):
                group.chunks.clear()  # nothing left that anyone waits for

    @staticmethod
    def _finish(group: _Group) -> None:
        for job, results, left in zip(group.jobs, group.results, group.left, strict=True):
            if left == 0:
                settle(job.future, result=results)
