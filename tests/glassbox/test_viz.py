"""Attention pictures: the right maps, the right panels, files written; the interactive page
checked in a real headless Chromium (skipped where Chromium is absent)."""

import base64
import dataclasses
import json
import random
import re

import pytest
import torch

from aiayn.cli.main import main
from aiayn.config import BOS_ID, PAD_ID, ModelConfig
from aiayn.glassbox import viz
from aiayn.glassbox.attention_page import attention_page
from aiayn.glassbox.viz import (
    attention_figures,
    attention_for_model,
    attention_for_translations,
    plot_attention_grid,
)
from aiayn.nn.model import AttentionMaps, Transformer
from aiayn.nn.tracing import tracing
from aiayn.nn.variants import DecoderLM, EncoderClassifier
from aiayn.store.model_dir import load_model_dir, save_model_dir
from aiayn.text.tokenizer import Tokenizer

WORDS = "the cat dog sees a small big red house tree runs walks on under street garden".split()  # noqa: SIM905
SENTENCES = ["the cat sees a red house", "a dog", "under the big tree the small cat runs"]
PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("model")
    rng = random.Random(0)
    lines = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 8))) for _ in range(300)]
    tok = Tokenizer.train(lines, vocab_size=320)
    torch.manual_seed(0)
    save_model_dir(Transformer(ModelConfig.preset("cpu_tiny", vocab_size=tok.vocab_size)), path)
    tok.save(path)
    return path


@pytest.fixture(scope="module")
def examples(model_dir):
    model, tok = load_model_dir(model_dir), Tokenizer.load(model_dir)
    return attention_for_translations(model, tok, SENTENCES, max_len=6)


# --- attention maps -------------------------------------------------------------------------------


def test_several_sentences_maps_equal_one_sentence_at_a_time(model_dir, examples):
    """Each sentence of several gets the unpadded maps it gets alone."""
    model, tok = load_model_dir(model_dir), Tokenizer.load(model_dir)
    for sentence, ex in zip(SENTENCES, examples, strict=True):
        (alone,) = attention_for_translations(model, tok, [sentence], max_len=6)
        assert (alone.src, alone.out, alone.fed) == (ex.src, ex.out, ex.fed)
        for kind in ("enc_self", "dec_self", "cross"):
            for a, b in zip(alone.maps[kind], ex.maps[kind], strict=True):
                torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_maps_are_the_produced_translation(model_dir, examples):
    model, tok = load_model_dir(model_dir), Tokenizer.load(model_dir)
    ex = examples[0]
    src = tok.encode(SENTENCES[0])
    assert ex.src == tok.pieces(src) and ex.fed[0] == tok.pieces([BOS_ID])[0]
    assert ex.fed[1:] == ex.out[:-1] and len(ex.out) <= 6
    L, H = model.cfg.n_layers, model.cfg.n_heads
    T, S = len(ex.out), len(src)
    assert [tuple(m.shape) for m in ex.maps["cross"]] == [(H, T, S)] * L
    assert [tuple(m.shape) for m in ex.maps["dec_self"]] == [(H, T, T)] * L
    assert bool((ex.maps["dec_self"][0].triu(1) == 0).all())  # causal: nothing from the future
    torch.testing.assert_close(ex.maps["enc_self"][1].sum(-1), torch.ones(H, S))
    assert PAD_ID not in tok.encode(SENTENCES[0])


def test_attention_grid_has_a_panel_per_layer_and_head_plus_the_mean(examples, tmp_path):
    ex = examples[2]
    fig = plot_attention_grid(ex.maps["cross"], ex.out, ex.src, "cross")
    L, H = len(ex.maps["cross"]), ex.maps["cross"][0].size(0)
    panels = [ax for ax in fig.axes if ax.get_images()]
    assert len(panels) == L * (H + 1)
    assert [t.get_text() for t in panels[0].get_xticklabels()] == ex.src
    assert panels[H].get_title() == "layer 0 · mean of heads"
    figs = attention_figures(ex)
    assert sorted(figs) == ["average.png", "cross.png", "dec_self.png", "enc_self.png"]
    for name, f in figs.items():
        f.savefig(tmp_path / name)
        assert (tmp_path / name).read_bytes().startswith(PNG)


def test_cli_attend_writes_pngs_and_html(model_dir, tmp_path, capsys):
    out = tmp_path / "att"
    assert main(["attend", "--model", str(model_dir), SENTENCES[0], "--out", str(out),
                 "--max-len", "4"]) == 0  # fmt: skip
    for name in ("enc_self.png", "dec_self.png", "cross.png", "average.png"):
        assert (out / name).read_bytes().startswith(PNG)
    page = (out / "attention.html").read_text(encoding="utf-8")
    assert "<script" in page and not re.search(
        r"<script[^>]*\bsrc=|<link|<img|fetch\(|XMLHttp", page
    )
    (tmp_path / "in.txt").write_text("a dog\n\nthe red tree\n", encoding="utf-8")
    assert main(["attend", "--model", str(model_dir), "--input", str(tmp_path / "in.txt"),
                 "--out", str(tmp_path / "two"), "--max-len", "3"]) == 0  # fmt: skip
    assert (tmp_path / "two" / "001" / "cross.png").exists()
    assert main(["attend", "--model", str(model_dir), "--out", str(tmp_path / "x")]) == 2
    assert "at least one sentence" in capsys.readouterr().err
    (tmp_path / "latin1.txt").write_bytes("caf\xe9\n".encode("latin-1"))  # was a traceback
    assert main(["attend", "--model", str(model_dir), "--input", str(tmp_path / "latin1.txt"),
                 "--out", str(tmp_path / "y")]) == 2  # fmt: skip
    assert "line 1 is not valid UTF-8" in capsys.readouterr().err


def test_cli_attend_refuses_a_file_as_out(model_dir, tmp_path, capsys):
    """--out names a directory; an existing file there is one line of error, left untouched."""
    taken = tmp_path / "pictures.png"
    taken.write_bytes(b"mine")
    for out, message in ((taken, "is an existing file"), (taken / "sub", "is a file, not a dir")):
        assert main(["attend", "--model", str(model_dir), "a dog", "--out", str(out)]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("aiayn attend: error: --out") and message in err, err
        assert "\n" not in err and "Traceback" not in err
    (tmp_path / "att").mkdir()
    (tmp_path / "att" / "001").write_bytes(b"mine")  # where the second sentence's PNGs go
    argv = ["attend", "--model", str(model_dir), "a dog", "a cat", "--max-len", "3"]
    assert main([*argv, "--out", str(tmp_path / "att")]) == 2
    err = capsys.readouterr().err.strip()
    assert "cannot write into --out" in err and "\n" not in err, err
    assert taken.read_bytes() == (tmp_path / "att" / "001").read_bytes() == b"mine"


def test_attend_is_bounded_before_the_work(model_dir, tmp_path, capsys):
    """A 900-piece sentence on a 1,024-position model drew a 109,000 x 43,000-pixel canvas (the
    machine ran out of its 24 GB); too many weights or sentences are refused before any is
    recorded, and a long sentence that passes is drawn within MAX_GRID_INCHES a side."""
    long = " ".join(["cat"] * 900)  # ~900 pieces: 2 layers x 4 heads x 900^2 > MAX_NUMBERS
    argv = ["attend", "--model", str(model_dir), "--max-len", "2", "--out", str(tmp_path / "a")]
    assert main([*argv, long]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "more than the 5,000,000 pictures are drawn from" in err
    assert main([*argv, *(["a dog"] * (viz.MAX_SENTENCES + 1))]) == 2
    assert f"at most {viz.MAX_SENTENCES} at a time" in capsys.readouterr().err
    many = tmp_path / "many.txt"  # read only as far as the bound: not held whole
    many.write_text("a dog\n" * 100_000 + "caf\xe9\n", encoding="latin-1")
    assert main([*argv, "--input", str(many)]) == 2
    assert f"more than {viz.MAX_SENTENCES} sentences" in capsys.readouterr().err
    assert not (tmp_path / "a").exists()
    model, tok = load_model_dir(model_dir), Tokenizer.load(model_dir)
    (ex,) = attention_for_translations(model, tok, [" ".join(["cat"] * 600)], max_len=2)
    fig = plot_attention_grid(ex.maps["enc_self"], ex.src, ex.src, "long")
    assert max(fig.get_size_inches()) <= viz.MAX_GRID_INCHES
    panel = next(ax for ax in fig.axes if ax.get_images())
    labels = [t.get_text() for t in panel.get_xticklabels()]
    every = int(panel.get_xticks()[1])  # thinned to fit: every `every`-th piece, from the first
    assert every > 1 and labels == ex.src[::every]


@pytest.fixture(scope="module")
def other_models(model_dir, tmp_path_factory):
    """An encoder-only classifier and a decoder-only LM sharing the tokenizer, saved."""
    tok = Tokenizer.load(model_dir)
    cfg = ModelConfig(vocab_size=tok.vocab_size, d_model=32, n_heads=2, n_layers=2, d_ff=64)
    dirs = {}
    for name, model in (("cls", EncoderClassifier(cfg, n_classes=3)), ("lm", DecoderLM(cfg))):
        dirs[name] = tmp_path_factory.mktemp(name)
        save_model_dir(model, dirs[name])
        tok.save(dirs[name])
    return dirs


def test_encoder_only_and_decoder_only_models(other_models):
    lm, tok = load_model_dir(other_models["lm"]), Tokenizer.load(other_models["lm"])
    (ex,) = attention_for_model(lm, tok, [SENTENCES[0]])
    ids = tok.encode(SENTENCES[0], bos=True, eos=False)  # a prompt, as generate feeds it
    assert list(ex.maps) == ["lm_self"] and ex.src == tok.pieces(ids) and ex.out == []
    with torch.no_grad(), tracing() as trace:
        lm(torch.tensor([ids]))  # the model's own maps
    maps = AttentionMaps.from_trace(trace).dec_self
    assert len(maps) == lm.cfg.n_layers
    for got, want in zip(ex.maps["lm_self"], maps, strict=True):
        torch.testing.assert_close(got, want[0])
    assert bool((ex.maps["lm_self"][1].triu(1) == 0).all())
    cls = load_model_dir(other_models["cls"])
    a, b = attention_for_model(cls, tok, SENTENCES[:2])  # each sentence its own maps
    assert list(a.maps) == ["enc_self"] and a.maps["enc_self"][0].shape[-1] == len(a.src)
    torch.testing.assert_close(b.maps["enc_self"][1].sum(-1), torch.ones(2, len(b.src)))
    assert sorted(attention_figures(a)) == ["average.png", "enc_self.png"]
    # an input past the positional table keeps its last tokens, as a prompt does (it was the
    # model's ValueError, a traceback from `aiayn attend`)
    short = DecoderLM(dataclasses.replace(lm.cfg, max_len=6))
    (cut,) = attention_for_model(short, tok, [SENTENCES[2]])
    assert cut.src == tok.pieces(tok.encode(SENTENCES[2], eos=False)[-6:])
    assert cut.maps["lm_self"][0].shape == (lm.cfg.n_heads, 6, 6)


def test_cli_attend_on_a_decoder_only_model(other_models, tmp_path):
    out = tmp_path / "lm"
    assert main(["attend", "--model", str(other_models["lm"]), "a dog", "--out", str(out)]) == 0
    assert (out / "lm_self.png").exists() and (out / "average.png").exists()
    assert '"lm_self"' in (out / "attention.html").read_text(encoding="utf-8")


def test_page_embeds_every_weight(examples):
    page = attention_page(examples)
    blob = page.split('<script type="application/json" id="data">')[1].split("</script>")[0]
    data = json.loads(blob.replace("<\\/", "</"))
    assert len(data["examples"]) == 3
    w = data["examples"][1]["kinds"]["cross"]["w"]
    torch.testing.assert_close(torch.tensor(w), torch.stack(examples[1].maps["cross"]), atol=6e-5,
                               rtol=0)  # fmt: skip


# --- the interactive page in a real browser -------------------------------------------------------


EDGES = "JSON.stringify([...document.querySelectorAll('#edges line')].map(l => " \
        "[l.getAttribute('y1'), l.getAttribute('y2'), l.getAttribute('stroke'), " \
        "l.getAttribute('stroke-opacity')]))"  # fmt: skip


def choose(select: str, value: str) -> str:
    return (f"(() => {{ const s = document.getElementById('{select}'); s.value = '{value}';"
            f" s.dispatchEvent(new Event('change')); }})()")  # fmt: skip


def test_interactive_page_in_headless_chromium(chromium, examples, other_models, tmp_path):
    lm, tok = load_model_dir(other_models["lm"]), Tokenizer.load(other_models["lm"])
    (lm_example,) = attention_for_model(lm, tok, ["the red tree"])
    page = tmp_path / "attention.html"
    page.write_text(attention_page(examples), encoding="utf-8")
    for domain in ("Runtime", "Log", "Page", "Network"):
        chromium.send(f"{domain}.enable")
    chromium.send("Emulation.setDeviceMetricsOverride", width=1300, height=900,
                  deviceScaleFactor=1, mobile=False)  # fmt: skip
    chromium.send("Page.navigate", url=page.as_uri())
    chromium.wait_for("Page.loadEventFired")
    assert chromium.js("document.getElementById('layer').options.length") == 2
    assert chromium.js("document.getElementById('head').options.length") == 5  # all + 4 heads
    all_heads = json.loads(chromium.js(EDGES))
    assert len({stroke for _, _, stroke, _ in all_heads}) == 4  # one colour per head
    chromium.js(choose("layer", "1"))
    layer1 = json.loads(chromium.js(EDGES))
    assert layer1 and layer1 != all_heads
    chromium.js(choose("head", "2"))
    head3 = json.loads(chromium.js(EDGES))
    assert head3 and len({stroke for _, _, stroke, _ in head3}) == 1 and head3 != layer1
    # the lines drawn are the weights: every query row's shown opacities sum to at most 1
    n_src = len(examples[0].src)
    assert len(head3) <= n_src * n_src
    chromium.js(choose("kind", "cross"))
    cross = json.loads(chromium.js(EDGES))
    assert cross != head3
    n_rows = len(examples[0].out)
    # hovering a query token keeps only its own lines
    chromium.js("document.querySelectorAll('#lines text.tok')[0]"
                ".dispatchEvent(new MouseEvent('mouseenter'))")  # fmt: skip
    hovered = json.loads(chromium.js(EDGES))
    assert 0 < len(hovered) < len(cross) or n_rows == 1
    assert {y1 for y1, _, _, _ in hovered} == {hovered[0][0]}
    assert "attends to" in chromium.js("document.getElementById('info').textContent")
    chromium.js(choose("example", "2"))
    assert "under" in chromium.js("document.getElementById('example').selectedOptions[0].text")
    shot = base64.b64decode(chromium.send("Page.captureScreenshot", format="png")["data"])
    (tmp_path / "screenshot.png").write_bytes(shot)
    assert shot.startswith(PNG) and len(shot) > 10_000
    # a page mixing a translation and a decoder-only model: the kinds follow the sentence
    lm_page = tmp_path / "mixed.html"
    lm_page.write_text(attention_page([examples[1], lm_example]), encoding="utf-8")
    chromium.send("Page.navigate", url=lm_page.as_uri())
    chromium.wait_for_n("Page.loadEventFired", 2)
    assert chromium.js("document.getElementById('kind').options.length") == 3
    chromium.js(choose("kind", "cross"))
    chromium.js(choose("example", "1"))
    assert chromium.js("[...document.getElementById('kind').options].map(o => o.value)") == [
        "lm_self"
    ]
    assert json.loads(chromium.js(EDGES))
    assert chromium.errors() == []
    requests = [e["params"]["request"]["url"] for e in chromium.events
                if e.get("method") == "Network.requestWillBeSent"]  # fmt: skip
    assert all(url.startswith("file:") for url in requests), requests  # no network
