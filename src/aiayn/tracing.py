"""Tracing: the glass box taps the real forward pass. A leaf: it imports nothing of aiayn.

    with tracing() as trace:          every `tap(name, x)` inside the block is recorded in
        model(src_BS, tgt_in_BT)      `trace.tensors[name]` (a detached copy), in order
    is_tracing()                      modules ask before computing what only a trace needs

When a trace is active, modules record named intermediates and attention takes the explicit
math path so that every number (Q, K, V, scores, weights...) exists. When none is active
(training, decoding), a tap is one context-variable read.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field

import torch
from torch import Tensor


@dataclass
class Trace:
    """Named intermediates of one traced forward pass, in the order they were computed."""

    tensors: dict[str, Tensor] = field(default_factory=dict)
    prefix: str = ""

    def record(self, name: str, x: Tensor) -> None:
        self.tensors[self.prefix + name] = x.detach().clone()


_TRACE: ContextVar[Trace | None] = ContextVar("aiayn_trace", default=None)


@contextmanager
def tracing(prefix: str = "") -> Iterator[Trace]:
    """Record every named intermediate computed inside the `with` block."""
    trace = Trace(prefix=prefix)
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
