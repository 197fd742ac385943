"""`aiayn serve`: a real uvicorn server in a subprocess, a real briefly trained model, httpx.

What is served equals what `Translator` and `aiayn explain` give for the same settings; every
bad request is a 4xx JSON `{"error": ...}`; concurrent requests are merged and each gets its
own answer; SIGTERM answers everything accepted and exits 0; the API key is checked.
"""

import dataclasses
import json
import re
import shutil
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

pytest.importorskip("fastapi", reason="the serve extra is not installed (pip install .[serve])")
import httpx
import torch
from paths import BENCH
from serving import ServerProcess

from aiayn.cli.main import main
from aiayn.errors import CheckpointError
from aiayn.nn.model import Transformer
from aiayn.serve.batcher import Batcher
from aiayn.serve.jobs import ExpiredError, Job
from aiayn.translate.translator import Translator

SENTENCES = ["forty-two", "seven hundred and one", "three thousand and nine", "eleven",
             "one hundred and twenty-three", "ninety", "five thousand, six hundred",
             "two"]  # fmt: skip
SCORE_TOL = 1e-4  # log-probabilities summed over a sentence, another process: fp32 rounding


@pytest.fixture(scope="module")
def server(served_model_dir):
    s = ServerProcess(served_model_dir, "--max-sentences", "16", "--max-chars-per-sentence",
                      "200", "--max-chars-per-request", "1000", "--max-beam", "6",
                      "--max-rows", "64", "--window-ms", "20")  # fmt: skip
    yield s
    s.stop()


@pytest.fixture(scope="module")
def translator(served_model_dir):
    return Translator.load(served_model_dir, device="cpu")


def hyps_of(translator, lines, **settings):
    return translator.translate_hyps(lines, translator.settings(**settings))


def assert_same(served, expected):
    """One served translation (/v1 shape) equals the Translator's n-best for that line."""
    assert [h["text"] for h in served["hypotheses"]] == [t.text for t in expected]
    assert [h["tokens"] for h in served["hypotheses"]] == [t.hyp.tokens for t in expected]
    for h, t in zip(served["hypotheses"], expected, strict=True):
        assert h["log_prob"] == pytest.approx(t.hyp.log_prob, abs=SCORE_TOL)
        assert h["score"] == pytest.approx(t.hyp.score, abs=SCORE_TOL)
        assert h["eos"] == t.hyp.eos


def assert_tree_close(got, want, where=""):
    """Equal JSON trees, floats within SCORE_TOL (another process computed them)."""
    if isinstance(want, dict):
        assert isinstance(got, dict) and got.keys() == want.keys(), where
        for k in want:
            assert_tree_close(got[k], want[k], f"{where}.{k}")
    elif isinstance(want, list):
        assert isinstance(got, list) and len(got) == len(want), where
        for i, (g, w) in enumerate(zip(got, want, strict=True)):
            assert_tree_close(g, w, f"{where}[{i}]")
    elif isinstance(want, float):
        assert got == pytest.approx(want, abs=SCORE_TOL), where
    else:
        assert got == want, where


# --- the endpoints --------------------------------------------------------------------------------


def test_health_model_and_languages(client, translator):
    assert client.get("/health").json()["status"] == "ok"
    info = client.get("/v1/model").json()
    assert info["languages"] == {"source": "en", "target": "de"}  # from train.en / train.de
    assert info["model"]["n_layers"] == translator.model.cfg.n_layers
    assert info["parameters"] == sum(p.numel() for p in translator.model.parameters())
    assert info["limits"]["max_sentences"] == 16 and info["examples"]  # validation sources
    assert client.get("/languages").json() == [
        {"code": "en", "name": "English", "targets": ["de"]},
        {"code": "de", "name": "German", "targets": []},
    ]
    assert client.post("/detect", json={"q": "seven"}).json()[0]["language"] == "en"


def test_libretranslate_shape(client, translator, one_thread):
    r = client.post("/translate", json={"q": "forty-two", "source": "en", "target": "de"})
    assert r.status_code == 200 and r.json() == {"translatedText": translator.translate(
        ["forty-two"])[0]}  # fmt: skip
    r = client.post("/translate", json={"q": SENTENCES[:3], "source": "en", "target": "de",
                                        "format": "text"})  # fmt: skip
    assert r.json()["translatedText"] == translator.translate(SENTENCES[:3])
    # alternatives: the n-best of a beam at least that wide, best first
    r = client.post("/translate", json={"q": "seven hundred and one", "source": "en",
                                        "target": "de", "alternatives": 2})  # fmt: skip
    beam = max(translator.cfg.beam_size, 3)
    nbest = [t.text for t in hyps_of(translator, ["seven hundred and one"], beam=beam,
                                     nbest=3)[0]]  # fmt: skip
    assert r.json() == {"translatedText": nbest[0], "alternatives": nbest[1:]}
    r = client.post("/translate", json={"q": ["two", "eleven"], "source": "auto", "target": "de",
                                        "alternatives": 1})  # fmt: skip
    body = r.json()
    assert len(body["alternatives"]) == 2 and all(len(a) == 1 for a in body["alternatives"])
    assert body["detectedLanguage"] == [{"confidence": 100.0, "language": "en"}] * 2
    # text with line breaks: each line translated, the breaks kept
    r = client.post("/translate", json={"q": "two\neleven", "source": "en", "target": "de"})
    assert r.json()["translatedText"] == "\n".join(translator.translate(["two", "eleven"]))
    # a form-encoded request (some LibreTranslate clients send forms)
    r = client.post("/translate", data={"q": "ninety", "source": "en", "target": "de"})
    assert r.json()["translatedText"] == translator.translate(["ninety"])[0]


def test_language_pair_is_checked(client):
    r = client.post("/translate", json={"q": "two", "source": "fr", "target": "de"})
    assert r.status_code == 400
    assert "en -> de (English to German)" in r.json()["error"] and "fr -> de" in r.json()["error"]
    r = client.post("/translate", json={"q": "two", "source": "en", "target": "es"})
    assert r.status_code == 400


@pytest.mark.parametrize(
    "settings",
    [{}, {"beam": 3, "nbest": 2}, {"beam": 4, "alpha": 1.0, "min_len": 2},
     {"beam": 4, "nbest": 4, "alpha": 1.0, "length_penalty": "power"},
     {"sample": True, "seed": 5, "top_k": 10, "nbest": 2}, {"sample": True, "top_p": 0.8}],
)  # fmt: skip
def test_v1_translate_equals_translator(client, translator, settings, one_thread):
    r = client.post("/v1/translate", json={"q": SENTENCES[:5], **settings})
    assert r.status_code == 200, r.text
    names = {"beam": "beam_size"}
    cfg = translator.settings(**{names.get(k, k): v for k, v in settings.items()})
    expected = translator.translate_hyps(SENTENCES[:5], cfg)
    body = r.json()
    assert body["settings"]["beam_size"] == cfg.beam_size and body["settings"]["seed"] == cfg.seed
    for served, exp in zip(body["translations"], expected, strict=True):
        assert served["text"] == exp[0].text
        assert_same(served, exp)


def test_v1_explain_equals_aiayn_explain(client, served_model_dir, capsys, one_thread):
    sentence = "seven hundred and one"
    assert main(["explain", sentence, "--model", str(served_model_dir), "--format", "json",
                 "--beam", "2", "--device", "cpu"]) == 0  # fmt: skip
    cli = json.loads(capsys.readouterr().out)
    served = client.post("/v1/explain", json={"q": sentence, "beam": 2}).json()
    assert served.keys() == cli.keys() and served["format"] == "aiayn.explain/2"
    for key in cli:
        if key != "tensors":
            assert_tree_close(served[key], cli[key], key)
    assert [t["name"] for t in served["tensors"]] == [t["name"] for t in cli["tensors"]]
    for s, c in zip(served["tensors"], cli["tensors"], strict=True):
        assert (s["rows"], s["cols"], s["shape"]) == (c["rows"], c["cols"], c["shape"])
        got = torch.tensor(s["data"], dtype=torch.float64).nan_to_num(-1e30)  # null = -inf
        want = torch.tensor(c["data"], dtype=torch.float64).nan_to_num(-1e30)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    weights = client.post("/v1/explain", json={"q": sentence, "tensors": "attention",
                                               "layers": [1], "heads": [2]}).json()  # fmt: skip
    names = [t["name"] for t in weights["tensors"]]
    assert names and all(n.endswith(".1.self_attn.head2.weights") or
                         n.endswith(".1.cross_attn.head2.weights") for n in names)  # fmt: skip


def test_metrics_count_requests_sentences_and_batches(client):
    client.post("/v1/translate", json={"q": ["two", "eleven", "ninety"]})
    text = client.get("/metrics").text
    assert re.search(r'aiayn_requests_total\{endpoint="/v1/translate",status="200"\} \d', text)
    assert float(re.search(r"^aiayn_sentences_total (\S+)", text, re.M).group(1)) >= 3
    assert float(re.search(r"^aiayn_source_tokens_total (\S+)", text, re.M).group(1)) > 0
    assert "aiayn_request_seconds_bucket" in text and "aiayn_batch_sentences_bucket" in text


def test_metrics_show_the_garbage_collector_s_pauses(client):
    def sample(text, name):
        return float(re.search(rf"^{re.escape(name)} (\S+)$", text, re.M).group(1))

    client.post("/v1/translate", json={"q": ["two", "eleven", "ninety"]})
    text = client.get("/metrics").text
    for g in range(3):
        count = sample(text, f'aiayn_gc_pause_seconds_count{{generation="{g}"}}')
        buckets = [
            float(v)
            for v in re.findall(
                rf'^aiayn_gc_pause_seconds_bucket\{{generation="{g}",le="[^"]+"\}} (\S+)$',
                text,
                re.M,
            )
        ]
        assert len(buckets) == 11 and buckets == sorted(buckets) and buckets[-1] == count
    assert sample(text, 'aiayn_gc_pause_seconds_count{generation="0"}') > 0  # timed as they ran
    assert sample(text, 'aiayn_gc_pause_max_seconds{generation="0"}') > 0
    # `aiayn serve` froze what it had loaded (torch, the model, FastAPI) out of full collections
    assert sample(text, "aiayn_gc_frozen_objects") > 50_000


# --- bad requests: always 4xx JSON with one "error" -----------------------------------------------

LONG = "seven " * 40  # 240 characters: over the server's 200 per sentence
BAD = [
    ("post", "/translate", b"{", {}, 400, "invalid JSON"),
    ("post", "/translate", b'["q"]', {}, 400, "must be a JSON object"),
    ("post", "/translate", b'{"q": "\xff\xfe"}', {}, 400, "not valid UTF-8"),
    ("post", "/translate", b"", {}, 400, "invalid JSON"),
    ("post", "/translate", b"[" * 60_000, {}, 400, "nested too deeply"),
    ("post", "/v1/translate", b"[" * 60_000, {}, 400, "error parsing the body"),
    ("post", "/translate", {"source": "en", "target": "de"}, None, 422, "'q': Field required"),
    ("post", "/translate", {"q": 5}, None, 422, "string or a list of strings"),
    ("post", "/translate", {"q": ["a", 3]}, None, 422, "'q.1': Input should be a valid string"),
    ("post", "/translate", {"q": " "}, None, 422, "'q': no text to translate"),
    ("post", "/v1/explain", {"q": " \ufeff"}, None, 422, "'q': no text to translate"),
    ("post", "/translate", {"q": []}, None, 422, "'q': List should have at least 1 item"),
    ("post", "/translate", {"q": "a", "alternatives": 9}, None, 422, "less than or equal to 5"),
    ("post", "/translate", {"q": "a", "alternatives": "two"}, None, 422, "a valid integer"),
    ("post", "/translate", {"q": "a", "format": "html"}, None, 422, "'format': Input should be"),
    ("post", "/translate", {"q": "a", "format": "xml"}, None, 422, "'format'"),
    ("post", "/translate", {"q": "a", "extra": 1}, None, 422, "'extra': Extra inputs"),
    ("post", "/translate", {"q": "a", "alternatives": 1.5}, None, 422, "a valid integer"),
    ("post", "/translate", {"q": ["two"] * 17}, None, 413, "17 sentences; the limit is 16"),
    ("post", "/translate", {"q": LONG}, None, 413, "240 characters; the limit is 200"),
    ("post", "/translate", {"q": ["seven " * 30] * 6}, None, 413, "the limit is 1000"),
    ("post", "/translate", b'{"q": "' + b"a" * 20000 + b'"}', {}, 422, "at most 1000 characters"),
    ("post", "/translate", b'{"q": "\\ud800"}', {}, 422, "'q': Input should be a valid string"),
    ("post", "/v1/translate", b'{"q": ["\\ud800"]}', {}, 422, "'q"),
    ("post", "/v1/explain", b'{"q": "a\\udfff"}', {}, 422, "'q'"),
    ("post", "/v1/translate", {"q": "a", "beem": 2}, None, 422, "'beem': Extra inputs"),
    ("post", "/v1/translate", {"q": "a", "beam": 0}, None, 422, "'beam': Input should be greater"),
    ("post", "/v1/translate", {"q": "a", "beam": 7}, None, 422, "less than or equal to 6 (got 7)"),
    ("post", "/v1/translate", {"q": "a", "beam": True}, None, 422, "'beam': Input should be a"),
    ("post", "/v1/translate", {"q": "a", "temperature": -1}, None, 422, "greater than 0"),
    ("post", "/v1/translate", {"q": "a", "top_p": "x"}, None, 422, "'top_p': Input should be a"),
    ("post", "/v1/translate", {"q": "a", "sample": "yes"}, None, 422, "'sample': Input should"),
    ("post", "/v1/translate", {"q": "a", "beam": "2"}, None, 422, "'beam': Input should be"),
    ("post", "/v1/translate", b'{"q": "a", "alpha": Infinity}', {}, 422, "finite number"),
    ("post", "/v1/translate", b'{"q": "a", "temperature": NaN}', {}, 422, "finite number"),
    ("post", "/v1/translate", {"q": "a", "alpha": "inf"}, None, 422, "'alpha': Input should be"),
    ("post", "/v1/translate", {"q": "a", "max_len_b": 10**6}, None, 422, "'max_len_b'"),
    ("post", "/v1/translate", {"q": "a", "min_len": 10**7}, None, 422, "'min_len'"),
    ("post", "/v1/translate", {"q": "a", "max_tokens": 10**6}, None, 422, "'max_tokens'"),
    ("post", "/v1/translate", {"q": ["two"] * 16, "beam": 6}, None, 413, "96 search rows; the li"),
    ("post", "/v1/explain", {"beam": 2}, None, 422, "'q': Field required"),
    ("post", "/v1/explain", {"q": "a", "layers": [9]}, None, 422, "'layers.0': Input should be"),
    ("post", "/v1/explain", {"q": "a", "layers": {"a": 1}}, None, 422, "'layers': Input should"),
    ("post", "/v1/explain", {"q": "a", "heads": "2"}, None, 422, "'heads': Input should be a"),
    ("post", "/v1/explain", {"q": "a", "steps": [0, 10**9]}, None, 422, "'steps.1': Input shou"),
    ("post", "/v1/explain", {"q": "a", "steps": "0-2000000000"}, None, 422, "'steps': Input"),
    ("post", "/v1/explain", {"q": "a", "tensors": "some"}, None, 422, "'tensors': Input should"),
    ("post", "/v1/explain", {"q": "a", "top_k": 0}, None, 422, "'top_k'"),
    ("post", "/v1/explain", {"q": "a", "max_len": 0}, None, 422, "'max_len': Input should"),
    ("post", "/v1/explain", {"q": "a", "beam": 9}, None, 422, "'beam': Input should be less"),
    ("get", "/translate", None, None, 405, "Method Not Allowed"),
    ("get", "/no/such/page", None, None, 404, "Not Found"),
]


@pytest.mark.parametrize(("method", "path", "body", "headers", "status", "message"), BAD)
def test_bad_requests_are_4xx_json(client, method, path, body, headers, status, message):
    if method == "get":
        r = client.get(path)
    elif isinstance(body, bytes):
        r = client.post(path, content=body, headers={"Content-Type": "application/json"})
    else:
        r = client.post(path, json=body)
    assert r.status_code == status, r.text
    assert r.headers["content-type"] == "application/json"
    assert list(r.json()) == ["error"] and message in r.json()["error"], r.json()


def test_huge_body_is_refused_by_its_length(client):
    r = client.post("/translate", content=b"x" * 200_000,
                    headers={"Content-Type": "application/json"})  # fmt: skip
    assert r.status_code == 413 and "the limit is" in r.json()["error"]


# --- concurrency: merged batches, each request its own answer, in order ---------------------------


def test_concurrent_requests_each_get_their_own_answer(server, translator, one_thread):
    requests = [SENTENCES[i % 8 : i % 8 + 1 + i % 4] for i in range(40)]
    with httpx.Client(base_url=server.url, timeout=120) as c:
        before = c.get("/metrics").text

        def send(lines):
            return c.post("/v1/translate", json={"q": lines}).json()

        with ThreadPoolExecutor(16) as pool:
            answers = list(pool.map(send, requests))
        after = c.get("/metrics").text
    for lines, answer in zip(requests, answers, strict=True):
        expected = translator.translate_hyps(lines, translator.cfg)
        assert [t["text"] for t in answer["translations"]] == [e[0].text for e in expected]
        for served, exp in zip(answer["translations"], expected, strict=True):
            assert_same(served, exp)

    def merged(text):  # model batches that held more than one request
        count = float(re.search(r"^aiayn_batch_requests_count (\S+)", text, re.M).group(1))
        single = float(re.search(r'^aiayn_batch_requests_bucket\{le="1.0"\} (\S+)', text,
                                 re.M).group(1))  # fmt: skip
        return count - single, count

    def shared(text):  # requests summed over model batches (continuous: over steps that ended some)
        return float(re.search(r"^aiayn_batch_requests_sum (\S+)", text, re.M).group(1))

    (m0, n0), (m1, n1) = merged(before), merged(after)
    assert m1 - m0 >= 1  # concurrency made at least one batch of several requests
    assert (shared(after) - shared(before)) / (n1 - n0) > 1.5  # and they shared it, on average


# --- the model worker on its own: dropped jobs are not decoded ------------------------------------


@pytest.mark.parametrize("continuous", [False, True])
def test_batcher_merges_equal_settings_and_drops_gone_or_late_jobs(translator, continuous):
    batches = []
    b = Batcher(translator, window_s=0.3, on_batch=batches.append, continuous=continuous)
    try:
        cfg = translator.cfg
        a = b.translate(["two"], cfg, timeout_s=30)
        gone = b.translate(["eleven"], cfg, timeout_s=30)
        late = b.submit(Job(["ninety"], cfg, deadline=time.monotonic() - 1))
        c = b.translate(["seven", "forty-two"], cfg, timeout_s=30)
        sampled = b.translate(["two"], translator.settings(sample=True), timeout_s=30)
        gone.cancel()  # within the window: before the worker decodes
        got_c = [r[0].text for r in c.future.result(60)]
        assert got_c == translator.translate(["seven", "forty-two"])
        assert a.future.result(60)[0][0].text == translator.translate(["two"])[0]
        assert sampled.future.result(60)[0][0].text == translator.translate(["two"], sample=True)[0]
        assert gone.future.cancelled()
        with pytest.raises(ExpiredError):
            late.future.result(60)
        if not continuous:  # a and c shared one turn; the sampled job ran alone
            assert [(s.requests, s.sentences) for s in batches] == [(2, 3), (1, 1)]
        else:  # a and c in one running search, reported as their sentences end
            assert sum(s.sentences for s in batches) == 4
        # the dropped ones never ran
    finally:
        b.close()
    with pytest.raises(Exception, match="shutting down"):
        b.translate(["two"], translator.cfg, timeout_s=30)


# --- a server with no recorded languages: accepts any pair; drops late and gone requests ----------


def test_no_languages_timeout_and_disconnect(served_model_dir, tmp_path):
    bare = tmp_path / "bare"
    shutil.copytree(served_model_dir, bare)
    (bare / "run_config.json").unlink()  # no training files, so no languages
    # The 300 ms window holds every job longer than the 0.2 s timeout: each one times out.
    # (Turns: under continuous batching a request does not wait for the window.)
    s = ServerProcess(bare, "--window-ms", "300", "--timeout", "0.2", "--batching", "turns")
    try:
        with httpx.Client(base_url=s.url, timeout=30) as c:
            assert c.get("/v1/model").json()["languages"] is None
            assert c.get("/languages").json() == []
            r = c.post("/translate", json={"q": "two", "source": "xx", "target": "yy"})
            assert r.status_code == 503 and "timed out after 0.2 s" in r.json()["error"]
            time.sleep(0.4)  # the worker's window for that request is over: a new one starts
            with pytest.raises(httpx.TimeoutException):  # the client gives up and goes away
                c.post("/v1/translate", json={"q": "eleven"}, timeout=0.1)
            time.sleep(0.6)
            metrics = c.get("/metrics").text
        assert 'aiayn_dropped_requests_total{reason="disconnected"} 1.0' in metrics
        assert 'aiayn_dropped_requests_total{reason="timeout"}' in metrics
        assert "aiayn_sentences_total 0.0" in metrics, [  # nothing was decoded for anybody
            line for line in metrics.splitlines() if line.startswith("aiayn_")
        ]
    finally:
        code, _, err = s.stop()
    assert code == 0, err


# --- SIGTERM: stop accepting, answer everything accepted, exit 0 ----------------------------------


def test_sigterm_answers_every_accepted_request_and_exits_0(served_model_dir, translator,
                                                            one_thread):  # fmt: skip
    s = ServerProcess(served_model_dir, "--window-ms", "50")
    requests = [SENTENCES[i % 8 :] for i in range(12)]  # 1-8 sentences each, beam 4: slow enough
    answers: list = [None] * len(requests)

    def send(i):
        with httpx.Client(base_url=s.url, timeout=120) as c:
            answers[i] = c.post("/v1/translate", json={"q": requests[i], "beam": 4})

    threads = [threading.Thread(target=send, args=(i,)) for i in range(len(requests))]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 60
    while httpx.get(s.url + "/health").json()["in_flight"] < len(requests):  # all of them in
        assert time.monotonic() < deadline
        time.sleep(0.05)
    code, out, err = s.stop()
    for t in threads:
        t.join(60)
    assert code == 0, err
    for lines, r in zip(requests, answers, strict=True):
        assert r is not None and r.status_code == 200, r
        expected = translator.translate(lines, beam=4)
        assert [t["text"] for t in r.json()["translations"]] == expected
    n = re.search(r"answered (\d+) of (\d+) accepted requests", out)
    assert n and n.group(1) == n.group(2) and int(n.group(1)) >= len(requests), out
    with pytest.raises(httpx.ConnectError):  # and nothing listens any more
        httpx.get(s.url + "/health", timeout=5)


# --- the API key ----------------------------------------------------------------------------------


def test_api_key_and_language_flags(served_model_dir):
    s = ServerProcess(served_model_dir, "--source-lang", "fr", "--target-lang", "it",
                      env={"AIAYN_API_KEY": "s3cret"})  # fmt: skip
    try:
        with httpx.Client(base_url=s.url, timeout=60) as c:
            assert c.get("/health").status_code == 200  # no key needed
            r = c.get("/v1/model")
            assert r.status_code == 401 and "API key is required" in r.json()["error"]
            assert r.headers["www-authenticate"] == "Bearer"
            assert c.get("/v1/model", headers={"Authorization": "Bearer nope"}).status_code == 403
            ok = c.get("/v1/model", headers={"Authorization": "Bearer s3cret"}).json()
            assert ok["languages"] == {"source": "fr", "target": "it"}  # the flags win
            assert c.get("/metrics").status_code == 401
            assert c.get("/", params={"api_key": "s3cret"}).status_code == 200
            body = {"q": "two", "source": "fr", "target": "it"}
            assert c.post("/translate", json=body).status_code == 401
            assert c.post("/translate", content=b"{").status_code == 401  # the key comes first
            assert c.post("/translate", json={**body, "api_key": "s3cret"}).status_code == 200
            r = c.post("/translate", json={**body, "source": "en", "api_key": "s3cret"})
            assert r.status_code == 400 and "fr -> it" in r.json()["error"]
    finally:
        s.stop()


def test_non_loopback_needs_a_key_and_bad_flags_are_one_line(served_model_dir, capsys,
                                                             monkeypatch, tmp_path):  # fmt: skip
    monkeypatch.delenv("AIAYN_API_KEY", raising=False)
    (tmp_path / "blank.txt").write_text("\n  \n", encoding="utf-8")
    (tmp_path / "latin1.txt").write_bytes("caf\xe9\n".encode("latin-1"))
    for argv, message in [
        (["--host", "0.0.0.0"], "--host 0.0.0.0 is reachable from other machines"),
        (["--max-beam", "0"], "--max-beam must be positive"),
        # each of these served before: NaN timeouts (every request 503), an endless window, a
        # count past int64 (a traceback). The host makes a regression fail, not serve forever.
        *[
            ([flag, value, "--host", "0.0.0.0"], message)
            for flag, value, message in [
                ("--timeout", "nan", "--timeout must be positive (at most 2,147,483,647)"),
                ("--window-ms", "inf", "--window-ms must be in 0..10,000, got inf"),
                ("--port", "65536", "--port must be in 0..65535, got 65536"),
                ("--max-output-tokens", str(10**20), "--max-output-tokens must be positive"),
            ]
        ],
        (["--source-lang", "en"], "give both --source-lang and --target-lang"),
        # a given examples file is read, not quietly replaced by the validation sentences
        (["--examples", str(tmp_path / "none.txt")], "none.txt: No such file or directory"),
        (["--examples", str(tmp_path / "blank.txt")], "blank.txt holds no sentence"),
        (["--examples", str(tmp_path / "latin1.txt")], "line 1 is not valid UTF-8"),
        (["--examples", str(tmp_path)], "Is a directory"),
    ]:
        assert main(["serve", "--model", str(served_model_dir), *argv]) == 2
        err = capsys.readouterr().err.strip()
        assert err.count("\n") == 0 and message in err, err


def test_a_beam_limit_wider_than_the_vocabulary_is_refused(served_model_dir, translator):
    """A request for more beams than the model has tokens would crash the search: the server
    refuses to start with such a `--max-beam` (in-process: a regression fails, never serves)."""
    from aiayn.errors import AiaynError
    from aiayn.serve.app import create_app
    from aiayn.serve.handlers import ServeOptions
    from aiayn.serve.requests import Limits

    V = translator.model.cfg.vocab_size
    with pytest.raises(AiaynError, match=f"--max-beam {V + 1} exceeds the model's vocabulary"):
        create_app(translator, served_model_dir, ServeOptions(limits=Limits(max_beam=V + 1)))
    app = create_app(translator, served_model_dir, ServeOptions(limits=Limits(max_beam=V)))
    app.state.server.batcher.close()


def test_a_taken_port_is_one_line_and_exit_2_before_the_model_loads(tmp_path):
    """A port in use: one line, status 2, before the model is loaded (so before its worker
    runs: the process once left while the worker calibrated, and the C++ runtime aborted it,
    status 134). A model that is not there proves the order: the port is said, not the model."""
    import socket
    import subprocess
    import sys

    from serving import child_env

    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    port = taken.getsockname()[1]
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "aiayn", "serve", "--model", str(tmp_path / "not-loaded"),
             "--port", str(port)], capture_output=True, text=True, timeout=120, env=child_env(),
        )  # fmt: skip
        err = proc.stderr.strip()
        assert proc.returncode == 2 and err.count("\n") == 0, (proc.returncode, err)
        assert err == f"aiayn serve: error: cannot listen on 127.0.0.1:{port}: Address " \
            "already in use"  # fmt: skip
    finally:
        taken.close()


def test_languages_come_from_the_training_files_suffixes(tmp_path):
    from aiayn.serve.requests import model_languages

    def langs(src, tgt):
        (tmp_path / "run_config.json").write_text(json.dumps({"train": {"src": src, "tgt": tgt}}))
        return model_languages(tmp_path)

    assert langs("data/train.en", "data/train.de") == ("en", "de")
    assert langs("/x/corpus.pt-BR", "/x/corpus.es") == ("pt-BR", "es")
    assert langs("pairs.tsv", "") is None  # one TSV file: no codes
    assert langs("train.txt", "valid.txt") is None
    assert langs("a.en", "b.en") is None  # the same suffix on both sides is not a pair
    (tmp_path / "run_config.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="run_config.json is unreadable"):
        model_languages(tmp_path)  # as Translator.load says: the server does not start


def test_the_listening_socket_sends_small_writes_at_once():
    """TCP_NODELAY on the listening socket (accepted ones inherit it): without it every
    keep-alive response written in two parts waited ~40 ms for the client's delayed ACK."""
    import socket

    from aiayn.serve.launch import listen

    sock = listen("127.0.0.1", 0)
    try:
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0
        client = socket.create_connection(sock.getsockname())
        accepted, _ = sock.accept()
        assert accepted.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0
        client.close()
        accepted.close()
    finally:
        sock.close()


def test_running_searches_share_one_bound_on_rows_in_flight(translator):
    """Requests with many distinct greedy settings get one search each, but the rows (and the
    cache memory) in flight stay within `max_rows` over all of them."""
    from aiayn.serve.streams import Streams

    stats = []
    streams = Streams(translator, 4, stats.append)
    jobs = []
    for alpha in (0.6, 0.7, 0.8):
        cfg = translator.settings(alpha=alpha)
        job = Job(["two", "seven", "forty-two"], cfg, deadline=time.monotonic() + 60)
        streams.take(job, cfg)
        jobs.append((job, cfg))
    most = 0
    while streams:
        streams.step()
        most = max(most, sum(s.run.live for s in streams._streams.values()))
    assert 0 < most <= 4
    for job, cfg in jobs:
        expected = translator.translate_hyps(job.lines, cfg)
        assert [r[0].text for r in job.future.result(0)] == [e[0].text for e in expected]


def test_beam_requests_join_a_running_beam_search_within_the_row_bound(translator):
    """Beam jobs run continuously too: sentences of several requests share one running beam
    search per settings, each with its own N beams (N rows against `max_rows`; a beam wider
    than the bound runs alone), admitted as rows free up, and every request gets the n-best
    lists `aiayn translate` gives for the same lines."""
    from aiayn.search.beam import BeamSearch
    from aiayn.serve.streams import Streams

    streams = Streams(translator, 7, lambda stats: None)
    jobs = []
    for cfg, lines in [
        (translator.settings(beam=3, nbest=2), ["two", "seven", "forty-two", "nine"]),
        (translator.settings(beam=3, nbest=2), ["seven hundred and one", "ten"]),
        (translator.settings(beam=2, alpha=1.0), ["eleven", "six"]),
        (translator.settings(beam=9), ["ninety"]),  # wider than the bound: runs alone
    ]:
        job = Job(lines, cfg, deadline=time.monotonic() + 60)
        streams.take(job, cfg)
        jobs.append((job, cfg))
    kinds, most, steps = set(), 0, 0
    while streams:
        streams.step()
        steps += 1
        runs = [s.run for s in streams._streams.values()]
        kinds |= {type(r) for r in runs}
        live = sum(r.live for r in runs)
        most = max(most, live if live <= 7 else 0)
        assert live <= 7 or [r.live for r in runs if r.live] == [9]  # the wide one alone
    assert kinds == {BeamSearch} and most > 3  # several sentences shared a search
    for job, cfg in jobs:
        expected = translator.translate_hyps(job.lines, cfg)
        got = job.future.result(0)
        assert [[t.text for t in r] for r in got] == [[e.text for e in x] for x in expected]
        for served, exp in zip(got, expected, strict=True):
            for a, b in zip(served, exp, strict=True):
                assert (a.hyp.tokens, a.hyp.eos) == (b.hyp.tokens, b.hyp.eos)
                assert a.hyp.score == pytest.approx(b.hyp.score, abs=1e-4)


@pytest.mark.parametrize("beam", [1, 3])
def test_an_admitted_group_is_encoded_in_parts_and_answers_stay_translates(translator, beam):
    """Sentences admitted together are encoded in parts of similar length (`padding_parts`;
    slack 0 here: one source length per part, where the test model's own slack keeps one
    part), and every request still gets what `aiayn translate` gives its lines."""
    from aiayn.serve.streams import Streams
    from aiayn.text.batches import padding_parts

    streams = Streams(translator, 6 * beam, lambda stats: None)  # room for all six at once
    streams.slack = 0
    assert len(padding_parts([1, 2, 3], streams.slack)) == 3
    model, encoded = translator.model, []
    encode = model.encode

    def counted(src_BS):  # the real encoder; only the batch sizes are recorded
        encoded.append(src_BS.size(0))
        return encode(src_BS)

    model.encode = counted
    try:
        cfg = translator.settings(beam=beam)
        lines = [["two", "seven hundred and one"], ["forty-two", "ten", "nine"], ["six"]]
        jobs = [Job(x, cfg, deadline=time.monotonic() + 60) for x in lines]
        for job in jobs:
            streams.take(job, cfg)
        while streams:
            streams.step()
    finally:
        del model.encode
    assert sum(encoded) == 6 and len(encoded) > 1  # one admission, several parts
    for job in jobs:
        expected = translator.translate_hyps(job.lines, cfg)
        got = job.future.result(0)
        assert [[t.text for t in r] for r in got] == [[e.text for e in x] for x in expected]


def test_running_searches_hold_at_most_the_token_budget(translator):
    """Rows x output-length limit of the sentences in flight stay within the turns' token
    budget (a sentence over it alone runs alone), so a request that forbids EOS up to a long
    limit holds the model no longer than a turn; the answers are still `translate`'s."""
    from aiayn.serve.streams import Streams

    streams = Streams(translator, 64, lambda stats: None, max_tokens=500)
    long = translator.settings(beam=2, max_len_a=0.0, max_len_b=100, min_len=100)
    over = translator.settings(beam=3, max_len_a=0.0, max_len_b=200, min_len=5)
    jobs = [Job(["two", "seven", "nine", "ten"], long, time.monotonic() + 60),
            Job(["eleven"], over, time.monotonic() + 60)]  # fmt: skip
    for job in jobs:
        streams.take(job, job.cfg)
    most = 0
    while streams:
        streams.step()
        held = [(s.tokens, len(s.rows)) for s in streams._streams.values()]
        assert sum(t for t, _ in held) <= 500 or held == [(600, 1)]  # 3 x 200: alone
        most = max(most, sum(n for _, n in held))
    assert most == 2  # 2 x 100 x 2 rows fit, a third does not
    for job in jobs:
        expected = translator.translate_hyps(job.lines, job.cfg)
        assert [r[0].text for r in job.future.result(0)] == [e[0].text for e in expected]


def test_searches_admit_first_come_first_served_so_greedy_rows_cannot_starve_a_beam(translator):
    """Greedy rows free up one at a time and a beam sentence needs N at once: the searches
    admit in turn, so the beam request is admitted while greedy sentences still wait, not after
    every greedy sentence queued."""
    from aiayn.serve.streams import Streams

    streams = Streams(translator, 4, lambda stats: None)
    greedy, beam = translator.settings(), translator.settings(beam=3)
    first = Job(["two", "seven", "nine", "ten", "six", "eleven"] * 2, greedy, time.monotonic() + 60)
    wide = Job(["forty-two"], beam, time.monotonic() + 60)
    second = Job(["seven hundred and one", "ninety"] * 4, greedy, time.monotonic() + 60)
    for job in (first, wide, second):
        streams.take(job, job.cfg)
    greedy_waiting = None
    while streams:
        streams.step()
        running = {s.run.cfg: s for s in streams._streams.values()}
        if greedy_waiting is None and beam in running and running[beam].rows:
            greedy_waiting = running[greedy].n_waiting
    assert greedy_waiting is not None and greedy_waiting >= 12  # of 20
    for job in (first, wide, second):
        expected = translator.translate_hyps(job.lines, job.cfg)
        assert [r[0].text for r in job.future.result(0)] == [e[0].text for e in expected]


def test_a_running_search_admits_one_sentence_of_each_waiting_request_in_turn(translator):
    """A one-sentence request that arrives behind long ones is admitted with their first
    sentences, not after all of them; every request still gets its own translations."""
    from aiayn.serve.streams import Streams

    streams = Streams(translator, 4, lambda stats: None)
    cfg = translator.settings()
    long_a, long_b = (Job(["two", "seven", "nine", "ten", "six"], cfg, time.monotonic() + 60)
                      for _ in range(2))  # fmt: skip
    single = Job(["forty-two"], cfg, time.monotonic() + 60)
    for job in (long_a, long_b, single):
        streams.take(job, cfg)
    (stream,) = streams._streams.values()
    streams.step()  # admits 4 rows: one of each request, then long_a's second
    admitted = [entry.job for entry, _ in stream.rows.values()]
    assert admitted.count(single) == 1 and admitted.count(long_b) == 1
    while streams:
        streams.step()
    for job in (long_a, long_b, single):
        expected = translator.translate_hyps(job.lines, cfg)
        assert [r[0].text for r in job.future.result(0)] == [e[0].text for e in expected]


def test_the_encoder_parts_slack_is_measured_on_this_machine(translator):
    """A part may carry the padded positions that cost what one more pass costs: the fixed
    cost of a pass over its cost per position, measured when the model worker starts."""
    from aiayn.serve.streams import part_slack, slack_of

    # 1 ms fixed + 10 us a position: 4 positions 1.04 ms, 256 positions 3.56 ms -> 100
    assert slack_of(1.04e-3, 4, 3.56e-3, 256) == 100
    assert slack_of(1e-3, 4, 0.5e-3, 256) == 4096  # no measurable cost per position: one part
    assert slack_of(0.04e-3, 4, 2.56e-3, 256) == 0  # no fixed cost: a part per length
    assert slack_of(1.04e-3, 4, 3.56e-3, 256, padded_s=2e-6) == 500  # padding costs less
    assert 0 <= part_slack(translator, reps=2) <= 4096
    short = Translator(  # a positional table shorter than the timed batches
        Transformer(dataclasses.replace(translator.model.cfg, max_len=3)), translator.tokenizer
    )
    assert 0 <= part_slack(short, reps=1) <= 4096
    batcher = Batcher(translator)
    try:
        job = batcher.translate(["two"], translator.settings(), timeout_s=60)
        assert job.future.result(60)[0][0].text == translator.translate(["two"])[0]
        assert batcher._streams.slack is not None  # measured as the worker started
    finally:
        batcher.close()


def test_the_closed_loop_bench_answers_what_translate_does(translator, one_thread, monkeypatch):
    """bench/continuous_engine.py --clients: the server's scheduler (`Streams`) fed by clients
    that send their next request as their last is answered gives every request the lines that
    `translate` gives, and restores the methods it timed."""
    import importlib.util
    import sys

    from aiayn.search.row_search import RowSearch

    bench_dir = BENCH
    monkeypatch.syspath_prepend(str(bench_dir))
    spec = importlib.util.spec_from_file_location(
        "continuous_engine", bench_dir / "continuous_engine.py"
    )
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "continuous_engine", bench)
    spec.loader.exec_module(bench)
    corpus = ["one two three", "four", "five six", "seven eight nine ten", "two", "three one"]
    requests = bench.make_requests(corpus, 12, 4, seed=1)
    add, step = RowSearch.add, RowSearch.step
    got, seconds, admitting, stepping = bench.closed_loop(
        translator, requests, clients=3, rows=8, cfg=translator.cfg
    )
    assert got == [translator.translate(r) for r in requests]
    assert admitting > 0 and stepping > 0 and admitting + stepping <= seconds
    assert (RowSearch.add, RowSearch.step) == (add, step)
