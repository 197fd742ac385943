"""`train.task = "classify"` and `"mlm"`: an encoder-only classifier trained on labelled
texts, masked-LM pre-training, and fine-tuning from a pre-trained encoder (tiny, CPU)."""

from __future__ import annotations

import dataclasses
import json
import random

import pytest
import torch
import torch.nn.functional as F

from aiayn.config import Config, ModelConfig, TrainConfig, check_recipe
from aiayn.config_files import read_run_config
from aiayn.errors import ConfigError, DataError
from aiayn.nn.encoder_only import EncoderClassifier, EncoderMLM
from aiayn.store.model_dir import load_model_dir
from aiayn.text.tokenizer import Tokenizer
from aiayn.training.loop import train
from aiayn.training.loss import train_step
from aiayn.training.mlm_setup import mask_tokens

GOOD = ["great", "lovely", "superb", "fine", "charming", "brilliant"]
BAD = ["awful", "dull", "boring", "weak", "tedious", "clumsy"]
FILLER = ["the", "film", "was", "a", "story", "with", "plot", "and", "cast", "very", "quite"]


def sentences(n: int, seed: int) -> list[tuple[str, str]]:
    """(label, text): the label is which word list the one telling word comes from."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        label = rng.choice(["pos", "neg"])
        words = rng.choices(FILLER, k=rng.randint(3, 8))
        words.insert(rng.randrange(len(words) + 1), rng.choice(GOOD if label == "pos" else BAD))
        out.append((label, " ".join(words)))
    return out


def write_tsv(path, pairs) -> str:
    path.write_text("label\ttext\n" + "".join(f"{y}\t{t}\n" for y, t in pairs))
    return str(path)


def encoder_cfg(tmp_path, task: str, **train_overrides) -> Config:
    model = ModelConfig(
        vocab_size=8, d_model=32, n_heads=4, n_layers=1, d_ff=64, dropout=0.0, max_len=64
    )
    tc = TrainConfig(
        task=task,
        out_dir=str(tmp_path / task),
        vocab_size=300,
        batch_size=16,
        lr_schedule="constant",
        lr=2e-3,
        warmup_steps=0,
        max_steps=60,
        valid_every=30,
        save_every=30,
        label_smoothing=0.0,
        bleu_samples=0,
        threads=1,
        dtype="fp32",
        best_metric="accuracy" if task == "classify" else "loss",
    )
    return Config(model=model, train=dataclasses.replace(tc, **train_overrides))


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("cls")
    train_pairs = sentences(400, 1)
    (root / "unlabelled.txt").write_text("\n".join(t for _, t in sentences(600, 2)) + "\n")
    return {
        "root": root,
        "train": write_tsv(root / "train.tsv", train_pairs),
        "valid": write_tsv(root / "valid.tsv", sentences(100, 3)),
        "text": str(root / "unlabelled.txt"),
    }


@pytest.fixture(scope="module")
def mlm_dir(data, tmp_path_factory):
    cfg = encoder_cfg(tmp_path_factory.mktemp("mlm"), "mlm", text=data["text"], max_steps=40)
    return train(cfg, progress=False).out_dir


def records(out_dir) -> list[dict]:
    return [json.loads(x) for x in (out_dir / "metrics.jsonl").read_text().splitlines()]


def test_a_classifier_learns_its_labels_and_keeps_their_names(tmp_path, data):
    cfg = encoder_cfg(
        tmp_path, "classify", data=data["train"], valid_data=data["valid"], max_steps=150,
        valid_every=50, lr=3e-3,
    )  # fmt: skip
    result = train(cfg, progress=False)
    valid = [r for r in records(result.out_dir) if "valid_accuracy" in r]
    assert valid[-1]["valid_accuracy"] >= 0.9, valid
    assert result.best == max(r["valid_accuracy"] for r in valid)  # best_metric = accuracy
    model = load_model_dir(result.out_dir, expect=EncoderClassifier)
    assert model.labels == ["neg", "pos"]
    assert Tokenizer.load(result.out_dir).mask_id is not None  # it could pre-train further


def test_without_validation_data_a_stratified_share_is_held_out(tmp_path, data):
    cfg = encoder_cfg(tmp_path, "classify", data=data["train"], max_steps=2, valid_every=2)
    result = train(cfg, progress=False)
    held = read_run_config(result.out_dir)["heldout_valid"]
    assert held == {"examples": 40, "share": 0.1, "seed": 1}


def test_mlm_pretraining_reports_masked_token_loss_and_accuracy(mlm_dir):
    valid = [r for r in records(mlm_dir) if "valid_loss" in r]
    assert valid and all("valid_masked_accuracy" in r for r in valid)
    assert valid[-1]["valid_loss"] < valid[0]["valid_loss"] + 1e-9
    assert isinstance(load_model_dir(mlm_dir), EncoderMLM)


def test_fine_tuning_starts_from_the_pretrained_encoder(tmp_path, data, mlm_dir):
    """lr = 0: nothing moves, so the classifier's encoder is the MLM's, bit for bit."""
    cfg = encoder_cfg(
        tmp_path, "classify", data=data["train"], init_from=str(mlm_dir), lr=0.0, max_steps=2
    )
    clf = load_model_dir(train(cfg, progress=False).out_dir, expect=EncoderClassifier)
    mlm = load_model_dir(mlm_dir, expect=EncoderMLM)
    own, pre = clf.state_dict(), mlm.state_dict()
    shared = [n for n in own if n.startswith(("embed.", "encoder."))]
    assert shared and all(torch.equal(own[n], pre[n]) for n in shared)
    assert Tokenizer.load(tmp_path / "classify").vocab_size == Tokenizer.load(mlm_dir).vocab_size


def test_a_frozen_encoder_trains_the_head_only(tmp_path, data, mlm_dir):
    cfg = encoder_cfg(
        tmp_path, "classify", data=data["train"], init_from=str(mlm_dir), freeze_encoder=True,
        max_steps=10, valid_every=0, save_every=10,
    )  # fmt: skip
    clf = load_model_dir(train(cfg, progress=False).out_dir, expect=EncoderClassifier)
    mlm = load_model_dir(mlm_dir, expect=EncoderMLM)
    assert torch.equal(clf.encoder.layers[0].ffn.w_1.weight, mlm.encoder.layers[0].ffn.w_1.weight)
    start = EncoderClassifier(clf.cfg, 2)  # the head moved from wherever it started
    assert not torch.equal(clf.classifier.weight, start.classifier.weight)


def test_a_translators_encoder_starts_a_classifier(tmp_path, data, tiny_cfg):
    from aiayn.nn.model import Transformer
    from aiayn.store.model_dir import save_model_dir

    tok = Tokenizer.train([t for _, t in sentences(300, 4)], 300)
    cfg = dataclasses.replace(tiny_cfg, vocab_size=tok.vocab_size, **tok.special_ids)
    translator = Transformer(cfg)
    save_model_dir(translator, tmp_path / "mt")
    tok.save(tmp_path / "mt")
    run = encoder_cfg(
        tmp_path, "classify", data=data["train"], init_from=str(tmp_path / "mt"), lr=0.0,
        max_steps=2,
    )  # fmt: skip
    clf = load_model_dir(train(run, progress=False).out_dir, expect=EncoderClassifier)
    assert torch.equal(clf.embed.tokens.weight, translator.src_embed.tokens.weight)
    assert torch.equal(
        clf.encoder.layers[0].self_attn.in_proj.weight,
        translator.encoder.layers[0].self_attn.in_proj.weight,
    )


def test_a_resumed_classifier_run_ends_where_an_unbroken_one_does(tmp_path, data):
    base = dict(data=data["train"], valid_data=data["valid"], max_steps=30, save_every=10)
    whole = train(encoder_cfg(tmp_path / "a", "classify", **base), progress=False)
    train(encoder_cfg(tmp_path / "b", "classify", **{**base, "max_steps": 20}), progress=False)
    resumed = train(encoder_cfg(tmp_path / "b", "classify", **base), progress=False)
    a = load_model_dir(whole.out_dir / "checkpoints" / "step_00000030")
    b = load_model_dir(resumed.out_dir / "checkpoints" / "step_00000030")
    assert all(torch.equal(x, y) for x, y in zip(a.parameters(), b.parameters(), strict=True))


def test_masking_follows_berts_recipe():
    tok = Tokenizer.train([t for _, t in sentences(300, 5)], 300, mask=True)
    ids_BT = torch.randint(5, tok.vocab_size, (64, 200))
    ids_BT[:, 0], ids_BT[:, -1], ids_BT[:8, 150:] = tok.bos_id, tok.eos_id, tok.pad_id
    inputs, where, targets = mask_tokens(ids_BT, tok, 0.15, torch.Generator().manual_seed(0))
    special = (ids_BT == tok.pad_id) | (ids_BT == tok.bos_id) | (ids_BT == tok.eos_id)
    assert not (where & special).any() and torch.equal(inputs[~where], ids_BT[~where])
    assert torch.equal(targets, ids_BT[where])
    share = where.sum() / (~special).sum()
    assert 0.14 < share < 0.16
    masked = (inputs[where] == tok.mask_id).float().mean()
    kept = (inputs[where] == ids_BT[where]).float().mean()
    assert 0.78 < masked < 0.82 and 0.09 < kept < 0.12  # 10% kept, plus random hits on itself


def test_class_weights_weigh_each_class_loss():
    net = torch.nn.Linear(4, 3)
    x, y = torch.randn(10, 4), torch.tensor([0, 0, 0, 0, 0, 0, 0, 1, 1, 2])
    w = torch.tensor([0.5, 1.5, 3.0])

    class B:
        inputs, tgt_out_BT, n_tgt_tokens = (x,), y, 10

    from aiayn.runtime.device import Precision
    from aiayn.runtime.distributed import Dist

    fp32 = Precision(torch.device("cpu"), "fp32", False, "test")
    opt = torch.optim.SGD(net.parameters(), lr=0.0)
    totals = train_step(
        net, opt, [B()], tokens=10, lr=0.0, pad_id=-100,
        tc=TrainConfig(label_smoothing=0.0), d=Dist(), precision=fp32, weight_C=w,
    )  # fmt: skip
    expected = F.cross_entropy(net(x), y, w, reduction="sum")
    assert torch.allclose(totals[0], expected) and torch.allclose(
        totals[1], F.cross_entropy(net(x), y, reduction="sum")
    )


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"task": "classify", "text": "x.txt"}, "reads train.data, not train.text"),
        ({"task": "lm", "data": "x.tsv"}, "reads train.text, not train.data"),
        ({"task": "classify", "best_metric": "bleu"}, "chooses by 'loss' or 'accuracy'"),
        ({"task": "translate", "best_metric": "accuracy"}, "chooses by 'loss' or 'bleu'"),
        ({"task": "classify", "freeze_encoder": True}, "need pre-trained layers"),
        ({"task": "lm", "class_weights": True}, "are a classifier's"),
        ({"task": "mlm", "mask_prob": 1.0}, "mask_prob=1.0 must be in (0, 1)"),
    ],
)
def test_settings_of_the_wrong_task_are_refused_in_one_line(overrides, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        check_recipe(TrainConfig(**overrides))


def test_a_file_with_one_label_is_refused(tmp_path):
    one = write_tsv(tmp_path / "one.tsv", [("pos", "good film")] * 20)
    with pytest.raises(DataError, match="every example has the label 'pos'"):
        train(encoder_cfg(tmp_path, "classify", data=one), progress=False)


def test_a_random_replacement_is_never_a_special_token():
    tok = Tokenizer.train([t for _, t in sentences(300, 6)], 300, mask=True)
    ids_BT = torch.randint(5, tok.vocab_size, (256, 64))
    inputs, _, _ = mask_tokens(ids_BT, tok, 0.5, torch.Generator().manual_seed(1))
    special = torch.tensor([tok.pad_id, tok.bos_id, tok.eos_id])
    assert not torch.isin(inputs, special).any()
