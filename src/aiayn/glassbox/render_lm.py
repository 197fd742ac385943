"""Print a language model's `Explanation` (kind "lm", aiayn.glassbox.explain_lm) as text, JSON
or HTML: the forward pass over BOS + the prompt in computation order, the next-token
distribution as temperature / top-k / top-p reshape it, and the traced generation steps.
(render.to_text / to_json and render_html.to_html are the translator's; `render_lm` builds on
them, so they refuse an LM trace rather than import this module.)
"""

from __future__ import annotations

import html
import json
from collections.abc import Iterator

from aiayn.glassbox.distribution import distribution_lines
from aiayn.glassbox.explanation import Entry, Explanation
from aiayn.glassbox.render import (
    SEARCH_NAME,
    View,
    _jsonable,
    _layer,
    _which,
    entry_lines,
    token_lines,
    top_k_lines,
)
from aiayn.glassbox.render_html import _CSS, entry_html, token_table_html
from aiayn.glassbox.switches import architecture

GENERATION = {"greedy": "greedy continuation", "sample": "sampled continuation"}
CAUSAL_NOTE = (
    "causal mask: position t sees positions 0..t only, so scores_masked is -inf above the "
    "diagonal and the weights there are exactly 0 (each row sums to 1 over 0..t)"
)


def lm_sections(trace: Explanation, view: View) -> Iterator[tuple[str, list[Entry], int | None]]:
    """(title, entries, step) in computation order: embeddings, each layer, the final norm and
    the next-token logits, then one (empty) section per traced generation step."""
    L, H = trace.layers_and_heads()

    def pick(names: list[str]) -> list[Entry]:
        return [trace.entries[n] for n in names if n in trace.entries and view.shows(n)]

    yield "embeddings", pick([f"decoder.embed.{x}" for x in ("tokens", "positions", "sum")]), None
    for layer in range(L):
        names = [n.replace("encoder.", "decoder.", 1) for n in _layer("encoder", layer, H)]
        if entries := pick(names):
            yield f"layer {layer} (causal self-attention, FFN)", entries, None
    top = pick(["decoder.norm", "next.logits", "next.probs"])
    yield "next token after the prompt (the last position)", top, None
    n = len(trace.src_ids)
    for choice in trace.steps:
        t = choice.t
        where = f"position {n - 1 + t}"
        yield f"generation step {t}: feed {choice.input_piece!r} at {where}", [], t


def lm_to_text(trace: Explanation, view: View | None = None) -> str:
    view = view or View()
    view.check(trace)
    c = trace.config
    out = [
        "aiayn explain: a prompt through the decoder-only language model, every intermediate named",
        f"model: DecoderLM d_model={c['d_model']} h={c['n_heads']} d_k={c['d_k']} "
        f"N={c['n_layers']} d_ff={c['d_ff']} vocab={c['vocab_size']}, {architecture(c)}",
        f"prompt: {trace.source}",
        f"{GENERATION[trace.search]}: {trace.translation}",
        f"showing layers {_which(view.layers)}, heads {_which(view.heads)}; first "
        f"{view.dims} dims per vector, {view.precision} decimals",
        "names: decoder.{layer}.self_attn.head{h}.{leaf}; layers count from 0, heads from 1",
        CAUSAL_NOTE,
        "",
        "== tokens (BOS + the prompt, as `aiayn generate` feeds them) ==",
    ]
    out += token_lines(trace)
    for title, entries, step in lm_sections(trace, view):
        out += ["", f"== {title} =="]
        for e in entries:
            out += entry_lines(e, view)
        if step is None and title.startswith("next token") and trace.distribution:
            out += ["", *distribution_lines(trace.distribution, view.precision)]
        if step is not None:
            out += ["", *top_k_lines(trace, step)]
    out += [
        "",
        f"== {GENERATION[trace.search]}: {trace.translation!r} ==",
        "pieces: " + " ".join(repr(p) for p in trace.tgt_pieces),
    ]
    if not trace.steps:
        out.append("(no generation steps: --max-len 0, or the prompt fills the context)")
    return "\n".join(out) + "\n"


def tensor_json(e: Entry, precision: int, extra: int = 4) -> dict:
    """One tensor in `aiayn explain --json`'s form, rounded to precision + extra decimals
    (-inf, a masked score, as null)."""
    data = e.value.double().round(decimals=precision + extra).tolist()
    return {
        "name": e.name,
        "description": e.description,
        "shape": list(e.value.shape),
        "rows": e.rows,
        "cols": e.cols,
        "data": data if bool(e.value.isfinite().all()) else _jsonable(data),
    }


def lm_to_json_text(trace: Explanation, view: View | None = None) -> str:
    return json.dumps(lm_to_json(trace, view), ensure_ascii=False, allow_nan=False) + "\n"


def lm_to_json(trace: Explanation, view: View | None = None) -> dict:
    """The LM trace as a JSON-ready dict (all dims of the chosen layers and heads)."""
    view = view or View()
    view.check(trace)
    tensors = [tensor_json(e, view.precision) for _, es, _ in lm_sections(trace, view) for e in es]
    hyp = trace.hypothesis
    return {
        "format": "aiayn.explain_lm/1",
        "kind": "lm",
        "search": trace.search,
        "config": trace.config,
        "prompt": {"text": trace.source, "ids": trace.src_ids, "pieces": trace.src_pieces},
        "distribution": trace.distribution.to_json() if trace.distribution else None,
        "continuation": {
            "text": trace.translation,
            "ids": trace.tgt_ids,
            "pieces": trace.tgt_pieces,
            "log_prob": hyp.log_prob if hyp else None,
        },
        "steps": [
            {
                "t": s.t,
                "input": s.input_piece,
                "chosen": s.chosen_piece,
                "chosen_id": s.chosen_id,
                "top": [{"id": i, "piece": p, "prob": pr} for i, p, pr in s.top],
            }
            for s in trace.steps
        ],
        "tensors": tensors,
    }


def lm_to_html(trace: Explanation, view: View | None = None) -> str:
    """One self-contained page: a collapsible table per tensor, the distribution, the steps."""
    view = view or View()
    view.check(trace)
    esc = html.escape
    search = GENERATION.get(trace.search, SEARCH_NAME[trace.search])
    parts = [
        f"<!doctype html><html><head><meta charset='utf-8'><title>aiayn explain (LM): "
        f"{esc(trace.source)}</title><style>{_CSS}</style></head><body>",
        f"<h1>aiayn explain: language model</h1><p>prompt: <b>{esc(trace.source)}</b><br>"
        f"{search}: <b>{esc(trace.translation)}</b><br>model: {esc(architecture(trace.config))}"
        f"</p><pre>{esc(json.dumps(trace.config))}</pre>",
        f"<p>{esc(CAUSAL_NOTE)}</p>",
        token_table_html(trace),
    ]
    for title, entries, step in lm_sections(trace, view):
        parts.append(f"<h2>{esc(title)}</h2>")
        parts += [entry_html(e, view) for e in entries]
        if step is None and title.startswith("next token") and trace.distribution:
            lines = distribution_lines(trace.distribution, view.precision)
            parts.append(f"<pre>{esc(chr(10).join(lines))}</pre>")
        if step is not None:
            parts.append(f"<pre>{esc(chr(10).join(top_k_lines(trace, step)))}</pre>")
    parts.append("</body></html>\n")
    return "\n".join(parts)
