"""The glass box of models with the switches after the paper (RoPE, ALiBi, RMSNorm, SwiGLU,
grouped-query K/V, a window, QK-norm, no biases): every new intermediate is filed under a
stable name with a plain-language label, its numbers are a NumPy recomputation's from the
ones before it, the architecture line names the switches, K/V with J < H heads are shown as
the shared head each query head reads (a head filter keeps them), a window's ring cache is
labelled by position, and `aiayn explain` (text, JSON, HTML) and the live pages draw it all.
"""

import html
import json
import math
import time

import numpy as np
import pytest
import torch

from aiayn.cli.main import main
from aiayn.config import ModelConfig
from aiayn.glassbox.explain_lm import explain_lm
from aiayn.glassbox.lm_page import lm_page_data
from aiayn.glassbox.render import View
from aiayn.glassbox.render_lm import lm_to_html, lm_to_json, lm_to_text
from aiayn.nn.encoder_only import EncoderClassifier
from aiayn.nn.model import Transformer
from aiayn.nn.variants import DecoderLM
from aiayn.store.model_dir import save_model_dir
from aiayn.text.charset import CharTokenizer

TEXT = "some training text, with more letters: the quick brown fox jumps over a lazy dog"
PROMPT = "the fox jumps"
H, J, W, D = 4, 2, 4, 32  # query heads, K/V heads, window, d_model
# every switch at once (LLaMA-like, plus a window and QK-norm), and ALiBi with one K/V head
SWITCHED = dict(positional="rope", norm="rmsnorm", activation="swiglu", kv_heads=J,
                attn_window=W, qk_norm=True, bias=False)  # fmt: skip
ALIBI = dict(positional="alibi", kv_heads=1)
ARCH = "differs from the paper: RoPE, RMSNorm, SwiGLU, GQA 4->2, window 4, QK-norm, no biases"
NEW_LEAVES = ("q_raw", "k_raw", "q_unrotated", "k_unrotated", "rope_cos", "rope_sin",
              "band_mask", "ffn.gate", "ffn.up")  # fmt: skip
ATOL = 1e-5  # fp32 recomputations of the same few products


def config(tok: CharTokenizer, **switches) -> ModelConfig:
    return ModelConfig(vocab_size=tok.vocab_size, d_model=D, n_heads=H, n_layers=2, d_ff=64,
                       dropout=0.0, max_len=32, **switches)  # fmt: skip


def save(model, tok: CharTokenizer, path):
    save_model_dir(model, path)
    tok.save(path)
    return path


@pytest.fixture(scope="module")
def tok():
    return CharTokenizer.fit([TEXT])


@pytest.fixture(scope="module")
def lm(tok):
    torch.manual_seed(0)
    model = DecoderLM(config(tok, **SWITCHED)).eval()
    with torch.no_grad():  # QK-norm's gains start at 1: make them count in the recomputation
        for layer in model.decoder.layers:
            layer.self_attn.q_norm.weight.uniform_(0.5, 1.5)
            layer.self_attn.k_norm.weight.uniform_(0.5, 1.5)
    return model


@pytest.fixture(scope="module")
def trace(lm, tok):
    return explain_lm(lm, tok, PROMPT, max_len=2)


def _np(x: torch.Tensor) -> np.ndarray:
    return x.detach().double().numpy()


def rms_norm(x: np.ndarray, g: np.ndarray, eps: float) -> np.ndarray:
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * g


def angles(pos: np.ndarray, K: int, base: float = 10000.0) -> np.ndarray:
    """RoFormer's angle pos / base^(2i/K) of pair i, at dims i and i + K/2 (halves layout)."""
    a = pos[:, None] / base ** (np.arange(0, K, 2) / K)[None, :]
    return np.hstack([a, a])


def rope(x: np.ndarray, pos: np.ndarray) -> np.ndarray:
    """RoPE from scratch: x cos + rotate_half(x) sin, rotate_half(x) = [-x2, x1]."""
    K, a = x.shape[-1], angles(pos, x.shape[-1])
    return x * np.cos(a) + np.hstack([-x[:, K // 2 :], x[:, : K // 2]]) * np.sin(a)


# --- a language model with every switch -------------------------------------------------------


def test_every_new_intermediate_is_named_and_labelled(trace):
    for leaf in NEW_LEAVES:
        head_leaf = leaf in ("q_raw", "k_raw", "q_unrotated", "k_unrotated")
        name = f"decoder.0.self_attn.head{H}.{leaf}" if head_leaf else f"decoder.0.self_attn.{leaf}"
        name = name.replace("self_attn.ffn.", "ffn.")
        assert name in trace.entries, name
        assert len(trace.entries[name].description) > 20, name
    e = trace.entries
    assert "decoder.embed.positions" not in e and "decoder.embed.sum" not in e
    assert "no positions are added here (RoPE" in e["decoder.embed.tokens"].description
    assert e["decoder.0.norm1"].description.startswith("RMSNorm")
    assert "QK-norm" in e["decoder.0.self_attn.head1.q_raw"].description
    assert "before RoPE" in e["decoder.0.self_attn.head1.q_unrotated"].description
    assert "window" in e["decoder.0.self_attn.band_mask"].description
    assert "2 shared K/V heads, each read by 2 query heads: query head 3 reads K/V head 2" in (
        e["decoder.0.self_attn.head3.v"].description
    )
    assert e["decoder.0.ffn.gate"].description.startswith("SwiGLU's gate swish(x W_1)")
    assert trace.config["differs"] == ARCH.split(": ")[1]


def test_the_new_numbers_are_recomputed_from_the_ones_before(lm, trace):
    cfg, attn = lm.cfg, lm.decoder.layers[0].self_attn
    K, T, eps = cfg.d_k, len(trace.src_ids), cfg.layer_norm_eps
    x = _np(trace["decoder.embed.tokens"])  # no positions added: the input of layer 0
    w_in = _np(attn.in_proj.weight)  # [W^Q (D rows); W^K (J K rows); W^V (J K rows)], no bias
    pos = np.arange(T, dtype=np.float64)
    for leaf, fn in (("rope_cos", np.cos), ("rope_sin", np.sin)):
        want = fn(angles(pos, K))
        np.testing.assert_allclose(_np(trace[f"decoder.0.self_attn.{leaf}"]), want, atol=ATOL)
    causal = np.tril(np.ones((T, T), dtype=bool))
    band = causal & (np.arange(T)[:, None] - np.arange(T)[None, :] < W)
    np.testing.assert_array_equal(_np(trace["decoder.0.self_attn.band_mask"]), band)
    for h in range(1, H + 1):
        j = (h - 1) // (H // J)  # the K/V head query head h reads (0-based)
        p = f"decoder.0.self_attn.head{h}"
        q_raw = x @ w_in[(h - 1) * K : h * K].T
        k_raw = x @ w_in[D + j * K : D + (j + 1) * K].T
        v = x @ w_in[D + J * K + j * K : D + J * K + (j + 1) * K].T
        q_n = rms_norm(q_raw, _np(attn.q_norm.weight), eps)
        k_n = rms_norm(k_raw, _np(attn.k_norm.weight), eps)
        for leaf, want in (("q_raw", q_raw), ("k_raw", k_raw), ("q_unrotated", q_n),
                           ("k_unrotated", k_n), ("q", rope(q_n, pos)), ("k", rope(k_n, pos)),
                           ("v", v)):  # fmt: skip
            np.testing.assert_allclose(_np(trace[f"{p}.{leaf}"]), want, atol=ATOL, err_msg=leaf)
        scores = np.where(band, rope(q_n, pos) @ rope(k_n, pos).T / math.sqrt(K), -np.inf)
        np.testing.assert_allclose(_np(trace[f"{p}.scores_masked"]), scores, atol=ATOL)
    # K/V shared: query heads 1 and 2 read the same K/V head, 3 and 4 the other
    assert torch.equal(trace["decoder.0.self_attn.head1.k"], trace["decoder.0.self_attn.head2.k"])
    assert not torch.equal(trace["decoder.0.self_attn.head2.k"],
                           trace["decoder.0.self_attn.head3.k"])  # fmt: skip
    ffn = lm.decoder.layers[0].ffn
    y = _np(trace["decoder.0.norm1"])
    gate = y @ _np(ffn.w_1.weight).T
    gate = gate / (1 + np.exp(-gate))  # swish
    up = y @ _np(ffn.w_3.weight).T
    np.testing.assert_allclose(_np(trace["decoder.0.ffn.gate"]), gate, atol=ATOL)
    np.testing.assert_allclose(_np(trace["decoder.0.ffn.up"]), up, atol=ATOL)
    np.testing.assert_allclose(_np(trace["decoder.0.ffn.hidden"]), gate * up, atol=ATOL)


def test_text_json_and_html_show_every_entry(trace):
    text = lm_to_text(trace)
    assert ARCH in text.splitlines()[1]
    missing = [n for n in trace.names() if f"\n{n}  [" not in text and not n.startswith("next.")]
    assert missing == []
    order = [text.index(f"\ndecoder.0.{n}  [") for n in (
        "self_attn.rope_cos", "self_attn.band_mask", "self_attn.head1.q_raw",
        "self_attn.head1.q_unrotated", "self_attn.head1.q", "self_attn.head1.scores",
        "norm1", "ffn.gate", "ffn.up", "ffn.hidden")]  # fmt: skip
    assert order == sorted(order)  # in the order the model computes them
    data = lm_to_json(trace)
    json.dumps(data, allow_nan=False)
    assert {t["name"] for t in data["tensors"]} >= {f"decoder.1.ffn.{x}" for x in ("gate", "up")}
    assert data["config"]["kv_heads"] == J and data["config"]["norm_type"] == "rmsnorm"
    page = lm_to_html(trace)
    assert "decoder.0.self_attn.head4.k_unrotated" in page and html.escape(ARCH) in page


def test_a_head_filter_keeps_the_shared_kv_head(lm, tok):
    view = View(layers=(1,), heads=(3,))
    trace = explain_lm(lm, tok, PROMPT, max_len=0, want=view.shows)
    text = lm_to_text(trace, view)
    for leaf in ("k", "v", "k_raw", "k_unrotated", "q"):
        assert f"\ndecoder.1.self_attn.head3.{leaf}  [" in text, leaf
    assert ".head1." not in text and ".head4." not in text and "decoder.0." not in text
    full = explain_lm(lm, tok, PROMPT, max_len=0)
    assert torch.equal(trace["decoder.1.self_attn.head3.k"], full["decoder.1.self_attn.head4.k"])


def test_the_page_data_holds_the_new_intermediates(lm, tok):
    data = lm_page_data(lm, tok, PROMPT, layers=[0], heads=[2])
    names = {t["name"] for t in data["forward"]["tensors"]}
    for leaf in ("rope_cos", "band_mask", "head2.q_raw", "head2.k_unrotated", "head2.k"):
        assert f"decoder.0.self_attn.{leaf}" in names, leaf
    assert "decoder.0.ffn.gate" in names and "differs" in data["config"]
    assert len(data["attention"]["w"][0]) == H  # H maps, though K has J heads


# --- the command line on the three architectures ------------------------------------------------


def test_cli_a_switched_translator_text_json_html(tok, tmp_path, capsys):
    torch.manual_seed(0)
    path = save(Transformer(config(tok, **SWITCHED)).eval(), tok, tmp_path / "tr")
    argv = ["explain", "--model", str(path), "the fox", "--max-len", "7"]
    assert main([*argv, "--layers", "0", "--heads", "4"]) == 0
    text = capsys.readouterr().out
    assert ARCH in text
    for name in (
        "encoder.0.self_attn.head4.q_raw",
        "encoder.0.self_attn.band_mask",
        "step6.decoder.0.self_attn.head4.k_unrotated",
        "step6.decoder.0.ffn.up",
        "step0.decoder.0.cross_attn.head4.k_raw",
        "step3.decoder.0.self_attn.rope_sin",
    ):
        assert f"\n{name}  [" in text, name  # fmt: skip
    assert main([*argv, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    tensors = {t["name"]: t for t in data["tensors"]}
    for t in tensors.values():  # every column label names a column
        assert t["cols"] is None or len(t["cols"]) == t["shape"][-1], t["name"]
    # step 6 reads a ring of W = 4 slots: slot s holds position 6 - (6 - s) mod 4
    fed = ["<s>", *data["translation"]["pieces"]]
    step6 = tensors["step6.decoder.1.self_attn.head1.weights"]
    assert step6["cols"] == [f"{c}:{fed[c]}" for c in (4, 5, 6, 3)]
    assert tensors["step6.decoder.1.self_attn.head2.k"]["rows"] == step6["cols"]
    # cross-attention: no RoPE, no window, but its K/V are shared as well
    cross = "step0.decoder.0.cross_attn.head{}.k"
    assert tensors[cross.format(3)]["data"] == tensors[cross.format(4)]["data"]
    assert "step0.decoder.0.cross_attn.rope_cos" not in tensors
    html_out = tmp_path / "explain.html"
    assert main([*argv, "--html", str(html_out), "--layers", "1"]) == 0
    page = html_out.read_text()
    assert "step2.decoder.1.self_attn.head1.q_unrotated" in page and html.escape(ARCH) in page


def test_a_pre_ln_translators_final_rmsnorm_is_shown(tok):
    from aiayn.glassbox.explain import explain
    from aiayn.glassbox.render import to_text

    torch.manual_seed(0)
    model = Transformer(config(tok, norm="rmsnorm", norm_first=True)).eval()
    ex = explain(model, tok, "the fox", max_len=2)
    text = to_text(ex)
    for name in ("encoder.norm", "step1.decoder.norm"):
        assert f"\n{name}  [" in text and ex.entries[name].description.startswith(
            "the final RMSNorm"
        ), name
    assert "pre-LN, sinusoidal positions; differs from the paper: RMSNorm" in text


def test_a_classifiers_embedding_rmsnorm_is_named(tok):
    from aiayn.classify.classifier import Classifier
    from aiayn.glassbox.explain_cls import explain_classifier
    from aiayn.glassbox.render_cls import cls_to_json, cls_to_text
    from aiayn.runtime.device import choose_precision

    torch.manual_seed(0)
    cfg = config(tok, norm="rmsnorm", pooling="cls", pooler=True, embed_norm=True)
    model = EncoderClassifier(cfg, 2, ["neg", "pos"]).eval()
    c = Classifier(model, tok, choose_precision("fp32", torch.device("cpu"), decoding=True))
    exp = explain_classifier(c, "a lazy dog")
    assert "embedding RMSNorm" in cls_to_text(exp).splitlines()[1]
    about = {t["name"]: t["description"] for t in cls_to_json(exp)["tensors"]}
    assert about["encoder.embed.norm"].startswith("RMSNorm")
    assert about["encoder.1.norm2"].startswith("RMSNorm")


def test_cli_alibi_classifier_and_language_model(tok, tmp_path, capsys):
    torch.manual_seed(0)
    labels = ["neg", "pos"]
    cls = save(EncoderClassifier(config(tok, **ALIBI), 2, labels).eval(), tok, tmp_path / "c")
    assert main(["explain", "--model", str(cls), "--text", "a lazy dog", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert "ALiBi, MQA 4->1" in data["config"]["differs"]
    tensors = {t["name"]: t for t in data["tensors"]}
    T = len(data["input"]["pieces"])
    dist = np.abs(np.arange(T)[:, None] - np.arange(T)[None, :])
    for h in range(1, H + 1):  # ALiBi's slopes for 4 heads: 2^(-8h/4)
        p = f"encoder.1.self_attn.head{h}"
        bias = np.array(tensors[f"{p}.alibi_bias"]["data"])
        np.testing.assert_allclose(bias, -(2.0 ** (-2 * h)) * dist, atol=1e-6)
        scaled = np.array(tensors[f"{p}.scores"]["data"]) / math.sqrt(D // H) + bias
        np.testing.assert_allclose(np.array(tensors[f"{p}.scores_scaled"]["data"]), scaled,
                                   atol=1e-4)  # fmt: skip
        assert "ALiBi" in tensors[f"{p}.alibi_bias"]["description"]
    assert (
        tensors["encoder.0.self_attn.head1.v"]["data"]
        == (tensors["encoder.0.self_attn.head4.v"]["data"])
    )  # one K/V head for all four
    assert "ALiBi" in tensors["encoder.embed.tokens"]["description"]

    lm = save(DecoderLM(config(tok, **ALIBI)).eval(), tok, tmp_path / "lm")
    assert main(["explain", "--model", str(lm), "--prompt", "the", "--max-len", "1"]) == 0
    text = capsys.readouterr().out
    assert "differs from the paper: ALiBi, MQA 4->1" in text
    assert "\ndecoder.0.self_attn.head2.alibi_bias  [" in text
    html_out = tmp_path / "lm.html"
    argv = ["explain", "--model", str(lm), "--prompt", "the", "--html", str(html_out)]
    assert main(argv) == 0
    assert "decoder.1.self_attn.head4.alibi_bias" in html_out.read_text()


def test_the_notebook_views_of_a_switched_translator(tok):
    """ForwardPassView draws the new intermediates; AttentionView puts a ring cache's slots
    back at the positions they hold (row t: the window's W keys, summing to 1)."""
    from aiayn.glassbox.explain import explain
    from aiayn.glassbox.notebook import AttentionView, ForwardPassView

    torch.manual_seed(0)
    ex = explain(Transformer(config(tok, **SWITCHED)).eval(), tok, "the fox", max_len=7)
    page = ForwardPassView(ex, 1, 3, step=6)._repr_html_()
    for leaf in ("self_attn.head3.q_raw", "self_attn.head3.k_unrotated", "self_attn.rope_sin",
                 "self_attn.band_mask", "ffn.gate", "ffn.up"):  # fmt: skip
        assert f"step6.decoder.1.{leaf}" in page, leaf
    assert "RMSNorm" in page and "gate ⊙ up" in page
    w = AttentionView(ex, "dec_self", 1, 2).value
    weights = ex["step6.decoder.1.self_attn.head2.weights"][0]  # slots hold 4, 5, 6, 3
    assert torch.equal(w[6, 3:7], weights[[3, 0, 1, 2]]) and float(w[6, :3].abs().sum()) == 0
    assert torch.allclose(w.sum(1), torch.ones(len(ex.steps)), atol=1e-6)


# --- the live pages, in headless Chromium ---------------------------------------------------------


def _wait(chromium, expression: str, timeout: float = 60):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := chromium.js(expression):
            return value
        time.sleep(0.05)
    raise TimeoutError(expression)


CELLS = "JSON.stringify([...new Set([...document.querySelectorAll('#fp-svg rect.fp-cell')]" \
    ".map(r => r.dataset.name))])"  # fmt: skip


def test_the_lm_page_draws_a_switched_models_intermediates(chromium, lm, tok, tmp_path):
    pytest.importorskip("fastapi", reason="the serve extra is not installed (pip install .[serve])")
    from serving import ServerProcess

    path = save(lm, tok, tmp_path / "lm")
    server = ServerProcess(path)
    try:
        for domain in ("Runtime", "Log", "Page"):
            chromium.send(f"{domain}.enable")
        chromium.send("Page.navigate", url=server.url + "/")
        chromium.wait_for("Page.loadEventFired")
        chromium.js(
            "(() => { const e = document.getElementById('prompt'); "
            f"e.value = {json.dumps(PROMPT)}; e.dispatchEvent(new Event('input')); }})()"
        )
        _wait(chromium, f"page !== null && page.q === {json.dumps(PROMPT)}")  # fmt: skip
        _wait(chromium, "document.querySelectorAll('#fp-positions button').length")
        chromium.js("document.querySelector('#fp-heads button[data-key=\"3\"]').click()")
        chromium.js("document.querySelector('#fp-positions button[data-key=\"6\"]').click()")
        _wait(chromium, "document.getElementById('fp-status').textContent.startsWith("
                        "'layer 0, head 3, position 6')")  # fmt: skip
        names = set(json.loads(chromium.js(CELLS)))
        for leaf in ("head3.q_raw", "head3.k_raw", "head3.q_unrotated", "head3.k", "head3.v",
                     "rope_cos", "rope_sin", "band_mask"):  # fmt: skip
            assert f"decoder.0.self_attn.{leaf}" in names, leaf
        assert "decoder.0.ffn.gate" in names and "decoder.0.ffn.up" in names
        svg = chromium.js("document.getElementById('fp-svg').textContent")
        assert ARCH in svg and "residual and RMSNorm" in svg
        assert "2 shared K/V heads, each read by 2 query heads: head 3 reads K/V head 2" in svg
        assert chromium.errors() == []
    finally:
        code, _, err = server.stop()
    assert code == 0 and "Traceback" not in err, err[-4000:]


def test_the_translators_page_draws_a_switched_models_forward_pass(chromium, tok, tmp_path):
    """Three clicks on a switched translator's page (a source piece, a layer, a head) draw
    every intermediate the server traced for them, the new ones included; then a decoding
    step past the window (a ring cache), its self- and cross-attention."""
    pytest.importorskip("fastapi", reason="the serve extra is not installed (pip install .[serve])")
    import httpx
    from serving import ServerProcess

    torch.manual_seed(0)
    path = save(Transformer(config(tok, **SWITCHED)).eval(), tok, tmp_path / "tr")
    server = ServerProcess(path)
    try:
        for domain in ("Runtime", "Log", "Page"):
            chromium.send(f"{domain}.enable")
        chromium.send("Page.navigate", url=server.url + "/")
        chromium.wait_for("Page.loadEventFired")
        _wait(chromium, "document.querySelectorAll('#fp-layers button').length")
        q = "the lazy dog"
        chromium.js(f"document.getElementById('src').value = {json.dumps(q)}; translate()")
        _wait(chromium, f"trace !== null && trace.source.text === {json.dumps(q)} && "
                        "document.querySelectorAll('#fp-positions button').length")  # fmt: skip
        for selector in ('#fp-positions button[data-key="enc2"]', '#fp-layers button[data-key="1"]',
                         '#fp-heads button[data-key="3"]'):  # fmt: skip
            chromium.js(f"document.querySelector({json.dumps(selector)}).click()")
        _wait(chromium, "document.getElementById('fp-status').textContent.startsWith("
                        "'layer 1: traced')")  # fmt: skip
        body = {"q": q, "layers": [1], "steps": [], "stack": "encoder", "top_k": 8}
        served = httpx.post(server.url + "/v1/explain", json=body, timeout=60).json()
        names = set(json.loads(chromium.js(CELLS)))
        shown = {n for n in (t["name"] for t in served["tensors"])
                 if ".head" not in n or ".head3." in n}  # fmt: skip
        assert names == shown  # every one traced for this layer and head, and nothing else
        assert {"encoder.1.self_attn.head3.q_raw", "encoder.1.self_attn.head3.k_unrotated",
                "encoder.1.self_attn.band_mask", "encoder.1.ffn.gate"} <= names  # fmt: skip
        svg = chromium.js("document.getElementById('fp-svg').textContent")
        assert ARCH in svg and "RMSNorm(x + FFN(x))" in svg and "gate ⊙ up" in svg
        assert "2 shared K/V heads, each read by 2 query heads: head 3 reads K/V head 2" in svg
        assert "no positions are added here (RoPE" in svg
        t = min(5, len(served["steps"]) - 1)  # past the window of 4: the ring's slots
        assert t >= W
        chromium.js(f"document.querySelector('#fp-positions button[data-key=\"dec{t}\"]').click()")
        _wait(chromium, f"document.getElementById('fp-svg').textContent.includes("
                        f"'decoding step {t}:')")  # fmt: skip
        names = set(json.loads(chromium.js(CELLS)))
        for leaf in ("self_attn.head3.k_raw", "self_attn.rope_cos", "self_attn.band_mask",
                     "cross_attn.head3.q_raw", "ffn.up"):  # fmt: skip
            assert f"step{t}.decoder.1.{leaf}" in names, leaf
        assert "step0.decoder.1.cross_attn.head3.k_raw" in names  # the source's, at step 0
        # the decoder self-attention picture puts the ring's slots back at their positions
        chromium.js("(() => { for (const [id, v] of [['kind', 'dec_self'], ['layer', '1'], "
                    "['head', '2']]) { const s = document.getElementById(id); s.value = v; "
                    "s.dispatchEvent(new Event('change')); } })()")  # fmt: skip
        drawn = json.loads(chromium.js(
            f"JSON.stringify([...document.querySelectorAll('#cells rect[data-i=\"{t}\"]')]"
            ".map(r => [+r.dataset.j, +r.dataset.w]))"))  # fmt: skip
        body = {"q": q, "layers": [1], "steps": [t], "stack": "decoder", "top_k": 8}
        dec = httpx.post(server.url + "/v1/explain", json=body, timeout=60).json()
        slots = {x["name"]: x for x in dec["tensors"]}[f"step{t}.decoder.1.self_attn.head2.weights"]
        pairs = zip(slots["cols"], slots["data"][0], strict=True)
        by_position = {int(c.split(":")[0]): w for c, w in pairs if c != "-"}
        assert len(by_position) == W and sorted(by_position) == list(range(t - W + 1, t + 1))
        assert {j: w for j, w in drawn if w} == pytest.approx(
            {j: round(w, 4) for j, w in by_position.items() if round(w, 4)}, abs=1e-4
        )
        assert chromium.errors() == []
    finally:
        code, _, err = server.stop()
    assert code == 0 and "Traceback" not in err, err[-4000:]
