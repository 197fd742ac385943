"""The glass box of a decoder-only LM: the traced numbers are a NumPy recomputation's, the
causal mask is visible, the sampling distribution keeps the right sets, the search traced is
`aiayn generate`'s, the page's JSON holds the maps, and the CLI says bad input in one line."""

import json
import logging
import math

import numpy as np
import pytest
import torch

from aiayn.cli.main import main
from aiayn.config import DecodeConfig, ModelConfig
from aiayn.errors import ConfigError
from aiayn.generate.generator import Generator
from aiayn.glassbox.distribution import next_token_distribution
from aiayn.glassbox.explain_lm import explain_lm, lm_prompt_ids
from aiayn.glassbox.lm_page import lm_page_data
from aiayn.glassbox.render import to_text
from aiayn.glassbox.render_lm import lm_to_html, lm_to_json, lm_to_text
from aiayn.nn.variants import DecoderLM
from aiayn.store.model_dir import load_model_dir, save_model_dir
from aiayn.text.charset import CharTokenizer

TEXT = "some training text, with more letters: the quick brown fox jumps over a lazy dog"
PROMPT = "the fox"


@pytest.fixture(scope="module")
def lm_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("lm")
    tok = CharTokenizer.fit([TEXT])
    cfg = ModelConfig(
        vocab_size=tok.vocab_size, d_model=32, n_heads=4, n_layers=2, d_ff=64, dropout=0.0,
        max_len=16,
    )  # fmt: skip
    torch.manual_seed(0)
    save_model_dir(DecoderLM(cfg), out)
    tok.save(out)
    return out


@pytest.fixture(scope="module")
def lm(lm_dir):
    return load_model_dir(lm_dir, expect=DecoderLM).eval(), CharTokenizer.load(lm_dir)


@pytest.fixture(scope="module")
def trace(lm):
    model, tok = lm
    return explain_lm(model, tok, PROMPT, max_len=3)


def _np(x: torch.Tensor) -> np.ndarray:
    return x.detach().double().numpy()


def test_layer0_is_a_numpy_recomputation(lm, trace):
    model, tok = lm
    cfg = model.cfg
    ids = lm_prompt_ids(model, tok, PROMPT)
    assert ids[0] == tok.bos_id and trace.src_ids == ids
    T, D, H, K = len(ids), cfg.d_model, cfg.n_heads, cfg.d_k
    # the input of layer 0: embedding x sqrt(d_model) + the sinusoids of §3.5
    pos, i = np.arange(T)[:, None], np.arange(0, D, 2)[None, :]
    pe = np.zeros((T, D))
    pe[:, 0::2], pe[:, 1::2] = np.sin(pos / 10000 ** (i / D)), np.cos(pos / 10000 ** (i / D))
    x = _np(model.embed.tokens.weight)[ids] * math.sqrt(D) + pe
    np.testing.assert_allclose(_np(trace["decoder.embed.sum"]), x, atol=1e-5)
    attn = model.decoder.layers[0].self_attn
    qkv = x @ _np(attn.in_proj.weight).T + _np(attn.in_proj.bias)
    causal = np.tril(np.ones((T, T), dtype=bool))
    for h in range(H):
        q, k, v = (qkv[:, j * D + h * K : j * D + (h + 1) * K] for j in range(3))
        scores = np.where(causal, q @ k.T / math.sqrt(K), -np.inf)
        w = np.exp(scores - scores.max(1, keepdims=True))
        w /= w.sum(1, keepdims=True)
        name = f"decoder.0.self_attn.head{h + 1}"
        np.testing.assert_allclose(_np(trace[f"{name}.scores_masked"]), scores, atol=1e-5)
        np.testing.assert_allclose(_np(trace[f"{name}.weights"]), w, atol=1e-6)
        np.testing.assert_allclose(_np(trace[f"{name}.output"]), w @ v, atol=1e-5)


def test_the_causal_mask_is_visible(lm, trace):
    model, _ = lm
    for layer in range(model.cfg.n_layers):
        for h in range(1, model.cfg.n_heads + 1):
            w = trace[f"decoder.{layer}.self_attn.head{h}.weights"]
            masked = trace[f"decoder.{layer}.self_attn.head{h}.scores_masked"]
            above = torch.ones_like(w, dtype=torch.bool).triu(1)
            assert bool((w[above] == 0).all()) and bool((w[~above] > 0).all())
            assert bool((masked[above] == float("-inf")).all())
            torch.testing.assert_close(w.sum(-1), torch.ones(w.size(0)))
    text = lm_to_text(trace)
    assert "-inf" in text and "position t sees positions 0..t" in text
    # the JSON is strict: -inf is null there
    data = json.loads(json.dumps(lm_to_json(trace), allow_nan=False))
    (masked,) = [
        t for t in data["tensors"] if t["name"].endswith("0.self_attn.head1.scores_masked")
    ]
    assert masked["data"][0][1] is None and masked["data"][1][0] is not None


def test_distribution_kept_sets_on_a_hand_made_case():
    p = torch.tensor([0.5, 0.2, 0.15, 0.1, 0.05])
    logits = p.log() + 3.0  # any shift: the same distribution

    def kept(**kw):
        d = next_token_distribution(logits, show=5, **kw)
        return sorted(d.kept_ids()), {t.id: t.renorm for t in d.tokens}, d

    ids, q, d = kept(top_p=0.6)  # mass before: 0, .5, .7 -> the first two reach .6
    assert ids == [0, 1] and d.n_kept == 2
    assert q[0] == pytest.approx(0.5 / 0.7) and q[1] == pytest.approx(0.2 / 0.7) and q[2] == 0
    assert d.kept_mass == pytest.approx(0.7)
    ids, q, _ = kept(top_k=3)
    assert ids == [0, 1, 2] and q[2] == pytest.approx(0.15 / 0.85)
    ids, _, _ = kept(top_k=3, top_p=0.8)  # within the top 3: .588, .235 (.824 >= .8 ends it)
    assert ids == [0, 1]
    ids, _, _ = kept(top_p=0.1)  # the best is always kept
    assert ids == [0]
    ids, q, d = kept(temperature=2.0)  # p(T) is proportional to sqrt(p); nothing filtered
    s = p.double().sqrt()
    assert ids == [0, 1, 2, 3, 4] and q[4] == pytest.approx(float(s[4] / s.sum()))
    assert [t.prob for t in d.tokens] == pytest.approx(p.tolist())
    _, q, d = kept(banned=[0])  # what the search never emits has probability 0
    prob = {t.id: t.prob for t in d.tokens}
    assert q[0] == 0 and prob[0] == 0 and q[1] == pytest.approx(0.2 / 0.5) and d.banned == (0,)
    for bad in ({"temperature": 0.0}, {"temperature": -1.0}, {"top_p": 0.0}, {"top_k": -1}):
        with pytest.raises(ConfigError):
            next_token_distribution(logits, **bad)


def test_the_search_traced_is_generates(lm, trace):
    model, tok = lm
    # step 0 feeds the prompt's last token after the prefill: its logits are the forward's
    top0 = trace.steps[0].top
    probs = trace["next.probs"]
    for i, _piece, prob in top0:
        assert prob == pytest.approx(float(probs[i]), abs=1e-5)
    gen = Generator(model, tok)
    (greedy,) = gen.generate_all([PROMPT], gen.settings(3, sample=False))
    assert trace.search == "greedy" and trace.tgt_ids[: len(greedy[0].tokens)] == greedy[0].tokens
    cfg = DecodeConfig(sample=True, temperature=0.9, top_k=5, top_p=0.95, seed=4)
    sampled = explain_lm(model, tok, PROMPT, cfg=cfg, max_len=3)
    (ref,) = gen.generate_all([PROMPT], gen.settings(3, sample=True, temperature=0.9, top_k=5,
                                                       top_p=0.95, seed=4))  # fmt: skip
    assert sampled.search == "sample" and sampled.translation == ref[0].text
    d = sampled.distribution
    assert d is not None and d.temperature == 0.9 and d.n_kept <= 5


def test_page_data(lm):
    model, tok = lm
    data = lm_page_data(model, tok, PROMPT, temperature=0.7, top_k=3, tensors="attention")
    json.dumps(data, allow_nan=False)
    T, L, H = len(PROMPT) + 1, model.cfg.n_layers, model.cfg.n_heads
    w = np.array(data["attention"]["w"])
    assert (
        w.shape == (L, H, T, T)
        and (w[..., np.triu_indices(T, 1)[0], np.triu_indices(T, 1)[1]] == 0).all()
    )
    assert data["attention"]["rows"][0] == "<s>" and data["distribution"]["n_kept"] == 3
    assert {t["name"].rsplit(".", 1)[1] for t in data["forward"]["tensors"]} == {"weights"}
    full = lm_page_data(model, tok, PROMPT, layers=[1], heads=[2])
    names = [t["name"] for t in full["forward"]["tensors"]]
    assert "decoder.1.self_attn.head2.q" in names and "decoder.1.self_attn.head1.q" not in names
    assert "decoder.0.ffn.hidden" not in names and "next.probs" in names
    assert len(full["attention"]["w"]) == L  # the maps are always whole
    with pytest.raises(ConfigError):
        lm_page_data(model, tok, PROMPT, temperature=0)


# --- the command line -----------------------------------------------------------------------------


def explain(lm_dir, *flags):
    return main(["explain", "--model", str(lm_dir), *flags])


def test_cli_explain_lm_text_json_html(lm_dir, tmp_path, capsys):
    assert explain(lm_dir, "--prompt", PROMPT, "--max-len", "2", "--layers", "0") == 0
    text = capsys.readouterr().out
    assert "decoder.0.self_attn.head1.scores_masked" in text and "decoder.1." not in text
    assert "kept" in text and "generation step 1" in text and "-inf" in text
    assert (
        explain(lm_dir, "--prompt", PROMPT, "--json", "--max-len", "2", "--sample-top-k", "2") == 0
    )
    data = json.loads(capsys.readouterr().out)
    assert data["kind"] == "lm" and len(data["steps"]) == 2 and data["distribution"]["n_kept"] == 2
    out = tmp_path / "lm.html"
    assert explain(lm_dir, "--prompt", PROMPT, "--html", str(out), "--greedy") == 0
    assert out.read_text(encoding="utf-8").startswith("<!doctype html>")


def test_cli_explain_lm_edges(lm_dir, capsys, caplog):
    assert explain(lm_dir, "--prompt", "", "--json", "--max-len", "1") == 0  # BOS alone
    data = json.loads(capsys.readouterr().out)
    assert data["prompt"]["pieces"] == ["<s>"] and len(data["steps"]) == 1
    with caplog.at_level(logging.WARNING):
        assert explain(lm_dir, "--prompt", TEXT, "--json", "--max-len", "2") == 0
    data = json.loads(capsys.readouterr().out)
    assert len(data["prompt"]["ids"]) == 16 and data["prompt"]["pieces"][-1] == TEXT[-1]
    assert "explaining its last 16" in caplog.text and data["steps"] == []  # no room left
    assert explain(lm_dir, "--prompt", PROMPT, "--temperature", "0") == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "temperature must be positive" in err
    assert explain(lm_dir, "--prompt", PROMPT, "--beam", "2") == 2
    assert "beam" in capsys.readouterr().err


def test_cli_attend_lm_png(lm_dir, tmp_path, capsys):
    out = tmp_path / "attn.png"
    assert main(["attend", "--model", str(lm_dir), "--prompt", PROMPT, "--out", str(out)]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (
        main(
            ["attend", "--model", str(lm_dir), "--prompt", PROMPT, "--out", str(tmp_path / "a.xyz")]
        )
        == 2
    )
    assert "not an image format" in capsys.readouterr().err


def test_html_of_an_lm_trace(trace):
    page = lm_to_html(trace)
    assert "next token after the prompt" in page and "renormalised" in page
    with pytest.raises(ValueError, match="render_lm"):
        to_text(trace)  # the translator's renderer refuses it
