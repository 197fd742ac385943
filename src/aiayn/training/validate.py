"""Validation during training: the loss per target token and greedy BLEU on a sample."""

from __future__ import annotations

import math

import torch

from aiayn.config import TrainConfig
from aiayn.nn.model import Transformer
from aiayn.runtime.device import Precision
from aiayn.runtime.distributed import Dist, all_sum
from aiayn.text.batches import Example, batch_plan, collate
from aiayn.text.tokenizer import Tokenizer
from aiayn.training.loss import label_smoothed_loss
from aiayn.translate import metrics
from aiayn.translate.metrics import Score


@torch.no_grad()
def validate(
    model: Transformer, data: list[Example], tc: TrainConfig, d: Dist, precision: Precision
) -> dict[str, float]:
    """Mean label-smoothed loss and perplexity (exp of mean NLL) over the validation set."""
    was_training = model.training
    model.eval()
    plan = batch_plan(data, tc.max_tokens, shuffle=False)
    totals = torch.zeros(3, dtype=torch.float64, device=d.device)  # loss, NLL, tokens
    for idx in plan[d.rank :: d.world]:
        b = collate(data, idx, model.cfg.pad_id).to(d.device)
        with precision.autocast():
            logits_BTV = model(b.src_BS, b.tgt_in_BT)
        loss, nll = label_smoothed_loss(
            logits_BTV.flatten(0, 1), b.tgt_out_BT.flatten(), tc.label_smoothing, model.cfg.pad_id
        )
        totals[:2] += torch.stack([loss.double(), nll.double()])
        totals[2] += b.n_tgt_tokens  # counted on the host by collate
    loss_sum, nll_sum, n = all_sum(totals, d)
    model.train(was_training)
    return {"valid_loss": loss_sum / n, "valid_ppl": math.exp(min(nll_sum / n, 50.0))}


def validation_bleu(
    model: Transformer,
    tok: Tokenizer,
    data: list[Example],
    refs: list[str],
    n: int,
    precision: Precision,
) -> Score:
    """Corpus BLEU (sacreBLEU, detokenized) of greedy translations of the first `n` pairs."""
    from aiayn.search.decode import greedy_decode

    hyps: list[str] = []
    for start in range(0, min(n, len(data)), 32):
        idx = list(range(start, min(start + 32, n, len(data))))
        with precision.autocast():
            src_BS = collate(data, idx, model.cfg.pad_id).src_BS
            ids = greedy_decode(model, src_BS.to(precision.device))
        hyps.extend(tok.decode(x) for x in ids)
    return metrics.bleu(hyps, refs[: len(hyps)])
