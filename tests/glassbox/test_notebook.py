"""The inline Jupyter views (aiayn.glassbox.notebook): self-contained HTML (no script, no
network) whose cells hold the traced numbers, and every stage of one position's forward pass."""

import re

import pytest
import torch

from aiayn.config import DecodeConfig
from aiayn.glassbox.explain import explain, trace_beam
from aiayn.glassbox.notebook import (
    AttentionView,
    BeamView,
    ForwardPassView,
    MatrixView,
    SeedExampleView,
)
from aiayn.glassbox.seed_example import seed_example_json

CELL = re.compile(r'data-name="([^"]+)" data-r="(\d+)" data-c="(\d+)" data-v="([^"]+)"')


@pytest.fixture(scope="module")
def ex(tmp_path_factory):
    from aiayn.store.model_dir import load_model_dir
    from aiayn.text.tokenizer import Tokenizer
    from glassbox.test_explain import SENTENCE, make_model_dir

    path = make_model_dir(tmp_path_factory.mktemp("model"), eos_boost=4.0)
    model, tok = load_model_dir(path), Tokenizer.load(path)
    trace = explain(model, tok, SENTENCE, max_len=4)
    trace.beam = trace_beam(model, tok, SENTENCE, DecodeConfig(beam_size=2), max_len=4)
    return trace


def cells(page: str) -> dict[str, dict[tuple[int, int], str]]:
    out: dict[str, dict[tuple[int, int], str]] = {}
    for name, r, c, v in CELL.findall(page):
        out.setdefault(name, {})[(int(r), int(c))] = v
    return out


def assert_self_contained(page: str) -> None:
    assert "<script" not in page.lower() and "require" not in page
    assert re.findall(r"(?:src|href)=", page) == []  # nothing to fetch
    assert set(re.findall(r"https?://[^\s\"']+", page)) <= {"http://www.w3.org/2000/svg"}


def assert_cells_are(ex, drawn) -> None:
    for name, placed in drawn.items():
        value = ex[name].double()
        for (r, c), v in placed.items():
            want = value[c] if value.dim() == 1 else value[r, c]
            assert (v == "-inf") if want == float("-inf") else float(v) == float(want), name


@pytest.mark.parametrize("where", [{"source": 2}, {"step": 0}, {"step": 2}])
def test_forward_pass_view_draws_every_stage_of_one_position(ex, where):
    view = ForwardPassView(ex, layer=1, head=2, dims=5, **where)
    page = view._repr_html_()
    assert_self_contained(page)
    drawn = cells(page)
    if "source" in where:
        want = {n for n in ex.names() if n.startswith(("encoder.embed.", "encoder.1."))
                and (".head" not in n or ".head2." in n)}  # fmt: skip
    else:
        t = where["step"]
        want = {n for n in ex.names() if n.startswith((f"step{t}.decoder.embed.",
                f"step{t}.decoder.1.", f"step{t}.logits", f"step{t}.probs"))
                and (".head" not in n or ".head2." in n)}  # fmt: skip
        want |= {f"step0.decoder.1.cross_attn.head2.{x}" for x in ("k", "v")}
    assert set(drawn) == want
    assert_cells_are(ex, drawn)
    model_dims = drawn["encoder.embed.sum" if "source" in where else f"step{where['step']}.logits"]
    assert {c for _, c in model_dims} == set(range(5))  # the dims limit
    weights = next(n for n in drawn if n.endswith("self_attn.head2.weights"))
    assert len(drawn[weights]) == ex[weights].size(-1)  # every key
    hidden = next(n for n in drawn if n.endswith("ffn.hidden"))
    row = ex[hidden][where.get("source", 0)]
    assert f"{int((row == 0).sum())} of {row.numel()} are 0 (ReLU)" in page
    with pytest.raises(ValueError):
        ForwardPassView(ex, layer=0)


def test_attention_view_is_the_traced_weights(ex):
    page = AttentionView(ex, "cross", layer=0, head=1)._repr_html_()
    assert_self_contained(page)
    drawn = next(iter(cells(page).values()))
    assert len(drawn) == len(ex.steps) * len(ex.src_pieces)
    for (r, c), v in drawn.items():
        assert float(v) == float(ex[f"step{r}.decoder.0.cross_attn.head1.weights"][0, c])
    mean = cells(AttentionView(ex, "enc_self", layer=1, head="mean")._repr_html_())
    want = torch.stack([ex[f"encoder.1.self_attn.head{h}.weights"] for h in (1, 2, 3, 4)]).mean(0)
    for (r, c), v in next(iter(mean.values())).items():
        assert float(v) == float(want[r, c].double())
    dec = next(iter(cells(AttentionView(ex, "dec_self", 0, 3)._repr_html_()).values()))
    assert float(dec[(1, 1)]) == float(ex["step1.decoder.0.self_attn.head3.weights"][0, 1])


def test_views_of_what_the_trace_does_not_have_say_what_it_has(ex):
    """A KeyError on a tensor name, an IndexError, a 'crss' kind drawn as decoder
    self-attention, a 3-D tensor's unpacking error: each is now a ValueError that says why."""
    n_steps, n_src = len(ex.steps), len(ex.src_pieces)
    for make, message in [
        (lambda: AttentionView(ex, "cross", layer=2, head=1), r"layer 2 does not exist: .* 0..1"),
        (lambda: AttentionView(ex, "cross", layer=0, head=0), r"head 0 does not exist: .* 1..4"),
        (lambda: AttentionView(ex, "crss"), "kind='crss': choose"),
        (lambda: ForwardPassView(ex, source=n_src), f"source={n_src}: .* 0..{n_src - 1}"),
        (lambda: ForwardPassView(ex, step=n_steps), f"step={n_steps}: .* 0..{n_steps - 1}"),
        (lambda: ForwardPassView(ex, head=5, step=0), "head 5 does not exist"),
        (lambda: MatrixView(torch.zeros(2, 3, 4)), r"1-D or 2-D tensor .* \(2, 3, 4\)"),
        (lambda: MatrixView(torch.zeros(2, 3), rows=["a"]), "1 row and 3 column labels"),
    ]:
        with pytest.raises(ValueError, match=message):
            make()
    AttentionView(ex, "cross", layer=1, head="4")  # a head's number as text, as before


def test_beam_view_shows_every_candidate_and_the_output(ex):
    page = BeamView(ex.beam)._repr_html_()
    assert_self_contained(page)
    n_cands = sum(len(s.candidates) for s in ex.beam.steps)
    assert len(re.findall(r'<tr class="(?:live|pruned|finished)" title=', page)) == n_cands
    assert f"output: <b>{ex.beam.best.text()}</b>" in page.replace("&lt;", "<").replace("&gt;", ">")


def test_matrix_and_seed_example_views():
    x = torch.tensor([[1.0, -2.0], [float("-inf"), 0.5]])
    page = MatrixView(x, ["a", "b"], ["k0", "k1"], title="x")._repr_html_()
    assert_self_contained(page)
    assert cells(page)["x"] == {(0, 0): "1.0", (0, 1): "-2.0", (1, 0): "-inf", (1, 1): "0.5"}
    # the first max_rows x max_cols cells are drawn: 300 x 500 was 150,000 SVG elements
    big = MatrixView(torch.randn(300, 500), title="big")._repr_html_()
    assert "[300 × 500, the first 256 × 256 drawn]" in big
    assert len(cells(big)["big"]) == 256 * 256
    assert max(cells(big)["big"]) == (255, 255)
    with pytest.raises(ValueError, match="max_rows and max_cols must be at least 1"):
        MatrixView(x, max_cols=0)
    seed = SeedExampleView()._repr_html_()
    assert_self_contained(seed)
    labels = re.findall(r'<table data-label="([^"]+)">', seed)
    data = seed_example_json()["sections"]
    assert len(labels) == sum("label" in i for s in data for i in s["items"])
    assert "7.54348784" in seed and "(what the seed printed: wrong)" in seed
