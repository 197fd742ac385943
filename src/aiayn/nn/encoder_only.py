"""Encoder-only models (the tutorials' BERT): the encoder stack of Figure 1 read both ways,
with a head for a sentence's class or for masked tokens.

    EncoderClassifier   sentence -> pooled vector -> class logits (fine-tuning, or from scratch)
    EncoderMLM          masked-language-model pre-training (Devlin et al., 2019, §3.1): the
                        tokens behind [MASK] predicted from both sides

Both name their layers alike (`embed`, `encoder`), so a classifier starts from a pre-trained
encoder by copying those weights (aiayn.training.cls_setup.load_encoder); a translator's
`src_embed` and `encoder` are one too.

An input is BOS + the text's ids + EOS, right-padded (aiayn.text.labelled.classifier_ids): with
`pooling = "cls"` the BOS position is BERT's [CLS], whose output stands for the sentence.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from aiayn.config import ModelConfig
from aiayn.nn.embeddings import Embeddings
from aiayn.nn.model import GATES, Encoder, _ModelBase, check_encoder_positions
from aiayn.nn.packed import encode_packed, skips_padding
from aiayn.nn.tracing import tap
from aiayn.runtime.kernels import ACTIVATIONS, Linear


def pool(x_BSD: Tensor, keep_BS: Tensor, how: str) -> Tensor:
    """The sentence vector (B, D): the first position's ("cls") or the mean over real tokens."""
    if how == "cls":
        return x_BSD[:, 0]
    keep_BS1 = keep_BS[:, :, None].to(x_BSD.dtype)
    return (x_BSD * keep_BS1).sum(1) / keep_BS1.sum(1).clamp(min=1.0)


def head_activation(activation: str) -> str:
    """The MLM head's activation: its one dense layer has no gate and no square, so a gated
    FFN's head takes the gate's activation (swiglu: swish, geglu: gelu) and relu2's the ReLU."""
    return {"relu2": "relu", **GATES}.get(activation, activation)


class EncoderClassifier(_ModelBase):
    """The encoder stack, a pooled sentence vector, and a linear layer over `n_classes`
    (BERT's sequence classification). `labels` names the classes, in the order of the logits."""

    def __init__(self, cfg: ModelConfig, n_classes: int, labels: list[str] | None = None) -> None:
        super().__init__()
        check_encoder_positions(cfg)
        if n_classes < 2:
            raise ValueError(f"n_classes must be at least 2, got {n_classes}")
        names = [str(i) for i in range(n_classes)] if labels is None else list(labels)
        if len(names) != n_classes or len(set(names)) != n_classes:
            raise ValueError(f"labels must name each of the {n_classes} classes once: {names}")
        if not all(isinstance(n, str) for n in names):
            raise ValueError("labels must be strings")
        self.cfg, self.n_classes, self.labels = cfg, n_classes, names
        self.embed = Embeddings(cfg, nn.Embedding(cfg.vocab_size, cfg.d_model, cfg.pad_id))
        self.encoder = Encoder(cfg)
        self.pooler = Linear(cfg.d_model, cfg.d_model) if cfg.pooler else None
        self.dropout = nn.Dropout(cfg.dropout)  # on the sentence vector, as BERT's head
        self.classifier = Linear(cfg.d_model, n_classes)
        self._init_weights()
        self._name_for_trace()

    def extra_config(self) -> dict[str, Any]:
        return {"n_classes": self.n_classes, "labels": self.labels}

    def features(self, ids_BS: Tensor) -> Tensor:
        """The pooled sentence vector (B, D) the classifier reads."""
        self.check_ids(ids_BS, "input")
        keep_BS = ids_BS != self.cfg.pad_id
        x_BSD = self.embed(ids_BS)
        if skips_padding(self, keep_BS):  # inference on a CPU: the same values, less work
            x_BSD = encode_packed(self.encoder, x_BSD, keep_BS)
        else:
            x_BSD = self.encoder(x_BSD, keep_BS[:, None, None, :])
        pooled_BD = pool(x_BSD, keep_BS, self.cfg.pooling)
        tap("pooled", pooled_BD)
        if self.pooler is not None:
            pooled_BD = torch.tanh(self.pooler(pooled_BD))
            tap("pooler", pooled_BD)
        return pooled_BD

    def forward(self, ids_BS: Tensor) -> Tensor:
        """Class logits (B, n_classes)."""
        pooled_BD = self.features(ids_BS)
        if self.dropout.training:
            pooled_BD = self.dropout(pooled_BD)
        logits_BC = self.classifier(pooled_BD)
        tap("classifier.logits", logits_BC)
        return logits_BC


class EncoderMLM(_ModelBase):
    """The encoder stack pre-trained to fill in masked tokens: BERT's head on each output
    (dense, activation, LayerNorm), then the vocabulary's logits through the embedding matrix
    (tied, with a bias of its own)."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        check_encoder_positions(cfg)
        self.cfg = cfg
        tokens = nn.Embedding(cfg.vocab_size, cfg.d_model, padding_idx=cfg.pad_id)
        self.embed = Embeddings(cfg, tokens)
        self.encoder = Encoder(cfg)
        self.head = Linear(cfg.d_model, cfg.d_model)
        self.head_norm = nn.LayerNorm(cfg.d_model, eps=cfg.layer_norm_eps)
        self.generator = Linear(cfg.d_model, cfg.vocab_size)
        self._init_weights()
        self.generator.weight = tokens.weight
        self._name_for_trace()

    def forward(self, ids_BT: Tensor, where_BT: Tensor | None = None) -> Tensor:
        """Vocabulary logits: at every position (B, T, V), or only where `where_BT` is True
        (P, V), the masked positions in row-major order (training scores nothing else, and
        the output layer is most of a small model's cost)."""
        self.check_ids(ids_BT, "input")
        keep_BT = ids_BT != self.cfg.pad_id
        x_BTD = self.encoder(self.embed(ids_BT), keep_BT[:, None, None, :])
        h = x_BTD if where_BT is None else x_BTD[where_BT]
        h = self.head_norm(ACTIVATIONS[head_activation(self.cfg.activation)](self.head(h)))
        logits = self.generator(h)
        tap("generator.logits", logits)
        return logits
