"""A run's tokenizer, the same on every rank of a torchrun run (every task's setup uses it)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch.distributed as dist

from aiayn.runtime.distributed import Dist
from aiayn.text.tokenizer import Tokenizer


def shared_tokenizer(
    out: Path, resume: Path | None, given: Tokenizer | None, d: Dist, make: Callable[[], Tokenizer]
) -> Tokenizer:
    """The run's tokenizer, the same on every rank: reloaded on resume; else rank 0 takes
    `given` or `make()`s one and saves it in `out`, and the other ranks read that."""
    if resume is not None:
        return Tokenizer.load(out)
    if d.main:
        tok = given or make()
        out.mkdir(parents=True, exist_ok=True)
        tok.save(out)
    if d.world > 1:
        dist.barrier()
    return tok if d.main else Tokenizer.load(out)  # type: ignore[return-value]
