"""What a request hands the model worker (`Job`), how the worker answers it, and what it
reports of each batch (`BatchStats`): shared by the turns (aiayn.serve.batcher) and the running
searches (aiayn.serve.streams)."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future, InvalidStateError
from dataclasses import dataclass, field
from typing import Any

from aiayn.config import DecodeConfig
from aiayn.translate.translator import Translation


class QueueFullError(Exception):
    """More jobs are waiting than the server accepts (it answers 503)."""


class ClosedError(Exception):
    """The batcher has stopped taking jobs (the server is shutting down)."""


class ExpiredError(Exception):
    """The job's deadline passed before the model finished it."""


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
        """The client went away: the worker skips what is left of this job."""
        self.cancelled = True

    def gone(self, now: float) -> bool:
        return self.cancelled or now > self.deadline


@dataclass
class BatchStats:
    """What one chunk (one turn of the model) held: for the server's metrics. In continuous
    batching, what finished at one step, with the model time since the last report."""

    requests: int
    sentences: int
    src_tokens: int
    tgt_tokens: int
    seconds: float


def settle(future: Future, *, result: Any = None, error: BaseException | None = None) -> None:
    """Answer a future once (a waiting handler may have cancelled it meanwhile)."""
    if future.done():
        return
    try:
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)
    except InvalidStateError:  # cancelled between the check and the set
        pass


def drop(job: Job) -> None:
    """A job nobody waits for any more: cancelled, or its deadline passed."""
    if job.cancelled:
        job.future.cancel()
    else:
        settle(job.future, error=ExpiredError("timed out waiting for the model"))


def batch_stats(requests: int, found: list[list[Translation]], seconds: float) -> BatchStats:
    src_tokens = sum(r[0].src_tokens for r in found)
    tgt_tokens = sum(len(r[0].hyp.tokens) for r in found)
    return BatchStats(requests, len(found), src_tokens, tgt_tokens, seconds)
