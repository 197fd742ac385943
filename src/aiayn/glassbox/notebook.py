"""Inline views for Jupyter: a matrix, attention, the forward pass, beam search, the seeds' example.

Each object has `_repr_html_`, so the last expression of a cell draws it. The HTML is
self-contained: inline SVG and CSS, no script, no CDN, no require.js, so it renders offline and
in front ends that strip scripts; hovering a cell shows its value through SVG's <title>.

    ex = explain(model, tok, "forty-two")           # aiayn.glassbox.explain.Explanation
    AttentionView(ex, "cross", layer=1, head=2)      # rows: produced tokens, columns: the source
    ForwardPassView(ex, layer=0, head=1, source=2)   # one source piece's chain through layer 0
    ForwardPassView(ex, layer=1, head=1, step=3)     # decoding step 3, up to the logits
    BeamView(trace_beam(model, tok, "forty-two", DecodeConfig(beam_size=4)))
    MatrixView(torch.randn(3, 4), title="anything 1-D or 2-D")
    SeedExampleView()                                # aiayn explain --seed-example, as tables

Every cell drawn from a trace carries `data-name`, `data-r`, `data-c` and `data-v` (the stable
name, the place and the value as Python prints the float), as the page of `aiayn serve` does.
"""

from __future__ import annotations

import html
import math
from collections.abc import Sequence

import torch
from torch import Tensor

from aiayn.glassbox.colours import colour
from aiayn.glassbox.explanation import BeamTrace, Explanation
from aiayn.glassbox.switches import norm_name, ring_positions
from aiayn.search.hypothesis import LENGTH_PENALTY_FORMULAS

CELL = 14  # pixels per vector element
LABEL = 300  # pixels for a strip's label
_STYLE = (
    "<style>.aiayn-nb{font:12px system-ui,sans-serif;color:#222}.aiayn-nb h4{margin:.6em 0 .2em;"
    "font-size:13px}.aiayn-nb table{border-collapse:collapse;font:12px ui-monospace,monospace}"
    ".aiayn-nb td,.aiayn-nb th{padding:1px 6px;border:1px solid #eee;text-align:right}"
    ".aiayn-nb .live{color:#1a7f37}.aiayn-nb .finished{color:#1f4fb4;font-weight:bold}"
    ".aiayn-nb .pruned{color:#999;text-decoration:line-through}</style>"
)
esc = html.escape


def _values(x: Tensor) -> list[float | None]:
    return [None if v == float("-inf") else v for v in x.double().tolist()]


def _cells(
    row: Sequence[float | None],
    x0: float,
    y: float,
    name: str,
    r: int,
    cols: Sequence[str],
    unit: bool,
    size: int = CELL,
) -> list[str]:
    finite = [abs(v) for v in row if v is not None]
    scale = max(finite, default=0.0)
    out = []
    for j, v in enumerate(row):
        shown = "-inf" if v is None else repr(v)
        out.append(
            f'<rect x="{x0 + j * size}" y="{y}" width="{size - 1}" height="{size - 1}" '
            f'fill="{colour(v, scale, unit)}" data-name="{esc(name)}" data-r="{r}" '
            f'data-c="{j}" data-v="{shown}"><title>{esc(name)}[{r}, {j}] ({esc(cols[j])}) = '
            f"{shown}</title></rect>"
        )
    return out


def _svg(parts: list[str], width: float, height: float) -> str:
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width:.0f}" height="{height:.0f}" '
        f'font-family="sans-serif" font-size="12">{"".join(parts)}</svg>'
    )


def _check_place(
    ex: Explanation,
    layer: int,
    head: int | str,
    *,
    source: int | None = None,
    step: int | None = None,
) -> None:
    """A layer, head, source piece or step that the explanation does not have is a ValueError
    naming what it has (a KeyError on a tensor name, or an IndexError, before)."""
    n_layers, n_heads = ex.layers_and_heads()
    if not 0 <= layer < n_layers:
        raise ValueError(f"layer {layer} does not exist: the model has layers 0..{n_layers - 1}")
    if head != "mean" and not (str(head).isdigit() and 1 <= int(head) <= n_heads):
        raise ValueError(f"head {head!r} does not exist: the model has heads 1..{n_heads}")
    if source is not None and not 0 <= source < len(ex.src_pieces):
        raise ValueError(f"source={source}: the sentence has pieces 0..{len(ex.src_pieces) - 1}")
    if step is not None and not 0 <= step < len(ex.steps):
        raise ValueError(f"step={step}: the translation has steps 0..{len(ex.steps) - 1}")


class MatrixView:
    """A 1-D or 2-D tensor as a heat map with row and column labels (values on hover).

    At most `max_rows` x `max_cols` cells are drawn, the first ones (a cell is an SVG element:
    an FFN's 1,000 x 2,048 hidden layer would be two million of them); the title says so.
    """

    def __init__(
        self,
        value: Tensor,
        rows: Sequence[str] | None = None,
        cols: Sequence[str] | None = None,
        title: str = "",
        unit: bool = False,
        name: str = "",
        max_rows: int = 256,
        max_cols: int = 256,
    ) -> None:
        if value.dim() not in (1, 2):
            raise ValueError(f"a 1-D or 2-D tensor is drawn, got shape {tuple(value.shape)}")
        if min(max_rows, max_cols) < 1:
            raise ValueError(f"max_rows and max_cols must be at least 1: {max_rows}, {max_cols}")
        self.value = value[None] if value.dim() == 1 else value
        n_rows, n_cols = self.value.shape
        self.rows = list(rows) if rows is not None else [str(i) for i in range(n_rows)]
        self.cols = list(cols) if cols is not None else [f"d{j}" for j in range(n_cols)]
        if (len(self.rows), len(self.cols)) != (n_rows, n_cols):
            raise ValueError(
                f"{len(self.rows)} row and {len(self.cols)} column labels for a "
                f"{n_rows} x {n_cols} tensor"
            )
        self.title, self.unit, self.name = title, unit, name or title
        self.max_rows, self.max_cols = max_rows, max_cols

    def _repr_html_(self) -> str:
        shape = " × ".join(map(str, self.value.shape))
        shown = self.value[: self.max_rows, : self.max_cols]
        if shown.shape != self.value.shape:
            shape += f", the first {shown.size(0)} × {shown.size(1)} drawn"
        size = 22 if shown.size(1) <= 24 else 10
        left = 10 + 7 * max(len(s) for s in self.rows)
        top = 10 + 6 * max(len(s) for s in self.cols) if size > 10 else 10
        parts = []
        for j, c in enumerate(self.cols[: shown.size(1)] if size > 10 else []):
            x = left + j * size + size * 0.6
            parts.append(
                f'<text x="{x}" y="{top - 4}" transform="rotate(-60 {x} {top - 4})">{esc(c)}</text>'
            )
        for i, row in enumerate(shown):
            y = top + i * size
            parts.append(
                f'<text x="{left - 4}" y="{y + size * 0.7}" text-anchor="end">'
                f"{esc(self.rows[i])}</text>"
            )
            parts += _cells(_values(row), left, y, self.name, i, self.cols, self.unit, size)
        width = left + size * shown.size(1) + 10
        svg = _svg(parts, width, top + size * shown.size(0) + 4)
        return f'<div class="aiayn-nb">{_STYLE}<h4>{esc(self.title)} [{shape}]</h4>{svg}</div>'


class AttentionView(MatrixView):
    """One layer and head (or "mean") of a traced translation's attention.

    kind: "cross" (rows: produced tokens, columns: the source), "enc_self" or "dec_self"
    (rows: produced tokens, columns: the tokens fed, BOS first).
    """

    def __init__(
        self, ex: Explanation, kind: str = "cross", layer: int = 0, head: int | str = 1
    ) -> None:
        if kind not in ("cross", "enc_self", "dec_self"):  # "crss" drew decoder self-attention
            raise ValueError(f"kind={kind!r}: choose 'cross', 'enc_self' or 'dec_self'")
        _check_place(ex, layer, head)
        _, n_heads = ex.layers_and_heads()
        heads = range(1, n_heads + 1) if head == "mean" else [int(head)]
        fed = [s.input_piece for s in ex.steps]
        if kind == "enc_self":
            names = [f"encoder.{layer}.self_attn.head{h}.weights" for h in heads]
            w = torch.stack([ex[n] for n in names]).mean(0)
            rows, cols = ex.src_pieces, ex.src_pieces
        else:
            attn = "cross_attn" if kind == "cross" else "self_attn"
            n_keys = len(ex.src_pieces) if kind == "cross" else len(fed)
            w = torch.zeros(len(ex.steps), n_keys)
            window = int(ex.config.get("attn_window") or 0)  # type: ignore[call-overload]
            for s in ex.steps:  # step t has t + 1 keys in decoder self-attention
                one = torch.stack(
                    [ex[f"step{s.t}.decoder.{layer}.{attn}.head{h}.weights"][0] for h in heads]
                ).mean(0)
                if kind == "dec_self" and window and one.numel() != s.t + 1:  # a ring's slots
                    for slot, col in enumerate(ring_positions(s.t, window, one.numel())):
                        if col >= 0:
                            w[s.t, col] = one[slot]
                else:
                    w[s.t, : one.numel()] = one
            rows, cols = (
                [s.chosen_piece for s in ex.steps],
                ex.src_pieces if kind == "cross" else fed,
            )
        title = f"{kind} attention, layer {layer}, head {head}"
        super().__init__(w, rows, cols, title, unit=True, name=title)


def _stages(
    ex: Explanation, layer: int, head: int, source: int | None, step: int | None
) -> list[tuple[str, list[tuple[str, str, str, int]]]]:
    """[(stage title, [(label, shape, stable name, row)])]: the chain of one position."""
    enc = step is None
    pre, r = ("encoder", int(source or 0)) if enc else (f"step{step}.decoder", 0)
    norm = norm_name(ex.config)  # LayerNorm, or RMSNorm
    act = str(ex.config.get("activation", "relu"))
    hidden = {"relu": "max(0, x W₁ + b₁)", "swiglu": "gate ⊙ up", "geglu": "gate ⊙ up"}.get(
        act, f"{act}(x W₁ + b₁)"
    )
    out = [
        (
            "Input embedding and positional encoding (§3.4, §3.5)",
            [
                ("embedding × √d_model", "1 × d_model", f"{pre}.embed.tokens", r),
                ("PE(pos)", "1 × d_model", f"{pre}.embed.positions", r),
                ("x = embedding + PE", "1 × d_model", f"{pre}.embed.sum", r),
            ],
        )
    ]
    blocks = (
        [("self_attn", "self-attention")]
        if enc
        else [("self_attn", "masked self-attention"), ("cross_attn", "cross-attention")]
    )
    for sub, (attn, title) in enumerate(blocks, start=1):
        p, hp = f"{pre}.{layer}.{attn}", f"{pre}.{layer}.{attn}.head{head}"
        kv = f"step0.decoder.{layer}.cross_attn.head{head}" if attn == "cross_attn" else hp
        # the switches' intermediates (QK-norm, RoPE): drawn where the model has them
        new_k = kv if attn == "cross_attn" else hp  # a step's self-attention: its new key
        rows: list[tuple[str, str, str, int]] = [
            ("x W^Q before QK-norm", "1 × d_k", f"{hp}.q_raw", r),
            ("K before QK-norm", "1 × d_k", f"{new_k}.k_raw", r),
            ("Q before RoPE", "1 × d_k", f"{hp}.q_unrotated", r),
            ("K before RoPE", "1 × d_k", f"{new_k}.k_unrotated", r),
            ("RoPE cos", "1 × d_k", f"{p}.rope_cos", r),
            ("RoPE sin", "1 × d_k", f"{p}.rope_sin", r),
            ("Q = x W^Q", "1 × d_k", f"{hp}.q", r),
        ]
        for leaf in ("k", "v"):
            n_keys = ex.entries[f"{kv}.{leaf}"].value.size(0) if f"{kv}.{leaf}" in ex.entries else 0
            rows += [
                (f"{leaf.upper()} row {i}", "n × d_k", f"{kv}.{leaf}", i) for i in range(n_keys)
            ]
        rows += [
            ("window: 1 = may attend", "1 × n", f"{p}.band_mask", r),
            ("ALiBi bias", "1 × n", f"{hp}.alibi_bias", r),
            ("scores Q Kᵀ", "1 × n", f"{hp}.scores", r),
            ("Q Kᵀ / √d_k", "1 × n", f"{hp}.scores_scaled", r),
            ("+ mask", "1 × n", f"{hp}.scores_masked", r),
            ("softmax", "1 × n", f"{hp}.weights", r),
            ("weights · V", "1 × d_k", f"{hp}.output", r),
            ("Concat(head_1..head_h)", "1 × h·d_k", f"{p}.concat", r),
            ("· W^O + b^O", "1 × d_model", f"{p}.output", r),
            ("x + Sublayer(x)", "1 × d_model", f"{pre}.{layer}.residual{sub}", r),
            (norm, "1 × d_model", f"{pre}.{layer}.norm{sub}", r),
        ]
        out.append((f"Layer {layer}: {title}, head {head} (§3.2)", rows))
    sub = len(blocks) + 1
    out.append(
        (
            f"Layer {layer}: feed-forward network (§3.3)",
            [
                ("gate: act(x W₁)", "1 × d_ff", f"{pre}.{layer}.ffn.gate", r),
                ("up: x W₃", "1 × d_ff", f"{pre}.{layer}.ffn.up", r),
                (hidden, "1 × d_ff", f"{pre}.{layer}.ffn.hidden", r),
                ("· W₂ + b₂", "1 × d_model", f"{pre}.{layer}.ffn.output", r),
                ("x + FFN(x)", "1 × d_model", f"{pre}.{layer}.residual{sub}", r),
                (norm, "1 × d_model", f"{pre}.{layer}.norm{sub}", r),
            ],
        )
    )
    if not enc:
        out.append(
            (
                f"Output at step {step} (from the last layer; §3.4)",
                [
                    ("logits", "1 × vocab", f"step{step}.logits", 0),
                    ("softmax(logits)", "1 × vocab", f"step{step}.probs", 0),
                ],
            )
        )
    return out


class ForwardPassView:
    """One position's chain through one layer: give `source=i` (a source piece) or `step=t`
    (a decoding step, up to the logits). `dims` limits the model dimensions drawn per vector
    (rows over the keys keep every key); each row's L2 norm is printed."""

    def __init__(
        self,
        ex: Explanation,
        layer: int = 0,
        head: int = 1,
        *,
        source: int | None = None,
        step: int | None = None,
        dims: int = 16,
    ) -> None:
        if (source is None) == (step is None):
            raise ValueError("give source=i or step=t")
        _check_place(ex, layer, head, source=source, step=step)
        self.ex, self.layer, self.head, self.source, self.step = ex, layer, head, source, step
        self.dims = dims

    def stages(self) -> list[tuple[str, list[tuple[str, str, str, int]]]]:
        return _stages(self.ex, self.layer, self.head, self.source, self.step)

    def _repr_html_(self) -> str:
        ex, parts, y = self.ex, [], 4.0
        if self.step is None:
            where = f"source position {self.source}: {ex.src_pieces[self.source or 0]}"
        else:
            where = f"decoding step {self.step}: {ex.steps[self.step].input_piece} fed"
        parts.append(f'<text x="4" y="{y + 14}" font-weight="bold">{esc(where)}</text>')
        y += 24
        for title, rows in self.stages():
            parts.append(f'<text x="4" y="{y + 14}" font-weight="bold">{esc(title)}</text>')
            y += 20
            for label, shape, name, r in rows:
                if name not in ex.entries:  # e.g. a pre-LN model has no norm entries
                    continue
                e = ex.entries[name]
                row = e.value if e.value.dim() == 1 else e.value[r]
                n = row.numel() if e.cols is not None else min(row.numel(), self.dims)
                cols = e.cols or [f"d{j}" for j in range(row.numel())]
                unit = name.endswith(("weights", "probs"))
                extra = ""
                if name.endswith("ffn.hidden"):  # "(ReLU)" unless the model has another
                    relu = ex.config.get("activation", "relu") == "relu"
                    extra = f"   {int((row == 0).sum())} of {row.numel()} are 0"
                    extra += " (ReLU)" if relu else ""
                finite = row[row.isfinite()].double()
                norm = float(finite.norm()) if finite.numel() else 0.0
                more = f"… +{row.numel() - n}  " if n < row.numel() else ""
                parts.append(
                    f'<text x="12" y="{y + 11}">{esc(label)}</text><text x="12" '
                    f'y="{y + 23}" font-size="10" fill="#667">{esc(shape)} = 1 × '
                    f"{row.numel()}  {esc(name)}</text>"
                )
                parts += _cells(_values(row[:n]), LABEL, y + 4, name, r, cols, unit)
                parts.append(
                    f'<text x="{LABEL + n * CELL + 6}" y="{y + 15}" font-size="10">'
                    f"{more}‖row‖ = {norm:.4f}{esc(extra)}</text>"
                )
                y += 30
        if self.step is not None:
            s = ex.steps[self.step]
            top = ", ".join(f"{p} {prob:.3f}" for _, p, prob in s.top)
            parts.append(
                f'<text x="12" y="{y + 12}">top: {esc(top)}; chosen: '
                f"<tspan font-weight='bold' fill='#c0392b'>{esc(s.chosen_piece)}"
                "</tspan></text>"
            )
            y += 20
        width = LABEL + CELL * max(self.dims, len(ex.src_pieces), len(ex.steps) + 1) + 280
        return f'<div class="aiayn-nb">{_STYLE}{_svg(parts, width, y + 6)}</div>'


class BeamView:
    """A traced beam search (`aiayn.glassbox.explain.trace_beam`): each step's live
    hypotheses and the candidates with their log-probability, score and fate; the finished
    ones; the output."""

    def __init__(self, beam: BeamTrace) -> None:
        self.beam = beam

    def _repr_html_(self) -> str:
        b = self.beam
        out = [
            f'<div class="aiayn-nb">{_STYLE}<h4>beam search: beam {b.beam_size}, '
            f"α = {b.alpha} (lp(Y) = {LENGTH_PENALTY_FORMULAS[b.length_penalty]}), at most "
            f"{b.max_len} tokens</h4>"
        ]
        for step in b.steps:
            out.append(
                f"<h4>step {step.t}</h4><table><tr><th>rank</th><th>hypothesis + token"
                "</th><th>log p</th><th>score</th><th>fate</th></tr>"
            )
            for c in step.candidates:
                parent = step.live[c.parent].text()
                out.append(
                    f'<tr class="{c.status}" title="{esc(c.reason)}"><td>{c.rank}</td>'
                    f"<td>{esc(parent)} <b>{esc(c.piece)}</b></td><td>{c.log_prob:.4f}</td>"
                    f"<td>{c.score:.4f}</td><td>{c.status}</td></tr>"
                )
            out.append("</table>")
        out.append(
            f"<p>stopped: {esc(b.stop_reason)}</p><table><tr><th>finished</th>"
            "<th>log p</th><th>score</th></tr>"
        )
        for h in sorted(b.finished, key=lambda h: -h.score):
            out.append(
                f'<tr class="finished"><td>{esc(h.text())}</td><td>{h.log_prob:.4f}</td>'
                f"<td>{h.score:.4f}</td></tr>"
            )
        best = f"<p>output: <b>{esc(b.best.text())}</b></p>" if b.finished else ""
        return "".join(out) + "</table>" + best + "</div>"


class SeedExampleView:
    """`aiayn explain --seed-example` as tables: every matrix of docs/worked_example.md under its
    label (the seeds' wrong values marked)."""

    def __init__(self, sections: Sequence[int] = (1, 2, 3)) -> None:
        from aiayn.glassbox.seed_example import seed_example_json

        data = seed_example_json()["sections"]
        self.sections = [data[i - 1] for i in sections]

    def _repr_html_(self) -> str:
        out = [f'<div class="aiayn-nb">{_STYLE}']
        for sec in self.sections:
            out.append(f"<h4>{esc(sec['title'])}</h4>")
            for item in sec["items"]:
                if "text" in item:
                    out.append(f"<pre>{esc(item['text'])}</pre>")
                    continue
                rows = item["data"] if isinstance(item["data"][0], list) else [item["data"]]
                wrong = (
                    " (what the seed printed: wrong)" if item["label"].startswith("seed 00") else ""
                )
                cells = "".join(
                    "<tr>"
                    + "".join(f"<td>{_seed_number(v, item['decimals'])}</td>" for v in r)
                    + "</tr>"
                    for r in rows
                )
                out.append(
                    f'<table data-label="{esc(item["label"])}"><caption>'
                    f"{esc(item['label'])}{wrong}</caption>{cells}</table>"
                )
        return "".join(out) + "</div>"


def _seed_number(v: float | None, decimals: int) -> str:
    if v is None:
        return "-inf"
    if decimals != 8:
        return f"{v:.{decimals}f}"
    from aiayn.glassbox.seed_example import num

    return num(v) if math.isfinite(v) else str(v)
