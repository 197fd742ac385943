"""What the live page of a classifier draws (static/classify.html), as one JSON-ready dict.

`classify_page_json(classifier, "a gripping film", class_label="pos")` runs one traced forward
pass over BOS + the text + EOS (aiayn.glassbox.explain_cls; only the attention weights and the
head are recorded) and returns

    text, ids, pieces, cut   what the model read (cut: the text was longer than its positions)
    config                   the model's shape, pooling and classes
    labels, logits, probabilities, prediction
    attention                {rows, cols, w[layer][head][query][key]} (4 decimals)
    pooled, pooler           the sentence vector (and the pooler's output, or null)
    saliency                 gradient x input per token, of `class_label`'s logit (default
                             the predicted class), signed and normalised, with what it is not
    rollout                  attention rollout at the pooled position(s), and what it is not

Sizes are bounded: the text is cut to the model's positions, and the numbers traced to
MAX_PAGE_NUMBERS (the maps grow with layers x heads x length^2); past it,
TraceTooLargeError. The server answers it at POST /v1/explain/classify (its route lives in
aiayn.serve), the page's class selector asks again with {"text", "class"}.
"""

from __future__ import annotations

from torch import Tensor

from aiayn.classify.classifier import Classifier
from aiayn.glassbox.explain_cls import ROLLOUT_NOTE, SALIENCY_NOTE, explain_classifier
from aiayn.glassbox.render_cls import POOLED_AT, rounded

PAGE_FORMAT = "aiayn.classify_page/1"
# Numbers one page's trace may hold: ~2M attention weights are ~16 MB of JSON, e.g. 12 layers
# x 12 heads x 118 tokens, or 4 x 4 x 350.
MAX_PAGE_NUMBERS = 2_000_000
DECIMALS = 4  # what the page shows; the numbers are rounded to it
CONFIG_KEYS = ("d_model", "n_heads", "n_layers", "d_ff", "vocab_size", "norm", "positional",
               "pooling", "pooler", "embed_norm", "n_classes", "differs")  # fmt: skip


def classify_page_json(
    classifier: Classifier,
    text: str,
    class_label: str | None = None,
    *,
    max_numel: int | None = None,
) -> dict:
    """The page's JSON for `text` (module docstring). An unknown `class_label` is an
    AiaynError naming the classes; `max_numel` (at most MAX_PAGE_NUMBERS) bounds the numbers
    traced (TraceTooLargeError past it)."""
    budget = MAX_PAGE_NUMBERS if max_numel is None else min(max_numel, MAX_PAGE_NUMBERS)
    exp = explain_classifier(
        classifier, text, class_label=class_label, want=lambda _name: False, max_numel=budget
    )
    c = exp.forward.config
    s = exp.saliency
    maps = [[_rows(w_TT) for w_TT in w_HTT] for w_HTT in exp.attention()]
    return {
        "format": PAGE_FORMAT,
        "config": {key: c[key] for key in CONFIG_KEYS},
        "text": exp.text,
        "ids": exp.ids,
        "pieces": exp.pieces,
        "cut": exp.cut,
        "labels": exp.labels,
        "logits": rounded(exp.logits, 6),
        "probabilities": rounded(exp.probs, 6),
        "prediction": {
            "index": exp.predicted,
            "label": exp.labels[exp.predicted],
            "probability": float(exp.probs[exp.predicted]),
        },
        "attention": {"rows": exp.pieces, "cols": exp.pieces, "w": maps},
        "pooled": rounded(exp.pooled, DECIMALS),
        "pooler": None if exp.pooler is None else rounded(exp.pooler, DECIMALS),
        "saliency": {
            "method": "gradient x input",
            "class": s.label,
            "class_index": s.target,
            "values": rounded(s.values, 6),
            "normalised": rounded(s.normalised, DECIMALS),
        },
        "rollout": {
            "method": "attention rollout (Abnar & Zuidema, 2020)",
            "read_at": POOLED_AT[exp.pooling],
            "per_token": rounded(exp.rollout, DECIMALS),
        },
        "notes": {"saliency": SALIENCY_NOTE, "rollout": ROLLOUT_NOTE},
    }


def _rows(w_TT: Tensor) -> list[list[float]]:
    return w_TT.double().round(decimals=DECIMALS).tolist()
