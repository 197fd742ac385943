"""`aiayn import bert`: a BertForSequenceClassification made here with `transformers` and a
WordPiece vocabulary written here (no download), its logits, ids and probabilities against
Hugging Face's own, fine-tuning from it, and bad input as one-line errors."""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers")
pytest.importorskip("tokenizers")

from aiayn.classify.classifier import Classifier  # noqa: E402
from aiayn.cli.main import main  # noqa: E402
from aiayn.config import Config, ModelConfig, TrainConfig  # noqa: E402
from aiayn.interop.bert import import_bert  # noqa: E402
from aiayn.nn.encoder_only import EncoderClassifier  # noqa: E402
from aiayn.store.model_dir import load_model_dir  # noqa: E402
from aiayn.text.bert_tokenizer import BertTokenizer  # noqa: E402
from aiayn.text.tokenizer import Tokenizer  # noqa: E402
from aiayn.training.loop import train  # noqa: E402

SPECIAL = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
WORDS = [
    "the", "a", "cat", "dog", "sat", "on", "mat", "run", "film", "was", "great", "awful",
    "story", "plot", "and", "with", "very", "not", "good", "bad", "is", "it", "this", "that",
    "of", "to", "in", "caf", "un", "##s", "##ing", "##ed", "##ly", "##er", "##e", "##ning",
    "##n", "##é",
]  # fmt: skip
CHARS = list("abcdefghijklmnopqrstuvwxyz.,!?'-é") + [f"##{c}" for c in "abcdefghijklmnoprstuy"]
LABELS = ["negative", "neutral", "positive"]
TEXTS = [
    "The cat sat on the mat.",
    "This film was GREAT, not awful!",
    "Dogs running with cats",
    "café unknownword zzz",
    "a [MASK] story",
    "",
    "中文 and Ünïcödé",
    "very very very very very good good good bad bad bad plot plot and and with with it",
]


def write_vocab(directory: Path) -> int:
    """A tiny uncased WordPiece vocabulary, BERT's special tokens first; its size."""
    pieces = list(dict.fromkeys(SPECIAL + WORDS + CHARS))
    (directory / "vocab.txt").write_text("\n".join(pieces) + "\n", encoding="utf-8")
    return len(pieces)


def make_bert_dir(path: Path, *, seed: int = 0, tokenizer: str = "files", **config) -> Path:
    """A randomly initialised BertForSequenceClassification (every weight moved off its start,
    token types and LayerNorms included), saved with safetensors, and a tokenizer: "files"
    (vocab.txt + tokenizer_config.json), "json" (tokenizer.json only) or "none"."""
    path.mkdir(parents=True, exist_ok=True)
    vocab_size = write_vocab(path)
    hf_tok = transformers.BertTokenizerFast.from_pretrained(str(path))  # from vocab.txt: uncased
    hf_tok.save_pretrained(str(path))  # tokenizer.json, tokenizer_config.json, ...
    settings = dict(
        vocab_size=vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=64, max_position_embeddings=48, num_labels=3,
        id2label=dict(enumerate(LABELS)), label2id={n: i for i, n in enumerate(LABELS)},
        initializer_range=0.2,
    )  # fmt: skip
    torch.manual_seed(seed)
    cfg = transformers.BertConfig(**{**settings, **config})
    model = transformers.BertForSequenceClassification(cfg)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    model.save_pretrained(path, safe_serialization=True)
    if tokenizer != "json":
        (path / "tokenizer.json").unlink()
    if tokenizer == "json":
        (path / "vocab.txt").unlink()
    if tokenizer == "none":
        for name in ("vocab.txt", "tokenizer_config.json", "special_tokens_map.json"):
            (path / name).unlink(missing_ok=True)
    return path


@pytest.fixture(scope="module")
def bert_dir(tmp_path_factory) -> Path:
    return make_bert_dir(tmp_path_factory.mktemp("hf") / "tiny-bert")


@pytest.fixture(scope="module")
def imported(bert_dir: Path, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("aiayn") / "bert"
    assert main(["import", "bert", str(bert_dir), "--out", str(out)]) == 0
    return out


def hf_model(bert_dir: Path):
    return transformers.BertForSequenceClassification.from_pretrained(bert_dir).eval()


def test_logits_match_hugging_face_on_a_padded_batch(bert_dir: Path, imported: Path) -> None:
    model = load_model_dir(imported, expect=EncoderClassifier)
    cfg = model.cfg
    assert (cfg.pooling, cfg.pooler, cfg.embed_norm) == ("cls", True, True)
    assert cfg.positional == "learned"
    assert (cfg.activation, cfg.scale_embeddings, cfg.norm_first) == ("gelu", False, False)
    assert cfg.layer_norm_eps == 1e-12 and cfg.init == "normal" and cfg.max_len == 48
    assert model.labels == LABELS
    gen = torch.Generator().manual_seed(1)
    ids_BS = torch.randint(5, cfg.vocab_size, (4, 30), generator=gen)
    ids_BS[:, 0] = cfg.bos_id
    for row, n in enumerate((30, 17, 5, 2)):  # [CLS] ... [SEP], then [PAD]
        ids_BS[row, n - 1] = cfg.eos_id
        ids_BS[row, n:] = cfg.pad_id
    with torch.no_grad():
        want = hf_model(bert_dir)(input_ids=ids_BS, attention_mask=ids_BS != cfg.pad_id).logits
        fast = model(ids_BS)  # the prepacked oneDNN path (kernels.Linear)
    plain = model(ids_BS).detach()  # the plain F.linear path
    assert want.abs().max() > 0.5  # weights large enough that a wrong mapping shows
    assert (fast - want).abs().max() <= 1e-4
    assert (plain - want).abs().max() <= 1e-4


@pytest.mark.parametrize("kind", ["files", "json"])
def test_texts_go_through_both_tokenizers_alike(kind: str, tmp_path: Path) -> None:
    """vocab.txt (built as BertTokenizerFast builds it) and tokenizer.json give Hugging Face's
    ids, and `Classifier.probabilities` its probabilities, padding and all."""
    hf_dir = make_bert_dir(tmp_path / "hf", seed=2, tokenizer=kind)
    hf_tok = transformers.BertTokenizerFast.from_pretrained(str(hf_dir))
    out = tmp_path / "aiayn"
    import_bert(hf_dir, out)
    tok = Tokenizer.load(out)
    assert isinstance(tok, BertTokenizer)
    assert [tok.bos_id, tok.eos_id, tok.pad_id, tok.mask_id] == [2, 3, 0, 4]
    want_ids = hf_tok(TEXTS)["input_ids"]
    assert tok.encode_batch(TEXTS, bos=True) == want_ids
    assert any(1 in row for row in want_ids)  # [UNK]: a character the vocabulary cannot spell
    clf = Classifier.open(out, device="cpu", dtype="fp32")
    batch = hf_tok(TEXTS, padding=True, return_tensors="pt")
    with torch.no_grad():
        want = torch.softmax(hf_model(hf_dir)(**batch).logits, dim=-1)
    got = clf.probabilities(TEXTS)
    assert (got - want).abs().max() <= 1e-4
    top = clf.classify(TEXTS[:2], top_k=2)
    assert [len(t) for t in top] == [2, 2] and all(label in LABELS for label, _ in top[0])


def test_the_tokenizer_decodes_masks_and_saves_without_pickle(imported: Path) -> None:
    tok = Tokenizer.load(imported)
    assert isinstance(tok, BertTokenizer)
    ids = tok.encode("The cats ran on the mat.", bos=True)
    assert tok.pieces(ids)[:4] == ["[CLS]", "the", "cat", "##s"]
    assert tok.decode(ids) == "the cats ran on the mat."
    masked = tok.encode("the [MASK] sat")
    assert tok.mask_id in masked and len(masked) == 4  # one token, as in BertTokenizerFast
    assert json.loads((imported / "hf_tokenizer.json").read_text())["model"]["type"] == "WordPiece"


def test_without_a_tokenizer_the_weights_come_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    hf_dir = make_bert_dir(tmp_path / "hf", tokenizer="none")
    with caplog.at_level(logging.WARNING):
        done = import_bert(hf_dir, tmp_path / "out")
    assert not done.tokenizer and "has no tokenizer" in caplog.text
    model = load_model_dir(done.out, expect=EncoderClassifier)
    ids_BS = torch.tensor([[2, 10, 11, 3], [2, 12, 3, 0]])
    with torch.no_grad():
        want = hf_model(hf_dir)(input_ids=ids_BS, attention_mask=ids_BS != 0).logits
        assert (model(ids_BS) - want).abs().max() <= 1e-4


def bad_dirs(bert_dir: Path, tmp_path: Path) -> list[tuple[Path, str]]:
    """(a broken copy of bert_dir, what its one-line error says)."""
    cases = []

    def copy(name: str, edit=None, config=None) -> Path:
        d = tmp_path / name
        shutil.copytree(bert_dir, d)
        if config is not None:
            hf = json.loads((d / "config.json").read_text())
            (d / "config.json").write_text(json.dumps({**hf, **config}))
        if edit is not None:
            edit(d)
        return d

    def pickle_only(d: Path) -> None:
        (d / "model.safetensors").rename(d / "pytorch_model.bin")

    def other_cls(d: Path) -> None:
        (d / "tokenizer_config.json").write_text(json.dumps({"cls_token": "<s>"}))

    cases += [
        (copy("pickle", pickle_only), "never opens a pickle"),
        (copy("relu", config={"hidden_act": "relu"}), "hidden_act='relu'"),
        (copy("rel", config={"position_embedding_type": "relative_key"}), "relative_key"),
        (copy("gpt2", config={"model_type": "gpt2"}), "not a BERT"),
        (copy("mlm", config={"architectures": ["BertForMaskedLM"]}), "BertForSequenceClass"),
        (copy("multi", config={"problem_type": "multi_label_classification"}), "one class"),
        (copy("vocab", config={"vocab_size": 500}), "the tokenizer has"),
        (copy("labels", config={"id2label": {"0": "a", "2": "b"}}), "id2label"),
        (copy("cls_token", other_cls), "cls_token='<s>'"),
        (copy("layers", config={"num_hidden_layers": 3}), "has no tensor"),
        (tmp_path / "nowhere", "not found"),
    ]
    return cases


def test_bad_directories_are_one_line_exit_2_nothing_written(
    bert_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    for hf_dir, message in bad_dirs(bert_dir, tmp_path):
        out = tmp_path / f"out_{hf_dir.name}"
        capsys.readouterr()
        assert main(["import", "bert", str(hf_dir), "--out", str(out)]) == 2, hf_dir
        err = capsys.readouterr().err
        assert message in err and len(err.strip().splitlines()) == 1, (hf_dir, err)
        assert not out.exists()


def test_fine_tuning_starts_from_the_imported_encoder(imported: Path, tmp_path: Path) -> None:
    """train.init_from=an imported BERT, lr = 0: the classifier's encoder and pooler are
    BERT's, bit for bit, its pooling BERT's [CLS] (the config's "mean" set aside), its
    tokenizer the WordPiece; new labels, a new output layer."""
    pairs = [("pos", "a great film"), ("neg", "an awful plot"), ("pos", "very good story")] * 8
    data = tmp_path / "train.tsv"
    data.write_text("label\ttext\n" + "".join(f"{y}\t{t}\n" for y, t in pairs))
    model = ModelConfig(vocab_size=8, d_model=16, n_heads=2, n_layers=1, d_ff=32, dropout=0.0)
    assert (model.pooling, model.pooler) == ("mean", False)
    tc = TrainConfig(
        task="classify", data=str(data), init_from=str(imported), out_dir=str(tmp_path / "ft"),
        batch_size=8, lr_schedule="constant", lr=0.0, warmup_steps=0, max_steps=2,
        valid_every=2, save_every=2, label_smoothing=0.0, bleu_samples=0, threads=1,
        dtype="fp32", best_metric="accuracy",
    )  # fmt: skip
    out = train(Config(model=model, train=tc), progress=False).out_dir
    clf = load_model_dir(out, expect=EncoderClassifier)
    bert = load_model_dir(imported, expect=EncoderClassifier)
    own, pre = clf.state_dict(), bert.state_dict()
    shared = [n for n in own if n.startswith(("embed.", "encoder.", "pooler."))]
    assert "pooler.weight" in shared and all(torch.equal(own[n], pre[n]) for n in shared)
    assert (clf.cfg.pooling, clf.cfg.pooler, clf.cfg.embed_norm) == ("cls", True, True)
    assert clf.labels == ["neg", "pos"]
    assert isinstance(Tokenizer.load(out), BertTokenizer)
