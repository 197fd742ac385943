"""Masked-language-model pre-training (`train.task = "mlm"`; Devlin et al., 2019, §3.1): the
encoder reads a line with some of its tokens hidden and predicts them from both sides.

    mask_tokens     BERT's corruption: `mask_prob` (15%) of the real tokens are chosen; of
                    those 80% become MASK, 10% a random token, 10% stay; only they are scored
    load_mlm_data   the lines of `train.text` as BOS + ids + EOS, validation from
                    `train.valid_text` or the last `valid_share` of the lines
    MaskedLoader    the classifier's loader over lines, each batch masked afresh, seeded by
                    (seed, epoch, its texts): a resumed run masks the same way
    validate_mlm    loss and accuracy on the masked tokens of the validation lines, masked
                    with a fixed seed (the same positions at every validation)
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor

from aiayn.config import TrainConfig
from aiayn.errors import ConfigError, DataError
from aiayn.nn.encoder_only import EncoderMLM
from aiayn.runtime.device import Precision
from aiayn.runtime.distributed import Dist, all_sum
from aiayn.text.batches import pad_rows
from aiayn.text.labelled import classifier_ids
from aiayn.text.lm_data import NOT_SCORED, read_texts
from aiayn.text.tokenizer import Tokenizer
from aiayn.training.cls_setup import SentenceBatch, SentenceLoader, sentence_plan

log = logging.getLogger(__name__)


def mask_tokens(
    ids_BT: Tensor, tok: Tokenizer, prob: float, gen: torch.Generator
) -> tuple[Tensor, Tensor, Tensor]:
    """(inputs, where, targets): `ids_BT` with BERT's corruption, the chosen positions (bool,
    B x T) and their original ids (in row-major order, as `EncoderMLM(inputs, where)` gives
    its logits). Special tokens (PAD, BOS, EOS) are never chosen; a batch gets at least one."""
    assert tok.mask_id is not None
    real_BT = (ids_BT != tok.pad_id) & (ids_BT != tok.bos_id) & (ids_BT != tok.eos_id)
    where_BT = (torch.rand(ids_BT.shape, generator=gen) < prob) & real_BT
    if not bool(where_BT.any()) and bool(real_BT.any()):  # a batch of short lines
        where_BT.view(-1)[int(real_BT.view(-1).nonzero()[0])] = True
    roll_BT = torch.rand(ids_BT.shape, generator=gen)
    random_BT = torch.randint(0, tok.vocab_size, ids_BT.shape, generator=gen)
    # a drawn special id (a PAD mid-sentence would read as padding) keeps the token instead
    special_BT = torch.isin(
        random_BT, torch.tensor([tok.pad_id, tok.bos_id, tok.eos_id, tok.mask_id])
    )
    random_BT = torch.where(special_BT, ids_BT, random_BT)
    inputs_BT = ids_BT.clone()
    inputs_BT[where_BT & (roll_BT < 0.8)] = tok.mask_id
    swap_BT = where_BT & (roll_BT >= 0.8) & (roll_BT < 0.9)
    inputs_BT[swap_BT] = random_BT[swap_BT]
    return inputs_BT, where_BT, ids_BT[where_BT]


@dataclass
class MaskedData:
    """An mlm run's lines as ids. `valid` is truthy when there is validation."""

    train_ids: list[list[int]]
    valid_ids: list[list[int]]
    heldout: dict[str, object] = field(default_factory=dict)

    @property
    def valid(self) -> list[int]:
        return list(range(len(self.valid_ids)))


def text_lines(spec: str) -> list[str]:
    """The non-blank lines of `train.text` (files, a folder of *.txt, comma-separated)."""
    return [line for _, text in read_texts(spec) for line in text.split("\n") if line.strip()]


def load_mlm_data(tc: TrainConfig, tok: Tokenizer, max_len: int) -> MaskedData:
    if tok.mask_id is None:
        raise ConfigError(
            "this vocabulary has no mask piece: masked-LM pre-training trains its own "
            "tokenizer (leave train.init_from empty)"
        )
    lines = text_lines(tc.text)
    heldout: dict[str, object] = {}
    if tc.valid_text:
        valid = text_lines(tc.valid_text)
    else:
        n = int(len(lines) * tc.valid_share)
        lines, valid = (lines[: len(lines) - n], lines[len(lines) - n :]) if n else (lines, [])
        heldout = {"lines": len(valid), "share": tc.valid_share, "of": "the last lines"}
    if not lines:
        raise DataError(f"{tc.text}: no line of text to pre-train on")
    return MaskedData(
        classifier_ids(tok, lines, max_len), classifier_ids(tok, valid, max_len), heldout
    )


class MaskedLoader(SentenceLoader):
    """`SentenceLoader` over lines; each batch masked by `mask_tokens`."""

    def __init__(self, data: MaskedData, tok: Tokenizer, tc: TrainConfig, d: Dist) -> None:
        super().__init__(data.train_ids, [0] * len(data.train_ids), tc, d)
        self.tok = tok
        self._ready: dict[tuple[int, ...], SentenceBatch] = {}

    def next_step(
        self, epoch: int, batch_in_epoch: int
    ) -> tuple[list[list[int]], int, tuple[int, int]]:
        """As the classifier's; the step's targets are its masked tokens over every rank, so
        each rank masks every batch of the step (cheap) and keeps its own."""
        plan, self.epoch = self.plan(epoch), epoch
        chunk = plan[batch_in_epoch : batch_in_epoch + self.per_step]
        masked = [self._masked(idx) for idx in chunk]
        self._ready = {tuple(idx): b for idx, b in zip(chunk, masked, strict=True)}
        mine, _, position = super().next_step(epoch, batch_in_epoch)
        return mine, sum(b.n_tgt_tokens for b in masked), position

    def _masked(self, idx: list[int]) -> SentenceBatch:
        ids_BT = pad_rows([self.ids[i] for i in idx], self.tok.pad_id)
        gen = torch.Generator().manual_seed(hash((self.tc.seed, self.epoch, *idx)) % 2**62)
        inputs_BT, where_BT, targets_P = mask_tokens(ids_BT, self.tok, self.tc.mask_prob, gen)
        return SentenceBatch((inputs_BT, where_BT), targets_P, int(where_BT.sum()))

    def batch(self, idx: list[int], pad_id: int) -> SentenceBatch:
        return self._ready.pop(tuple(idx), None) or self._masked(idx)

    @staticmethod
    def unscored(pad_id: int) -> int:
        return NOT_SCORED


@torch.no_grad()
def validate_mlm(
    model: EncoderMLM,
    data: MaskedData,
    tok: Tokenizer,
    tc: TrainConfig,
    d: Dist,
    precision: Precision,
) -> dict[str, float]:
    """Loss per masked token (nats, no smoothing), its perplexity, and the share of masked
    tokens predicted right."""
    was_training = model.training
    model.eval()
    totals = torch.zeros(3, dtype=torch.float64)  # nll, right, masked
    lengths = [len(ids) for ids in data.valid_ids]
    for b, idx in enumerate(sentence_plan(lengths, tc, 0, 0, shuffle=False)):
        if b % d.world != d.rank:
            continue
        gen = torch.Generator().manual_seed(b)  # the same positions at every validation
        ids_BT = pad_rows([data.valid_ids[i] for i in idx], tok.pad_id)
        inputs_BT, where_BT, targets_P = mask_tokens(ids_BT, tok, tc.mask_prob, gen)
        with precision.autocast():
            logits_PV = model(inputs_BT.to(d.device), where_BT.to(d.device))
        logits_PV = logits_PV.float().cpu()
        totals[0] += float(F.cross_entropy(logits_PV, targets_P, reduction="sum"))
        totals[1] += float((logits_PV.argmax(-1) == targets_P).sum())
        totals[2] += targets_P.numel()
    nll, right, n = all_sum(totals, d)
    model.train(was_training)
    if n == 0:
        raise ConfigError("the validation text has no token to mask")
    return {
        "valid_loss": nll / n,
        "valid_ppl": math.exp(min(nll / n, 50.0)),
        "valid_masked_accuracy": right / n,
    }
