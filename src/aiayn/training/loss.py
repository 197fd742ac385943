"""The training objective and one optimizer step (§5.3, §5.4).

loss      label_smoothed_loss: (1 - ε) NLL + ε · mean over V of -log p   (ε = 0.1, §5.4)
step      train_step: forward, loss, backward (accumulated), clipping, Adam, the rate
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import nullcontext
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch import Tensor

from aiayn.config import TrainConfig
from aiayn.runtime.device import Precision
from aiayn.runtime.distributed import Dist
from aiayn.text.batches import Batch
from aiayn.text.lm_data import LMBatch

if TYPE_CHECKING:
    from aiayn.training.cls_setup import SentenceBatch


def label_smoothed_loss(
    logits_PV: Tensor, target_P: Tensor, epsilon: float, pad_id: int
) -> tuple[Tensor, Tensor]:
    """Summed label-smoothed cross-entropy and summed NLL over the non-PAD targets.

    Shapes: P target positions (a batch's B x T flattened), V vocabulary.

    The smoothed target puts 1 - ε on the true class and spreads ε uniformly over all V
    classes (PyTorch's definition; the Annotated Transformer spreads it over V - 2), so
    `loss_sum == F.cross_entropy(logits, target, label_smoothing=ε, ignore_index=pad,
    reduction="sum")`. The NLL (no smoothing) gives perplexity; it is a reading, not a
    gradient's source. The backward is written out (`_SmoothedCE`).
    """
    return _SmoothedCE.apply(logits_PV, target_P, epsilon, pad_id)  # type: ignore[no-any-return]


# Rows of the P x V logits handled at once by the loss: their fp32 log-probabilities (~1 MiB)
# stay in a CPU core's cache between the passes over them, where one P x V fp32 matrix went
# through memory four times (docs/lab/training.md, "The loss in chunks").
CHUNK_BYTES = 1 << 20


def _chunk_rows(logits_PV: Tensor) -> int:
    """Rows a chunk of the loss takes: all of them on a GPU (each chunk is more launches), a
    cache's worth on a CPU."""
    if logits_PV.device.type != "cpu":
        return max(logits_PV.size(0), 1)
    return max(CHUNK_BYTES // (4 * logits_PV.size(-1)), 1)


class _SmoothedCE(torch.autograd.Function):
    """The loss above with its gradient in closed form: d loss / d logits = p - (1 - ε)·onehot
    - ε/V on each kept row (p the softmax). Autograd's own chain (log_softmax, gather, mean
    over V, and their backwards) takes about twice as long; on a CPU the P x V matrix is a large
    share of a small model's step (a 7,310 x 10,000 batch: 1.0-1.3 s fwd + bwd by autograd,
    0.54-0.70 s in one pass over the whole matrix; one CPU thread).

    Both passes go through the rows in chunks (`_chunk_rows`), and the backward recomputes a
    chunk's log-probabilities from the saved logits rather than keeping a P x V fp32 matrix
    from the forward: every row gets the bits one pass over the whole matrix gave (the ops are
    row-wise), in half the time with bf16 logits on an AVX512-BF16 CPU (721 -> 360 ms for 7,740
    x 10,000, forward and backward) and a quarter less in fp32 (647 -> 489-503 ms)."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any, logits_PV: Tensor, target_P: Tensor, epsilon: float, pad_id: int
    ) -> tuple[Tensor, Tensor]:
        # A 0/1 weight rather than boolean indexing: indexing must learn how many rows survive,
        # which stops the host until a GPU has caught up.
        keep_P = (target_P != pad_id).float()
        gold_P1 = target_P.clamp(min=0)[:, None]
        nll_P = keep_P.new_empty(keep_P.shape)
        uniform_P = keep_P.new_empty(keep_P.shape)
        rows = _chunk_rows(logits_PV)
        for a in range(0, logits_PV.size(0), rows):
            logp_RV = F.log_softmax(logits_PV[a : a + rows].float(), dim=-1)
            nll_P[a : a + rows] = -logp_RV.gather(-1, gold_P1[a : a + rows]).squeeze(-1)
            uniform_P[a : a + rows] = -logp_RV.mean(dim=-1)
        loss_P = (1.0 - epsilon) * nll_P + epsilon * uniform_P
        nll = (nll_P * keep_P).sum()
        ctx.mark_non_differentiable(nll)
        ctx.save_for_backward(logits_PV, gold_P1, keep_P)
        ctx.epsilon = epsilon
        return (loss_P * keep_P).sum(), nll

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx: Any, g_loss: Tensor, _g_nll: Tensor) -> tuple[Tensor, None, None, None]:
        logits_PV, gold_P1, keep_P = ctx.saved_tensors
        eps, V = ctx.epsilon, logits_PV.size(-1)
        grad_PV = torch.empty_like(logits_PV)  # in the logits' dtype: no P x V copy to cast
        scale_P1 = (keep_P * g_loss)[:, None]
        rows = _chunk_rows(logits_PV)
        for a in range(0, logits_PV.size(0), rows):
            gold_R1 = gold_P1[a : a + rows]
            g_RV = F.log_softmax(logits_PV[a : a + rows].float(), dim=-1).exp_().sub_(eps / V)
            g_RV.scatter_add_(-1, gold_R1, g_RV.new_full(gold_R1.shape, eps - 1.0))  # -(1 - ε)
            grad_PV[a : a + rows] = g_RV.mul_(scale_P1[a : a + rows])
        return grad_PV, None, None, None


def train_step(
    net: torch.nn.Module,
    opt: torch.optim.Optimizer,
    batches: Sequence[Batch | LMBatch | SentenceBatch],
    *,
    tokens: int,
    lr: float,
    pad_id: int,
    tc: TrainConfig,
    d: Dist,
    precision: Precision,
    weight_C: Tensor | None = None,
) -> Tensor:
    """Forward/backward over this rank's micro-batches (already on the device), then one Adam
    step.

    Each micro-batch's summed loss is divided by the step's *global* target-token count
    (times world, because DDP averages gradients over ranks), so the gradient is the mean
    over every target token of the step, however it is split over ranks and micro-batches.
    Returns this rank's summed (smoothed loss, NLL) as a tensor on the device: nothing here
    waits for the GPU, the log reads the totals every `log_every` steps.

    The logits are (B, T, V) (a token per position), (B, C) (a class per text) or (P, V) (the
    masked tokens only); the targets have their shape less the last dimension. `weight_C`
    weighs each class's loss (a classifier's `train.class_weights`); a parameter group's
    `lr_scale` scales its rate (a pre-trained encoder's `train.encoder_lr`).
    """
    for group in opt.param_groups:
        group["lr"] = lr * group.get("lr_scale", 1.0)
    opt.zero_grad(set_to_none=True)
    totals = torch.zeros(2, device=d.device)
    for a, b in enumerate(batches):
        last = a == len(batches) - 1
        with nullcontext() if d.world == 1 or last else net.no_sync():  # type: ignore[operator]
            with precision.autocast():
                logits = net(*b.inputs)
            logits_PV, target_P = logits.reshape(-1, logits.size(-1)), b.tgt_out_BT.reshape(-1)
            if weight_C is None:
                loss, nll = label_smoothed_loss(logits_PV, target_P, tc.label_smoothing, pad_id)
            else:
                logits_PV = logits_PV.float()
                loss = F.cross_entropy(
                    logits_PV,
                    target_P,
                    weight_C,
                    ignore_index=pad_id,
                    reduction="sum",
                    label_smoothing=tc.label_smoothing,
                )
                nll = F.cross_entropy(
                    logits_PV.detach(), target_P, ignore_index=pad_id, reduction="sum"
                )
            (loss * (d.world / tokens)).backward()
        totals += torch.stack([loss.detach(), nll.detach()])
    if tc.clip_norm > 0:
        torch.nn.utils.clip_grad_norm_(net.parameters(), tc.clip_norm)
    opt.step()
    return totals
