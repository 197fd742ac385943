"""Print an `Explanation` (aiayn.glassbox.explanation) as text tables or JSON (HTML: render_html).

A `View` chooses what to show, so that a 512-dimensional, 6-layer, 8-head model stays
readable: which layers and heads, which decoding steps in full, how many model dimensions per
vector (the rest are elided; each row's L2 norm is shown), and how many decimals.
Everything is printed in the order the model computes it (Figure 1, bottom to top).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass

from aiayn.errors import AiaynError
from aiayn.glassbox.explanation import NAME_RE, BeamTrace, Entry, Explanation
from aiayn.glassbox.switches import architecture
from aiayn.search.hypothesis import LENGTH_PENALTY_FORMULAS

MAX_INDICES = 10_000  # more layers, heads or steps than any model has
# A head's intermediates in the order they are computed; the switches' (QK-norm's raw Q and K,
# RoPE's unrotated ones, ALiBi's bias) are there only in a model that has them.
HEAD_LEAVES = ("q_raw", "k_raw", "q_unrotated", "k_unrotated", "q", "k", "v", "alibi_bias",
               "scores", "scores_scaled", "scores_masked", "weights", "output")  # fmt: skip
# One per attention, before its heads: RoPE's angles, the window's mask.
ATTENTION_LEAVES = ("rope_cos", "rope_sin", "band_mask")
SEARCH_NAME = {"greedy": "greedy translation", "sample": "sampled translation"}
CHOSEN = {"greedy": "greedy: the most probable", "sample": "sampled"}
STEP_TOP_RE = re.compile(r"^step(\d+)\.(?:logits|probs)$")  # the generator at step t


@dataclass(frozen=True)
class View:
    """What to show. None = everything. Layers count from 0, heads from 1."""

    layers: tuple[int, ...] | None = None
    heads: tuple[int, ...] | None = None
    steps: tuple[int, ...] | None = None  # decoding steps shown in full (top-k is always shown)
    dims: int = 8  # model dimensions shown per vector
    precision: int = 4

    def check(self, trace: Explanation) -> None:
        """Raise a clear error for a layer or head the model does not have."""
        n_layers, n_heads = trace.layers_and_heads()
        for what, chosen, valid in (
            ("layer", self.layers, range(n_layers)),
            ("head", self.heads, range(1, n_heads + 1)),
        ):
            bad = [i for i in chosen or () if i not in valid]
            if bad:
                raise AiaynError(
                    f"{what} {bad[0]} does not exist: the model has {what}s "
                    f"{valid.start}..{valid.stop - 1}"
                )
        if self.dims < 1 or not 0 <= self.precision <= 12:
            raise AiaynError("dims must be >= 1 and precision between 0 and 12")

    def shows(self, name: str) -> bool:
        m = NAME_RE.match(name)
        if m is None:  # step{t}.logits / .probs: chosen by their step only
            top = STEP_TOP_RE.match(name)
            return top is None or self.steps is None or int(top.group(1)) in self.steps
        step = m.group("step")
        if step is not None and self.steps is not None and int(step) not in self.steps:
            return False
        layer = m.group("layer")
        if layer != "embed" and self.layers is not None and int(layer) not in self.layers:
            return False
        head = m.group("head")
        return head is None or self.heads is None or int(head) in self.heads


def parse_indices(text: str | None) -> tuple[int, ...] | None:
    """'0,2' or '1-3' or '0,4-5' -> (0, 2) / (1, 2, 3) / (0, 4, 5); None or 'all' -> None."""
    if text is None or text.strip().lower() in ("", "all"):
        return None
    out: list[int] = []
    for part in text.split(","):
        lo, sep, hi = part.strip().partition("-")
        try:
            span = range(int(lo), int(hi) + 1) if sep else range(int(lo), int(lo) + 1)
        except ValueError:  # outside, AiaynError (a ValueError) would be taken for a bad number
            raise AiaynError(f"{text!r}: expected numbers like '0,2' or '1-3'") from None
        if not span:  # '3-1' would select nothing, and the view would show no layer
            raise AiaynError(f"{text!r}: a range runs from low to high, like '1-3'")
        if len(out) + len(span) > MAX_INDICES:  # "0-2000000000" would fill the memory
            raise AiaynError(f"{text!r}: more than {MAX_INDICES:,} indices")
        out.extend(span)
    return tuple(out)


def _attention_block(prefix: str, n_heads: int) -> list[str]:
    names = [f"{prefix}.{leaf}" for leaf in ATTENTION_LEAVES]
    names += [f"{prefix}.head{h}.{leaf}" for h in range(1, n_heads + 1) for leaf in HEAD_LEAVES]
    return [*names, f"{prefix}.concat", f"{prefix}.output"]


def _layer(stack: str, layer: int, n_heads: int) -> list[str]:
    p = f"{stack}.{layer}"
    ffn = [f"{p}.ffn.{leaf}" for leaf in ("gate", "up", "hidden", "output")]  # gate, up: gated
    if stack == "encoder":
        sub = [_attention_block(f"{p}.self_attn", n_heads), ffn]
    else:
        sub = [
            _attention_block(f"{p}.self_attn", n_heads),
            _attention_block(f"{p}.cross_attn", n_heads),
            ffn,
        ]
    names: list[str] = []
    for i, block in enumerate(sub, start=1):
        names += [*block, f"{p}.residual{i}", f"{p}.norm{i}"]
    return names


def sections(trace: Explanation, view: View) -> Iterator[tuple[str, list[Entry], int | None]]:
    """(title, entries, step) in computation order; step is set for decoding-step sections."""
    L, H = trace.layers_and_heads()
    embed = ("tokens", "positions", "sum")

    def pick(names: list[str]) -> list[Entry]:
        return [trace.entries[n] for n in names if n in trace.entries and view.shows(n)]

    yield "encoder: embeddings", pick([f"encoder.embed.{x}" for x in embed]), None
    for layer in range(L):
        if entries := pick(_layer("encoder", layer, H)):  # layers not chosen leave no heading
            yield f"encoder layer {layer}", entries, None
    if entries := pick(["encoder.norm"]):  # a pre-LN stack's final norm: the encoder output
        yield "encoder output (the final norm of a pre-LN stack)", entries, None
    for choice in trace.steps:
        t = choice.t
        title = f"decoding step {t}: feed {choice.input_piece!r} at position {t}"
        names = [f"step{t}.decoder.embed.{x}" for x in embed]
        for layer in range(L):
            names += [f"step{t}.{n}" for n in _layer("decoder", layer, H)]
        names += [f"step{t}.decoder.norm", f"step{t}.logits", f"step{t}.probs"]  # Figure 1's top
        yield title, pick(names), t


def format_number(x: float, precision: int) -> str:
    if x == float("-inf"):
        return "-inf"
    return f"{x:.{precision}f}"


def token_lines(trace: Explanation) -> list[str]:
    """The traced input, a token a line: position, id, piece."""
    return [
        f"  {i:>3}  id {t:<6} {p!r}"
        for i, (t, p) in enumerate(zip(trace.src_ids, trace.src_pieces, strict=True))
    ]


def entry_lines(e: Entry, view: View) -> list[str]:
    """One traced tensor: its name, shape and meaning, then its numbers as `view` shows them."""
    shape = "x".join(str(s) for s in e.value.shape)
    return ["", f"{e.name}  [{shape}]  {e.description}", *_table(e, view)]


def _table(entry: Entry, view: View) -> list[str]:
    value = entry.value.float()
    if value.dim() == 1:
        value = value[None]
    n_rows, n_cols = value.shape
    token_cols = entry.cols is not None
    shown = n_cols if token_cols else min(n_cols, view.dims)
    header = list(entry.cols) if entry.cols else [f"d{j}" for j in range(shown)]
    cells = [[format_number(float(v), view.precision) for v in row[:shown]] for row in value]
    if not token_cols:
        header += ([f"…+{n_cols - shown}"] if shown < n_cols else []) + ["‖row‖"]
        norms = value.norm(dim=1)
        for r, row in enumerate(cells):
            row += (["…"] if shown < n_cols else []) + [
                format_number(float(norms[r]), view.precision)
            ]
    labels = [f"{entry.row_start + i}:{p}" for i, p in enumerate(entry.rows)]
    if not entry.numbered:  # a ring cache's slots: each label says its position
        labels = list(entry.rows)
    if len(labels) != n_rows:
        labels = [str(i) for i in range(n_rows)]
    w0 = max(len(s) for s in labels)
    widths = [max(len(h), *(len(row[j]) for row in cells)) for j, h in enumerate(header)]
    lines = [" " * w0 + "  " + "  ".join(h.rjust(w) for h, w in zip(header, widths, strict=True))]
    for label, row in zip(labels, cells, strict=True):
        lines.append(
            label.ljust(w0) + "  " + "  ".join(c.rjust(w) for c, w in zip(row, widths, strict=True))
        )
    return lines


def top_k_lines(trace: Explanation, t: int) -> list[str]:
    choice = trace.steps[t]
    lines = [f"next token after step {t} (top {len(choice.top)} of softmax(logits)):"]
    chosen = CHOSEN[trace.search]
    for rank, (i, piece, p) in enumerate(choice.top, start=1):
        mark = ""
        if i == choice.chosen_id:
            mark = f"  <- chosen ({chosen})"
        elif i in choice.banned:
            mark = "  (never emitted here: the search bans PAD, BOS, and </s> before --min-len)"
        lines.append(f"  {rank:>2}. {piece!r:<16} id {i:<6} p = {p:.4f}{mark}")
    if choice.chosen_id not in [i for i, _, _ in choice.top]:
        lines.append(f"  chosen: {choice.chosen_piece!r} (id {choice.chosen_id})")
    return lines


def to_text(trace: Explanation, view: View | None = None) -> str:
    """The trace as plain-text tables, in the order the model computes them."""
    if trace.kind == "lm":  # a language model's (aiayn.glassbox.explain_lm)
        raise ValueError("a language model's trace is rendered by render_lm.lm_to_text")
    view = view or View()
    view.check(trace)
    c = trace.config
    out = [
        "aiayn explain: one sentence through the Transformer, every intermediate named",
        f"model: d_model={c['d_model']} h={c['n_heads']} d_k={c['d_k']} N={c['n_layers']} "
        f"d_ff={c['d_ff']} vocab={c['vocab_size']}, {architecture(c)}",
        f"source: {trace.source}",
        f"{SEARCH_NAME[trace.search]}: {trace.translation}",
        f"showing layers {_which(view.layers)}, heads {_which(view.heads)}, decoding steps "
        f"{_which(view.steps)}; first {view.dims} dims per vector, {view.precision} decimals",
        "names: encoder.{layer}.self_attn.head{h}.{leaf}; layers count from 0, heads from 1",
        "",
        "== tokens (SentencePiece pieces and ids; the source ends in </s>) ==",
    ]
    out += token_lines(trace)
    for title, entries, step in sections(trace, view):
        out += ["", f"== {title} =="]
        for e in entries:
            out += entry_lines(e, view)
        if step is not None:
            out += ["", *top_k_lines(trace, step)]
    out += [
        "",
        f"== {SEARCH_NAME[trace.search]}: {trace.translation!r} ==",
        "pieces: " + " ".join(repr(p) for p in trace.tgt_pieces),
    ]
    if isinstance(trace.beam, BeamTrace):
        out += ["", *beam_text(trace.beam)]
    return "\n".join(out) + "\n"


def _plural(n: int, one: str, many: str) -> str:
    return f"{n} {one if n == 1 else many}"


def _which(chosen: tuple[int, ...] | None) -> str:
    return "all" if chosen is None else ",".join(map(str, chosen))


def beam_text(beam: BeamTrace) -> list[str]:
    """Every step of a traced beam search as a table of candidates and their fate."""
    out = [
        f"== beam search: beam {beam.beam_size}, length penalty alpha={beam.alpha} ==",
        f"score = log p(Y) / lp(Y), lp(Y) = {LENGTH_PENALTY_FORMULAS[beam.length_penalty]}, "
        "|Y| = generated tokens including </s>. Each step examines the 2N best extensions by "
        "log p.",
    ]
    for step in beam.steps:
        out += [
            "",
            f"-- step {step.t}: {_plural(len(step.live), 'live hypothesis', 'live hypotheses')} --",
        ]
        for i, h in enumerate(step.live):
            out.append(f"  [{i}] {h.text():<40} log p = {h.log_prob:9.4f}  score = {h.score:9.4f}")
        out.append("  rank  from  token             log p      score  status    why")
        for c in step.candidates:
            out.append(
                f"  {c.rank:>4}  [{c.parent}]  {c.piece!r:<16} {c.log_prob:9.4f}  {c.score:9.4f}  "
                f"{c.status:<8}  {c.reason}"
            )
    out += ["", f"stopped: {beam.stop_reason}", "finished hypotheses, best score first:"]
    for h in sorted(beam.finished, key=lambda h: -h.score):
        out.append(f"  score {h.score:9.4f}  log p {h.log_prob:9.4f}  {h.text()}   ({h.reason})")
    if beam.finished:
        out.append(f"beam search output: {beam.best.text()}")
    return out


def _jsonable(rows: list) -> list:
    """-inf (masked scores) becomes null: strict JSON has no infinities."""
    if rows and isinstance(rows[0], list):
        return [_jsonable(r) for r in rows]
    return [None if v == float("-inf") else v for v in rows]


def to_json(trace: Explanation, view: View | None = None) -> dict:
    """The trace as a JSON-ready dict (all dims of the chosen layers/heads/steps)."""
    if trace.kind == "lm":
        raise ValueError("a language model's trace is rendered by render_lm.lm_to_json")
    view = view or View()
    view.check(trace)
    tensors = []
    for _title, entries, _step in sections(trace, view):
        for e in entries:
            tensors.append(
                {
                    "name": e.name,
                    "description": e.description,
                    "shape": list(e.value.shape),
                    "rows": e.rows,
                    "cols": e.cols,
                    "data": _jsonable(e.value.double().round(decimals=view.precision + 4).tolist()),
                }
            )
    out = {
        "format": "aiayn.explain/2",  # 2: `search`, log-probabilities; beam `logprob` -> `log_prob`
        "search": trace.search,
        "config": trace.config,
        "source": {"text": trace.source, "ids": trace.src_ids, "pieces": trace.src_pieces},
        "translation": {
            "text": trace.translation,
            "ids": trace.tgt_ids,
            "pieces": trace.tgt_pieces,
            "log_prob": trace.hypothesis.log_prob if trace.hypothesis else None,
            "score": trace.hypothesis.score if trace.hypothesis else None,
        },
        "steps": [
            {
                "t": s.t,
                "input": s.input_piece,
                "chosen": s.chosen_piece,
                "top": [{"id": i, "piece": p, "prob": pr} for i, p, pr in s.top],
            }
            for s in trace.steps
        ],
        "tensors": tensors,
    }
    if isinstance(trace.beam, BeamTrace):
        from dataclasses import asdict

        out["beam"] = asdict(trace.beam)
    return out


def to_json_text(trace: Explanation, view: View | None = None) -> str:
    return json.dumps(to_json(trace, view), ensure_ascii=False, allow_nan=False) + "\n"
