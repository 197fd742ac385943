"""Pictures of a model at work: attention heatmaps (PNG) and the maps an interactive attention
page (HTML) shows; `write_figure` saves a figure whole (`aiayn plot-log`'s training curves too,
drawn by aiayn.training.curves).

Figures use matplotlib's object API on the Agg canvas (no pyplot, no global backend switch), so
they work headless and never touch a caller's own matplotlib state.

Dimension key: B batch, L layers, H heads, T target (query) length, S source (key) length.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from pathlib import Path

import torch
from matplotlib.figure import Figure
from torch import Tensor

from aiayn.errors import AiaynError
from aiayn.nn.model import AttentionMaps, Transformer
from aiayn.nn.tracing import tracing
from aiayn.nn.variants import DecoderLM, EncoderClassifier
from aiayn.text.corpus import source_text
from aiayn.text.labelled import classifier_ids
from aiayn.text.tokenizer import Tokenizer

log = logging.getLogger(__name__)

KINDS = {
    "enc_self": "encoder self-attention",
    "dec_self": "decoder masked self-attention",
    "cross": "decoder cross-attention (encoder-decoder)",
    "lm_self": "decoder-only causal self-attention",
}
AXES = {  # (rows, columns) of each kind's maps
    "enc_self": ("source token (query)", "source token (key)"),
    "dec_self": ("output token being produced (query)", "token fed to the decoder (key)"),
    "cross": ("output token being produced (query)", "source token (key)"),
    "lm_self": ("input token (query)", "input token (key)"),
}


# Bounds on one run's pictures: the maps grow with length^2 and all of them go into the page.
MAX_SENTENCES = 100
MAX_NUMBERS = 5_000_000  # attention weights in all maps (the page's JSON: ~40 MB)
MAX_GRID_INCHES = 80.0  # a grid figure's longest side (8,800 pixels at attend's 110 dpi)
LABEL_INCHES = 0.1  # the least room for a 6-point tick label; fewer labels where cells shrink


@dataclass
class AttentionExample:
    """One sentence's attention maps, padding removed.

    For a `Transformer` (translation), decoder rows are labelled by the token each position
    *produced* (position t is fed token t-1, BOS first, and predicts token t); decoder
    self-attention columns by the tokens *fed*. Encoder-only and decoder-only models have one
    kind of map (`enc_self` or `lm_self`) over their input, and no output.
    """

    src: list[str]  # source pieces (keys of enc_self and cross)
    out: list[str]  # produced pieces (queries of dec_self and cross)
    fed: list[str]  # fed pieces: BOS + out[:-1] (keys of dec_self)
    maps: dict[str, list[Tensor]]  # kind -> per layer (H, T_q, T_k)
    translation: str = ""  # the output as text

    def labels(self, kind: str) -> tuple[list[str], list[str]]:
        """(row labels, column labels) of `kind`'s maps."""
        return {
            "enc_self": (self.src, self.src),
            "dec_self": (self.out, self.fed),
            "cross": (self.out, self.src),
            "lm_self": (self.src, self.src),
        }[kind]


def figure_format(path: str | Path) -> str:
    """The image format `path`'s suffix names (PNG without one); a suffix matplotlib cannot
    write, or a directory, is an AiaynError, said before any work is done."""
    from matplotlib.backend_bases import FigureCanvasBase

    path = Path(path)
    if path.is_dir():
        raise AiaynError(f"--out {path} is a directory; give an image file (e.g. curves.png)")
    fmt = path.suffix.lstrip(".").lower() or "png"
    formats = FigureCanvasBase.get_supported_filetypes()
    if fmt not in formats:
        raise AiaynError(
            f"--out {path}: .{fmt} is not an image format that can be written "
            f"(png, svg, pdf, jpg, ...: {', '.join(sorted(formats))})"
        )
    return fmt


def write_figure(fig: Figure, path: str | Path, dpi: int = 100) -> Path:
    """Save `fig` to `path` whole or not at all (the format from the suffix, else PNG)."""
    import io

    from aiayn.atomic import atomic_write_bytes

    path = Path(path)
    data = io.BytesIO()
    fig.savefig(data, format=figure_format(path), dpi=dpi)
    atomic_write_bytes(path, data.getvalue())
    return path


def examples_from_maps(
    tok: Tokenizer, src_BS: Tensor, tgt_in_BT: Tensor, tgt_out_BT: Tensor, maps: AttentionMaps
) -> list[AttentionExample]:
    """Split a batch's `AttentionMaps` into per-sentence examples without their PAD rows/columns.

    Args:
        src_BS, tgt_in_BT, tgt_out_BT: right-padded ids; tgt_out is tgt_in shifted left.
        maps: `AttentionMaps.from_trace(trace)` of `model(src_BS, tgt_in_BT)` under `tracing()`.
    """
    out = []
    for b in range(src_BS.size(0)):
        S = int((src_BS[b] != tok.pad_id).sum())
        # tgt_out has no BOS: counted there, since BOS may be PAD (Marian starts from PAD)
        T = int((tgt_out_BT[b] != tok.pad_id).sum())
        ex = AttentionExample(
            tok.pieces(src_BS[b, :S].tolist()),
            tok.pieces(tgt_out_BT[b, :T].tolist()),
            tok.pieces(tgt_in_BT[b, :T].tolist()),
            {
                "enc_self": [m[b, :, :S, :S] for m in maps.enc_self],
                "dec_self": [m[b, :, :T, :T] for m in maps.dec_self],
                "cross": [m[b, :, :T, :S] for m in maps.cross],
            },
        )
        out.append(ex)
    return out


@torch.no_grad()
def attention_for_translations(
    model: Transformer, tok: Tokenizer, sentences: list[str], max_len: int | None = None
) -> list[AttentionExample]:
    """Translate each sentence greedily (as `aiayn translate --beam 1`), then take the attention
    maps of one teacher-forced pass over the translation the model actually produced."""
    from aiayn.glassbox.explain import greedy_translate

    _check_count(sentences)
    pairs = [greedy_translate(model, tok, s, max_len) for s in sentences]
    LH = model.cfg.n_layers * model.cfg.n_heads  # each stack's maps per (query, key) pair
    _check_numbers([LH * (len(s) ** 2 + len(o) ** 2 + len(o) * len(s)) for s, o in pairs])
    model.eval()
    device = next(model.parameters()).device
    examples = []
    for src, out in pairs:  # one at a time: a batch's padded maps grow with its longest sentence
        src_BS, tgt_in_BT, tgt_out_BT = (
            torch.tensor([ids]) for ids in (src, [tok.bos_id, *out[:-1]], out)
        )
        with tracing() as trace:  # the maps come from the taps, as in `aiayn explain`
            model(src_BS.to(device), tgt_in_BT.to(device))
        maps = AttentionMaps.from_trace(trace)
        maps = AttentionMaps(  # pictures are drawn on the CPU
            *([m.cpu() for m in kind] for kind in (maps.enc_self, maps.dec_self, maps.cross))
        )
        (ex,) = examples_from_maps(tok, src_BS, tgt_in_BT, tgt_out_BT, maps)
        ex.translation = tok.decode(out)
        examples.append(ex)
    return examples


@torch.no_grad()
def attention_for_inputs(
    model: EncoderClassifier | DecoderLM, tok: Tokenizer, sentences: list[str]
) -> list[AttentionExample]:
    """Encoder-only and decoder-only models: the self-attention over each input (no output).

    The weights are recorded by `tracing()` from the model's own forward pass.
    """
    kind = "enc_self" if isinstance(model, EncoderClassifier) else "lm_self"
    _check_count(sentences)
    limit = model.cfg.max_len
    # A language model reads BOS + the text, no EOS, as `aiayn generate` feeds a prompt, and a
    # text past its context keeps its end; a classifier reads BOS + the text + EOS, as
    # `aiayn classify` feeds it (classifier_ids: BOS is the [CLS] position cls pooling reads).
    lm = kind == "lm_self"
    texts = [source_text(s) for s in sentences]
    if lm:
        ids = [tok.encode(t, bos=True, eos=False) for t in texts]
    else:
        ids = [[tok.bos_id, *row, tok.eos_id] for row in tok.encode_batch(texts, eos=False)]
    for i, row in enumerate(ids):
        if len(row) > limit:
            log.warning(
                "sentence %d has %d tokens, more than the model's max_len=%d; drawing its %s %d",
                i + 1,
                len(row),
                limit,
                "last" if lm else "first",
                limit,
            )
            ids[i] = row[-limit:] if lm else classifier_ids(tok, [texts[i]], limit)[0]
    _check_numbers([model.cfg.n_layers * model.cfg.n_heads * len(row) ** 2 for row in ids])
    model.eval()
    examples = []
    for row in ids:  # one at a time, as for translations: no padded maps
        with tracing() as rec:
            model(torch.tensor([row], device=next(model.parameters()).device))
        maps = [w[0].cpu() for k, w in rec.tensors.items() if k.endswith(".self_attn.weights")]
        examples.append(AttentionExample(tok.pieces(row), [], [], {kind: maps}))
    return examples


def _check_count(sentences: list[str]) -> None:
    if len(sentences) > MAX_SENTENCES:
        raise AiaynError(
            f"more than {MAX_SENTENCES} sentences; attention pictures are drawn for at most "
            f"{MAX_SENTENCES} at a time (each gets its own figures)"
        )


def _check_numbers(per_sentence: list[int]) -> None:
    """Refuse maps past MAX_NUMBERS before they are recorded (their length^2 grows fast)."""
    if sum(per_sentence) > MAX_NUMBERS:
        worst = max(range(len(per_sentence)), key=per_sentence.__getitem__)
        raise AiaynError(
            f"the attention maps would hold {sum(per_sentence):,} weights (sentence {worst + 1}: "
            f"{per_sentence[worst]:,}), more than the {MAX_NUMBERS:,} pictures are drawn from; "
            "give fewer or shorter sentences (`aiayn explain` prints a long one's numbers)"
        )


def attention_for_model(
    model: object, tok: Tokenizer, sentences: list[str], max_len: int | None = None
) -> list[AttentionExample]:
    """Any aiayn model: translations for a `Transformer`, the inputs' self-attention otherwise."""
    if not sentences:
        raise AiaynError("no sentences to show")
    vocab = getattr(getattr(model, "cfg", None), "vocab_size", None)
    if vocab != tok.vocab_size:
        raise AiaynError(f"tokenizer has {tok.vocab_size} pieces, the model {vocab}")
    if isinstance(model, Transformer):
        return attention_for_translations(model, tok, sentences, max_len)
    if isinstance(model, EncoderClassifier | DecoderLM):
        return attention_for_inputs(model, tok, sentences)
    raise AiaynError(f"no attention pictures for a {type(model).__name__}")


# --- PNG heatmaps ---------------------------------------------------------------------------------


def plot_attention_grid(
    maps_L: list[Tensor], rows: list[str], cols: list[str], title: str, axis_names=("", "")
) -> Figure:
    """One heatmap per layer (grid rows) and head (grid columns), plus each layer's head mean.

    Args:
        maps_L: per layer, weights (H, T_q, T_k); rows/cols label T_q and T_k.
        axis_names: what the rows (queries) and columns (keys) are, for the axis labels.
    """
    L, H = len(maps_L), maps_L[0].size(0)
    # 0.22 inch a label reads well, and a panel is as wide as its keys and as tall as its
    # queries. A long sentence shrinks the cells to keep the figure (its canvas is width x height
    # pixels in memory) within MAX_GRID_INCHES a side, and then every `every`-th label is shown.
    w, h = (0.22 * len(labels) + 0.9 for labels in (cols, rows))
    shrink = min(1.0, MAX_GRID_INCHES / (w * (H + 1)), MAX_GRID_INCHES / (h * L + 0.8))
    w, h = (max(1.8, side * shrink) for side in (w, h))  # room for a panel's title
    every = max(1, math.ceil(LABEL_INCHES / (0.8 * shrink * 0.22)))
    fig = Figure(figsize=(w * (H + 1), h * L + 0.8), layout="constrained")
    fig.suptitle(title)
    axes = fig.subplots(L, H + 1, squeeze=False)
    vmax = max(float(m.max()) for m in maps_L) or 1.0
    image = None
    for layer, m_HTS in enumerate(maps_L):
        panels = [*m_HTS, m_HTS.mean(0)]
        for h, w_TS in enumerate(panels):
            ax = axes[layer][h]
            image = ax.imshow(w_TS.float().numpy(), cmap="viridis", vmin=0.0, vmax=vmax)
            ax.set_title(
                f"layer {layer} · " + (f"head {h + 1}" if h < H else "mean of heads"), fontsize=8
            )
            ax.set_xticks(range(0, len(cols), every), cols[::every], rotation=90, fontsize=6)
            ax.set_yticks(range(0, len(rows), every), rows[::every], fontsize=6)
    assert image is not None  # maps_L holds at least one layer
    fig.colorbar(image, ax=axes, shrink=0.6, label="attention weight")
    fig.supylabel(axis_names[0] or "query")
    fig.supxlabel(axis_names[1] or "key")
    return fig


def plot_attention_average(ex: AttentionExample, title: str) -> Figure:
    """Each kind of attention averaged over all layers and heads, side by side."""
    fig = Figure(figsize=(4.7 * len(ex.maps), 5), layout="constrained")
    fig.suptitle(title)
    axes = fig.subplots(1, len(ex.maps), squeeze=False)[0]
    for ax, kind in zip(axes, ex.maps, strict=True):
        w_TS = torch.stack(ex.maps[kind]).mean((0, 1))
        rows, cols = ex.labels(kind)
        image = ax.imshow(w_TS.float().numpy(), cmap="viridis", vmin=0.0)
        ax.set_title(f"{KINDS[kind]}\nmean over layers and heads", fontsize=9)
        ax.set_ylabel(AXES[kind][0], fontsize=8)
        ax.set_xlabel(AXES[kind][1], fontsize=8)
        every = max(1, math.ceil(LABEL_INCHES * max(len(rows), len(cols)) / 3.5))  # 3.5 in wide
        ax.set_xticks(range(0, len(cols), every), cols[::every], rotation=90, fontsize=7)
        ax.set_yticks(range(0, len(rows), every), rows[::every], fontsize=7)
        fig.colorbar(image, ax=ax, shrink=0.7)
    return fig


def lm_attention_figure(model: DecoderLM, tok: Tokenizer, prompt: str) -> Figure:
    """A language model's causal self-attention over BOS + `prompt`: one heatmap per layer
    and head (the upper triangle is 0: position t sees 0..t), and each layer's head mean."""
    from aiayn.glassbox.explain_lm import lm_attention

    maps, pieces = lm_attention(model, tok, prompt)
    _check_numbers([model.cfg.n_layers * model.cfg.n_heads * len(pieces) ** 2])
    title = f"{KINDS['lm_self']} (position t sees 0..t)\nprompt: {prompt!r}"
    return plot_attention_grid(maps, pieces, pieces, title, AXES["lm_self"])


def attention_figures(ex: AttentionExample) -> dict[str, Figure]:
    """File name -> figure: enc_self.png, dec_self.png, cross.png (grids) and average.png."""
    src = " ".join(ex.src)
    figs = {}
    for kind in ex.maps:
        name, rows, cols = KINDS[kind], *ex.labels(kind)
        title = f"{name}\nsource: {src}"
        figs[f"{kind}.png"] = plot_attention_grid(ex.maps[kind], rows, cols, title, AXES[kind])
    title = f"source: {src}\noutput: {' '.join(ex.out)}"
    figs["average.png"] = plot_attention_average(ex, title)
    return figs
