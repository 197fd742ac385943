"""Print a classifier's `ClassifierExplanation` (aiayn.glassbox.explain_cls) as text or JSON:
the forward pass in computation order (embeddings, each layer, the pooled vector, the logits),
then the decision, the pooled vector summarised, and the two attributions (gradient x input
saliency, attention rollout) per token, each said plainly for what it is and is not.

The text view draws signed bars in characters everywhere and, where `colour` is asked for (a
terminal), shades each token by its saliency: red towards the class, blue away from it.
"""

from __future__ import annotations

import html
import json
from collections.abc import Iterator

from torch import Tensor

from aiayn.glassbox.colours import BLUE, RED, colour
from aiayn.glassbox.explain_cls import ROLLOUT_NOTE, SALIENCY_NOTE, ClassifierExplanation
from aiayn.glassbox.explanation import Entry
from aiayn.glassbox.render import View, _layer, _which, entry_lines, token_lines
from aiayn.glassbox.render_lm import tensor_json
from aiayn.glassbox.switches import architecture, norm_name

FORMAT = "aiayn.explain_cls/1"
BAR = 12  # characters a full bar takes, each side of a signed bar
SPARK = "▁▂▃▄▅▆▇█"
SPARK_DIMS = 64  # dimensions drawn in the pooled vector's strip
# What the classifier's own names are (the encoder's come from aiayn.glassbox.explanation).
DESCRIPTIONS = {
    "encoder.embed.norm": "LayerNorm of the embedding sum (BERT's; cfg.embed_norm): the input of "
    "layer 0",
    "pooled": "the sentence vector: the last layer's output pooled over the positions",
    "pooler": "tanh(pooled W + b): BERT's pooler, what the classifier reads",
    "classifier.logits": "pooled W_c + b_c: one score per class",
    "classifier.probs": "softmax(logits): the class probabilities",
}
POOLED_AT = {
    "cls": "row 0 (BOS, BERT's [CLS]: cls pooling reads its output)",
    "mean": "the mean of the rows (mean pooling averages every position)",
}


def describe(e: Entry) -> str:
    """What the tensor is (the classifier's own names first: its logits are not a decoder's;
    a switched model's words before those: an embedding RMSNorm is no LayerNorm)."""
    switched = e.about if e.name == "encoder.embed.norm" else ""
    return switched or DESCRIPTIONS.get(e.name) or e.description


def cls_sections(exp: ClassifierExplanation, view: View) -> Iterator[tuple[str, list[Entry]]]:
    """(title, entries) in computation order: embeddings, each layer, the head."""
    trace = exp.forward
    L, H = trace.layers_and_heads()

    def pick(names: list[str]) -> list[Entry]:
        return [trace.entries[n] for n in names if n in trace.entries and view.shows(n)]

    embed = [f"encoder.embed.{x}" for x in ("tokens", "positions", "sum", "norm")]
    yield "embeddings", pick(embed)
    for layer in range(L):
        if entries := pick(_layer("encoder", layer, H)):
            yield f"layer {layer} (self-attention over the whole text, FFN)", entries
    head = ["encoder.norm", "pooled", "pooler", "classifier.logits", "classifier.probs"]
    yield "the sentence vector and the classes", pick(head)


def signed_bar(v: float, width: int = BAR) -> str:
    """A signed bar for v in [-1, 1]: to the left of '|' when negative, to the right when not."""
    n = round(min(1.0, abs(v)) * width)
    left = ("█" * n).rjust(width) if v < 0 else " " * width
    right = ("█" * n).ljust(width) if v > 0 else " " * width
    return f"{left}|{right}"


def bar(v: float, width: int = 2 * BAR) -> str:
    """An unsigned bar for v in [0, 1]."""
    return ("█" * round(min(1.0, max(0.0, v)) * width)).ljust(width)


def shade(text: str, v: float) -> str:
    """`text` on an ANSI 24-bit background: red for v > 0, blue for v < 0, |v| its strength."""
    rgb = RED if v > 0 else BLUE
    a = min(1.0, abs(v))
    r, g, b = (round(255 + (int(c) - 255) * a) for c in rgb.split(","))
    ink = "97" if a > 0.55 else "30"  # white on a dark shade, black otherwise
    return f"\x1b[{ink};48;2;{r};{g};{b}m{text}\x1b[0m"


def spark(x: Tensor) -> str:
    """The first SPARK_DIMS values of x as one line of blocks, lowest to highest."""
    x = x[:SPARK_DIMS].float()
    lo, hi = float(x.min()), float(x.max())
    span = hi - lo or 1.0
    return "".join(SPARK[min(len(SPARK) - 1, int((float(v) - lo) / span * len(SPARK)))] for v in x)


def vector_lines(name: str, x: Tensor, precision: int) -> list[str]:
    """A vector summarised: norm, mean, spread, extremes and a strip of its first dimensions."""
    x = x.float()
    lo, hi = int(x.argmin()), int(x.argmax())
    std = float(x.std()) if x.numel() > 1 else 0.0
    return [
        f"  {name} ({x.numel()} dims): ‖v‖ = {float(x.norm()):.{precision}f}, mean "
        f"{float(x.mean()):.{precision}f}, std {std:.{precision}f}, min "
        f"{float(x[lo]):.{precision}f} (d{lo}), max {float(x[hi]):.{precision}f} (d{hi})",
        f"  {'dims 0..' + str(min(x.numel(), SPARK_DIMS) - 1):<14} {spark(x)}",
    ]


def decision_lines(exp: ClassifierExplanation, precision: int) -> list[str]:
    width = max(5, *(len(label) for label in exp.labels))
    out = [f"  {'class'.ljust(width)}  {'logit':>10}  {'p':>{precision + 2}}"]
    order = sorted(range(len(exp.labels)), key=lambda c: -float(exp.probs[c]))
    for c in order:
        p = float(exp.probs[c])
        mark = "  <- predicted" if c == exp.predicted else ""
        out.append(
            f"  {exp.labels[c].ljust(width)}  {float(exp.logits[c]):10.{precision}f}  "
            f"{p:.{precision}f}  {bar(p)}{mark}"
        )
    return out


def saliency_lines(exp: ClassifierExplanation, precision: int, ansi: bool) -> list[str]:
    s = exp.saliency
    which = "the predicted class" if s.target == exp.predicted else "the class asked for"
    out = [f"  of the logit of {s.label!r} ({which}); bars: value / max |value|", ""]
    width = max(len(repr(p)) for p in exp.pieces)
    for t, piece in enumerate(exp.pieces):
        shown = repr(piece).ljust(width)
        if ansi:
            shown = shade(shown, s.normalised[t])
        out.append(
            f"  {t:>3}  {shown}  {s.values[t]:+.{precision}f}  {s.normalised[t]:+.2f}  "
            f"{signed_bar(s.normalised[t])}"
        )
    if ansi:
        out += [
            "",
            "  " + "".join(shade(p, v) for p, v in zip(exp.pieces, s.normalised, strict=True)),
        ]
    return out


def rollout_lines(exp: ClassifierExplanation, precision: int) -> list[str]:
    top = float(exp.rollout.max()) or 1.0
    out = [f"  read at {POOLED_AT[exp.pooling]}; the row sums to 1; bars: value / max", ""]
    width = max(len(repr(p)) for p in exp.pieces)
    for t, piece in enumerate(exp.pieces):
        v = float(exp.rollout[t])
        out.append(f"  {t:>3}  {repr(piece).ljust(width)}  {v:.{precision}f}  {bar(v / top)}")
    return out


def cls_to_text(exp: ClassifierExplanation, view: View | None = None, ansi: bool = False) -> str:
    """The explanation as text: the forward pass's tables, then the decision and the two
    attributions (`ansi`: colour shading of the tokens, for a terminal)."""
    view = view or View()
    view.check(exp.forward)
    c = exp.forward.config
    extras = [f"{c['pooling']} pooling"]
    extras += ["pooler"] if c["pooler"] else []
    extras += [f"embedding {norm_name(c)}"] if c["embed_norm"] else []
    p = view.precision
    out = [
        "aiayn explain: a text through the encoder-only classifier, every intermediate named",
        f"model: EncoderClassifier d_model={c['d_model']} h={c['n_heads']} d_k={c['d_k']} "
        f"N={c['n_layers']} d_ff={c['d_ff']} vocab={c['vocab_size']}, {', '.join(extras)}, "
        f"{architecture(c)}",
        f"classes: {', '.join(exp.labels)}",
        f"text: {exp.text}" + ("  (cut to the model's positions)" if exp.cut else ""),
        f"prediction: {exp.labels[exp.predicted]} (p = {float(exp.probs[exp.predicted]):.{p}f})",
        f"showing layers {_which(view.layers)}, heads {_which(view.heads)}; first "
        f"{view.dims} dims per vector, {p} decimals",
        "names: encoder.{layer}.self_attn.head{h}.{leaf}; layers count from 0, heads from 1; "
        "every position sees every other (no causal mask)",
        "",
        "== tokens (BOS + the text + EOS, as the classifier reads them) ==",
        *token_lines(exp.forward),
    ]
    for title, entries in cls_sections(exp, view):
        out += ["", f"== {title} =="]
        for e in entries:
            lines = entry_lines(e, view)
            shape = "x".join(str(s) for s in e.value.shape)
            lines[1] = f"{e.name}  [{shape}]  {describe(e)}"  # entry_lines' header, described
            out += lines
    out += ["", "== the decision ==", *decision_lines(exp, p)]
    out += ["", "== the sentence vector, summarised ==", *vector_lines("pooled", exp.pooled, p)]
    if exp.pooler is not None:
        out += vector_lines("pooler", exp.pooler, p)
    out += ["", "== saliency: gradient x input per token ==", *_wrap(SALIENCY_NOTE)]
    out += saliency_lines(exp, p, ansi)
    out += ["", "== attention rollout per token ==", *_wrap(ROLLOUT_NOTE)]
    out += rollout_lines(exp, p)
    out += [
        "",
        "Neither view is a causal account of the decision: where they disagree, both are still "
        "only what they say above.",
    ]
    return "\n".join(line.rstrip() for line in out) + "\n"


def _wrap(text: str, width: int = 96) -> list[str]:
    lines, line = [], ""
    for word in text.split():
        if line and len(line) + 1 + len(word) > width:
            lines.append("  " + line)
            line = word
        else:
            line = f"{line} {word}" if line else word
    return [*lines, "  " + line] if line else lines


def rounded(x: Tensor | list[float], decimals: int) -> list:
    values = x.tolist() if isinstance(x, Tensor) else x
    return [round(float(v), decimals) for v in values]


def cls_to_json(exp: ClassifierExplanation, view: View | None = None) -> dict:
    """The explanation as a JSON-ready dict (all dims of the chosen layers and heads)."""
    view = view or View()
    view.check(exp.forward)
    d = view.precision + 4
    tensors = []
    for _, entries in cls_sections(exp, view):
        for e in entries:
            t = tensor_json(e, view.precision)
            t["description"] = describe(e)
            tensors.append(t)
    s = exp.saliency
    return {
        "format": FORMAT,
        "kind": "classify",
        "config": exp.forward.config,
        "input": {"text": exp.text, "ids": exp.ids, "pieces": exp.pieces, "cut": exp.cut},
        "labels": exp.labels,
        "prediction": {
            "index": exp.predicted,
            "label": exp.labels[exp.predicted],
            "probability": float(exp.probs[exp.predicted]),
        },
        "logits": rounded(exp.logits, d),
        "probabilities": rounded(exp.probs, d),
        "pooled": rounded(exp.pooled, d),
        "pooler": None if exp.pooler is None else rounded(exp.pooler, d),
        "saliency": {
            "method": "gradient x input",
            "class": s.label,
            "class_index": s.target,
            "values": rounded(s.values, d),
            "normalised": rounded(s.normalised, d),
            "note": SALIENCY_NOTE,
        },
        "rollout": {
            "method": "attention rollout (Abnar & Zuidema, 2020)",
            "read_at": POOLED_AT[exp.pooling],
            "per_token": rounded(exp.rollout, d),
            "matrix": [rounded(row, d) for row in exp.rollout_matrix],
            "note": ROLLOUT_NOTE,
        },
        "tensors": tensors,
    }


def cls_to_json_text(exp: ClassifierExplanation, view: View | None = None) -> str:
    return json.dumps(cls_to_json(exp, view), ensure_ascii=False, allow_nan=False) + "\n"


def cls_to_html(exp: ClassifierExplanation) -> str:
    """The decision and the two attributions as an HTML fragment (a notebook's view of a
    `ClassifierExplanation`): class probabilities as bars, the tokens shaded by saliency (red
    towards the class, blue away) and by rollout, each with its note; no script."""
    esc = html.escape
    s, top = exp.saliency, float(exp.rollout.max()) or 1.0
    rows = "".join(
        f"<tr><td>{esc(label)}</td><td>{float(exp.logits[c]):.4f}</td>"
        f"<td>{float(exp.probs[c]):.4f}</td><td><div style='width:{200 * float(exp.probs[c]):.1f}"
        f"px;height:10px;background:rgba({BLUE},.8)'></div></td>"
        f"<td>{'predicted' if c == exp.predicted else ''}</td></tr>"
        for c, label in enumerate(exp.labels)
    )

    def tokens(values: list[float], unit: bool, what: str) -> str:
        return "".join(
            f"<span title='{t}: {esc(p)} {what} {v:.4f}' style='background:"
            f"{colour(v / top if unit else v, 1.0, unit)};padding:1px 2px;margin:1px'>"
            f"{esc(p)}</span>"
            for t, (p, v) in enumerate(zip(exp.pieces, values, strict=True))
        )

    note = "<p style='font-size:11px;color:#667;max-width:60em'>{}</p>"
    return (
        "<div style='font:13px system-ui,sans-serif'>"
        f"<h4>{esc(exp.text)}: {esc(exp.labels[exp.predicted])} "
        f"(p = {float(exp.probs[exp.predicted]):.4f})</h4>"
        f"<table><tr><th>class</th><th>logit</th><th>p</th><th></th><th></th></tr>{rows}</table>"
        f"<h4>saliency (gradient x input) of the logit of {esc(s.label)!r}</h4>"
        f"<div style='font:14px/2 ui-monospace,monospace'>"
        f"{tokens(s.normalised, False, 'normalised saliency')}</div>"
        + note.format(esc(SALIENCY_NOTE))
        + f"<h4>attention rollout, read at {esc(POOLED_AT[exp.pooling])}</h4>"
        f"<div style='font:14px/2 ui-monospace,monospace'>"
        f"{tokens(exp.rollout.tolist(), True, 'rollout')}</div>"
        + note.format(esc(ROLLOUT_NOTE))
        + "</div>"
    )
