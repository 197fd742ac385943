"""The live page of a language model (`aiayn serve --model LM`, GET /) and its route, POST
/v1/explain/lm, on a real server subprocess (a tiny untrained DecoderLM).

The route answers what `aiayn.glassbox.lm_page.lm_page_data` returns in-process; bad bodies are
4xx JSON with one line, a trace over --max-trace-numbers 413; a translator's server answers
404 naming its own endpoints. In a real headless Chromium the page draws the prompt's causal
self-attention, the next-token distribution (the sliders reshape it as the server would, kept
set included), the forward-pass view with the route's numbers, and "sample" appends the token
the shown distribution gives.
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
from aiayn.glassbox.lm_page import lm_page_data
from aiayn.nn.variants import DecoderLM
from aiayn.store.model_dir import save_model_dir
from aiayn.text.charset import CharTokenizer

TEXT = "ROMEO: But soft, what light through yonder window breaks? JULIET: Ay me! 0123456789"
MAX_TRACE = 20_000  # numbers: a short prompt's whole trace fits, a long prompt's maps do not


@pytest.fixture(scope="module")
def lm_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("lm_page")
    torch.manual_seed(0)
    tok = CharTokenizer.fit([TEXT])
    cfg = ModelConfig(vocab_size=tok.vocab_size, d_model=32, n_heads=4, n_layers=2, d_ff=64,
                      dropout=0.0, max_len=64)  # fmt: skip
    save_model_dir(DecoderLM(cfg), out)
    tok.save(out)
    return out


@pytest.fixture(scope="module")
def server(lm_dir):
    s = ServerProcess(lm_dir, "--max-trace-numbers", str(MAX_TRACE))
    yield s
    code, _, err = s.stop()
    assert code == 0 and "Traceback" not in err, err[-4000:]


@pytest.fixture(scope="module")
def lm(lm_dir):
    """The model and tokenizer in-process, on one thread (as the server decodes)."""
    g = Generator.load(lm_dir, device="cpu")  # as the server loads it
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield g.model, g.tokenizer
    torch.set_num_threads(before)


def in_process(lm, body: dict) -> dict:
    """What the route should answer for `body`: lm_page_data, as JSON."""
    model, tok = lm
    kwargs = {k: v for k, v in body.items() if k != "q"}
    return json.loads(json.dumps(lm_page_data(model, tok, body["q"], **kwargs)))


# --- the route ------------------------------------------------------------------------------------


@pytest.mark.parametrize("body", [
    {"q": "ROMEO:", "temperature": 0.7, "top_k": 5, "top_p": 0.9, "show": 20},
    {"q": "", "tensors": "attention"},
    {"q": "JULIET: Ay", "tensors": "all", "layers": [1], "heads": [2], "precision": 6,
     "show": 100},
    {"q": "window", "tensors": "none", "temperature": 2.5, "top_p": 0.5},
])  # fmt: skip
def test_served_equals_in_process(client, lm, body):
    r = client.post("/v1/explain/lm", json=body)
    assert r.status_code == 200, r.text
    served = r.json()
    assert served == in_process(lm, body)
    assert served["format"] == "aiayn.lm_page/1"
    T = len(body["q"]) + 1  # BOS + one piece a character
    assert len(served["attention"]["w"]) == 2 and len(served["attention"]["w"][0][0]) == T


def test_each_listed_token_says_what_it_adds(client):
    d = client.post("/v1/explain/lm", json={"q": "ROM", "show": 100}).json()["distribution"]
    eos = d["eos_id"]
    assert {t["id"] for t in d["tokens"]} == set(range(d["vocab_size"]))  # every token listed
    special = {"</s>": "", "<unk>": "\ufffd", "<pad>": "", "<s>": ""}  # EOS ends the text
    for t in d["tokens"]:
        assert t["text"] == special.get(t["piece"], t["piece"]), t
        assert (t["id"] == eos) == (t["piece"] == "</s>")


@pytest.mark.parametrize("body,status,message", [
    ({"q": "a", "temperature": 0}, 422, "'temperature': Input should be greater than 0"),
    ({"q": "a", "temperature": 101}, 422, "'temperature': Input should be less than or equal"),
    ({"q": "a", "top_k": -1}, 422, "'top_k': Input should be greater than or equal to 0"),
    ({"q": "a", "top_p": 0}, 422, "'top_p': Input should be greater than 0"),
    ({"q": "a", "show": 101}, 422, "'show': Input should be less than or equal to 100"),
    ({"q": "a", "tensors": "some"}, 422, "'tensors': Input should be 'all', 'attention' or"),
    ({"q": "a", "layers": [2]}, 422, "'layers.0': Input should be less than or equal to 1"),
    ({"q": "a", "heads": [5]}, 422, "'heads.0': Input should be less than or equal to 4"),
    ({"q": "a", "precision": 13}, 422, "'precision': Input should be less than or equal to 12"),
    ({"q": 3}, 422, "'q': Input should be a valid string"),
    ({"q": "a" * 1001}, 422, "'q': String should have at most 1000 characters"),
    ({"q": "a", "beam": 2}, 422, "'beam': Extra inputs are not permitted"),
    ({}, 422, "'q': Field required"),
    ({"q": "ROMEO: " * 8, "tensors": "attention"}, 413, "--max-trace-numbers"),
])  # fmt: skip
def test_bad_bodies_are_4xx_json_with_one_line(client, body, status, message):
    r = client.post("/v1/explain/lm", json=body)
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert message in error and "\n" not in error, error


def test_bodies_that_are_not_json_are_refused(client):
    def post(content: bytes, media: str = "application/json") -> httpx.Response:
        return client.post("/v1/explain/lm", content=content, headers={"Content-Type": media})

    r = post(b'{"q": "a"}', "text/plain")
    assert r.status_code == 415 and "JSON" in r.json()["error"]
    r = post(b'{"q": ')
    assert r.status_code == 400 and r.json()["error"].startswith("invalid JSON")
    assert post(b'{"q": "a", "top_p": NaN}').status_code in (400, 422)


def test_the_schema_and_the_metrics_name_the_route(client):
    paths = client.get("/openapi.json").json()["paths"]
    assert "post" in paths["/v1/explain/lm"] and "/v1/explain" not in paths
    client.post("/v1/explain/lm", json={"q": "a", "tensors": "none"})
    assert 'endpoint="/v1/explain/lm"' in client.get("/metrics").text
    assert client.get("/v1/model").json()["traceable"] is True


def test_a_translator_server_answers_404(served_model_dir):
    s = ServerProcess(served_model_dir)
    try:
        with httpx.Client(base_url=s.url, timeout=60) as c:
            r = c.post("/v1/explain/lm", json={"q": "a"})
            assert r.status_code == 404
            assert "/v1/explain/lm needs a language model" in r.json()["error"]
            assert "/v1/explain/lm" not in c.get("/openapi.json").json()["paths"]
            assert "explain/lm" not in c.get("/").text  # the translator's page
    finally:
        s.stop()


# --- the page in headless Chromium ----------------------------------------------------------------


def wait_js(chromium, expression: str, timeout: float = 60):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := chromium.js(expression):
            return value
        time.sleep(0.05)
    raise TimeoutError(expression)


def set_value(chromium, element: str, value, event: str = "input") -> None:
    chromium.js(f"(() => {{ const e = document.getElementById('{element}'); "
                f"e.value = {json.dumps(value)}; "
                f"e.dispatchEvent(new Event('{event}')); }})()")  # fmt: skip


def traced(chromium, prompt: str) -> None:
    """Until the page shows the forward pass of `prompt`."""
    wait_js(chromium, f"page !== null && page.q === {json.dumps(prompt)} && "
                      "document.querySelectorAll('#bars > div').length > 0")  # fmt: skip


KEPT = "JSON.stringify(dist.tokens.filter(t => t.kept).map(t => [t.id, t.renorm]))"


def test_lm_page_in_headless_chromium(chromium, server, lm, tmp_path):
    import base64

    for domain in ("Runtime", "Log", "Page", "Network"):
        chromium.send(f"{domain}.enable")
    chromium.send("Page.navigate", url=server.url + "/")
    chromium.wait_for("Page.loadEventFired")
    traced(chromium, "")  # the empty prompt: BOS alone
    assert chromium.js("document.getElementById('layer').options.length") == 2
    assert chromium.js("document.getElementById('head').options.length") == 5  # mean + 4

    # type a prompt: its causal attention (t sees 0..t), its distribution as bars
    prompt = "ROMEO: But"
    set_value(chromium, "prompt", prompt)
    traced(chromium, prompt)
    T = len(prompt) + 1
    assert chromium.js("document.querySelectorAll('#cells rect').length") == T * (T + 1) // 2
    assert chromium.js("document.querySelectorAll('#matrix text.row').length") == T
    want = in_process(lm, {"q": prompt, "show": 100})
    w = want["attention"]["w"][0][0]
    cell = "document.querySelector('#cells rect[data-i=\"{}\"][data-j=\"{}\"]').dataset.w"
    assert float(chromium.js(cell.format(T - 1, 0))) == pytest.approx(w[T - 1][0], abs=1e-4)
    assert chromium.js("document.querySelectorAll('#bars > div').length") == 20
    n_kept = want["distribution"]["vocab_size"] - len(want["distribution"]["banned"])
    assert chromium.js("dist.n_kept") == n_kept  # no filter: every token it can emit
    assert chromium.js("document.getElementById('kept').textContent").startswith(f"{n_kept} of ")

    # the sliders reshape the distribution here, as the server's sampling step would
    for temperature, top_k, top_p in [(1.0, 3, 1.0), (0.5, 0, 0.9), (2.0, 10, 0.6)]:
        set_value(chromium, "temperature", str(temperature))
        set_value(chromium, "top-k", str(top_k))
        set_value(chromium, "top-p", str(top_p))
        settings = {"temperature": temperature, "top_k": top_k, "top_p": top_p, "show": 100}
        server_side = in_process(lm, {"q": prompt, **settings})["distribution"]
        kept = [(t["id"], t["renorm"]) for t in server_side["tokens"] if t["kept"]]
        assert chromium.js("dist.n_kept") == server_side["n_kept"] == len(kept)
        shown = json.loads(chromium.js(KEPT))
        assert [i for i, _ in shown] == [i for i, _ in kept]
        assert [q for _, q in shown] == pytest.approx([q for _, q in kept], abs=1e-9)
        text = chromium.js("document.getElementById('kept').textContent")
        assert text.startswith(f"{server_side['n_kept']} of ")
        dark = chromium.js("document.querySelectorAll('#bars > div.kept').length")
        assert dark == min(server_side["n_kept"], 20)
    assert chromium.js("page.q") == prompt  # the sliders asked nothing of the server

    # sample step by step: greedy appends the most probable token's text
    chromium.js("document.getElementById('greedy').checked = true")
    best = want["distribution"]["tokens"][0]
    assert best["id"] != want["distribution"]["eos_id"]
    chromium.js("document.getElementById('sample').click()")
    traced(chromium, prompt + best["text"])
    assert chromium.js("document.getElementById('sampled').textContent").startswith("sampled: ")
    # then a draw from q: the prompt grows by a kept token (or the model says EOS)
    chromium.js("document.getElementById('greedy').checked = false")
    before = chromium.js("page.q")
    kept_texts = {t["text"] for t in json.loads(chromium.js("JSON.stringify(dist.tokens)"))
                  if t["kept"]}  # fmt: skip
    chromium.js("document.getElementById('sample').click()")
    eos = "document.getElementById('status').textContent.includes('EOS')"
    now = wait_js(chromium, f"page.q !== {json.dumps(before)} ? page.q : {eos}")
    if now is not True:  # not EOS: one kept token's text more
        assert now.startswith(before) and now[len(before) :] in kept_texts and now != before
        traced(chromium, now)
    # undo takes the last token back
    chromium.js("document.getElementById('undo').click()")
    traced(chromium, before)

    # the forward-pass view: one position, one layer, one head, the route's numbers
    wait_js(chromium, "document.querySelectorAll('#fp-positions button').length")
    chromium.js("document.querySelector('#fp-layers button[data-key=\"1\"]').click()")
    chromium.js("document.querySelector('#fp-heads button[data-key=\"3\"]').click()")
    chromium.js("document.querySelector('#fp-positions button[data-key=\"2\"]').click()")
    wait_js(chromium, "document.getElementById('fp-status').textContent.startsWith("
                      "'layer 1, head 3, position 2')")  # fmt: skip
    cells = json.loads(chromium.js(
        "JSON.stringify([...document.querySelectorAll('#fp-svg rect.fp-cell')].map(r => "
        "[r.dataset.name, +r.dataset.r, +r.dataset.c, r.dataset.v]))"))  # fmt: skip
    traced_now = in_process(lm, {"q": before, "show": 100, "layers": [1]})
    tensors = {t["name"]: t for t in traced_now["forward"]["tensors"]}
    names = {name for name, *_ in cells}
    assert "decoder.1.self_attn.head3.weights" in names and "decoder.1.ffn.hidden" in names
    assert not any(".head1." in n or "decoder.0." in n for n in names)
    for name, r, c, v in cells:
        t = tensors[name]
        value = t["data"][c] if len(t["shape"]) == 1 else t["data"][r][c]
        assert (v == "-inf") if value is None else float(v) == value, (name, r, c, v)
    weights = [c for c in cells if c[0] == "decoder.1.self_attn.head3.weights"]
    assert {r for _, r, _, _ in weights} == {2}  # position 2's row, over every key

    shot = base64.b64decode(chromium.send("Page.captureScreenshot", format="png")["data"])
    (tmp_path / "lm_page.png").write_bytes(shot)
    assert chromium.errors() == []
    urls = [e["params"]["request"]["url"] for e in chromium.events
            if e.get("method") == "Network.requestWillBeSent"]  # fmt: skip
    assert urls and all(u.startswith((server.url, "data:", "blob:")) for u in urls), urls


def test_a_vocabulary_too_large_to_list_is_reshaped_by_the_server(chromium, tmp_path):
    """1,204 tokens: more than the server lists (100 shown + 1,000 kept), so the page asks the
    server to reshape the distribution as the sliders move, and shows its kept set."""
    torch.manual_seed(0)
    tok = CharTokenizer.fit(["".join(chr(0x4E00 + i) for i in range(1200))])
    cfg = ModelConfig(vocab_size=tok.vocab_size, d_model=16, n_heads=2, n_layers=1, d_ff=32,
                      dropout=0.0, max_len=32)  # fmt: skip
    save_model_dir(DecoderLM(cfg), tmp_path)
    tok.save(tmp_path)
    s = ServerProcess(tmp_path)
    try:
        for domain in ("Runtime", "Log", "Page"):
            chromium.send(f"{domain}.enable")
        chromium.send("Page.navigate", url=s.url + "/")
        chromium.wait_for("Page.loadEventFired")
        traced(chromium, "")
        assert chromium.js("serverSide") is True
        set_value(chromium, "top-k", "7")
        wait_js(chromium, "page.distribution.top_k === 7 && dist.n_kept === 7")
        assert chromium.js("document.getElementById('kept').textContent").startswith("7 of 1204")
        assert chromium.js("document.querySelectorAll('#bars > div.kept').length") == 7
        assert chromium.errors() == []
    finally:
        s.stop()
