"""The live glass box (GET /) in a real headless Chromium against a real `aiayn serve`.

It loads with no console errors and no request leaving the server; typing a sentence shows its
translation (the served greedy translation) and an attention picture; changing the attention
kind, layer, head and decoding step changes what is drawn; hovering a token says where it
attends; the beam search table shows kept, pruned and finished hypotheses; SVG and PNG export
work. The test saves a screenshot.
"""

import base64
import json
import time

import pytest

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
    for domain in ("Runtime", "Log", "Page", "Network"):
        chromium.send(f"{domain}.enable")
    chromium.send("Emulation.setDeviceMetricsOverride", width=1400, height=1000,
                  deviceScaleFactor=1, mobile=False)  # fmt: skip
    chromium.send("Page.navigate", url=server.url + "/")
    chromium.wait_for("Page.loadEventFired")
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
