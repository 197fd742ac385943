"""`aiayn serve` against careless and hostile clients (issue 19), on a real server subprocess.

Every case is answered with a 4xx or within its limits, quickly; the worst request the limits
allow does not starve an ordinary one; abandoned work frees the model within a step; the body
is read with a cap and the key is checked first; a browser page on another site cannot drive
the server; the key never reaches a log.
"""

import json
import threading
import time

import pytest

pytest.importorskip("fastapi", reason="the serve extra is not installed (pip install .[serve])")
import httpx
from serving import ServerProcess

KEY = "s3cret-key-for-tests"
WORST_LINE = "seven hundred and seventy-seven thousand, " * 20  # ~860 characters


def worst_request() -> dict:
    """The most work /v1/translate allows by default: long lines up to the 20,000 characters
    of a request, beam 8 (the largest), and no EOS before the output-token limit."""
    n_lines = 20_000 // len(WORST_LINE)
    return {"q": [WORST_LINE] * n_lines, "beam": 8, "min_len": 256, "max_len_b": 256}


@pytest.fixture(scope="module")
def server(served_model_dir):
    s = ServerProcess(served_model_dir, "--timeout", "60")
    yield s
    s.stop()


def timed_post(url: str, path: str, body: dict, timeout: float = 60) -> tuple[int, float]:
    t0 = time.monotonic()
    with httpx.Client(base_url=url, timeout=timeout) as c:
        r = c.post(path, json=body)
    return r.status_code, time.monotonic() - t0


def test_an_ordinary_request_is_answered_while_the_worst_one_runs(server):
    idle_status, _ = timed_post(server.url, "/v1/translate", {"q": "two"})
    assert idle_status == 200
    worst: dict = {}
    hog = threading.Thread(target=lambda: worst.update(
        r=timed_post(server.url, "/v1/translate", worst_request())))  # fmt: skip
    hog.start()
    time.sleep(0.5)  # the worst request is being decoded
    status, seconds = timed_post(server.url, "/v1/translate", {"q": "two"})
    hog.join(120)
    assert worst["r"][0] == 200  # the worst request is served too, within the timeout
    # The ordinary request waited for one turn of the worst, not for all of it (with one
    # turn for the whole request, it waits ~80% of the worst's time). The 2 s is
    # measured by bench/serve_hostile.py; here a loaded CI machine gets some slack.
    assert status == 200 and seconds < 3.0 and seconds < 0.5 * worst["r"][1], (seconds, worst)


def test_a_client_that_leaves_frees_the_model_within_a_step(server):
    with httpx.Client(base_url=server.url, timeout=60) as c:
        before = c.get("/metrics").text
    with pytest.raises(httpx.TimeoutException):  # the client gives up after 1 s and goes away
        httpx.post(server.url + "/v1/translate", json=worst_request(), timeout=1.0)
    time.sleep(0.3)  # the server hears of it at once, the worker within a step
    status, seconds = timed_post(server.url, "/v1/translate", {"q": "two"})
    assert status == 200 and seconds < 1.0
    with httpx.Client(base_url=server.url, timeout=60) as c:
        after = c.get("/metrics").text

    def dropped(text):
        line = [x for x in text.splitlines() if x.startswith("aiayn_dropped_requests_total{")]
        return sum(float(x.split()[-1]) for x in line if 'reason="disconnected"' in x)

    assert dropped(after) == dropped(before) + 1


def test_a_running_decode_past_its_timeout_frees_the_model(served_model_dir):
    s = ServerProcess(served_model_dir, "--timeout", "1")
    try:
        status, seconds = timed_post(s.url, "/v1/translate", worst_request())
        assert status == 503 and seconds < 2.0  # answered at its deadline, not at its end
        status, seconds = timed_post(s.url, "/v1/translate", {"q": "two"})
        # The worker had stopped the abandoned search (its whole decode takes many seconds);
        # 1 s as for a client that left: 0.78 s was seen with another test run beside it.
        assert status == 200 and seconds < 1.0
    finally:
        s.stop()


def test_hostile_explain_requests_are_refused_before_any_work(served_model_dir):
    s = ServerProcess(served_model_dir, "--max-trace-numbers", "20000")
    try:
        with httpx.Client(base_url=s.url, timeout=30) as c:
            rss = s.rss_mb()
            for body, status, message in [
                ({"q": "two", "steps": "0-2000000000"}, 422, "'steps'"),
                ({"q": "two", "steps": [0, 2_000_000_000]}, 422, "'steps.1'"),
                ({"q": "two", "layers": [0, 7]}, 422, "'layers.1'"),
                ({"q": "two", "heads": [0]}, 422, "'heads.0'"),
                ({"q": "two", "max_len": 10**9}, 422, "'max_len'"),
                # all tensors of 100+ steps: more numbers than this server's trace budget
                ({"q": "seven hundred and one", "min_len": 100}, 413, "--max-trace-numbers"),
            ]:
                t0 = time.monotonic()
                r = c.post("/v1/explain", json=body)
                assert (r.status_code, list(r.json())) == (status, ["error"]), r.text
                assert message in r.json()["error"] and time.monotonic() - t0 < 1.0
            # attention-only traces keep only what they return: this one fits the budget
            ok = c.post("/v1/explain", json={"q": "two", "tensors": "attention", "max_len": 3})
            assert ok.status_code == 200
            assert all(t["name"].endswith(".weights") for t in ok.json()["tensors"])
            assert s.rss_mb() - rss < 200
    finally:
        s.stop()


def test_the_body_is_capped_and_the_key_comes_first(served_model_dir):
    s = ServerProcess(served_model_dir, "--api-key", KEY)
    try:

        def chunks(n_mb: int):  # a chunked upload: no Content-Length to refuse it by
            for _ in range(n_mb):
                yield b"x" * (1 << 20)

        with httpx.Client(base_url=s.url, timeout=30) as c:
            # The server's first refused upload costs ~9-10 MB on its own (code paths run the
            # first time); measure from after one, so the bound is the upload's alone.
            c.post("/translate", content=chunks(1), headers={"Content-Type": "text/plain"})
            rss = s.rss_mb()
            t0 = time.monotonic()
            r = c.post("/translate", content=chunks(64), headers={"Content-Type": "text/plain"})
            assert r.status_code == 413 and time.monotonic() - t0 < 5
            assert s.rss_mb() - rss < 10  # at most the cap (~145 kB) was ever held
            r = c.post("/v1/translate", content=b'{"q": "two"}',
                       headers={"Content-Type": "text/plain"})  # fmt: skip
            assert r.status_code == 401  # no key: nothing is said about the body
            r = c.post("/v1/translate", content=b"x" * 10, headers={
                "Content-Type": "text/plain", "Authorization": f"Bearer {KEY}"})  # fmt: skip
            assert r.status_code == 415
            for raw in (b"[1, 2]", b'"api_key"', b"null", b"\xff{", b"[" * 100_000):
                r = c.post("/v1/translate", content=raw,
                           headers={"Content-Type": "application/json"})  # fmt: skip
                assert r.status_code == 401, (raw[:20], r.text)  # never a 500
            r = c.post("/v1/translate", json={"q": "two", "api_key": "wrong"})
            assert r.status_code == 403
            r = c.post("/v1/translate", json={"q": "two", "api_key": KEY})
            assert r.status_code == 200
            for path in ("/docs", "/openapi.json", "/metrics", "/v1/model", "/languages", "/"):
                assert c.get(path).status_code == 401, path
                assert c.get(path, headers={"Authorization": f"Bearer {KEY}"}).status_code == 200
            assert c.get("/health").status_code == 200
    finally:
        s.stop()


def test_other_sites_cannot_drive_a_local_server(server, served_model_dir):
    with httpx.Client(base_url=server.url, timeout=30) as c:
        # a cross-site form or text/plain POST needs no CORS preflight: refused by type
        r = c.post("/v1/translate", content=b'{"q": "two"}', headers={"Content-Type": "text/plain"})
        assert r.status_code == 415 and "application/json" in r.json()["error"]
        r = c.post("/v1/explain", content=b"q=two",
                   headers={"Content-Type": "application/x-www-form-urlencoded"})  # fmt: skip
        assert r.status_code == 415
        # LibreTranslate's endpoints take forms, as LibreTranslate does
        r = c.post("/translate", data={"q": "two", "alternatives": "1"})
        assert r.status_code == 200 and r.json()["alternatives"]
        # DNS rebinding: the page's own name arrives as Host
        r = c.get("/v1/model", headers={"Host": "attacker.example:8000"})
        assert r.status_code == 400 and "--allowed-host" in r.json()["error"]
        assert c.get("/v1/model", headers={"Host": "localhost:1234"}).status_code == 200
        page = c.get("/")
        assert page.headers["x-frame-options"] == "DENY"  # not framed by another site
        assert page.headers["referrer-policy"] == "no-referrer"  # its ?api_key= never leaks
        assert page.headers["x-content-type-options"] == "nosniff"
        assert "server" not in page.headers
        # no CORS headers unless --cors-origin is given
        r = c.get("/v1/model", headers={"Origin": "https://attacker.example"})
        assert "access-control-allow-origin" not in r.headers
    s = ServerProcess(served_model_dir, "--allowed-host", "mt.example.org",
                      "--cors-origin", "https://tools.example.org")  # fmt: skip
    try:
        with httpx.Client(base_url=s.url, timeout=30) as c:
            assert c.get("/health", headers={"Host": "mt.example.org"}).status_code == 200
            assert c.get("/health", headers={"Host": "other.example"}).status_code == 400
            pre = c.options("/v1/translate", headers={
                "Origin": "https://tools.example.org", "Access-Control-Request-Method": "POST",
                "Access-Control-Request-Headers": "content-type"})  # fmt: skip
            assert pre.status_code == 200
            assert pre.headers["access-control-allow-origin"] == "https://tools.example.org"
            r = c.get("/v1/model", headers={"Origin": "https://attacker.example"})
            assert "access-control-allow-origin" not in r.headers
    finally:
        s.stop()


def test_the_key_never_reaches_the_log(served_model_dir):
    s = ServerProcess(served_model_dir, "--api-key", KEY, access_log=True)
    try:
        with httpx.Client(base_url=s.url, timeout=30) as c:
            assert c.get("/", params={"api_key": KEY}).status_code == 200  # how the page opens
            assert c.get("/v1/model", params={"api_key": "wrong-key"}).status_code == 403
            assert c.post("/translate", json={"q": "two", "api_key": KEY}).status_code == 200
    finally:
        _, out, err = s.stop()
    log = out + err
    assert '"GET /' in log and '"POST /translate" 200' in log  # the access log is there
    assert KEY not in log and "wrong-key" not in log and "api_key" not in log


def test_languages_are_real_language_codes(tmp_path):
    from aiayn.serve.requests import model_languages

    def langs(src, tgt):
        (tmp_path / "run_config.json").write_text(json.dumps({"train": {"src": src, "tgt": tgt}}))
        return model_languages(tmp_path)

    for a, b in [("src", "tgt"), ("tok", "txt"), ("bpe", "raw"), ("src", "en"), ("de", "tok")]:
        assert langs(f"train.{a}", f"train.{b}") is None, (a, b)
    assert langs("train.de", "train.en") == ("de", "en")
    assert langs("corpus.sr-Latn", "corpus.yue") == ("sr-Latn", "yue")


def test_a_two_file_runs_held_out_sentences_are_the_pages_examples(tmp_path):
    from aiayn.serve.requests import example_sentences

    run = tmp_path / "run"
    (run / "averaged").mkdir(parents=True)
    (run / "heldout_valid.src").write_text("held out one\nheld out two\n")
    record = {
        "train": {"src": "a.en", "tgt": "a.de"},
        "heldout_valid": {"src": "heldout_valid.src", "tgt": "heldout_valid.tgt"},
    }
    for where in (run, run / "averaged"):  # the run directory, or its averaged model
        (where / "run_config.json").write_text(json.dumps(record))
        assert example_sentences(where, None) == ["held out one", "held out two"]
