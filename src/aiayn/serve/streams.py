"""Continuous batching for greedy search: one running search per set of settings.

Jobs whose settings are greedy (beam 1, one hypothesis, no sampling) do not wait for turns:
each set of settings has one running search (`aiayn.search.rows.RowSearch`) that the model
worker steps. Between two steps the sentences queued meanwhile join it, their encoder run and
their cache rows added, up to `max_rows` rows in flight over all the searches, one sentence
of each waiting request in turn (so a short request does not queue behind every sentence of
the long ones); a sentence leaves at the step it ends, and its request is answered when its
last sentence has. So a short request never waits for a long one to finish, and the batch
stays full while clients send their next requests. Rows with different settings run as
separate searches (their limits and length penalty differ; one search per setting keeps each
search the paper's). Rows of requests that are gone (client left, deadline passed) leave
before the next step.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from aiayn.config import DecodeConfig
from aiayn.search.rows import RowSearch
from aiayn.search.settings import Hypothesis
from aiayn.search.step import inference
from aiayn.serve.jobs import BatchStats, Job, batch_stats, drop, settle
from aiayn.translate.translator import Translation, Translator, one_line

log = logging.getLogger(__name__)

# Rows that ended stay in their search until they are a quarter of it: with many rows one ends
# at almost every step, and copying the cache each time cost more than the dead rows' steps.
# (So the searches hold at most a third more rows, and cache, than the `max_rows` in flight.)
COMPACT = 0.25


@dataclass(eq=False)  # identity: a request waits in a dict
class _Entry:
    """A job in a continuous search: its results so far and how many lines are left."""

    job: Job
    results: list[list[Translation]]
    left: int


@dataclass
class _Stream:
    """One running greedy search for one set of settings, and the sentences it serves."""

    run: RowSearch
    entries: list[_Entry] = field(default_factory=list)
    # Sentences not admitted yet, by request (in order of arrival): line number, token ids.
    waiting: dict[_Entry, deque[tuple[int, list[int]]]] = field(default_factory=dict)
    n_waiting: int = 0
    rows: dict[int, tuple[_Entry, int, int]] = field(default_factory=dict)  # row -> line, tokens
    seconds: float = 0.0  # model time not yet reported
    sharing: set[int] = field(default_factory=set)  # requests in the batch since that report

    @property
    def busy(self) -> bool:
        return bool(self.entries)


def _take_in_turn(stream: _Stream, n: int) -> list[tuple[_Entry, int, list[int]]]:
    """Up to `n` waiting sentences, one from each waiting request in turn (oldest first): a
    one-sentence request then waits behind at most one sentence of each request before it, not
    behind all of their sentences, and every request still advances at the same pace."""
    out: list[tuple[_Entry, int, list[int]]] = []
    while stream.waiting and len(out) < n:
        for entry in list(stream.waiting):
            if len(out) == n:
                break
            lines = stream.waiting.pop(entry)
            out.append((entry, *lines.popleft()))
            if lines:  # back in line after the others
                stream.waiting[entry] = lines
    stream.n_waiting -= len(out)
    return out


class Streams:
    """The running greedy searches of one model worker, by settings."""

    def __init__(
        self, translator: Translator, max_rows: int, report: Callable[[BatchStats], None]
    ) -> None:
        self.translator, self.max_rows, self.report = translator, max_rows, report
        self._streams: dict[DecodeConfig, _Stream] = {}

    def __bool__(self) -> bool:
        return bool(self._streams)

    def step(self, aborting: bool = False) -> None:
        """One step of every running search; a search with nothing left is closed."""
        for cfg, stream in list(self._streams.items()):
            self._step(stream, aborting)
            if not stream.busy:
                del self._streams[cfg]

    def take(self, job: Job, cfg: DecodeConfig) -> None:
        """Queue a greedy job's lines for its settings' running search (started if need be)."""
        try:
            todo, ids = self.translator.encode_lines(job.lines)
        except Exception as e:  # answer the request, keep the worker
            log.exception("model worker")
            settle(job.future, error=e)
            return
        empty = Translation("", Hypothesis([], 0.0, 0.0, True))  # what an empty line gets
        entry = _Entry(job, [[empty] for _ in job.lines], len(todo))
        if not todo:
            settle(job.future, result=entry.results)
            return
        stream = self._streams.get(cfg)
        if stream is None:
            run = RowSearch(self.translator.model, cfg, compact=COMPACT)
            stream = self._streams[cfg] = _Stream(run)
        stream.entries.append(entry)
        stream.waiting[entry] = deque(zip(todo, ids, strict=True))
        stream.n_waiting += len(todo)

    def _step(self, stream: _Stream, aborting: bool) -> None:
        """Admit waiting sentences (up to `max_rows` rows in flight over all searches), run one
        step, answer what ended."""
        now = time.monotonic()
        gone = [e for e in stream.entries if aborting or e.job.gone(now)]
        if gone:
            for e in gone:
                drop(e.job)
            stream.entries = [e for e in stream.entries if e not in gone]
            for e in gone:
                stream.n_waiting -= len(stream.waiting.pop(e, ()))
            rows = {r for r, (e, _, _) in stream.rows.items() if e in gone}
            stream.run.drop(rows)
            for r in rows:
                del stream.rows[r]
        # Sentences join in groups (one encoder batch, one cache copy) when a quarter of the
        # rows are free or all that wait fit: admitting one at a time copies the cache often.
        admit: list[tuple[_Entry, int, list[int]]] = []
        # One bound for all running searches: many distinct settings must not multiply the
        # rows (and cache memory) in flight.
        free = self.max_rows - sum(s.run.live for s in self._streams.values())
        if free >= min(stream.n_waiting, max(1, self.max_rows // 4)):
            admit = _take_in_turn(stream, free)
        t0 = time.monotonic()
        try:
            with inference(self.translator.model), self.translator.precision.autocast():
                if admit:
                    src_BS = self.translator.pad([ids for _, _, ids in admit])
                    for r, (e, i, ids) in zip(stream.run.add(src_BS), admit, strict=True):
                        stream.rows[r] = (e, i, len(ids))
                stream.sharing |= {id(e) for e, _, _ in stream.rows.values()}
                finished = stream.run.step() if stream.run.live else []
        except Exception as e:  # answer the waiting requests, start the search afresh
            log.exception("model worker")
            for entry in stream.entries:
                settle(entry.job.future, error=e)
            stream.entries.clear()
            stream.waiting.clear()
            stream.n_waiting = 0
            return
        stream.seconds += time.monotonic() - t0
        done = []
        for r, hyp in finished:
            entry, i, n_src = stream.rows.pop(r)
            text = one_line(self.translator.tokenizer.decode(hyp.tokens))
            entry.results[i] = [Translation(text, hyp, n_src)]
            entry.left -= 1
            done.append(entry.results[i])
            if entry.left == 0:
                settle(entry.job.future, result=entry.results)
        stream.entries = [e for e in stream.entries if e.left > 0 and not e.job.future.done()]
        if done:
            # requests: those whose rows shared the batch while these sentences were written
            self.report(batch_stats(len(stream.sharing), done, stream.seconds))
            stream.seconds, stream.sharing = 0.0, {id(e) for e, _, _ in stream.rows.values()}
