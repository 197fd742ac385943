"""The classifier's live page: the JSON it draws (`classify_page_json`) holds the traced maps,
the classifier's probabilities, the chosen class's saliency and the rollout, within bounds; the
page itself (static/classify.html) is one file that asks nothing of the network but its route,
and on a real `aiayn serve` in headless Chromium (skipped where Chromium is absent) it draws
the route's numbers and asks again for another class's saliency."""

import base64
import json
import re
import time
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
from aiayn.store.model_dir import save_model_dir
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


# --- the page on a real server (`aiayn serve --model CLS`, GET /), in headless Chromium --------


@pytest.fixture(scope="module")
def served(classifier, tmp_path_factory):
    """`aiayn serve` of the module's classifier, saved: its page and POST /v1/explain/classify."""
    pytest.importorskip("fastapi", reason="the serve extra is not installed (pip install .[serve])")
    from serving import ServerProcess

    out = tmp_path_factory.mktemp("classify_page")
    save_model_dir(classifier.model, out)
    classifier.tok.save(out)
    server = ServerProcess(out)
    yield server
    code, _, err = server.stop()
    assert code == 0 and "Traceback" not in err, err[-4000:]


CELLS = ("JSON.stringify([...document.querySelectorAll('#cells rect')]"
         ".map(r => [+r.dataset.i, +r.dataset.j, +r.dataset.w]))")  # fmt: skip


def wait_js(chromium, expression: str, timeout: float = 60):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := chromium.js(expression):
            return value
        time.sleep(0.05)
    raise TimeoutError(expression)


def shown(chromium, selector: str) -> list[float]:
    """The numbers the page put on the elements `selector` finds (their data-v)."""
    return json.loads(chromium.js(
        f"JSON.stringify([...document.querySelectorAll('{selector}')].map(e => +e.dataset.v))"))


def test_the_page_in_headless_chromium(chromium, served, classifier, tmp_path):
    for domain in ("Runtime", "Log", "Page", "Network"):
        chromium.send(f"{domain}.enable")
    chromium.send("Page.navigate", url=served.url + "/")
    chromium.wait_for("Page.loadEventFired")
    text = "the best film"
    chromium.js(f"(() => {{ const e = document.getElementById('text'); e.value = "
                f"{json.dumps(text)}; e.dispatchEvent(new Event('input')); }})()")  # fmt: skip
    wait_js(chromium, "page !== null && document.querySelectorAll('#cells rect').length > 0")
    want = classify_page_json(classifier, text)
    T = len(want["pieces"])
    # the attention of layer 0, head 1: every query over every key, the route's weights
    assert chromium.js("document.getElementById('layer').options.length") == 2
    assert chromium.js("document.getElementById('head').options.length") == 5  # mean + 4
    assert chromium.js("document.querySelectorAll('#cells rect').length") == T * T
    cells = json.loads(chromium.js(CELLS))
    w = want["attention"]["w"][0][0]
    assert [v for _, _, v in cells] == pytest.approx([w[i][j] for i, j, _ in cells], abs=1e-4)
    # the classes, most probable first; the tokens shaded by saliency and rollout; the vectors
    labels = json.loads(chromium.js("JSON.stringify([...document.querySelectorAll("
                                    "'#classes > div')].map(d => d.dataset.label))"))  # fmt: skip
    assert labels == sorted(LABELS, key=lambda x: -want["probabilities"][LABELS.index(x)])
    assert shown(chromium, "#saliency span") == pytest.approx(want["saliency"]["values"], abs=1e-5)
    assert shown(chromium, "#rollout span") == pytest.approx(want["rollout"]["per_token"], abs=1e-4)
    assert shown(chromium, "#vec-pooled rect") == pytest.approx(want["pooled"], abs=1e-4)
    assert len(shown(chromium, "#vec-pooler rect")) == 32
    # another class: the page asks again, and the saliency is of that class's logit
    other = LABELS[1 - want["prediction"]["index"]]
    chromium.js(f"document.querySelector('#classes > div[data-label=\"{other}\"]').click()")
    wait_js(chromium, f"page.saliency.class === {json.dumps(other)}")
    again = classify_page_json(classifier, text, class_label=other)
    assert shown(chromium, "#saliency span") == pytest.approx(again["saliency"]["values"], abs=1e-5)
    assert chromium.js("document.getElementById('class').value") == other
    assert chromium.js("document.querySelector('#classes .target').dataset.label") == other
    # the mean of the heads
    chromium.js("(() => { const s = document.getElementById('head'); s.value = 'mean';"
                " s.dispatchEvent(new Event('change')); })()")  # fmt: skip
    mean = np.mean(want["attention"]["w"][0], axis=0)
    cells = json.loads(chromium.js(CELLS))
    assert [v for _, _, v in cells] == pytest.approx([mean[i][j] for i, j, _ in cells], abs=1e-4)
    shot = base64.b64decode(chromium.send("Page.captureScreenshot", format="png")["data"])
    (tmp_path / "classify_page.png").write_bytes(shot)
    assert shot.startswith(b"\x89PNG") and chromium.errors() == []
    urls = [e["params"]["request"]["url"] for e in chromium.events
            if e.get("method") == "Network.requestWillBeSent"]  # fmt: skip
    assert urls and all(u.startswith((served.url, "data:", "blob:")) for u in urls), urls
