"""`aiayn export onnx` of a classifier: one graph, ids (B, S) -> logits (B, C), run by
`OnnxClassifier` with `Classifier`'s interface; its logits against aiayn's on padded batches of
several lengths, `load_classifier`'s dispatch, and CTranslate2's one-line refusal."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from aiayn.classify.classifier import Classifier
from aiayn.cli.main import main
from aiayn.config import ModelConfig
from aiayn.errors import AiaynError
from aiayn.nn.encoder_only import EncoderClassifier
from aiayn.store.model_dir import save_model_dir
from aiayn.text.batches import pad_rows
from aiayn.text.tokenizer import Tokenizer

ort = pytest.importorskip("onnxruntime", reason="onnxruntime is not installed (aiayn[export])")
pytest.importorskip("onnxscript", reason="onnxscript is not installed (aiayn[export])")

from aiayn.interop.cls_engines import load_classifier  # noqa: E402
from aiayn.interop.export_cls import CLS_FILE, OnnxClassifier, export_cls_onnx  # noqa: E402

LABELS = ["negative", "neutral", "positive"]
CORPUS = [
    f"the {a} film was {b}, said {c} critics"
    for a in ("new", "old", "long", "short")
    for b in ("great", "awful", "fine", "dull", "superb")
    for c in ("two", "many", "few")
] * 5
TEXTS = [
    "",
    "great",
    "the old film was dull, said few critics",
    "ünïcödé words the tokenizer spells in bytes",
    "the film " * 40,  # longer than the model's positions: cut, its EOS kept
    "superb superb superb",
]
BERT_LIKE = dict(
    pooling="cls", pooler=True, embed_norm=True, positional="learned", activation="gelu",
    scale_embeddings=False, layer_norm_eps=1e-12,
)  # fmt: skip


@pytest.fixture(scope="module", autouse=True)
def one_thread() -> Iterator[None]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def tok() -> Tokenizer:
    return Tokenizer.train(CORPUS, 300, mask=True)


def classifier_dir(root: Path, tok: Tokenizer, **overrides: object) -> Path:
    """A classifier whose every weight is moved off its start (so a wrong op shows)."""
    cfg = ModelConfig(
        vocab_size=tok.vocab_size, d_model=32, n_heads=4, n_layers=2, d_ff=64, dropout=0.0,
        max_len=24, **tok.special_ids,
    )  # fmt: skip
    torch.manual_seed(0)
    model = EncoderClassifier(dataclasses.replace(cfg, **overrides), 3, LABELS)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.2)
    save_model_dir(model, root)
    tok.save(root)
    return root


@pytest.fixture(scope="module")
def bert_like(tok: Tokenizer, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return classifier_dir(tmp_path_factory.mktemp("cls"), tok, **BERT_LIKE)


@pytest.fixture(scope="module")
def exported(bert_like: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("x") / "onnx"
    assert main(["export", "onnx", "--model", str(bert_like), "--out", str(out)]) == 0
    return out


def padded_batches(tok: Tokenizer, clf: Classifier) -> list[torch.Tensor]:
    """Batches of several sizes and lengths, right-padded, up to the model's positions."""
    ids = clf.ids(TEXTS)
    return [
        pad_rows(ids, tok.pad_id),  # 6 rows, the longest max_len
        pad_rows(ids[:2], tok.pad_id),  # short
        pad_rows([ids[2]], tok.pad_id),  # one row, no padding
        pad_rows([ids[1], ids[5], ids[0]], tok.pad_id),
        pad_rows([ids[0]], tok.pad_id),  # BOS, EOS: 2 positions
    ]


def check_export_logits(source: Path, export: Path, tok: Tokenizer) -> None:
    torch_clf = Classifier.open(source, device="cpu", dtype="fp32")
    onnx_clf = OnnxClassifier.open(export)
    batches = padded_batches(tok, torch_clf)
    assert len({b.size(1) for b in batches}) >= 4  # lengths from 2 to max_len
    assert batches[0].size(1) == torch_clf.model.cfg.max_len
    for ids_BS in batches:
        with torch.no_grad():
            want = torch_clf.model(ids_BS)
        got = onnx_clf.run(ids_BS)
        assert want.abs().max() > 0.5  # logits large enough that a wrong op shows
        assert (got - want).abs().max() <= 1e-5, ids_BS.shape


def test_onnx_logits_equal_aiayns_on_padded_batches(
    bert_like: Path, exported: Path, tok: Tokenizer
) -> None:
    check_export_logits(bert_like, exported, tok)
    meta = json.loads((exported / "aiayn_export.json").read_text())
    assert meta["architecture"] == "EncoderClassifier" and meta["files"] == {"model": CLS_FILE}
    assert meta["extra"] == {"n_classes": 3, "labels": LABELS}
    session = ort.InferenceSession(str(exported / CLS_FILE), providers=["CPUExecutionProvider"])
    (inp,), (out,) = session.get_inputs(), session.get_outputs()
    assert (inp.name, inp.type, out.name) == ("input_ids", "tensor(int64)", "logits")
    assert isinstance(inp.shape[0], str) and isinstance(inp.shape[1], str)  # dynamic


def test_onnx_classifier_offers_classifiers_interface(bert_like: Path, exported: Path) -> None:
    ours = load_classifier(bert_like, device="cpu", dtype="fp32")
    theirs = load_classifier(exported, threads=1)
    assert type(ours) is Classifier and isinstance(theirs, OnnxClassifier)
    assert theirs.labels == ours.labels == LABELS
    assert theirs.ids(TEXTS) == ours.ids(TEXTS)
    assert (theirs.probabilities(TEXTS) - ours.probabilities(TEXTS)).abs().max() <= 1e-5
    got, want = theirs.classify(TEXTS, top_k=2), ours.classify(TEXTS, top_k=2)
    assert [[n for n, _ in row] for row in got] == [[n for n, _ in row] for row in want]
    assert theirs.classify([]) == [] and theirs.probabilities([]).shape == (0, 3)


def test_an_export_runs_on_the_cpu_in_fp32_only(exported: Path, tmp_path: Path) -> None:
    for device, dtype in (("cuda", "auto"), ("auto", "bf16")):
        with pytest.raises(AiaynError, match="runs on the CPU in fp32"):
            load_classifier(exported, device=device, dtype=dtype)
    broken = tmp_path / "broken"
    broken.mkdir()
    for name in (p.name for p in exported.iterdir() if p.name != CLS_FILE):
        (broken / name).write_bytes((exported / name).read_bytes())
    with pytest.raises(AiaynError, match=f"has no {CLS_FILE}"):
        load_classifier(broken)
    meta = json.loads((exported / "aiayn_export.json").read_text())
    (broken / "aiayn_export.json").write_text(json.dumps({**meta, "architecture": "DecoderLM"}))
    with pytest.raises(AiaynError, match="not an ONNX export of a classifier"):
        load_classifier(broken)


def test_ctranslate2_refuses_a_classifier_in_one_line(
    bert_like: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    out = tmp_path / "ct2"
    assert main(["export", "ctranslate2", "--model", str(bert_like), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "CTranslate2 cannot run" in err and "aiayn export onnx" in err, err
    assert len(err.strip().splitlines()) == 1 and not out.exists()


def test_a_paper_style_classifier_exports_too(
    tok: Tokenizer, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """Mean pooling, no pooler, sinusoidal positions, ReLU, embeddings x sqrt(d_model)."""
    source = classifier_dir(tmp_path_factory.mktemp("paper"), tok)
    export = export_cls_onnx(source, tmp_path_factory.mktemp("x") / "onnx")
    check_export_logits(source, export, tok)
