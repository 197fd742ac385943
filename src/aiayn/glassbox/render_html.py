"""An `Explanation` as one self-contained HTML page: a shaded table per tensor (no script, no
network), the same sections and `View` as the text rendering in aiayn.glassbox.render.
"""

from __future__ import annotations

import html
import json

from aiayn.glassbox.colours import colour
from aiayn.glassbox.explanation import BeamTrace, Entry, Explanation
from aiayn.glassbox.render import SEARCH_NAME, View, beam_text, format_number, sections, top_k_lines
from aiayn.glassbox.switches import architecture

_CSS = """body{font:14px system-ui,sans-serif;margin:1.5em;color:#222}
table{border-collapse:collapse;font:12px ui-monospace,monospace;margin:.3em 0 1em}
td,th{padding:1px 6px;text-align:right;border:1px solid #eee}th{background:#f6f6f6}
summary{cursor:pointer;font-family:ui-monospace,monospace}summary span{color:#666;
font-family:system-ui}h2{margin-top:1.5em;border-bottom:1px solid #ccc}
pre{background:#f8f8f8;padding:.5em}"""


def token_table_html(trace: Explanation) -> str:
    """The traced input as a table: position, id, piece."""
    esc = html.escape
    rows = "".join(
        f"<tr><td>{i}</td><td>{t}</td><td>{esc(p)}</td></tr>"
        for i, (t, p) in enumerate(zip(trace.src_ids, trace.src_pieces, strict=True))
    )
    return f"<h2>tokens</h2><table><tr><th>pos</th><th>id</th><th>piece</th></tr>{rows}</table>"


def entry_html(e: Entry, view: View) -> str:
    """One traced tensor, folded: its name, shape and meaning, its numbers inside."""
    esc = html.escape
    return (
        f"<details><summary>{esc(e.name)} <span>[{'x'.join(map(str, e.value.shape))}] "
        f"{esc(e.description)}</span></summary>{_html_table(e, view)}</details>"
    )


def _html_table(e: Entry, view: View) -> str:
    value = e.value.float()
    if value.dim() == 1:
        value = value[None]
    n_cols = value.size(1)
    shown = n_cols if e.cols is not None else min(n_cols, view.dims)
    head = e.cols if e.cols is not None else [f"d{j}" for j in range(shown)]
    finite = value[:, :shown][value[:, :shown].isfinite()]
    scale = float(finite.abs().max()) if finite.numel() else 0.0
    weights = e.name.endswith("weights")
    rows = []
    for r in range(value.size(0)):
        label = e.rows[r] if r < len(e.rows) else str(r)
        cells = "".join(
            f'<td style="background:{colour(x, scale, weights)}">'
            f"{format_number(x, view.precision)}</td>"
            for x in value[r, :shown].tolist()
        )
        more = "<td>…</td>" if shown < n_cols else ""
        rows.append(f"<tr><th>{html.escape(label)}</th>{cells}{more}</tr>")
    ths = "".join(f"<th>{html.escape(h)}</th>" for h in head) + (
        "<th>…</th>" if shown < n_cols else ""
    )
    return f"<table><tr><th></th>{ths}</tr>{''.join(rows)}</table>"


def to_html(trace: Explanation, view: View | None = None) -> str:
    """One self-contained page (no script, no network): a collapsible table per tensor."""
    if trace.kind == "lm":  # a language model's (aiayn.glassbox.explain_lm)
        raise ValueError("a language model's trace is rendered by render_lm.lm_to_html")
    view = view or View()
    view.check(trace)
    esc = html.escape
    parts = [
        f"<!doctype html><html><head><meta charset='utf-8'><title>aiayn explain: "
        f"{esc(trace.source)}</title><style>{_CSS}</style></head><body>",
        f"<h1>aiayn explain</h1><p>source: <b>{esc(trace.source)}</b><br>"
        f"{SEARCH_NAME[trace.search]}: "
        f"<b>{esc(trace.translation)}</b><br>model: {esc(architecture(trace.config))}</p>"
        f"<pre>{esc(json.dumps(trace.config))}</pre>",
        token_table_html(trace),
    ]
    for title, entries, step in sections(trace, view):
        parts.append(f"<h2>{esc(title)}</h2>")
        parts += [entry_html(e, view) for e in entries]
        if step is not None:
            parts.append(f"<pre>{esc(chr(10).join(top_k_lines(trace, step)))}</pre>")
    if isinstance(trace.beam, BeamTrace):
        parts.append(f"<h2>beam search</h2><pre>{esc(chr(10).join(beam_text(trace.beam)))}</pre>")
    parts.append("</body></html>\n")
    return "\n".join(parts)
