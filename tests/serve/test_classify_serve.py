"""`aiayn serve --model CLS`: a classifier behind POST /v1/classify, on a real server subprocess
(a tiny EncoderClassifier trained for a few seconds in a module fixture).

What is served equals `Classifier.probabilities` in-process (within 1e-6: the texts share
batches with other requests' there, so their padding differs), in the request's order; top_k
lists the most probable labels; every bound is a 4xx JSON error of one line; each kind of
server answers the other kinds' endpoints with a 404 naming its own; requests from concurrent
clients are all answered right, sharing forward passes; a request whose client has gone is
skipped before its pass (`Coalescer`, in-process); POST /v1/explain/classify gives the page's
trace (aiayn.glassbox.classify_page), bounded by --max-trace-numbers.
"""

import random
import threading
import time

import pytest

pytest.importorskip("fastapi", reason="the serve extra is not installed (pip install .[serve])")
import httpx
import torch
from serving import ServerProcess

from aiayn.classify.classifier import Classifier
from aiayn.config import Config, ModelConfig, TrainConfig
from aiayn.serve.batcher import Batcher
from aiayn.serve.classify_handler import (
    ON_CLASSIFIER_SERVER,
    ON_LM_SERVER_CLS,
    ON_LM_SERVER_CLS_EXPLAIN,
    ON_TRANSLATOR_SERVER_CLS,
    ON_TRANSLATOR_SERVER_CLS_EXPLAIN,
    Coalescer,
)
from aiayn.serve.jobs import QueueFullError

PROB_TOL = 1e-6
WORDS = {
    "pos": ["great", "lovely", "superb", "charming"],
    "neg": ["awful", "dull", "boring", "tedious"],
    "mid": ["average", "okay", "passable", "middling"],
}
FILLER = ["the", "film", "was", "a", "story", "with", "plot", "and", "cast", "very", "quite"]
TEXTS = [
    "the film was great",
    "a dull story with a plot",
    "okay",
    "the cast was quite charming and the plot was very lovely, a superb film " * 2,
    "tedious",
    "ünïcödé — 映画 was average",
]


def labelled(n: int, seed: int) -> list[tuple[str, str]]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        label = rng.choice(sorted(WORDS))
        words = rng.choices(FILLER, k=rng.randint(2, 7))
        words.insert(rng.randrange(len(words) + 1), rng.choice(WORDS[label]))
        out.append((label, " ".join(words)))
    return out


@pytest.fixture(scope="module")
def cls_dir(tmp_path_factory):
    """A classifier of three labels, trained for 30 steps (a few seconds on one CPU)."""
    from aiayn.training.loop import train

    root = tmp_path_factory.mktemp("cls")
    for name, (n, seed) in {"train": (300, 1), "valid": (60, 2)}.items():
        rows = "".join(f"{y}\t{t}\n" for y, t in labelled(n, seed))
        (root / f"{name}.tsv").write_text("label\ttext\n" + rows)
    model = ModelConfig(vocab_size=8, d_model=32, n_heads=2, n_layers=1, d_ff=64, dropout=0.0,
                        max_len=24)  # fmt: skip
    tc = TrainConfig(task="classify", out_dir=str(root / "model"), data=str(root / "train.tsv"),
                     valid_data=str(root / "valid.tsv"), vocab_size=300, batch_size=16,
                     lr_schedule="constant", lr=2e-3, warmup_steps=0, max_steps=30,
                     valid_every=30, save_every=30, bleu_samples=0, threads=1, dtype="fp32",
                     best_metric="accuracy")  # fmt: skip
    return train(Config(model=model, train=tc), progress=False).out_dir


@pytest.fixture(scope="module")
def server(cls_dir):
    s = ServerProcess(cls_dir, "--max-sentences", "8", "--max-chars-per-sentence", "200",
                      "--max-chars-per-request", "600", "--window-ms", "50",
                      "--max-trace-numbers", "1000")  # fmt: skip
    yield s
    code, _, err = s.stop()
    assert code == 0 and "Traceback" not in err, err[-4000:]


@pytest.fixture(scope="module")
def classifier(cls_dir):
    return Classifier.open(cls_dir, device="cpu", dtype="fp32")


def assert_served_equals(served: dict, probs_NC: torch.Tensor, labels: list[str]) -> None:
    for result, row in zip(served["results"], probs_NC.tolist(), strict=True):
        assert list(result["probabilities"]) == labels  # the model's label order
        assert list(result["probabilities"].values()) == pytest.approx(row, abs=PROB_TOL)
        assert result["label"] == labels[max(range(len(row)), key=row.__getitem__)]


# --- served == in-process -------------------------------------------------------------------------


def test_classify_equals_probabilities_in_order(client, classifier, cls_dir, one_thread):
    r = client.post("/v1/classify", json={"texts": TEXTS})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["model"] == cls_dir.name and len(body["results"]) == len(TEXTS)
    assert_served_equals(body, classifier.probabilities(TEXTS), classifier.labels)
    for i, text in enumerate(TEXTS):  # alone, and within a request: the same, in its place
        alone = client.post("/v1/classify", json={"texts": [text]}).json()["results"][0]
        assert alone["label"] == body["results"][i]["label"]
        got, want = alone["probabilities"].values(), body["results"][i]["probabilities"].values()
        assert list(got) == pytest.approx(list(want), abs=PROB_TOL)


@pytest.mark.parametrize("k", [1, 2, 3])
def test_top_k_lists_the_most_probable_labels(client, classifier, k, one_thread):
    r = client.post("/v1/classify", json={"texts": TEXTS, "top_k": k})
    assert r.status_code == 200, r.text
    want = classifier.classify(TEXTS, top_k=k)
    for result, expected in zip(r.json()["results"], want, strict=True):
        assert "probabilities" not in result
        assert [t["label"] for t in result["top"]] == [label for label, _ in expected]
        got = [t["probability"] for t in result["top"]]
        assert got == pytest.approx([p for _, p in expected], abs=PROB_TOL)
        assert got == sorted(got, reverse=True) and result["label"] == expected[0][0]


# --- what is refused ------------------------------------------------------------------------------

BAD = [
    ({}, 422, "'texts': Field required"),
    ({"texts": []}, 422, "'texts': List should have at least 1 item"),
    ({"texts": "a film"}, 422, "'texts': Input should be a valid list"),
    ({"texts": [""]}, 422, "'texts.0': no text to classify (empty or only spaces)"),
    ({"texts": ["fine", " \t\ufeff"]}, 422, "'texts.1': no text to classify (empty or only"),
    ({"texts": [3]}, 422, "'texts.0': Input should be a valid string"),
    ({"texts": ["a" * 201]}, 422, "'texts.0': String should have at most 200 characters"),
    ({"texts": ["a"] * 9}, 422, "'texts': List should have at most 8 items"),
    ({"texts": ["a" * 200] * 4}, 413,
     "800 characters; the limit is 600 (--max-chars-per-request)"),
    ({"texts": ["a"], "top_k": 0}, 422, "'top_k': Input should be greater than or equal to 1"),
    ({"texts": ["a"], "top_k": 4}, 422, "'top_k': Input should be less than or equal to 3"),
    ({"texts": ["a"], "top_k": "2"}, 422, "'top_k': Input should be a valid integer"),
    ({"texts": ["a"], "k": 2}, 422, "'k': Extra inputs are not permitted"),
]  # fmt: skip


@pytest.mark.parametrize(("body", "status", "message"), BAD)
def test_bad_values_are_4xx_json_with_one_line(client, body, status, message):
    r = client.post("/v1/classify", json=body)
    assert r.status_code == status, r.text
    assert r.headers["content-type"] == "application/json"
    assert message in r.json()["error"] and "\n" not in r.json()["error"]


def test_bodies_that_are_not_json_are_refused(client):
    r = client.post("/v1/classify", content=b'{"texts": ["a"',
                    headers={"content-type": "application/json"})  # fmt: skip
    assert r.status_code == 400 and r.json()["error"].startswith("invalid JSON")
    r = client.post("/v1/classify", content=b"texts=a",
                    headers={"content-type": "application/x-www-form-urlencoded"})  # fmt: skip
    assert r.status_code == 415 and "send the body as JSON" in r.json()["error"]
    r = client.post("/v1/classify", content=b'{"texts": ["a"], "top_k": NaN}',
                    headers={"content-type": "application/json"})  # fmt: skip
    assert r.status_code in (400, 422) and "error" in r.json()
    r = client.post("/v1/classify", content=b'{"texts": ["\\ud800"]}',
                    headers={"content-type": "application/json"})  # fmt: skip
    assert r.status_code == 422 and r.json()["error"].startswith("'texts.0': ")  # a lone surrogate


# --- one kind of model per server -----------------------------------------------------------------


def test_a_classifier_server_says_what_it_holds(client, classifier):
    assert client.get("/health").json()["kind"] == "classifier"
    info = client.get("/v1/model").json()
    assert info["kind"] == "classifier" and info["labels"] == classifier.labels
    assert info["limits"]["max_sentences"] == 8 and info["model"]["max_len"] == 24
    assert info["examples"] and all(isinstance(t, str) for t in info["examples"])  # valid.tsv's
    assert 'aiayn_model_kind{kind="classifier"} 1.0' in client.get("/metrics").text
    for method, path, body in [("POST", "/v1/translate", {"q": "a"}),
                               ("POST", "/translate", {"q": "a", "source": "en", "target": "de"}),
                               ("POST", "/v1/explain", {"q": "a"}), ("POST", "/detect", {"q": "a"}),
                               ("GET", "/languages", None), ("POST", "/v1/explain/lm", {"q": "a"}),
                               ("POST", "/v1/generate", {"prompt": ""})]:  # fmt: skip
        r = client.request(method, path, json=body)
        assert r.status_code == 404, path
        assert r.json() == {"error": ON_CLASSIFIER_SERVER}
    paths = client.get("/openapi.json").json()["paths"]
    assert {"/v1/classify", "/v1/explain/classify"} <= set(paths)
    assert not {"/v1/translate", "/v1/generate", "/v1/explain", "/v1/explain/lm"} & set(paths)
    page = client.get("/")
    if page.headers["content-type"].startswith("text/html"):  # static/classify.html exists
        assert page.status_code == 200
    else:
        assert page.status_code == 404 and "/v1/classify" in page.json()["error"]


@pytest.fixture(scope="module")
def lm_dir(tmp_path_factory):
    from aiayn.nn.variants import DecoderLM
    from aiayn.store.model_dir import save_model_dir
    from aiayn.text.charset import CharTokenizer

    out = tmp_path_factory.mktemp("lm")
    tok = CharTokenizer.fit(["a small language model's text"])
    cfg = ModelConfig(vocab_size=tok.vocab_size, d_model=16, n_heads=2, n_layers=1, d_ff=32,
                      max_len=32)  # fmt: skip
    save_model_dir(DecoderLM(cfg), out)
    tok.save(out)
    return out


@pytest.mark.parametrize(("which", "message", "explain", "kind"), [
    ("served_model_dir", ON_TRANSLATOR_SERVER_CLS, ON_TRANSLATOR_SERVER_CLS_EXPLAIN, "translator"),
    ("lm_dir", ON_LM_SERVER_CLS, ON_LM_SERVER_CLS_EXPLAIN, "language_model"),
])  # fmt: skip
def test_other_servers_refuse_classify(request, which, message, explain, kind):
    s = ServerProcess(request.getfixturevalue(which))
    try:
        with httpx.Client(base_url=s.url, timeout=60) as c:
            assert c.get("/health").json()["kind"] == kind
            assert f'aiayn_model_kind{{kind="{kind}"}} 1.0' in c.get("/metrics").text
            r = c.post("/v1/classify", json={"texts": ["a"]})
            assert r.status_code == 404 and r.json() == {"error": message}
            r = c.post("/v1/explain/classify", json={"text": "a"})
            assert r.status_code == 404 and r.json() == {"error": explain}
            paths = c.get("/openapi.json").json()["paths"]
            assert not {"/v1/classify", "/v1/explain/classify"} & set(paths)
    finally:
        code, _, err = s.stop()
    assert code == 0 and "Traceback" not in err, err[-4000:]


# --- the page's trace ----------------------------------------------------------------------------


def test_explain_classify_is_the_pages_trace(client, classifier, one_thread):
    r = client.post("/v1/explain/classify", json={"text": "the film was great"})
    assert r.status_code == 200, r.text
    d = r.json()
    assert d["format"] == "aiayn.classify_page/1" and d["labels"] == classifier.labels
    (want,) = classifier.probabilities(["the film was great"]).tolist()
    assert d["probabilities"] == pytest.approx(want, abs=2e-6)  # rounded to 6 decimals
    assert d["saliency"]["class"] == d["prediction"]["label"]
    other = next(label for label in classifier.labels if label != d["prediction"]["label"])
    r = client.post("/v1/explain/classify", json={"text": "the film was great", "class": other})
    assert r.status_code == 200 and r.json()["saliency"]["class"] == other
    assert client.get("/v1/model").json()["traceable"] is True


@pytest.mark.parametrize(("body", "status", "message"), [
    ({"text": " "}, 422, "'text': no text to classify (empty or only spaces)"),
    ({"text": "a", "class": "nope"}, 422, "'class': Input should be"),
    ({"text": "a", "class_": "pos"}, 422, "'class_': Extra inputs are not permitted"),
    ({"q": "a"}, 422, "'text': Field required"),
    # 1 layer x 2 heads x 24^2 attention weights and the head: over --max-trace-numbers 1000
    ({"text": TEXTS[3]}, 413, "(--max-trace-numbers)"),
])  # fmt: skip
def test_explain_classify_refuses_in_one_line(client, body, status, message):
    r = client.post("/v1/explain/classify", json=body)
    assert r.status_code == status, r.text
    assert message in r.json()["error"] and "\n" not in r.json()["error"]


# --- concurrent clients ---------------------------------------------------------------------------


def passes(client) -> tuple[float, float]:
    """(forward passes, requests they answered) so far, from /metrics."""
    text = client.get("/metrics").text
    values = dict(line.rsplit(" ", 1) for line in text.splitlines() if not line.startswith("#"))
    return float(values["aiayn_batch_requests_count"]), float(values["aiayn_batch_requests_sum"])


def test_concurrent_requests_are_all_answered_right_sharing_passes(
    client, server, classifier, one_thread
):
    rng = random.Random(5)
    requests = [[t for _, t in labelled(rng.randint(1, 8), 100 + i)] for i in range(16)]
    answers: list = [None] * len(requests)
    start = threading.Barrier(len(requests))
    before = passes(client)

    def send(i: int) -> None:
        with httpx.Client(base_url=server.url, timeout=60) as c:
            start.wait()
            answers[i] = c.post("/v1/classify", json={"texts": requests[i]})

    threads = [threading.Thread(target=send, args=(i,)) for i in range(len(requests))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for texts, r in zip(requests, answers, strict=True):
        assert r.status_code == 200, r.text
        assert_served_equals(r.json(), classifier.probabilities(texts), classifier.labels)
    n_passes, n_requests = (a - b for a, b in zip(passes(client), before, strict=True))
    assert n_requests == len(requests)
    assert n_passes < len(requests)  # some shared a forward pass (the 50 ms window)


# --- the coalescer, in-process --------------------------------------------------------------------


def test_waiting_requests_share_a_pass_and_one_whose_client_left_is_skipped():
    """A pass blocks the worker; three requests wait; one is cancelled (its client left):
    the next pass runs the other two's texts, in one call, and answers each its own rows."""
    batcher = Batcher(None, window_s=0.0)
    calls: list[list[str]] = []
    release = threading.Event()

    def forward(texts: list[str]) -> tuple[list[list[float]], int]:
        calls.append(list(texts))
        release.wait(10)
        return [[float(len(t)), 0.0] for t in texts], len(texts)

    stats = []
    co = Coalescer(batcher, forward, max_rows=64, max_waiting=3, timeout_s=30, on_pass=stats.append)
    try:
        first = co.submit(["a"])
        deadline = time.monotonic() + 10
        while not calls and time.monotonic() < deadline:  # the first pass is running
            time.sleep(0.01)
        jobs = [co.submit(["bb", "ccc"]), co.submit(["dddd"]), co.submit(["eeeee"])]
        jobs[1].cancel()
        assert co.waiting() == 3
        with pytest.raises(QueueFullError):  # --max-queue requests wait already
            co.submit(["f"])
        release.set()
        assert first.future.result(10) == [[1.0, 0.0]]
        assert jobs[0].future.result(10) == [[2.0, 0.0], [3.0, 0.0]]
        assert jobs[2].future.result(10) == [[5.0, 0.0]]
        assert jobs[1].future.cancelled()
        assert calls == [["a"], ["bb", "ccc", "eeeee"]]
        assert [(s.requests, s.sentences) for s in stats] == [(1, 1), (2, 3)]
    finally:
        release.set()
        batcher.close(timeout_s=10)


def test_a_pass_takes_whole_requests_up_to_its_rows():
    batcher = Batcher(None, window_s=0.0)
    calls: list[int] = []
    gate = threading.Event()

    def forward(texts: list[str]) -> tuple[list[list[float]], int]:
        gate.wait(10)
        calls.append(len(texts))
        return [[0.5, 0.5] for _ in texts], 0

    co = Coalescer(batcher, forward, max_rows=4, max_waiting=10, timeout_s=30, on_pass=lambda s: 0)
    try:
        jobs = [co.submit(["x"] * n) for n in (3, 2, 2, 5)]  # 5 > 4 rows: a pass of its own
        gate.set()
        for job, n in zip(jobs, (3, 2, 2, 5), strict=True):
            assert len(job.future.result(10)) == n
        assert calls[-1] == 5 and all(c <= 4 for c in calls[:-1]) and sum(calls) == 12
    finally:
        gate.set()
        batcher.close(timeout_s=10)


def test_requests_after_shutdown_are_refused():
    from aiayn.serve.jobs import ClosedError

    batcher = Batcher(None, window_s=0.0)
    co = Coalescer(batcher, lambda t: ([[1.0]] * len(t), 0), max_rows=8, max_waiting=8,
                   timeout_s=30, on_pass=lambda s: 0)  # fmt: skip
    batcher.close(timeout_s=10)
    with pytest.raises(ClosedError):
        co.submit(["a"])
    assert co.waiting() == 0



def test_a_classifiers_onnx_export_is_served_too(cls_dir, classifier, tmp_path, one_thread):
    pytest.importorskip("onnxruntime", reason="onnxruntime is not installed (pip install .[onnx])")
    from aiayn.interop.export_cls import export_cls_onnx

    export = export_cls_onnx(cls_dir, tmp_path / "onnx")
    s = ServerProcess(export)
    try:
        with httpx.Client(base_url=s.url, timeout=60) as c:
            r = c.post("/v1/classify", json={"texts": TEXTS})
            assert r.status_code == 200, r.text
            for result, row in zip(r.json()["results"], classifier.probabilities(TEXTS).tolist(),
                                   strict=True):  # fmt: skip
                assert list(result["probabilities"].values()) == pytest.approx(row, abs=1e-5)
            info = c.get("/v1/model").json()
            assert info["engine"].startswith("onnxruntime") and info["parameters"] is None
            assert info["labels"] == classifier.labels and info["examples"]  # its source's
            assert info["traceable"] is False
            r = c.post("/v1/explain/classify", json={"text": "okay"})
            assert r.status_code == 409 and "nothing to trace" in r.json()["error"]
    finally:
        code, _, err = s.stop()
    assert code == 0 and "Traceback" not in err, err[-4000:]
