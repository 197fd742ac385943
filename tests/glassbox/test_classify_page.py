"""The classifier's live page: the JSON it draws (`classify_page_json`) holds the traced maps,
the classifier's probabilities, the chosen class's saliency and the rollout, within bounds; the
page itself (static/classify.html) is one file that asks nothing of the network but its route."""

import json
import re
from importlib import resources

import numpy as np
import pytest
import torch

from aiayn.classify.classifier import Classifier
from aiayn.config import ModelConfig
from aiayn.errors import AiaynError
from aiayn.glassbox import classify_page
from aiayn.glassbox.classify_page import classify_page_json
from aiayn.glassbox.explain_cls import explain_classifier
from aiayn.nn.encoder_only import EncoderClassifier
from aiayn.nn.tracing import TraceTooLargeError
from aiayn.runtime.device import choose_precision
from aiayn.text.charset import CharTokenizer

TEXT = "a gripping film with a dull plot, the best and the worst of it"
LABELS = ["negative", "positive"]


@pytest.fixture(scope="module")
def classifier():
    tok = CharTokenizer.fit([TEXT])
    cfg = ModelConfig(vocab_size=tok.vocab_size, d_model=32, n_heads=4, n_layers=2, d_ff=64,
                      dropout=0.0, max_len=40, pooling="cls", pooler=True)  # fmt: skip
    torch.manual_seed(0)
    model = EncoderClassifier(cfg, len(LABELS), LABELS)
    return Classifier(model, tok, choose_precision("fp32", torch.device("cpu"), decoding=True))


def test_the_page_json(classifier):
    text = "the best film"
    data = json.loads(json.dumps(classify_page_json(classifier, text), allow_nan=False))
    assert data["format"] == "aiayn.classify_page/1" and data["labels"] == LABELS
    T, L, H = len(text) + 2, 2, 4
    assert data["pieces"] == ["<s>", *text, "</s>"] and data["ids"] == classifier.ids([text])[0]
    w = np.array(data["attention"]["w"])
    assert w.shape == (L, H, T, T) and data["attention"]["rows"] == data["pieces"]
    np.testing.assert_allclose(w.sum(-1), np.ones((L, H, T)), atol=1e-3)  # 4 decimals a weight
    probs = classifier.probabilities([text])[0].tolist()
    assert data["probabilities"] == pytest.approx(probs, abs=1e-6)
    assert data["prediction"]["label"] == LABELS[int(np.argmax(probs))]
    assert len(data["pooled"]) == len(data["pooler"]) == 32
    exp = explain_classifier(classifier, text)
    assert data["pooler"] == pytest.approx(exp.pooler.tolist(), abs=1e-4)
    torch.testing.assert_close(torch.tensor(w), torch.stack(exp.attention()).double(), atol=6e-5,
                               rtol=0)  # fmt: skip
    assert data["saliency"]["class"] == data["prediction"]["label"]
    assert data["saliency"]["values"] == pytest.approx(exp.saliency.values, abs=1e-6)
    assert len(data["saliency"]["normalised"]) == T
    assert sum(data["rollout"]["per_token"]) == pytest.approx(1.0, abs=1e-3)
    assert data["rollout"]["read_at"].startswith("row 0")
    assert "IS NOT" in data["notes"]["saliency"] and "IS NOT" in data["notes"]["rollout"]
    assert data["config"]["pooling"] == "cls" and data["config"]["n_classes"] == 2


def test_a_class_asked_for(classifier):
    text = "a dull plot"
    predicted = classify_page_json(classifier, text)["prediction"]["index"]
    other = LABELS[1 - predicted]
    data = classify_page_json(classifier, text, class_label=other)
    assert data["saliency"]["class"] == other and data["saliency"]["class_index"] == 1 - predicted
    assert data["prediction"]["index"] == predicted  # the decision does not change
    exp = explain_classifier(classifier, text, class_label=other)
    assert data["saliency"]["values"] == pytest.approx(exp.saliency.values, abs=1e-6)
    with pytest.raises(AiaynError, match="no class 'neutral'"):
        classify_page_json(classifier, text, class_label="neutral")


def test_sizes_are_bounded(classifier, monkeypatch):
    long = classify_page_json(classifier, TEXT * 3)  # 186 characters, 40 positions
    assert long["cut"] and len(long["ids"]) == 40
    with pytest.raises(TraceTooLargeError):
        classify_page_json(classifier, TEXT, max_numel=500)
    monkeypatch.setattr(classify_page, "MAX_PAGE_NUMBERS", 1000)  # a larger max_numel too
    with pytest.raises(TraceTooLargeError):
        classify_page_json(classifier, TEXT, max_numel=10**9)
    assert classify_page_json(classifier, "ab", max_numel=10**9)["pieces"] == ["<s>", "a", "b",
                                                                             "</s>"]  # fmt: skip


def test_the_page_is_one_file_without_the_network():
    page = (resources.files("aiayn.serve") / "static" / "classify.html").read_text("utf-8")
    assert page.startswith("<!doctype html>") and "<script>" in page
    assert not re.search(r"<script[^>]*\bsrc=|<link(?![^>]*data:)|<img|https?://(?!www\.w3)", page)
    assert page.count("fetch(") == 1  # in api(), whose one caller asks the page's route
    assert re.findall(r"""\bapi\("([^"]+)""", page) == ["/v1/explain/classify"]
