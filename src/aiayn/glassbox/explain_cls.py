"""The glass box of an encoder-only classifier (`aiayn.nn.encoder_only.EncoderClassifier`).

`explain_classifier(Classifier.open(dir), "a gripping film")` runs the classifier once over
BOS + the text's ids + EOS (the input `Classifier` gives it) under
`aiayn.nn.tracing.tracing()`, with gradients on, and returns a `ClassifierExplanation`:

- every intermediate of that forward pass under stable names (`encoder.embed.*`,
  `encoder.{l}.self_attn.head{h}.*`, `encoder.{l}.ffn.*`, ...), as `aiayn explain` shows a
  translator's encoder, then the pooled sentence vector (`pooled`, and `pooler` when
  cfg.pooler), the class logits and their softmax;
- two attributions of the decision to the input tokens. Neither is an explanation in the
  causal sense; each answers one narrow question, said in its docstring:
  `Saliency` (gradient x input) and `rollout` (attention rollout, Abnar & Zuidema, 2020).

The numbers are computed in fp32 wherever the model runs (no autocast), from the same pass.
"""

from __future__ import annotations

import importlib
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from aiayn.classify.classifier import Classifier
from aiayn.errors import AiaynError
from aiayn.glassbox.explain import _add, _config_summary
from aiayn.glassbox.explanation import Entry, Explanation, stable_name
from aiayn.nn.encoder_only import EncoderClassifier
from aiayn.nn.tracing import tracing

log = logging.getLogger(__name__)

# Trace names of the classifier's head (aiayn.nn.encoder_only), filed apart from the stack's.
HEAD_NAMES = ("pooled", "pooler", "classifier.logits")

SALIENCY_NOTE = (
    "saliency = gradient x input: d(logit of the class)/d(token embedding) . (token embedding), "
    "summed over d_model; a first-order, local estimate of how much scaling that token's "
    "embedding would move the logit (red/positive: towards the class). It IS NOT causal proof "
    "or a removal test: it is linear around this input, the positions' share is not in it, "
    "and tokens interact in ways one number per token cannot show"
)
ROLLOUT_NOTE = (
    "rollout (Abnar & Zuidema, 2020) = the product over layers of 0.5 x (attention averaged "
    "over heads) + 0.5 x I (the residual), rows renormalised, read at the pooled position(s): "
    "how attention alone could route each token into the sentence vector (the row sums to "
    "1). It IS NOT importance: it ignores the FFNs, the values' and W^O's norms, LayerNorm "
    "and the pooler, treats heads as equal, and carries no sign"
)


@dataclass
class Saliency:
    """Gradient x input per token (Shrikumar et al., 2016), on the token embeddings.

    `values[t]` = sum over d of (d logit_c / d e_td) x e_td, where e is the token embeddings
    entering the embedding sum (the scale by sqrt(d_model) cancels: g/s . s e = g . e) and c
    is `target`. It IS a signed, first-order estimate of how the class's logit would change
    if token t's embedding were scaled a little (d logit / d alpha at alpha = 1 for e_t ->
    alpha e_t). It IS NOT a causal account of the decision: it is local to this input,
    leaves the positional encodings out, and cannot show interactions between tokens.
    `normalised` divides by the largest |value| (for display; 0 when all are 0)."""

    target: int  # the class whose logit is differentiated
    label: str
    values: list[float]
    normalised: list[float]


@dataclass
class ClassifierExplanation:
    """One text through a classifier: the traced forward pass, the decision, two attributions.

    `forward` holds every intermediate under its stable name (an `Explanation` of kind
    "classify": `src_ids`/`src_pieces` are the input, BOS + the text + EOS), including
    `pooled` (D,), `pooler` (D,) when the model has one, `classifier.logits` and
    `classifier.probs` (C,). `rollout_matrix` is the (T, T) rollout, `rollout` its reading at
    the pooled position(s): row 0 (BOS, BERT's [CLS]) for cls pooling, the mean of the rows
    for mean pooling (every position of one unpadded text is real)."""

    text: str
    ids: list[int]
    pieces: list[str]
    labels: list[str]
    pooling: str
    forward: Explanation
    logits: Tensor  # (C,)
    probs: Tensor  # (C,)
    predicted: int
    saliency: Saliency
    rollout_matrix: Tensor  # (T, T), float64
    rollout: Tensor  # (T,), float64, sums to 1
    cut: bool = False  # the text was longer than the model's positions and was cut

    @property
    def pooled(self) -> Tensor:
        return self.forward["pooled"]

    @property
    def pooler(self) -> Tensor | None:
        e = self.forward.entries.get("pooler")
        return None if e is None else e.value

    def _repr_html_(self) -> str:  # a notebook cell draws the decision and the attributions
        # by name: render_cls imports this module (no import cycle)
        render = importlib.import_module("aiayn.glassbox.render_cls")
        return render.cls_to_html(self)  # type: ignore[no-any-return]

    def attention(self) -> list[Tensor]:
        """Per layer, the (H, T, T) self-attention weights."""
        L, H = self.forward.layers_and_heads()
        name = "encoder.{}.self_attn.head{}.weights"
        return [
            torch.stack([self.forward[name.format(layer, h)] for h in range(1, H + 1)])
            for layer in range(L)
        ]


def cls_name(model_name: str) -> str:
    """An EncoderClassifier's trace name -> stable name: `embed.tokens` ->
    `encoder.embed.tokens`, `encoder.layers.0.x` -> `encoder.0.x`; the head's unchanged."""
    if model_name.startswith("embed."):
        model_name = "encoder." + model_name
    return stable_name(model_name)


def check_classifier(classifier: object) -> Classifier:
    if not isinstance(classifier, Classifier) or not isinstance(
        classifier.model, EncoderClassifier
    ):
        raise AiaynError(
            f"explain_classifier needs a Classifier (Classifier.open(dir)), got "
            f"{type(classifier).__name__}"
        )
    return classifier


def class_index(labels: list[str], label: str | None, default: int) -> int:
    """The index of class `label` (None: `default`); an unknown one names the classes."""
    if label is None:
        return default
    if label not in labels:
        shown = ", ".join(repr(x) for x in labels[:20]) + (", ..." if len(labels) > 20 else "")
        raise AiaynError(f"no class {label!r}: the model's classes are {shown}")
    return labels.index(label)


def classifier_input(classifier: Classifier, text: str) -> tuple[list[int], bool]:
    """(BOS + the text's ids + EOS as `Classifier` feeds them, whether the text was cut)."""
    if not isinstance(text, str):
        raise TypeError(f"one text (a str) is explained at a time, got {type(text)}")
    (ids,) = classifier.ids([text])
    limit = classifier.model.cfg.max_len
    n = len(classifier.tok.encode(text, eos=False))
    if n > limit - 2:
        log.warning(
            "the text has %d tokens, more than the model's max_len=%d leaves (BOS and EOS "
            "take 2); explaining its first %d, as the classifier reads it",
            n,
            limit,
            limit - 2,
        )
    return ids, n > limit - 2


def attention_rollout(maps_L: list[Tensor]) -> Tensor:
    """Abnar & Zuidema's rollout (2020), (T, T) float64: R = Â_{L-1} ... Â_1 Â_0 with
    Â_l = rownorm(0.5 mean_h(A_l) + 0.5 I). `maps_L`: per layer, (H, T, T) weights."""
    T = maps_L[0].size(-1)
    eye_TT = torch.eye(T, dtype=torch.float64)
    rollout_TT = eye_TT.clone()
    for w_HTT in maps_L:
        a_TT = 0.5 * w_HTT.double().mean(0) + 0.5 * eye_TT
        a_TT = a_TT / a_TT.sum(-1, keepdim=True)
        rollout_TT = a_TT @ rollout_TT  # the later layer reads what the earlier ones mixed
    return rollout_TT


def read_rollout(rollout_TT: Tensor, pooling: str) -> Tensor:
    """The rollout at what is pooled: row 0 (cls) or the mean of the rows (mean pooling)."""
    return rollout_TT[0] if pooling == "cls" else rollout_TT.mean(0)


def explain_classifier(
    classifier: Classifier,
    text: str,
    *,
    class_label: str | None = None,
    want: Callable[[str], bool] | None = None,
    max_numel: int | None = None,
) -> ClassifierExplanation:
    """Trace `classifier` over `text` (module docstring).

    Args:
        class_label: the class whose logit the saliency differentiates (default: the
            predicted one); an unknown label is an AiaynError naming the classes.
        want: which stable names the trace keeps (default all); the attention weights,
            which rollout reads, are always kept.
        max_numel: the most numbers the trace may hold (TraceTooLargeError past it).
    """
    classifier = check_classifier(classifier)
    model, tok = classifier.model, classifier.tok
    model.eval()
    labels = list(model.labels)
    if class_label is not None:
        class_index(labels, class_label, 0)  # an unknown class is said before the model runs
    ids, cut = classifier_input(classifier, text)
    pieces = tok.pieces(ids)
    forward = Explanation(text, ids, pieces, [], [], "", _config_summary(model))
    forward.kind = "classify"
    forward.config.update(
        pooling=model.cfg.pooling,
        pooler=model.cfg.pooler,
        embed_norm=model.cfg.embed_norm,
        n_classes=len(labels),
        labels=labels,
    )

    def keep(model_name: str) -> bool:
        name = cls_name(model_name)
        return name.endswith(".weights") or name in HEAD_NAMES or want is None or want(name)

    embedded: list[Tensor] = []
    owner = threading.get_ident()

    def as_leaf(_module: object, _inputs: object, out: Tensor) -> Tensor | None:
        # The token embeddings as a leaf of the graph: the gradient is taken with respect to
        # it. Only this thread's pass: a server may run the same model in another meanwhile.
        if threading.get_ident() != owner:
            return None
        leaf = out.detach().requires_grad_(True)
        embedded.append(leaf)
        return leaf

    dev = next(model.parameters()).device
    hook = model.embed.tokens.register_forward_hook(as_leaf)
    try:  # gradients on, whatever the caller turned off (no_grad, inference_mode)
        with torch.inference_mode(False), torch.enable_grad():
            with tracing(keep=keep, max_numel=max_numel) as rec:
                logits_1C = model(torch.tensor([ids], device=dev))
                rec.count(2 * logits_1C.numel())  # the filed probabilities, and the saliency
            logits_C = logits_1C[0].detach().float().cpu()
            predicted = int(logits_C.argmax())
            target = class_index(labels, class_label, predicted)
            (grad_1TD,) = torch.autograd.grad(logits_1C[0, target], embedded[0])
    finally:
        hook.remove()
    probs_C = logits_C.softmax(-1)
    values_T = (grad_1TD[0].double() * embedded[0][0].detach().double()).sum(-1).cpu()
    top = float(values_T.abs().max())
    normalised_T = values_T / top if top > 0 else torch.zeros_like(values_T)
    saliency = Saliency(target, labels[target], values_T.tolist(), normalised_T.tolist())

    raw = {k: v for k, v in rec.tensors.items() if k not in HEAD_NAMES}
    _add(forward, {cls_name(k): v for k, v in raw.items()}, pieces, {"self_attn": pieces})
    for name in ("pooled", "pooler"):
        if name in rec.tensors:
            forward.entries[name] = Entry(name, rec.tensors[name][0].float().cpu(), [name])
    for name, x in (("classifier.logits", logits_C), ("classifier.probs", probs_C)):
        forward.entries[name] = Entry(name, x, [name.split(".")[1]], labels)

    out = ClassifierExplanation(
        text, ids, pieces, labels, model.cfg.pooling, forward, logits_C, probs_C, predicted,
        saliency, torch.empty(0), torch.empty(0), cut,
    )  # fmt: skip
    out.rollout_matrix = attention_rollout(out.attention())
    out.rollout = read_rollout(out.rollout_matrix, out.pooling)
    return out
