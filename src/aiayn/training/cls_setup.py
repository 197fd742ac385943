"""What an encoder-only run (`train.task = "classify"` or `"mlm"`) sets up differently from a
translator's: its examples (one text each), their batches, their validation, and the start
from a pre-trained encoder.

    SentenceBatch        a batch of texts: the model's inputs, its targets, their count
    SentenceLoader       each step's batches: texts shuffled by (seed, epoch), grouped by length,
                         up to `train.batch_size` texts or `train.max_tokens` padded positions
    validate_classifier  loss, accuracy and macro-F1 on the validation texts
    start_classifier     the model config and weights a classifier starts from: a pre-trained
                         encoder's (an mlm run's, a translator's) with a new head, or a whole
                         classifier's
"""

from __future__ import annotations

import dataclasses
import logging
import math
import random
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor

from aiayn.classify.metrics import confusion, scores
from aiayn.config import Config, ModelConfig, TrainConfig
from aiayn.errors import ConfigError
from aiayn.nn.encoder_only import EncoderClassifier
from aiayn.runtime.device import Precision
from aiayn.runtime.distributed import Dist, all_sum
from aiayn.store.model_dir import WEIGHTS_FILE, load_model_config, load_tensors, read_model_meta
from aiayn.text.batches import pad_rows
from aiayn.text.labelled import LabelledData
from aiayn.text.lm_data import NOT_SCORED

log = logging.getLogger(__name__)

# Texts sorted by length within pools of this many batches: little padding, random batches.
POOL_BATCHES = 50


@dataclass
class SentenceBatch:
    """Texts as model inputs (`inputs`), their targets (`tgt_out_BT`: a class per text, or the
    masked tokens' ids) and how many targets count (`n_tgt_tokens`)."""

    inputs: tuple[Tensor, ...]
    tgt_out_BT: Tensor
    n_tgt_tokens: int

    def to(self, device: torch.device | str) -> SentenceBatch:
        device = torch.device(device)
        if device.type == "cpu":
            return self
        gpu = device.type == "cuda"

        def move(t: Tensor) -> Tensor:
            return (t.pin_memory() if gpu else t).to(device, non_blocking=gpu)

        inputs = tuple(move(t) for t in self.inputs)
        return SentenceBatch(inputs, move(self.tgt_out_BT), self.n_tgt_tokens)


def sentence_plan(
    lengths: list[int], tc: TrainConfig, seed: int, epoch: int, shuffle: bool = True
) -> list[list[int]]:
    """Batches of example indices: `batch_size` texts, or as many as keep the padded batch
    within `max_tokens`; shuffled (seeded by (seed, epoch)) and sorted by length in pools."""
    order = list(range(len(lengths)))
    rng = random.Random(1_000_003 * seed + epoch)
    if shuffle:
        rng.shuffle(order)
    per = tc.batch_size or max(1, tc.max_tokens // max(max(lengths, default=1), 1))
    pool = per * POOL_BATCHES
    batches: list[list[int]] = []
    for a in range(0, len(order), pool):
        chunk = sorted(order[a : a + pool], key=lambda i: lengths[i])
        batch: list[int] = []
        for i in chunk:
            size = (len(batch) + 1) * lengths[i]  # the pool is sorted: i is the longest
            if batch and (len(batch) >= per if tc.batch_size else size > tc.max_tokens):
                batches.append(batch)
                batch = []
            batch.append(i)
        if batch:
            batches.append(batch)
    if shuffle:
        rng.shuffle(batches)
    return batches


class SentenceLoader:
    """The `StepLoader` of a classifier: per optimizer step, this rank's batches of texts.
    An epoch is one pass over the training texts; (epoch, batch_in_epoch) is a complete data
    position, as the translator's (the plan is a function of (seed, epoch))."""

    def __init__(self, ids: list[list[int]], y: list[int], tc: TrainConfig, d: Dist) -> None:
        self.ids, self.y, self.tc, self.d = ids, y, tc, d
        self.per_step = tc.accum_steps * d.world
        self.lengths = [len(row) for row in ids]
        self.epoch = 0  # of the last step handed out
        self._plan: tuple[int, list[list[int]]] = (-1, [])

    def plan(self, epoch: int) -> list[list[int]]:
        if self._plan[0] != epoch:
            plan = sentence_plan(self.lengths, self.tc, self.tc.seed, epoch)
            if len(plan) < self.per_step:
                raise ConfigError(
                    f"one step needs {self.per_step} batches but an epoch has {len(plan)}; "
                    "lower train.batch_size, train.max_tokens or train.accum_steps"
                )
            self._plan = (epoch, plan)
        return self._plan[1]

    def next_step(
        self, epoch: int, batch_in_epoch: int
    ) -> tuple[list[list[int]], int, tuple[int, int]]:
        plan, self.epoch = self.plan(epoch), epoch
        chunk = plan[batch_in_epoch : batch_in_epoch + self.per_step]
        after = batch_in_epoch + self.per_step
        position = (epoch + 1, 0) if after + self.per_step > len(plan) else (epoch, after)
        return chunk[self.d.rank :: self.d.world], sum(map(len, chunk)), position

    def batch(self, idx: list[int], pad_id: int) -> SentenceBatch:
        ids = pad_rows([self.ids[i] for i in idx], pad_id)
        y = torch.tensor([self.y[i] for i in idx], dtype=torch.long)
        return SentenceBatch((ids,), y, len(idx))

    @staticmethod
    def unscored(pad_id: int) -> int:
        """None: every text's label counts (a class index may equal PAD's id)."""
        return NOT_SCORED


def class_weights(data: LabelledData) -> Tensor:
    """Each class's loss weighed by 1 / its share of the training texts, normalised so that a
    balanced set gets 1 everywhere (scikit-learn's class_weight="balanced")."""
    counts = torch.bincount(torch.tensor(data.train_y), minlength=len(data.labels)).double()
    return (counts.sum() / (len(data.labels) * counts.clamp(min=1))).float()


@torch.no_grad()
def validate_classifier(
    model: EncoderClassifier, data: LabelledData, tc: TrainConfig, d: Dist, precision: Precision
) -> dict[str, float]:
    """Loss (mean cross-entropy, no smoothing), accuracy and macro-F1 on the validation texts
    (each rank a share; the confusion matrix summed over ranks)."""
    was_training = model.training
    model.eval()
    n = len(data.labels)
    totals = torch.zeros(1 + n * n, dtype=torch.float64)
    lengths = [len(ids) for ids in data.valid_ids]
    for idx in sentence_plan(lengths, tc, 0, 0, shuffle=False)[d.rank :: d.world]:
        ids = pad_rows([data.valid_ids[i] for i in idx], model.cfg.pad_id).to(d.device)
        y = torch.tensor([data.valid_y[i] for i in idx], dtype=torch.long)
        with precision.autocast():
            logits = model(ids)
        logits = logits.float().cpu()
        totals[0] += float(F.cross_entropy(logits, y, reduction="sum"))
        totals[1:] += torch.from_numpy(confusion(y.tolist(), logits.argmax(-1).tolist(), n)).ravel()
    summed = all_sum(totals, d)
    model.train(was_training)
    conf = torch.tensor(summed[1:]).reshape(n, n).long().numpy()
    got = scores(conf, data.labels)
    total = max(got["examples"], 1)
    return {
        "valid_loss": summed[0] / total,
        "valid_ppl": math.exp(min(summed[0] / total, 50.0)),
        "valid_accuracy": got["accuracy"],
        "valid_macro_f1": got["macro_f1"],
    }


def encoder_tensors(directory: str | Path, head: tuple[str, ...] = ()) -> dict[str, Tensor]:
    """A pre-trained model's embedding and encoder weights under a classifier's names
    (`embed.*`, `encoder.*`): an mlm run's, a classifier's, or a translator's source side; a
    classifier's weights under the `head` prefixes too (its pooler, its output layer)."""
    meta = read_model_meta(directory)
    arch = meta.get("architecture")
    prefixes: dict[str, str] | None = {
        "EncoderMLM": {"embed.": "embed.", "encoder.": "encoder."},
        "EncoderClassifier": {"embed.": "embed.", "encoder.": "encoder."},
        "Transformer": {"src_embed.": "embed.", "encoder.": "encoder."},
    }.get(str(arch))
    if prefixes is None:
        raise ConfigError(
            f"train.init_from={directory} holds a {arch}: a classifier starts from an encoder "
            "(an mlm run, a translator or a classifier)"
        )
    if arch == "EncoderClassifier":
        prefixes = {**prefixes, **{p: p for p in head}}
    tensors = load_tensors(Path(directory) / WEIGHTS_FILE)
    out = {}
    for name, t in tensors.items():
        for old, new in prefixes.items():
            if name.startswith(old):
                out[new + name[len(old) :]] = t
    if arch == "Transformer" and "embed.tokens.weight" not in out:  # stored once, as its twin's
        twin = next((t for n, t in tensors.items() if n.endswith("tokens.weight")), None)
        if twin is not None:
            out["embed.tokens.weight"] = twin
    return out


def start_classifier(cfg: Config) -> tuple[Config, str]:
    """The config of a classifier starting from `train.init_from`: the pre-trained model's
    architecture with this config's dropout, and its pooling where it is a classifier (an
    imported BERT's [CLS] and pooler, say), else this config's; and what it starts from
    ("encoder", or "whole": a classifier, its head too)."""
    source = read_model_meta(cfg.train.init_from).get("architecture")
    pre: ModelConfig = load_model_config(cfg.train.init_from)
    mine = cfg.model
    if source != "EncoderClassifier":  # an mlm run's or a translator's: no pooling of its own
        pre = dataclasses.replace(pre, pooling=mine.pooling, pooler=mine.pooler)
    model = dataclasses.replace(pre, dropout=mine.dropout)
    return dataclasses.replace(cfg, model=model), (
        "whole" if source == "EncoderClassifier" else "encoder"
    )


def load_encoder(model: EncoderClassifier, directory: str | Path, whole: bool) -> None:
    """Copy a pre-trained encoder (and a classifier's pooler; with `whole`, its output layer
    too) into `model`; the pre-trained side's weights must fit it exactly."""
    tensors = encoder_tensors(directory, ("classifier.", "pooler.") if whole else ("pooler.",))
    own = model.state_dict()
    missing = [n for n in own if n.startswith(("embed.", "encoder.")) and n not in tensors]
    if missing:
        raise ConfigError(f"train.init_from={directory}: no {missing[0]} among its weights")
    wanted = {n: t for n, t in tensors.items() if n in own and own[n].shape == t.shape}
    model.load_state_dict(wanted, strict=False)
    log.info(
        "starting from %s of %s (%d tensors)",
        "the whole classifier" if whole else "the encoder",
        directory,
        len(wanted),
    )


def head_groups(model: EncoderClassifier, tc: TrainConfig) -> list[dict[str, object]]:
    """The optimizer's parameter groups: the pre-trained layers at `encoder_lr` times the rate
    (none when `freeze_encoder`: a linear probe), the head at the rate. `lr_scale` is read by
    aiayn.training.loss.train_step."""
    pre = [p for n, p in model.named_parameters() if n.startswith(("embed.", "encoder."))]
    head = [p for n, p in model.named_parameters() if not n.startswith(("embed.", "encoder."))]
    if tc.freeze_encoder:
        for p in pre:
            p.requires_grad_(False)
        return [{"params": head, "lr_scale": 1.0}]
    return [
        {"params": pre, "lr_scale": tc.encoder_lr},
        {"params": head, "lr_scale": 1.0},
    ]
