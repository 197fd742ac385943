"""Encoder-only and decoder-only models from the Transformer's own blocks (the
tutorials' conclusion), and the registry of architectures a model directory may hold.

    EncoderClassifier   the encoder stack, mean-pooled over real tokens, a linear classifier
    DecoderLM           the encoder block run causally (a GPT block), tied output layer
    MODEL_CLASSES       config.json's "architecture" -> class (aiayn.store.model_dir builds from it)
"""

from __future__ import annotations

from torch import Tensor, nn

from aiayn.config import ModelConfig
from aiayn.nn.embeddings import Embeddings
from aiayn.nn.model import Encoder, Transformer, _ModelBase
from aiayn.runtime.kernels import Linear


class EncoderClassifier(_ModelBase):
    """Encoder-only variant (for classification, as the tutorials end): the encoder stack,
    mean-pooled, then a linear classifier over `n_classes` (BERT-style sequence
    classification, without pre-training)."""

    def __init__(self, cfg: ModelConfig, n_classes: int) -> None:
        super().__init__()
        if n_classes < 2:
            raise ValueError(f"n_classes must be at least 2, got {n_classes}")
        self.cfg, self.n_classes = cfg, n_classes
        self.embed = Embeddings(cfg, nn.Embedding(cfg.vocab_size, cfg.d_model, cfg.pad_id))
        self.encoder = Encoder(cfg)
        self.classifier = nn.Linear(cfg.d_model, n_classes)
        self._init_weights()
        self._name_for_trace()

    def extra_config(self) -> dict[str, int]:
        return {"n_classes": self.n_classes}

    def forward(self, ids_BS: Tensor) -> Tensor:
        """Class logits (B, n_classes); the mean is over real (non-PAD) positions only."""
        self.check_ids(ids_BS, "input")
        keep_BS = ids_BS != self.cfg.pad_id
        x_BSD = self.encoder(self.embed(ids_BS), keep_BS[:, None, None, :])
        keep_BS1 = keep_BS[:, :, None].to(x_BSD.dtype)
        pooled_BD = (x_BSD * keep_BS1).sum(1) / keep_BS1.sum(1).clamp(min=1.0)
        return self.classifier(pooled_BD)


class DecoderLM(_ModelBase):
    """Decoder-only causal language model (GPT-style, for free generation): the encoder block
    with a causal mask (no cross-attention, since there is no source), tied output layer."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        tokens = nn.Embedding(cfg.vocab_size, cfg.d_model, padding_idx=cfg.pad_id)
        self.embed = Embeddings(cfg, tokens)
        self.decoder = Encoder(cfg)  # EncoderLayer + causal=True is exactly a GPT block
        self.generator = Linear(cfg.d_model, cfg.vocab_size, bias=cfg.logits_bias)
        self._init_weights()
        if cfg.tie_output:
            self.generator.weight = tokens.weight
        self._name_for_trace()

    def forward(self, ids_BT: Tensor) -> Tensor:
        """Next-token logits (B, T, V) at every position; position t sees tokens 0..t only."""
        self.check_ids(ids_BT, "input")
        return self.generator(self.decoder(self.embed(ids_BT), None, causal=True))


MODEL_CLASSES: dict[str, type[_ModelBase]] = {
    "Transformer": Transformer,
    "EncoderClassifier": EncoderClassifier,
    "DecoderLM": DecoderLM,
}
