"""A trained classifier applied to texts, in process: `aiayn classify`, `aiayn evaluate
--data`, the server's /v1/classify and the benchmarks all go through `Classifier`.

    Classifier.open     a model directory (an EncoderClassifier) on a device, in a precision
    probabilities       (N, C) class probabilities of N texts, in their order: the texts are
                        batched by length (sorted, at most `batch_tokens` padded positions a
                        batch) and put back in order
    classify            each text's top-k (label, probability), best first
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path

import torch
from torch import Tensor

from aiayn.nn.encoder_only import EncoderClassifier
from aiayn.runtime.device import Precision
from aiayn.store.directory import ModelDir, load_for_decoding
from aiayn.text.batches import pad_rows
from aiayn.text.labelled import classifier_ids
from aiayn.text.tokenizer import Tokenizer

# Padded positions a batch holds: large enough that a CPU's matrix products are efficient,
# small enough that a batch's activations stay in the tens of MB for a small model.
BATCH_TOKENS = 8192


class Classifier:
    """An `EncoderClassifier` and its tokenizer: texts in, class probabilities out."""

    def __init__(
        self,
        model: EncoderClassifier,
        tok: Tokenizer,
        precision: Precision,
        batch_tokens: int = BATCH_TOKENS,
    ) -> None:
        self.model, self.tok, self.precision = model.eval(), tok, precision
        self.labels = model.labels
        self.batch_tokens = batch_tokens

    @classmethod
    def open(
        cls, directory: str | Path | ModelDir, device: str = "auto", dtype: str = "auto"
    ) -> Classifier:
        """The classifier in a model directory; another kind of model is a CheckpointError
        naming the commands that take it."""
        opened, model, precision = load_for_decoding(directory, EncoderClassifier, device, dtype)
        return cls(model, opened.tokenizer, precision)

    def ids(self, texts: Sequence[str]) -> list[list[int]]:
        """BOS + each text's ids + EOS, cut to the model's positions (as it was trained)."""
        return classifier_ids(self.tok, texts, self.model.cfg.max_len)

    def batches(self, ids: list[list[int]]) -> Iterator[list[int]]:
        """Indices of `ids`, longest first, in batches of at most `batch_tokens` positions."""
        order = sorted(range(len(ids)), key=lambda i: -len(ids[i]))
        batch: list[int] = []
        for i in order:
            if batch and (len(batch) + 1) * len(ids[batch[0]]) > self.batch_tokens:
                yield batch
                batch = []
            batch.append(i)
        if batch:
            yield batch

    @torch.inference_mode()
    def logits(self, texts: Sequence[str]) -> Tensor:
        """(N, C) fp32 class logits, in the texts' order."""
        ids = self.ids(texts)
        out = torch.empty(len(ids), len(self.labels))
        device = self.precision.device
        for idx in self.batches(ids):
            ids_BS = pad_rows([ids[i] for i in idx], self.model.cfg.pad_id).to(device)
            with self.precision.autocast():
                out[idx] = self.model(ids_BS).float().cpu()
        return out

    def probabilities(self, texts: Sequence[str]) -> Tensor:
        """(N, C) class probabilities (softmax of the logits), in the texts' order."""
        return torch.softmax(self.logits(texts), dim=-1)

    def classify(self, texts: Sequence[str], top_k: int = 1) -> list[list[tuple[str, float]]]:
        """Each text's `top_k` most probable (label, probability), best first."""
        probs = self.probabilities(texts)
        k = max(1, min(top_k, len(self.labels)))
        p, i = probs.topk(k, dim=-1)
        return [
            [(self.labels[c], float(q)) for q, c in zip(row_p, row_i, strict=True)]
            for row_p, row_i in zip(p.tolist(), i.tolist(), strict=True)
        ]
