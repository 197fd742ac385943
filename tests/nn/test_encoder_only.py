"""The encoder-only models: the classifier against the NumPy reference for each of its
switches, its invariants (padding, batch), and the masked LM's head."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from torch import nn

from aiayn import reference
from aiayn.nn.encoder_only import EncoderClassifier, EncoderMLM

TOL = dict(rtol=1e-5, atol=1e-5)  # fp32

VARIANTS = [
    {},
    dict(pooling="cls"),
    dict(pooling="cls", pooler=True, embed_norm=True, positional="learned", activation="gelu",
         scale_embeddings=False),
    dict(norm_first=True, pooler=True),
]  # fmt: skip


def padded_batch(cfg, seed: int = 0) -> torch.Tensor:
    """BOS + ids + EOS rows of different lengths, right-padded."""
    g = torch.Generator().manual_seed(seed)
    rows = []
    for n in (7, 3, 10):
        body = torch.randint(4, cfg.vocab_size, (n,), generator=g).tolist()
        rows.append([cfg.bos_id, *body, cfg.eos_id])
    width = max(map(len, rows))
    return torch.tensor([r + [cfg.pad_id] * (width - len(r)) for r in rows])


@pytest.mark.parametrize("overrides", VARIANTS, ids=lambda o: ",".join(o) or "paper")
def test_the_classifier_matches_the_numpy_reference(tiny_cfg, overrides):
    cfg = dataclasses.replace(tiny_cfg, **overrides)
    torch.manual_seed(3)
    model = EncoderClassifier(cfg, 3, ["a", "b", "c"]).eval()
    for p in model.parameters():  # biases and norms start at 0 and 1: make them count
        nn.init.normal_(p, std=0.3)
    ids = padded_batch(cfg)
    expected = reference.classifier_forward(reference.weights_of(model), cfg, ids.numpy())
    np.testing.assert_allclose(model(ids).detach().double().numpy(), expected, **TOL)


@pytest.mark.parametrize("pooling", ["mean", "cls"])
def test_a_text_gets_the_same_logits_alone_and_in_a_padded_batch(tiny_cfg, pooling):
    cfg = dataclasses.replace(tiny_cfg, pooling=pooling)
    torch.manual_seed(4)
    model = EncoderClassifier(cfg, 2).eval()
    ids = padded_batch(cfg, seed=1)
    together = model(ids)
    for b in range(ids.size(0)):
        alone = ids[b : b + 1, : int((ids[b] != cfg.pad_id).sum())]
        torch.testing.assert_close(model(alone)[0], together[b], **TOL)


def test_the_masked_lm_scores_the_chosen_positions_as_all_of_them(tiny_cfg):
    torch.manual_seed(5)
    model = EncoderMLM(tiny_cfg).eval()
    ids = padded_batch(tiny_cfg, seed=2)
    where = torch.rand(ids.shape) < 0.3
    torch.testing.assert_close(model(ids, where), model(ids)[where], **TOL)
    assert model.generator.weight is model.embed.tokens.weight


def test_the_masked_lm_reads_both_sides(tiny_cfg):
    """Unlike a decoder, a change to a later token changes an earlier position's output."""
    torch.manual_seed(6)
    model = EncoderMLM(tiny_cfg).eval()
    ids = padded_batch(tiny_cfg, seed=3)[:1, :8]
    changed = ids.clone()
    changed[0, 6] = 5 if int(ids[0, 6]) != 5 else 6
    assert not torch.allclose(model(ids)[0, 1], model(changed)[0, 1])


@pytest.mark.parametrize(
    ("labels", "message"),
    [(["a", "a"], "once"), (["a"], "once"), ([1, 2], "strings")],
)
def test_labels_must_name_each_class_once(tiny_cfg, labels, message):
    with pytest.raises(ValueError, match=message):
        EncoderClassifier(tiny_cfg, 2, labels)


@pytest.mark.parametrize("pooling", ["mean", "cls"])
def test_inference_skipping_padding_gives_the_padded_forwards_logits(tiny_cfg, pooling):
    """On a CPU without gradients the classifier runs its real positions only (nn.packed)."""
    cfg = dataclasses.replace(tiny_cfg, pooling=pooling)
    torch.manual_seed(7)
    model = EncoderClassifier(cfg, 3).eval()
    ids = padded_batch(cfg, seed=4)
    padded = model(ids)  # gradients on: the padded forward
    with torch.no_grad():
        torch.testing.assert_close(model(ids), padded.detach(), **TOL)
