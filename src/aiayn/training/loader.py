"""Each optimizer step's share of a run's training batches, for this rank (`StepLoader`).

The epoch's plan comes from aiayn.text.batches (batch_plan: token-budget batches, seeded by
(seed, epoch)); the examples from aiayn.text.data's load_data.
"""

from __future__ import annotations

import logging

from aiayn.config import TrainConfig
from aiayn.errors import ConfigError
from aiayn.runtime.distributed import Dist
from aiayn.text.batches import (
    Batch,
    Example,
    batch_plan,
    collate,
    padding_efficiency,
    resegment,
)
from aiayn.text.tokenizer import Tokenizer

log = logging.getLogger(__name__)


class StepLoader:
    """Hands out, per optimizer step, this rank's micro-batches and the step's target tokens.

    One step consumes accum_steps × world batches of the epoch's plan; rank r takes every
    world-th of them. The plan depends only on (seed, epoch), so (epoch, batch_in_epoch), as
    a run's `TrainState` keeps them, is a complete data position. A remainder shorter than one
    step is skipped and the epoch ends at once, so the epoch always counts finished epochs.

    Under subword regularization (`train.subword_alpha`, with the examples' `text`) each epoch
    has examples of its own, the text segmented afresh by sampling seeded by (seed, epoch):
    `data` is the current epoch's, and a resume still finds the same batches.
    """

    def __init__(
        self,
        data: list[Example],
        tc: TrainConfig,
        d: Dist,
        text: list[tuple[str, str]] | None = None,
        tok: Tokenizer | None = None,
    ) -> None:
        self.best, self.data, self.tc, self.d = data, data, tc, d
        self.text, self.tok = text, tok
        self.per_step = tc.accum_steps * d.world
        self._plan: tuple[int, list[list[int]]] = (-1, [])

    def plan(self, epoch: int) -> list[list[int]]:
        if self._plan[0] != epoch:
            tc = self.tc
            if tc.subword_alpha and self.text and self.tok is not None:
                seed = 1_000_003 * tc.seed + 2 * epoch  # resegment uses seed and seed + 1
                self.data = resegment(
                    self.text, self.best, self.tok, tc.subword_alpha, seed, tc.max_len
                )
            plan = batch_plan(self.data, tc.max_tokens, seed=tc.seed, epoch=epoch)
            if len(plan) < self.per_step:
                raise ConfigError(
                    f"one step needs {self.per_step} batches but an epoch has {len(plan)}; "
                    "lower train.max_tokens or train.accum_steps"
                )
            if self.d.main:
                log.info(
                    "epoch %d: %d batches, padding efficiency %.1f%%",
                    epoch + 1,
                    len(plan),
                    100 * padding_efficiency(self.data, plan),
                )
            self._plan = (epoch, plan)
        return self._plan[1]

    def batch(self, idx: list[int], pad_id: int) -> Batch:
        return collate(self.data, idx, pad_id)

    @staticmethod
    def unscored(pad_id: int) -> int:
        """The target id the loss skips: PAD, which pads a pair's target."""
        return pad_id

    def next_step(
        self, epoch: int, batch_in_epoch: int
    ) -> tuple[list[list[int]], int, tuple[int, int]]:
        """This rank's batches of the step at (epoch, batch_in_epoch), the step's target tokens
        over all ranks, and the data position after the step."""
        plan = self.plan(epoch)
        chunk = plan[batch_in_epoch : batch_in_epoch + self.per_step]
        tokens = sum(self.data[i].tgt_positions for idx in chunk for i in idx)
        after = batch_in_epoch + self.per_step
        position = (epoch + 1, 0) if after + self.per_step > len(plan) else (epoch, after)
        return chunk[self.d.rank :: self.d.world], tokens, position
