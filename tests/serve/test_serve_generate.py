"""`aiayn serve --model LM`: a language model behind POST /v1/generate, on a real server
subprocess (a tiny untrained DecoderLM: what it writes is noise, but the same noise).

What is served equals `Generator.generate_all` in-process for the same settings and seed; the
streamed events of each completion add up to its text; bad values are 4xx JSON with one line;
a server answers the other kind of model's endpoints with a 404 naming the right one; a client
that leaves (whole or streamed) frees the model within a step; the schema fuzzes clean.
"""

import json
import time

import pytest

pytest.importorskip("fastapi", reason="the serve extra is not installed (pip install .[serve])")
import httpx
import torch
from serving import ServerProcess

from aiayn.config import ModelConfig
from aiayn.generate.generator import Generator
from aiayn.nn.variants import DecoderLM
from aiayn.store.model_dir import save_model_dir
from aiayn.text.charset import CharTokenizer

TEXT = "ROMEO: But soft, what light through yonder window breaks? JULIET: Ay me! 0123456789"
PROMPTS = ["ROMEO:", "JULIET: Ay", ""]  # "": from BOS alone
LOG_PROB_TOL = 1e-4  # summed over a completion, in another process: fp32 rounding


@pytest.fixture(scope="module")
def lm_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("lm")
    torch.manual_seed(0)
    tok = CharTokenizer.fit([TEXT])
    cfg = ModelConfig(vocab_size=tok.vocab_size, d_model=32, n_heads=4, n_layers=2, d_ff=64,
                      dropout=0.0, max_len=64)  # fmt: skip
    save_model_dir(DecoderLM(cfg), out)
    tok.save(out)
    return out


@pytest.fixture(scope="module")
def server(lm_dir):
    s = ServerProcess(lm_dir, "--max-output-tokens", "48", "--max-beam", "4", "--max-rows", "16",
                      "--max-sentences", "8")  # fmt: skip
    yield s
    code, _, err = s.stop()
    assert code == 0 and "Traceback" not in err, err[-4000:]


@pytest.fixture(scope="module")
def generator(lm_dir):
    return Generator.load(lm_dir, device="cpu")


def events(text: str) -> list[tuple[str, dict]]:
    """A server-sent-events body as (event, data) pairs."""
    out = []
    for block in text.split("\n\n"):
        if block.strip():
            fields = dict(line.split(": ", 1) for line in block.splitlines())
            out.append((fields["event"], json.loads(fields["data"])))
    return out


# --- served == in-process -------------------------------------------------------------------------

SETTINGS = [
    # (request fields, the Generator settings they mean)
    ({"max_tokens": 20, "seed": 7}, {"seed": 7}),
    ({"max_tokens": 30, "seed": 3, "num_samples": 2, "temperature": 0.7, "top_k": 10,
      "top_p": 0.9}, {"seed": 3, "nbest": 2, "temperature": 0.7, "top_k": 10, "top_p": 0.9}),
    ({"max_tokens": 16, "sample": False}, {"sample": False}),
    ({"max_tokens": 12, "beam": 3, "num_samples": 2},
     {"sample": False, "beam_size": 3, "nbest": 2}),
    ({"max_tokens": 40, "seed": 11}, {"seed": 11}),  # past the 64-position context: windows
]  # fmt: skip


@pytest.mark.parametrize(("fields", "settings"), SETTINGS)
def test_generate_equals_generate_all(client, generator, lm_dir, fields, settings, one_thread):
    r = client.post("/v1/generate", json={"prompt": PROMPTS, **fields})
    assert r.status_code == 200, r.text
    body = r.json()
    want = generator.generate_all(PROMPTS, generator.settings(fields["max_tokens"], **settings))
    assert body["model"] == lm_dir.name
    assert len(body["completions"]) == len(PROMPTS)
    for served, expected in zip(body["completions"], want, strict=True):
        assert [c["text"] for c in served] == [g.text for g in expected]
        assert [c["tokens"] for c in served] == [g.tokens for g in expected]
        for c, g in zip(served, expected, strict=True):
            assert c["log_prob"] == pytest.approx(g.log_prob, abs=LOG_PROB_TOL)
            assert c["prompt_tokens"] == g.prompt_tokens
            assert c["finish_reason"] == ("eos" if g.eos else "length")
    assert body["settings"]["max_len_b"] == fields["max_tokens"]


def test_one_prompt_and_the_default_settings(client, generator, one_thread):
    r = client.post("/v1/generate", json={"prompt": "ROMEO:"})
    body = r.json()
    assert r.status_code == 200 and len(body["completions"]) == 1
    (completion,) = body["completions"][0]
    # no max_tokens: the model's saved length (200 by default) within --max-output-tokens 48
    assert body["settings"]["sample"] is True and body["settings"]["max_len_b"] == 48
    want = generator.generate_all(["ROMEO:"], generator.settings(48))[0][0]
    assert completion["text"] == want.text


# --- streaming ------------------------------------------------------------------------------------


@pytest.mark.parametrize("fields", [
    {"max_tokens": 40, "seed": 5, "num_samples": 2},  # sampling, past the context
    {"max_tokens": 20, "sample": False},  # greedy
    {"max_tokens": 10, "beam": 3, "num_samples": 2},  # a beam: its texts at the end
])  # fmt: skip
def test_streamed_events_add_up_to_the_whole_reply(client, fields, one_thread):
    whole = client.post("/v1/generate", json={"prompt": PROMPTS, **fields}).json()
    with client.stream("POST", "/v1/generate",
                       json={"prompt": PROMPTS, "stream": True, **fields}) as r:  # fmt: skip
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        got = events(r.read().decode())
    assert got[-1][0] == "done" and {e for e, _ in got[:-1]} == {"token"}
    assert got[-1][1]["completions"] == whole["completions"]
    texts: dict[tuple[int, int], str] = {}
    for _, data in got[:-1]:
        key = (data["prompt"], data["sample"])
        texts[key] = texts.get(key, "") + data["text"]
    for p, completions in enumerate(whole["completions"]):
        for k, c in enumerate(completions):
            assert texts.get((p, k), "") == c["text"], (p, k)
    if "beam" not in fields:  # heard as produced: more events than completions
        assert len(got) - 1 > sum(map(len, whole["completions"]))


def test_a_stream_refused_before_it_starts_is_a_json_4xx(client):
    r = client.post("/v1/generate", json={"prompt": "a", "stream": True, "top_p": 0})
    assert r.status_code == 422 and r.headers["content-type"] == "application/json"
    assert r.json() == {"error": "'top_p': Input should be greater than 0 (got 0)"}


# --- what is refused ------------------------------------------------------------------------------

BAD = [
    ({"prompt": []}, 422, "'prompt': List should have at least 1 item"),
    ({}, 422, "'prompt': Field required"),
    ({"prompt": 5}, 422, "'prompt': must be a string or a list of strings (got 5)"),
    ({"prompt": "a", "temperature": 0}, 422, "'temperature': Input should be greater than 0"),
    ({"prompt": "a", "temperature": -1.5}, 422, "'temperature': Input should be greater than 0"),
    ({"prompt": "a", "top_p": 1.5}, 422, "'top_p': Input should be less than or equal to 1"),
    ({"prompt": "a", "top_p": 0}, 422, "'top_p': Input should be greater than 0"),
    ({"prompt": "a", "top_k": -1}, 422, "'top_k': Input should be greater than or equal to 0"),
    ({"prompt": "a", "max_tokens": 49}, 422,
     "'max_tokens': Input should be less than or equal to 48 (got 49)"),
    ({"prompt": "a", "max_tokens": 0}, 422, "'max_tokens': Input should be greater than or equal"),
    ({"prompt": "a", "num_samples": 5}, 422,
     "'num_samples': Input should be less than or equal to 4"),
    ({"prompt": "a", "beam": 0}, 422, "'beam': Input should be greater than or equal to 1"),
    ({"prompt": "a", "stream": "yes"}, 422, "'stream': Input should be a valid boolean"),
    ({"prompt": "a", "n": 2}, 422, "'n': Extra inputs are not permitted"),
    ({"prompt": ["a"] * 9}, 422, "'prompt': List should have at most 8 items"),
    ({"prompt": ["a"] * 5, "num_samples": 4}, 413,
     "5 sentences x 4 = 20 search rows; the limit is 16 (--max-rows)"),
]  # fmt: skip


@pytest.mark.parametrize(("body", "status", "message"), BAD)
def test_bad_values_are_4xx_json_with_one_line(client, body, status, message):
    r = client.post("/v1/generate", json=body)
    assert r.status_code == status, r.text
    assert r.headers["content-type"] == "application/json"
    assert message in r.json()["error"] and "\n" not in r.json()["error"]


def test_nan_and_non_json_are_refused(client):
    r = client.post("/v1/generate", content=b'{"prompt": "a", "temperature": NaN}',
                    headers={"content-type": "application/json"})  # fmt: skip
    assert r.status_code in (400, 422) and "error" in r.json()
    r = client.post("/v1/generate", content=b"prompt=a",
                    headers={"content-type": "application/x-www-form-urlencoded"})  # fmt: skip
    assert r.status_code == 415


# --- one kind of model per server -----------------------------------------------------------------


def test_an_lm_server_says_what_it_holds(client):
    assert client.get("/health").json()["kind"] == "language_model"
    info = client.get("/v1/model").json()
    assert info["kind"] == "language_model" and info["languages"] is None
    assert info["model"]["max_len"] == 64 and info["limits"]["max_output_tokens"] == 48
    for method, path, body in [("POST", "/v1/translate", {"q": "a"}),
                               ("POST", "/translate", {"q": "a", "source": "en", "target": "de"}),
                               ("POST", "/v1/explain", {"q": "a"}), ("POST", "/detect", {"q": "a"}),
                               ("GET", "/languages", None)]:  # fmt: skip
        r = client.request(method, path, json=body)
        assert r.status_code == 404, path
        assert r.json() == {"error": "this server holds a language model: POST /v1/generate"}
    paths = client.get("/openapi.json").json()["paths"]
    assert sorted(paths) == [
        "/health",
        "/v1/explain/lm",
        "/v1/explain/seed",
        "/v1/generate",
        "/v1/model",
    ]


def test_a_translator_server_refuses_generate(served_model_dir):
    s = ServerProcess(served_model_dir)
    try:
        with httpx.Client(base_url=s.url, timeout=60) as c:
            assert c.get("/health").json()["kind"] == "translator"
            assert c.get("/v1/model").json()["kind"] == "translator"
            r = c.post("/v1/generate", json={"prompt": "a"})
            assert r.status_code == 404 and "/v1/generate needs a language model" in r.json()[
                "error"]  # fmt: skip
            assert "/v1/generate" not in c.get("/openapi.json").json()["paths"]
    finally:
        s.stop()


# --- a client that leaves -------------------------------------------------------------------------


def dropped(url: str) -> float:
    text = httpx.get(url + "/metrics").text
    lines = [x for x in text.splitlines() if x.startswith("aiayn_dropped_requests_total{")]
    return sum(float(x.split()[-1]) for x in lines if 'reason="disconnected"' in x)


# No EOS before 4,000 tokens (min_len): ~7 s of one CPU thread, all 64 rows in one part.
LONG = {"prompt": ["ROMEO:"] * 8, "num_samples": 8, "max_tokens": 4000, "min_len": 4000}


def test_a_client_that_leaves_frees_the_model_within_a_step(lm_dir):
    s = ServerProcess(lm_dir, "--max-output-tokens", "4000", "--turn-tokens", "1000000",
                      "--timeout", "120")  # fmt: skip
    try:
        before = dropped(s.url)
        with pytest.raises(httpx.TimeoutException):  # the client gives up after 1 s and leaves
            httpx.post(s.url + "/v1/generate", json=LONG, timeout=1.0)
        time.sleep(0.3)  # the server hears of it at once, the worker within a step
        t0 = time.monotonic()
        r = httpx.post(s.url + "/v1/generate", json={"prompt": "a", "max_tokens": 4}, timeout=30)
        assert r.status_code == 200 and time.monotonic() - t0 < 1.0
        assert dropped(s.url) == before + 1
        # streamed: the client reads a few events and closes the connection
        with (
            httpx.Client(base_url=s.url, timeout=30) as c,
            c.stream("POST", "/v1/generate", json={**LONG, "stream": True}) as r,
        ):
            lines = r.iter_lines()
            assert next(lines) == "event: token" and next(lines).startswith("data: ")
        time.sleep(0.3)
        t0 = time.monotonic()
        r = httpx.post(s.url + "/v1/generate", json={"prompt": "a", "max_tokens": 4}, timeout=30)
        assert r.status_code == 200 and time.monotonic() - t0 < 1.0
        assert dropped(s.url) == before + 2
    finally:
        code, _, err = s.stop()
    assert code == 0 and "Traceback" not in err, err[-4000:]


def test_a_stream_past_its_timeout_ends_with_an_error_event(lm_dir):
    s = ServerProcess(lm_dir, "--max-output-tokens", "4000", "--turn-tokens", "1000000",
                      "--timeout", "1")  # fmt: skip
    try:
        with httpx.Client(base_url=s.url, timeout=30) as c:
            t0 = time.monotonic()
            r = c.post("/v1/generate", json={**LONG, "stream": True})
            got = events(r.text)
            assert time.monotonic() - t0 < 2.5
            assert got[-1] == ("error", {"error": got[-1][1]["error"], "status": 503})
            assert "timed out" in got[-1][1]["error"]
            r = c.post("/v1/generate", json=LONG)
            assert r.status_code == 503 and "timed out" in r.json()["error"]
    finally:
        s.stop()


# --- fuzzed ---------------------------------------------------------------------------------------


def test_schemathesis_finds_nothing_on_an_lm_server(lm_dir, tmp_path):
    # imported here: the module skips itself without schemathesis, which would skip this one
    from .test_serve_fuzz import fuzz

    result = fuzz(lm_dir, tmp_path, 8, "--max-beam", "4")
    # /health, /v1/model, /v1/explain/seed, /v1/explain/lm, /v1/generate
    assert result["operations"]["tested"] == 5
    assert result["test_cases"]["with_failures"] == 0 and not result["errors"]
