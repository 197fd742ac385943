"""The live glass box (GET /) in a real headless Chromium against a real `aiayn serve`.

It loads with no console errors and no request leaving the server; typing a sentence shows its
translation (the served greedy translation) and an attention picture; changing the attention
kind, layer, head and decoding step changes what is drawn; hovering a token says where it
attends; the beam search table shows kept, pruned and finished hypotheses; SVG and PNG export
work. The test saves a screenshot.

The forward-pass view: three clicks (a position, a layer, a head) draw every intermediate of
that position, layer and head and nothing else, each cell holding the JSON trace's number
(which is `aiayn explain --format json`'s); the dims limit, the ReLU's zero count, the hover
read-out, a decoding step's cross-attention and logits, and the export are checked. The
tutorials' example on the page shows every number of docs/worked_example.md to its printed
precision, and GET /v1/explain/seed needs the API key.
"""

import base64
import json
import time

import pytest
import torch

pytest.importorskip("fastapi", reason="the serve extra is not installed (pip install .[serve])")
import httpx
from serving import ServerProcess

PNG = b"\x89PNG\r\n\x1a\n"
CELLS = "JSON.stringify([...document.querySelectorAll('#cells rect')].map(r => " \
        "[r.getAttribute('x'), r.getAttribute('y'), r.dataset.w, " \
        "r.getAttribute('fill-opacity')]))"  # fmt: skip


@pytest.fixture(scope="module")
def server(served_model_dir):
    s = ServerProcess(served_model_dir, "--max-beam", "4")
    yield s
    s.stop()


def wait_js(chromium, expression: str, timeout: float = 60):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := chromium.js(expression):
            return value
        time.sleep(0.1)
    raise TimeoutError(expression)


def choose(chromium, select: str, value: str) -> None:
    chromium.js(f"(() => {{ const s = document.getElementById('{select}'); s.value = '{value}';"
                f" s.dispatchEvent(new Event('change')); }})()")  # fmt: skip


def test_glass_box_page_in_headless_chromium(chromium, server, tmp_path):
    open_page(chromium, server)
    wait_js(chromium, "document.getElementById('layer').options.length")
    assert chromium.js("document.getElementById('head').options.length") == 5  # mean + 4 heads
    wait_js(chromium, "document.querySelectorAll('#cells rect').length")  # the first example

    # type a sentence: its translation and its cross-attention appear
    sentence = "three thousand and nine"
    chromium.js(f"(() => {{ const s = document.getElementById('src'); s.value = '{sentence}';"
                " s.dispatchEvent(new Event('input')); })()")  # fmt: skip
    want = httpx.post(server.url + "/v1/explain", json={"q": sentence}, timeout=60).json()
    wait_js(chromium, f"document.getElementById('translation').textContent === "
                      f"{json.dumps(want['translation']['text'] or '(empty)')}")  # fmt: skip
    n_src, n_steps = len(want["source"]["pieces"]), len(want["steps"])
    cross = json.loads(chromium.js(CELLS))
    assert len(cross) == n_src * n_steps  # one cell per (output step, source token)
    assert chromium.js("document.querySelectorAll('#matrix text.col').length") == n_src

    # layer, head, kind and step each change the picture
    choose(chromium, "layer", "1")
    layer1 = json.loads(chromium.js(CELLS))
    assert layer1 != cross and len(layer1) == len(cross)
    choose(chromium, "head", "3")
    head3 = json.loads(chromium.js(CELLS))
    assert head3 != layer1
    choose(chromium, "head", "mean")
    assert json.loads(chromium.js(CELLS)) not in (head3, layer1)
    chromium.js("(() => { const s = document.getElementById('step'); s.value = '2';"
                " s.dispatchEvent(new Event('input')); })()")  # fmt: skip
    step2 = json.loads(chromium.js(CELLS))
    faded = {y for _, y, _, opacity in step2 if opacity != "1"}
    assert faded and len({y for _, y, _, _ in step2}) - len(faded) == 3  # rows 0..2 shown
    assert "step 2" in chromium.js("document.getElementById('step-label').textContent")
    topk = chromium.js("document.getElementById('topk').textContent")
    assert want["steps"][2]["top"][0]["piece"] in topk
    choose(chromium, "kind", "enc_self")
    enc = json.loads(chromium.js(CELLS))
    assert len(enc) == n_src * n_src
    choose(chromium, "kind", "dec_self")
    assert len(json.loads(chromium.js(CELLS))) == n_steps * (n_steps + 1) // 2  # causal
    choose(chromium, "kind", "cross")

    # hovering a query token dims every other row and says where it attends
    chromium.js("document.querySelectorAll('#matrix text.row')[1]"
                ".dispatchEvent(new MouseEvent('mouseenter'))")  # fmt: skip
    assert "attends to" in chromium.js("document.getElementById('info').textContent")
    dimmed = chromium.js("document.querySelectorAll('#cells rect[opacity]').length")
    assert dimmed == len(cross) - n_src

    # beam search, step by step: candidates kept (live), pruned and finished
    fates = chromium.js("[...document.querySelectorAll('#beam-steps tr')].map(r => r.className)")
    assert "live" in fates and "pruned" in fates

    # export: SVG markup and a PNG drawn from it
    svg = chromium.js("svgMarkup()")
    assert svg.startswith("<svg") and "cells" in svg
    png = chromium.send("Runtime.evaluate", expression="pngDataURL()", awaitPromise=True,
                        returnByValue=True)["result"]["value"]  # fmt: skip
    assert base64.b64decode(png.split(",", 1)[1]).startswith(PNG)

    shot = base64.b64decode(chromium.send("Page.captureScreenshot", format="png")["data"])
    (tmp_path / "serve_page.png").write_bytes(shot)
    assert shot.startswith(PNG) and len(shot) > 20_000
    assert chromium.errors() == []
    urls = [e["params"]["request"]["url"] for e in chromium.events
            if e.get("method") == "Network.requestWillBeSent"]  # fmt: skip
    assert urls and all(u.startswith((server.url, "data:", "blob:")) for u in urls), urls


# --- the forward-pass view ------------------------------------------------------------------------

FP_CELLS = "JSON.stringify([...document.querySelectorAll('#fp-svg rect.fp-cell')].map(r => " \
           "[r.dataset.name, +r.dataset.r, +r.dataset.c, r.dataset.v]))"  # fmt: skip


def click(chromium, selector: str) -> None:
    """One click, as a learner makes it."""
    chromium.js(f"document.querySelector({json.dumps(selector)}).click()")


def open_page(chromium, server) -> None:
    for domain in ("Runtime", "Log", "Page", "Network"):
        chromium.send(f"{domain}.enable")
    chromium.send("Emulation.setDeviceMetricsOverride", width=1400, height=1000,
                  deviceScaleFactor=1, mobile=False)  # fmt: skip
    chromium.send("Page.navigate", url=server.url + "/")
    chromium.wait_for("Page.loadEventFired")
    wait_js(chromium, "document.querySelectorAll('#fp-positions button').length")


def wait_forward_pass(chromium, layer: int) -> None:
    wait_js(chromium, f"document.getElementById('fp-status').textContent.startsWith("
                      f"'layer {layer}: traced')")  # fmt: skip


def drawn(chromium) -> dict[str, dict[tuple[int, int], str]]:
    cells: dict[str, dict[tuple[int, int], str]] = {}
    for name, r, c, v in json.loads(chromium.js(FP_CELLS)):
        cells.setdefault(name, {})[(r, c)] = v
    return cells


def assert_cells_are_the_trace(cells, tensors) -> None:
    """Every drawn cell holds the JSON trace's number at its place, exactly."""
    for name, placed in cells.items():
        t = tensors[name]
        for (r, c), v in placed.items():
            want = t["data"][c] if len(t["shape"]) == 1 else t["data"][r][c]
            assert (v == "-inf") if want is None else float(v) == want, (name, r, c, v, want)


def head_or_none(name: str, head: int) -> bool:
    return ".head" not in name or f".head{head}." in name


def test_forward_pass_view_shows_every_stage_with_the_traces_numbers(chromium, server, tmp_path,
                                                                     served_model_dir):  # fmt: skip
    from aiayn.glassbox.explain_report import explain_report
    from aiayn.glassbox.render import View

    open_page(chromium, server)
    q = chromium.js("document.getElementById('src').value")
    # three clicks: a source piece, a layer, a head
    click(chromium, '#fp-positions button[data-key="enc2"]')
    click(chromium, '#fp-layers button[data-key="1"]')
    click(chromium, '#fp-heads button[data-key="3"]')
    wait_forward_pass(chromium, 1)
    body = {"q": q, "layers": [1], "steps": [], "stack": "encoder", "top_k": 8}
    served = httpx.post(server.url + "/v1/explain", json=body, timeout=60).json()
    tensors = {t["name"]: t for t in served["tensors"]}
    assert tensors and not any(n.startswith("step") for n in tensors)  # the encoder only
    cells = drawn(chromium)
    # every intermediate of this position, layer and head is drawn, and nothing else
    assert set(cells) == {n for n in tensors if head_or_none(n, 3)}
    assert {r for placed in cells.values() for r, _ in placed} >= {2}
    assert_cells_are_the_trace(cells, tensors)
    # the served numbers are `aiayn explain --format json`'s (the server decodes on 1 thread)
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        view = View(layers=(1,), steps=())
        cli = json.loads(explain_report(str(served_model_dir), q, fmt="json", top_k=8,
                                        view=view, device="cpu"))  # fmt: skip
    finally:
        torch.set_num_threads(before)
    assert [t["name"] for t in cli["tensors"]] == list(tensors)
    for t in cli["tensors"]:
        assert t["data"] == tensors[t["name"]]["data"], t["name"]
    # shapes as the paper writes them; the ReLU's zeros counted
    text = chromium.js("document.getElementById('fp-svg').textContent")
    for shape in ("1 × d_model", "1 × d_k", "n × d_k", "1 × n", "1 × h·d_k", "1 × d_ff"):
        assert shape in text, shape
    hidden = tensors["encoder.1.ffn.hidden"]
    zeros = sum(v == 0 for v in hidden["data"][2])
    assert f"{zeros} of {hidden['shape'][1]} are 0 (ReLU)" in text
    # the dims limit: model-dimension rows shrink, a row over the keys keeps every key
    chromium.js("(() => { const d = document.getElementById('fp-dims'); d.value = '4';"
                " d.dispatchEvent(new Event('change')); })()")  # fmt: skip
    cells4 = drawn(chromium)
    assert {c for _, c in cells4["encoder.1.ffn.hidden"]} == {0, 1, 2, 3}
    n_src = len(served["source"]["pieces"])
    assert {c for _, c in cells4["encoder.1.self_attn.head3.weights"]} == set(range(n_src))
    assert_cells_are_the_trace(cells4, tensors)
    # hovering a cell reads its value out
    chromium.js("document.querySelector('#fp-svg rect[data-name=\"encoder.embed.sum\"]')"
                ".dispatchEvent(new MouseEvent('mouseover', {bubbles: true}))")  # fmt: skip
    info = chromium.js("document.getElementById('fp-info').textContent")
    assert info == f"encoder.embed.sum [row 2, d0] = {cells4['encoder.embed.sum'][(2, 0)]}"

    # a decoding step: self-attention over what was fed, cross-attention, logits at the top
    t = min(2, len(served["steps"]) - 1)
    click(chromium, f'#fp-positions button[data-key="dec{t}"]')
    wait_js(chromium, f"document.getElementById('fp-svg').textContent.includes("
                      f"'decoding step {t}:')")  # fmt: skip
    steps = sorted({0, t})
    body = {"q": q, "layers": [1], "steps": steps, "stack": "decoder", "top_k": 8}
    dec = httpx.post(server.url + "/v1/explain", json=body, timeout=60).json()
    dec_tensors = {x["name"]: x for x in dec["tensors"]}
    assert dec_tensors and all(n.startswith(("step0.", f"step{t}.")) for n in dec_tensors)
    cells = drawn(chromium)
    cross_kv = {f"step0.decoder.1.cross_attn.head3.{x}" for x in ("k", "v")}
    want = {n for n in dec_tensors if n.startswith(f"step{t}.") and head_or_none(n, 3)}
    assert set(cells) == want | cross_kv
    assert {f"step{t}.logits", f"step{t}.probs", f"step{t}.decoder.1.cross_attn.head3.weights",
            f"step{t}.decoder.1.norm3"} <= set(cells)  # fmt: skip
    assert_cells_are_the_trace(cells, dec_tensors)
    chosen = dec["steps"][t]["chosen"]
    top = chromium.js("[...document.querySelectorAll('#fp-svg .fp-top.hot')].map(e => "
                      "e.textContent).join('|')")  # fmt: skip
    assert top.startswith("1. ") and f"{chosen}  id" in top and "← chosen" in top

    # the picture exports
    svg = chromium.js("svgMarkup('fp-svg')")
    assert svg.startswith("<svg") and "fp-cell" in svg and "fp-sinusoid" in svg
    png = chromium.send("Runtime.evaluate", expression="pngDataURL('fp-svg')", awaitPromise=True,
                        returnByValue=True)["result"]["value"]  # fmt: skip
    assert base64.b64decode(png.split(",", 1)[1]).startswith(PNG)
    timing = chromium.js("fp.timing")
    assert timing["total_ms"] >= timing["request_ms"] > 0
    chromium.js("document.getElementById('fp-section').scrollIntoView()")
    shot = base64.b64decode(chromium.send("Page.captureScreenshot", format="png")["data"])
    (tmp_path / "forward_pass.png").write_bytes(shot)
    assert chromium.errors() == []


# --- the tutorials' example -----------------------------------------------------------------------


def test_seed_example_on_the_page_has_every_number_of_the_worked_example(chromium, server):
    from glassbox.test_explain import ALIASES, DOC, assert_matches, doc_sections, labelled_arrays

    open_page(chromium, server)
    click(chromium, "#seed-open")
    wait_js(chromium, "document.querySelectorAll('#seed table').length")
    tables = chromium.js("JSON.stringify([...document.querySelectorAll('#seed table')].map(t => "
                         "[t.dataset.label, t.className, [...t.querySelectorAll('tr')].map(r => "
                         "[...r.querySelectorAll('td')].map(d => d.textContent))]))")  # fmt: skip
    shown = {label: (cls, rows) for label, cls, rows in json.loads(tables)}

    def numbers(label: str, row: int | None = None) -> list:
        match = [k for k in shown if k == label or k.split(" = ")[0] == label]
        assert match, f"the page shows no {label!r}"
        rows = [[float(v) for v in r] for r in shown[match[0]][1]]
        rows = rows if len(rows) > 1 else rows[0]
        return rows if row is None else rows[row]

    with open(DOC, encoding="utf-8") as f:
        doc = doc_sections(f.read())
    found = 0
    for sec in ("1", "3"):
        for label, (raw, _) in labelled_arrays(doc[sec]).items():
            name, row = ALIASES.get(label, (label, None))
            assert_matches(raw, numbers(name, row))
            found += 1
    expected2 = labelled_arrays(doc["2"])
    for pos in range(3):  # the model's float32 sinusoids, printed to 6 decimals
        assert_matches(expected2[f"d=4, pos={pos}"][0], numbers(f"d=4, pos={pos}"), 6)
    assert found >= 26
    # where the tutorials are wrong, the page says so, with the numbers they printed
    seeds_in_doc = [v for label, (_, v) in expected2.items() if not label.startswith("d=4")]
    assert seeds_in_doc == [numbers("seed 003 pos=1 (wrong)"), numbers("seed 004 pos=2 (wrong)")]
    assert shown["seed 003 pos=1 (wrong)"][0] == "wrong" == shown["seed 004 K"][0]
    assert "seed 003 is wrong here" in chromium.js("document.getElementById('seed').textContent")
    assert chromium.errors() == []


def test_seed_endpoint_needs_the_key_and_the_schema_names_stack(served_model_dir):
    from aiayn.glassbox.seed_example import seed_example_json

    s = ServerProcess(served_model_dir, "--api-key", "k3y")
    try:
        assert httpx.get(s.url + "/v1/explain/seed", timeout=30).status_code == 401
        r = httpx.get(s.url + "/v1/explain/seed", headers={"Authorization": "Bearer k3y"},
                      timeout=30)  # fmt: skip
        assert r.status_code == 200 and r.json() == seed_example_json()
        schema = httpx.get(s.url + "/openapi.json", headers={"Authorization": "Bearer k3y"},
                           timeout=30).json()  # fmt: skip
        assert "get" in schema["paths"]["/v1/explain/seed"]
        explain_body = schema["paths"]["/v1/explain"]["post"]["requestBody"]["content"]
        ref = explain_body["application/json"]["schema"]["$ref"].rsplit("/", 1)[-1]
        stack = schema["components"]["schemas"][ref]["properties"]["stack"]  # documented
        assert {"encoder", "decoder"} <= set(json.dumps(stack).replace('"', " ").split())
    finally:
        s.stop()
