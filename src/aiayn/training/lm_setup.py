"""What a language-model run (`train.task = "lm"`) sets up differently from a translator's:
its vocabulary fitted to the text, its token streams, its batches of blocks and its validation.

    fit_lm_tokenizer      characters, bytes or a SentencePiece BPE of the training text
    BlockLoader           each step's blocks: `batch_size` random offsets, a function of
                          (seed, step), so a resumed run draws the same ones
    validate_lm           the loss per token over the whole validation stream, every token
                          scored once (what `aiayn evaluate --text` reports too)
"""

from __future__ import annotations

import logging
import math

from aiayn.config import TrainConfig
from aiayn.errors import ConfigError
from aiayn.generate.scoring import score_windows
from aiayn.nn.variants import DecoderLM
from aiayn.runtime.device import Precision
from aiayn.runtime.distributed import Dist
from aiayn.text.charset import ByteTokenizer, CharTokenizer
from aiayn.text.lm_data import (
    NOT_SCORED,
    LMBatch,
    LMData,
    block_batch,
    block_offsets,
    read_texts,
)
from aiayn.text.tokenizer import Tokenizer

log = logging.getLogger(__name__)


def fit_lm_tokenizer(tc: TrainConfig) -> Tokenizer:
    """A vocabulary fitted to the training text (`train.tokenizer`): its characters, bytes, or
    a SentencePiece BPE that decodes any text back exactly."""
    if tc.tokenizer == "byte":
        tok: Tokenizer = ByteTokenizer()
    else:
        texts = [text for _, text in read_texts(tc.text)]
        if tc.tokenizer == "char":
            tok = CharTokenizer.fit(texts)
        else:
            lines = [line for text in texts for line in text.splitlines()]
            log.info("training a %d-piece BPE tokenizer on %s", tc.vocab_size, tc.text)
            tok = Tokenizer.train(lines, tc.vocab_size, "bpe", exact=True)
    log.info("vocabulary: %s, %d ids", tc.tokenizer, tok.vocab_size)
    return tok


def blocks_per_batch(tc: TrainConfig, block: int) -> int:
    return tc.batch_size or max(1, tc.max_tokens // block)


class BlockLoader:
    """The LM's `StepLoader`: per optimizer step, this rank's micro-batches of blocks.

    An "epoch" is as many steps as hold as many tokens as the stream (the blocks are drawn
    at random, as nanoGPT's, so an epoch is a measure, not a pass); (epoch, batch_in_epoch)
    keep a run's position as the translator's loader does."""

    def __init__(self, data: LMData, tc: TrainConfig, d: Dist) -> None:
        self.data, self.tc, self.d = data, tc, d
        self.rows = blocks_per_batch(tc, data.block)
        self.per_step = tc.accum_steps * d.world
        per_epoch = len(data.train) // (self.rows * data.block * self.per_step)
        self.steps_per_epoch = max(1, per_epoch)

    def plan(self, epoch: int) -> list[list[int]]:
        """An epoch's batches: placeholders (their blocks are drawn in `next_step`)."""
        return [[]] * (self.steps_per_epoch * self.per_step)

    def next_step(
        self, epoch: int, batch_in_epoch: int
    ) -> tuple[list[list[int]], int, tuple[int, int]]:
        step = epoch * self.steps_per_epoch + batch_in_epoch // self.per_step
        n, block = len(self.data.train), self.data.block
        chunk = [
            block_offsets(n, block, self.rows, self.tc.seed, step * self.per_step + i).tolist()
            for i in range(self.per_step)
        ]
        tokens = self.rows * block * self.per_step
        after = batch_in_epoch + self.per_step
        done = after >= self.steps_per_epoch * self.per_step
        position = (epoch + 1, 0) if done else (epoch, after)
        return chunk[self.d.rank :: self.d.world], tokens, position

    def batch(self, offsets: list[int], pad_id: int) -> LMBatch:
        return block_batch(self.data.train, offsets, self.data.block)

    @staticmethod
    def unscored(pad_id: int) -> int:
        """None: a block is never padded, so every target counts, PAD's id too where it is
        also EOS (GPT-2's <|endoftext|>: an imported GPT-2 trained on text learns its ends)."""
        return NOT_SCORED


def validate_lm(
    model: DecoderLM, data: LMData, tc: TrainConfig, d: Dist, precision: Precision
) -> dict[str, float]:
    """The validation loss per token (nats; no label smoothing) and its perplexity, with bits
    per character where the validation text's characters are known."""
    nll, n = score_windows(model, data.valid_stream, data.block, precision, d)
    if n == 0:
        raise ConfigError("the validation text has no token to score")
    rec = {"valid_loss": nll / n, "valid_ppl": math.exp(min(nll / n, 50.0))}
    if data.chars:
        rec["valid_bits_per_char"] = nll / math.log(2) / data.chars
    return rec
