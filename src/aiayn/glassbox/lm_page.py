"""What the live page draws for a language model, as one JSON-ready dict.

`lm_page_data(model, tok, "ROMEO:", temperature=0.8, top_k=40, top_p=0.9)` runs one traced
forward pass over BOS + the prompt (aiayn.glassbox.explain_lm, no search) and returns

    prompt        text, ids, pieces (what the model read: BOS + the prompt, cut from the left)
    attention     {rows, cols, w[layer][head][query][key]}: the causal self-attention maps
                  (rounded to 4 decimals; 0 above the diagonal), as the attention page draws
    distribution  the next-token distribution: p, p at the temperature, the kept set of top-k
                  and top-p and its renormalised probabilities (aiayn.glassbox.distribution),
                  what Transformer Explainer shows for GPT-2; each token's `text` (what it
                  adds to the prompt: "" for EOS, whose id is `eos_id`)
    forward       the forward-pass tensors in `aiayn explain --json`'s form (`tensors`), for
                  the page's forward-pass view; `tensors="attention"` sends the weights only,
                  `"none"` none, `layers` / `heads` choose which

The server answers it at POST /v1/explain/lm (its route lives in aiayn.serve).
"""

from __future__ import annotations

from collections.abc import Sequence

from aiayn.config import DecodeConfig
from aiayn.errors import AiaynError
from aiayn.glassbox.explain_lm import attention_maps, explain_lm
from aiayn.glassbox.render import View
from aiayn.glassbox.render_lm import lm_sections, tensor_json
from aiayn.nn.variants import DecoderLM
from aiayn.text.tokenizer import Tokenizer

PAGE_FORMAT = "aiayn.lm_page/1"
TENSORS = ("all", "attention", "none")


def lm_page_data(
    model: DecoderLM,
    tok: Tokenizer,
    prompt: str,
    *,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    show: int = 10,
    tensors: str = "all",
    layers: Sequence[int] | None = None,
    heads: Sequence[int] | None = None,
    precision: int = 4,
    max_numel: int | None = None,
) -> dict:
    """The page's JSON for `prompt` (module docstring). Settings are checked first: a bad
    temperature, top_k or top_p is one ConfigError line; a layer or head the model lacks, an
    AiaynError. `max_numel` bounds the numbers traced (TraceTooLargeError past it)."""
    if tensors not in TENSORS:
        raise AiaynError(f"tensors={tensors!r}: choose one of {', '.join(TENSORS)}")
    view = View(
        tuple(layers) if layers is not None else None,
        tuple(heads) if heads is not None else None,
        None,
        8,
        precision,
    )
    L, H = model.cfg.n_layers, model.cfg.n_heads
    view_layers, view_heads = view.layers or range(L), view.heads or range(1, H + 1)
    for what, chosen, valid in (
        ("layer", view_layers, range(L)),
        ("head", view_heads, range(1, H + 1)),
    ):
        if bad := [i for i in chosen if i not in valid]:
            raise AiaynError(
                f"{what} {bad[0]} does not exist: the model has {what}s "
                f"{valid.start}..{valid.stop - 1}"
            )

    def want(name: str) -> bool:  # every weight (the maps), the rest as `tensors` asks
        if name.endswith(".weights"):
            return True
        return tensors == "all" and view.shows(name)

    cfg = DecodeConfig(sample=True, temperature=temperature, top_k=top_k, top_p=top_p)
    trace = explain_lm(
        model, tok, prompt, cfg=cfg, max_len=0, show=show, want=want, max_numel=max_numel
    )
    maps = attention_maps(trace)
    w = [m.double().round(decimals=4).tolist() for m in maps]  # [layer][head][query][key]
    forward = []
    if tensors != "none":
        for _title, entries, _step in lm_sections(trace, view):
            forward += [
                tensor_json(e, precision, extra=0)  # the page shows `precision` decimals
                for e in entries
                if tensors == "all" or e.name.endswith(".weights")
            ]
    assert trace.distribution is not None
    distribution = trace.distribution.to_json()
    distribution["eos_id"] = tok.eos_id
    for t in distribution["tokens"]:
        t["text"] = next_text(tok, trace.src_ids, t["id"])
    return {
        "format": PAGE_FORMAT,
        "config": trace.config,
        "prompt": {"text": prompt, "ids": trace.src_ids, "pieces": trace.src_pieces},
        "attention": {"rows": trace.src_pieces, "cols": trace.src_pieces, "w": w},
        "distribution": distribution,
        "forward": {"tensors": forward},
    }


def next_text(tok: Tokenizer, ids: Sequence[int], next_id: int) -> str:
    """The text `next_id` adds after `ids`: decoded after the last of them, whose text it may
    join (a subword's leading space), or alone."""
    last = [i for i in ids[-1:] if i != tok.bos_id]
    before, after = tok.decode(last), tok.decode([*last, next_id])
    return after[len(before) :] if after.startswith(before) else tok.decode([next_id])
