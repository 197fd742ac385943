"""Tracing: the glass box taps the real forward pass. A leaf: it imports nothing of aiayn.

    with tracing() as trace:          every `tap(name, x)` inside the block is recorded in
        model(src_BS, tgt_in_BT)      `trace.tensors[name]` (a detached copy), in order
    is_tracing()                      modules ask before computing what only a trace needs

When a trace is active, modules record named intermediates and attention takes the explicit
math path so that every number (Q, K, V, scores, weights...) exists. When none is active
(training, decoding), a tap is one context-variable read.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field

import torch
from torch import Tensor


class TraceTooLargeError(Exception):
    """A trace would hold more numbers than its `max_numel` allows."""


@dataclass
class Trace:
    """Named intermediates of one traced forward pass, in the order they were computed.

    `keep(name)` (when set) decides what is copied at all, so a trace that is asked for a
    part (some layers, the attention weights) never holds the rest; `max_numel` bounds the
    numbers it holds in all (a server's work budget): past it, `record` raises TraceTooLargeError.
    """

    tensors: dict[str, Tensor] = field(default_factory=dict)
    prefix: str = ""
    keep: Callable[[str], bool] | None = None
    max_numel: int | None = None
    numel: int = 0  # numbers copied so far, over the trace's life

    def record(self, name: str, x: Tensor) -> None:
        name = self.prefix + name
        if self.keep is not None and not self.keep(name):
            return
        self.count(x.numel())
        self.tensors[name] = x.detach().clone()

    def count(self, numel: int) -> None:
        """Charge `numel` numbers to the budget (also for what an observer keeps beside the
        trace, such as a search step's logits)."""
        self.numel += numel
        if self.max_numel is not None and self.numel > self.max_numel:
            raise TraceTooLargeError(
                f"the trace would hold more than {self.max_numel:,} numbers: ask for fewer "
                "layers, heads or steps, or the attention weights only"
            )


_TRACE: ContextVar[Trace | None] = ContextVar("aiayn_trace", default=None)


@contextmanager
def tracing(
    prefix: str = "", keep: Callable[[str], bool] | None = None, max_numel: int | None = None
) -> Iterator[Trace]:
    """Record every named intermediate computed inside the `with` block (those `keep` wants)."""
    trace = Trace(prefix=prefix, keep=keep, max_numel=max_numel)
    token = _TRACE.set(trace)
    try:
        yield trace
    finally:
        _TRACE.reset(token)


def _active_trace() -> Trace | None:
    # torch.compile cannot read a context variable without breaking the graph at every tap;
    # a compiled model is never traced (`tracing()` runs the eager model).
    return None if torch.compiler.is_compiling() else _TRACE.get()


def tap(name: str, x: Tensor) -> None:
    """Record `x` under `name` when a trace is active (one context-variable read otherwise)."""
    trace = _active_trace()
    if trace is not None:
        trace.record(name, x)


def is_tracing() -> bool:
    return _active_trace() is not None
