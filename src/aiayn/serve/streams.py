"""Continuous batching for greedy and beam search: one running search per set of settings.

Jobs whose settings do not sample do not wait for turns: each set of settings has one running search
(`aiayn.search.row_search.RowSearch` for greedy, `aiayn.search.beam.BeamSearch` for beam search,
each sentence keeping its own N beams) that the model worker steps. Between two steps the sentences
queued meanwhile join it, their encoder run (in parts of similar length) and their cache rows
added, up to `max_rows` rows in flight over all the searches (a beam sentence counts its N rows),
one sentence of each waiting request in turn (so a short request does not queue behind every
sentence of the long ones); a sentence leaves at the step it ends, and its request is answered when
its last sentence has. So a short request never waits for a long one to finish, and the batch stays
full while clients send their next requests. Rows with different settings run as separate searches
(their beam width, limits and length penalty differ; one search per setting keeps each search the
paper's). Rows of requests that are gone (client left, deadline passed) leave before the next step.
Sampling keeps the turns: its random streams are seeded per line of a request, and a whole request
is drawn as `aiayn translate` draws it.
"""

from __future__ import annotations

import logging
import sys
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import NamedTuple

import torch

from aiayn.config import DecodeConfig
from aiayn.search.beam import BeamSearch
from aiayn.search.hypothesis import Hypothesis
from aiayn.search.limits import max_output_lengths, output_cap
from aiayn.search.row_search import RowSearch
from aiayn.search.step import inference
from aiayn.serve.jobs import BatchStats, Job, batch_stats, drop, settle
from aiayn.text.batches import padding_parts
from aiayn.translate.translator import Translation, Translator, one_line

log = logging.getLogger(__name__)

# An admitted group is encoded in parts of similar length (`padding_parts`): sentences arrive
# in no order, and one padded batch of them wastes a third to a half of the encoder's
# positions. A part may carry as many padded positions as cost what one more pass costs (a
# pass has a fixed cost besides its cost per position), and that ratio differs between CPUs
# by a factor of four or more, so the server measures it on its own machine when it starts
# (docs/lab/serving.md, "Admission parts measured at start"). Since the encoder skips
# padding in its products on a CPU (`aiayn.nn.packed`), a padded position costs only its
# share of attention and cross K/V. On a GPU a pass of this size is launch-bound, and more
# parts only cost launches: one part.


def part_slack(translator: Translator, reps: int = 5) -> int:
    """How many padded positions an encoder part may carry before another part pays: the fixed
    cost of an admission pass (encoder + cross K/V) over what a padded position costs, from the
    fastest of `reps` passes over a 1 x 4 and an 8 x 32 batch (the fixed cost), and an 8 x 32
    batch half padding against 8 x 16 (a padded position: on a CPU the encoder skips padding
    in its products, `aiayn.nn.packed`, so only attention and cross K/V pay for it).
    ~0.1-0.6 s on a CPU for the models of this project. Parts change no result, only the time
    they take."""
    if translator.device.type != "cpu":
        return sys.maxsize
    model, device = translator.model, translator.device
    token = next(i for i in range(model.cfg.vocab_size) if i != model.cfg.pad_id)

    def seconds(rows: int, positions: int, real: int | None = None) -> float:
        src = torch.full((rows, positions), token, dtype=torch.long, device=device)
        if real is not None:  # the rest of each row is padding
            src[:, real:] = model.cfg.pad_id
        best = float("inf")
        for _ in range(reps):
            t0 = time.perf_counter()
            model.init_cache(model.encode(src), 0)
            best = min(best, time.perf_counter() - t0)
        return best

    short, long = min(4, model.cfg.max_len), min(32, model.cfg.max_len)  # max_len >= 2
    half = long // 2
    with inference(model), translator.precision.autocast():
        seconds(1, short)  # warm: the first pass pays one-time costs (weights prepacked, pages)
        padding_s = seconds(8, long, real=half) - seconds(8, half)
        return slack_of(
            seconds(1, short), short, seconds(8, long), 8 * long, padding_s / (8 * (long - half))
        )


def slack_of(
    small_s: float,
    small: int,
    large_s: float,
    large: int,
    padded_s: float | None = None,
    most: int = 4096,
) -> int:
    """Padded positions that cost what a pass's fixed cost does, within 0..most: the fixed
    cost from two passes' times (`small_s` over `small` positions and `large_s` over `large`: a
    line through both), over `padded_s`, a padded position's cost (default: a position's, the
    line's slope)."""
    per_position = max(large_s - small_s, 1e-12) / (large - small)
    fixed = max(small_s - small * per_position, 0.0)
    per_padded = per_position if padded_s is None else max(padded_s, 1e-12)
    return min(round(fixed / per_padded), most)


@dataclass(eq=False)  # identity: a request waits in a dict
class _Entry:
    """A job in a continuous search: its results so far and how many lines are left."""

    job: Job
    results: list[list[Translation]]
    left: int


class _Sentence(NamedTuple):
    line: int  # its place in the request
    ids: list[int]  # source token ids
    cost: int  # its rows x output-length limit: what it may cost the token budget


@dataclass
class _Stream:
    """One running search for one set of settings, and the sentences it serves."""

    run: RowSearch | BeamSearch
    entries: dict[_Entry, None] = field(default_factory=dict)  # in flight (an ordered set)
    # Sentences not admitted yet, by request (in order of arrival).
    waiting: dict[_Entry, deque[_Sentence]] = field(default_factory=dict)
    n_waiting: int = 0
    rows: dict[int, tuple[_Entry, _Sentence]] = field(default_factory=dict)  # by search id
    tokens: int = 0  # the token budget its admitted sentences hold
    admitted: int = -1  # when it last admitted (Streams._admissions): its turn
    seconds: float = 0.0  # model time not yet reported
    sharing: set[int] = field(default_factory=set)  # requests in the batch since that report

    @property
    def busy(self) -> bool:
        return bool(self.entries)


def _step_search(run: RowSearch | BeamSearch) -> list[tuple[int, list[Hypothesis]]]:
    """One step of `run`: (id, hypotheses best first) of each sentence that ended."""
    if isinstance(run, BeamSearch):
        return run.step()
    return [(r, [hyp]) for r, hyp in run.step()]


def _take_in_turn(
    stream: _Stream, n: int, tokens: int, force_first: bool = False
) -> list[tuple[_Entry, _Sentence]]:
    """Up to `n` waiting sentences whose costs fit `tokens`, one from each waiting request in
    turn (oldest first): a one-sentence request then waits behind at most one sentence of each
    request before it, not behind all of their sentences, and every request still advances at
    the same pace. The first sentence that does not fit ends the taking (it keeps its place);
    with `force_first` the first one is taken whatever it costs."""
    out: list[tuple[_Entry, _Sentence]] = []
    while stream.waiting and len(out) < n:
        for entry in list(stream.waiting):
            lines = stream.waiting[entry]
            if len(out) == n or (lines[0].cost > tokens and (out or not force_first)):
                stream.n_waiting -= len(out)
                return out
            tokens -= lines[0].cost
            out.append((entry, lines.popleft()))
            del stream.waiting[entry]
            if lines:  # back in line after the others
                stream.waiting[entry] = lines
    stream.n_waiting -= len(out)
    return out


class Streams:
    """The running searches (greedy, beam) of one model worker, by settings."""

    def __init__(
        self,
        translator: Translator,
        max_rows: int,
        report: Callable[[BatchStats], None],
        max_tokens: int = 0,
    ) -> None:
        """At most `max_rows` rows, and sentences whose rows x output-length limits sum to at
        most `max_tokens` (0: no token bound; no limit counted below max_tokens / max_rows),
        are in flight over all the searches: the turns' budget (aiayn.serve.batcher), so the
        worst request the limits allow holds the model no longer here than in a turn."""
        self.translator, self.max_rows, self.report = translator, max_rows, report
        self.max_tokens = max_tokens
        self.slack: int | None = None  # part_slack(), measured by `calibrate` (or set)
        self._streams: dict[DecodeConfig, _Stream] = {}
        self._admissions = 0  # admissions so far, over all searches: their turns

    def __bool__(self) -> bool:
        return bool(self._streams)

    def calibrate(self) -> int:
        """The encoder parts' slack (`part_slack`), measured once: the model worker does it as
        it starts, before the first admission needs it."""
        if self.slack is None:
            self.slack = part_slack(self.translator)
        return self.slack

    def step(self, aborting: bool = False) -> None:
        """One step of every running search; a search with nothing left is closed.

        Searches admit in turn: the one that admitted longest ago (or never) goes first; while
        a search still has sentences waiting (no room: a beam sentence needs its N rows at
        once, a long one its share of the token budget), the searches after it admit nothing.
        So greedy rows, freed one at a time, cannot starve a beam request, nor one long
        request the others: the rows and tokens they free wait for it when its turn comes."""
        blocked = False
        for cfg, stream in sorted(self._streams.items(), key=lambda item: item[1].admitted):
            before = stream.n_waiting
            self._step(stream, aborting, may_admit=not blocked)
            if stream.n_waiting < before:
                stream.admitted, self._admissions = self._admissions, self._admissions + 1
            blocked = blocked or stream.n_waiting > 0
            if not stream.busy:
                del self._streams[cfg]

    def take(self, job: Job, cfg: DecodeConfig) -> None:
        """Queue a job's lines for its settings' running search (started if need be)."""
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
            model = self.translator.model
            # Finished sentences leave their search at once (greedy: a row; beam: N rows).
            run = RowSearch(model, cfg) if cfg.beam_size == 1 else BeamSearch(model, cfg)
            stream = self._streams[cfg] = _Stream(run)
        cap = output_cap(cfg, self.translator.model.cfg.max_len)
        src_lens = torch.tensor([len(x) for x in ids])
        limits = max_output_lengths(src_lens, cfg.max_len_a, cfg.max_len_b, cap).tolist()
        floor = self.max_tokens // self.max_rows
        costs = [cfg.beam_size * max(n, floor) for n in limits]
        stream.entries[entry] = None
        stream.waiting[entry] = deque(map(_Sentence, todo, ids, costs))
        stream.n_waiting += len(todo)

    def _step(self, stream: _Stream, aborting: bool, may_admit: bool = True) -> None:
        """Admit waiting sentences (up to `max_rows` rows in flight over all searches; none
        unless `may_admit`), run one step, answer what ended."""
        now = time.monotonic()
        gone = [e for e in stream.entries if aborting or e.job.gone(now)]
        if gone:
            for e in gone:
                drop(e.job)
                del stream.entries[e]
                stream.n_waiting -= len(stream.waiting.pop(e, ()))
            rows = {r for r, (e, _) in stream.rows.items() if e in gone}
            stream.run.drop(rows)
            for r in rows:
                stream.tokens -= stream.rows.pop(r)[1].cost
        # Sentences join in groups (one encoder batch, one cache copy) when a quarter of the
        # rows are free or all that wait fit: admitting one at a time copies the cache often.
        admit: list[tuple[_Entry, _Sentence]] = []
        # One bound for all running searches: many distinct settings must not multiply the
        # rows (and cache memory) in flight. A sentence takes a row per beam; when nothing is
        # in flight one is admitted whatever it costs, so a beam wider than `max_rows` or a
        # sentence over the token budget runs (alone).
        per = stream.run.cfg.beam_size
        in_flight = sum(s.run.live for s in self._streams.values())
        room = max(self.max_rows - in_flight, 0) // per or int(in_flight == 0)
        if may_admit and room >= min(stream.n_waiting, max(1, self.max_rows // 4 // per)):
            used = sum(s.tokens for s in self._streams.values())
            tokens = self.max_tokens - used if self.max_tokens else sys.maxsize
            admit = _take_in_turn(stream, room, tokens, force_first=in_flight == 0)
        t0 = time.monotonic()
        try:
            with inference(self.translator.model), self.translator.precision.autocast():
                if admit:
                    cut = padding_parts([len(sent.ids) for _, sent in admit], self.calibrate())
                    parts = [self.translator.pad([admit[i][1].ids for i in p]) for p in cut]
                    admit = [admit[i] for part in cut for i in part]  # the rows' order
                    for r, (e, sent) in zip(stream.run.add(*parts), admit, strict=True):
                        stream.rows[r] = (e, sent)
                        stream.tokens += sent.cost
                    # Between admissions rows only leave, so the requests sharing the batch
                    # change here (and at a report), not at every step.
                    stream.sharing |= {id(e) for e, _ in admit}
                finished = _step_search(stream.run)
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
        decode = self.translator.tokenizer.decode
        for r, hyps in finished:
            entry, (i, ids, cost) = stream.rows.pop(r)
            stream.tokens -= cost
            entry.results[i] = [Translation(one_line(decode(h.tokens)), h, len(ids)) for h in hyps]
            entry.left -= 1
            done.append(entry.results[i])
            if entry.left == 0:  # answered: it leaves (an abandoned one left with `gone` above)
                settle(entry.job.future, result=entry.results)
                del stream.entries[entry]
        if done:
            # requests: those whose rows shared the batch while these sentences were written
            self.report(batch_stats(len(stream.sharing), done, stream.seconds))
            stream.seconds, stream.sharing = 0.0, {id(e) for e, _ in stream.rows.values()}
