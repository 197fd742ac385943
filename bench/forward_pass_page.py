"""The page's forward-pass view (issue 23): how long a learner waits after choosing a position
and a layer, in a real headless Chromium against a real `aiayn serve`. Prints JSON.

    python bench/forward_pass_page.py --model quickstart/model [--sentence "..."] [--threads 1]

For the sentence (default: the model's first example), for every layer, every source position
and every decoding step, the page's cache is emptied and the position's chip is clicked: the
time from the click to the drawn chain (`fp.timing.total_ms`: the POST /v1/explain that
traces the layer, then drawing the SVG) is recorded, with the part spent waiting for the server
(`request_ms`) and drawing (`draw_ms`). Needs Debian's `chromium` and websocket-client (the
page tests' `tests/chromium.py` drives it).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from datetime import date
from pathlib import Path

from serve_load import cpu_name, launch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from chromium import Chromium  # the page tests' DevTools driver, found through sys.path


def wait_js(browser: Chromium, expression: str, timeout: float = 60) -> object:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := browser.js(expression):
            return value
        time.sleep(0.01)
    raise TimeoutError(expression)


def measure(browser: Chromium, key: str, layer: int) -> dict:
    """Click a position chip with an empty cache; wait until the chain is drawn."""
    browser.js("fp.cache.clear(); fp.timing = null")
    browser.js(f"fp.layer = {layer}; document.querySelector("
               f"'#fp-positions button[data-key=\"{key}\"]').click()")  # fmt: skip
    wait_js(browser, "fp.timing !== null")
    return browser.js("fp.timing")


def summary(xs: list[float]) -> dict:
    return {"median": round(statistics.median(xs), 1), "max": round(max(xs), 1), "n": len(xs)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", type=Path, required=True)
    ap.add_argument("--sentence", help="default: the model's first example sentence")
    ap.add_argument("--threads", type=int, default=1, help="the server's torch threads")
    ap.add_argument("--chromium", default="chromium")
    args = ap.parse_args()
    proc, url = launch(args.model, ["--threads", str(args.threads), "--timeout", "120"])
    browser = Chromium(args.chromium)
    try:
        browser.send("Page.enable")
        browser.send("Page.navigate", url=url + "/")
        browser.wait_for("Page.loadEventFired")
        if args.sentence:
            browser.js(f"document.getElementById('src').value = {json.dumps(args.sentence)};"
                       " translate()")  # fmt: skip
        wait_js(browser, "document.querySelectorAll('#fp-positions button').length")
        keys = browser.js("[...document.querySelectorAll('#fp-positions button')]"
                          ".map(b => b.dataset.key)")  # fmt: skip
        layers = browser.js("info.model.n_layers")
        measure(browser, keys[0], 0)  # warm-up: the first trace pays for the explicit path
        runs = {"encoder": [], "decoder": []}
        for layer in range(layers):
            for key in keys:
                runs["encoder" if key.startswith("enc") else "decoder"].append(
                    measure(browser, key, layer)
                )
        sentence = browser.js("trace.source.text")
        report = {
            "date": date.today().isoformat(),
            "cpu": cpu_name(),
            "server_threads": args.threads,
            "model": str(args.model),
            "sentence": sentence,
            "source_pieces": sum(k.startswith("enc") for k in keys),
            "decoding_steps": sum(k.startswith("dec") for k in keys),
            "layers": layers,
        }
        for kind, timings in runs.items():
            report[kind] = {part: summary([t[part] for t in timings])
                            for part in ("total_ms", "request_ms", "draw_ms")}  # fmt: skip
        print(json.dumps(report, indent=1))
    finally:
        browser.close()
        proc.terminate()
        proc.wait(timeout=60)


if __name__ == "__main__":
    main()
