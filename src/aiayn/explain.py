"""The glass box: one sentence through a trained model, every intermediate named (issue 6).

`explain(model, tok, "sentence")` runs the real forward pass under `aiayn.attention.tracing()`
(encoder once, then the decoder step by step through greedy decoding with the KV cache, exactly
as translation runs it) and returns a `Trace`: every recorded tensor under a stable name, with
row and column labels (tokens or dimensions), plus the top-k next tokens of every step.
`aiayn.explain_render` prints a `Trace` as text tables, JSON or HTML.

Stable names (docs/explain.md has the full list):
    encoder.embed.tokens | positions | sum          token embedding x sqrt(d_model), PE, their sum
    encoder.{l}.self_attn.head{h}.q | k | v | scores | scores_scaled | scores_masked | weights
        | output                                     one head (§3.2.1); l from 0, h from 1
    encoder.{l}.self_attn.concat | output           Concat(head_1..head_h), then x W^O (§3.2.2)
    encoder.{l}.residual1 | norm1 | ffn.hidden | ffn.output | residual2 | norm2
    step{t}.decoder.embed.* / step{t}.decoder.{l}.self_attn.* / .cross_attn.* / residual3 / norm3
    step{t}.logits | step{t}.probs                  the generator at decoding step t
Layers count from 0 like the module paths (`encoder.layers.0`); heads count from 1 like the
paper's head_1..head_h.
"""

from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from aiayn.config import BOS_ID, EOS_ID, PAD_ID, DecodeConfig
from aiayn.decode import max_output_lengths
from aiayn.errors import AiaynError
from aiayn.model import Transformer
from aiayn.tokenizer import Tokenizer
from aiayn.tracing import tracing

if TYPE_CHECKING:  # explain_beam imports this module
    from aiayn.explain_beam import BeamTrace

# One line per leaf name: what the tensor is, in the paper's terms.
DESCRIPTIONS: dict[str, str] = {
    "embed.tokens": "token embedding x sqrt(d_model) (§3.4)",
    "embed.positions": "positional encoding PE(pos, i) (§3.5)",
    "embed.sum": "embedding + positional encoding: the input of layer 0",
    "q": "Q = x W^Q_h (queries of this head)",
    "k": "K = m W^K_h (keys; m = x for self-attention, the encoder output for cross)",
    "v": "V = m W^V_h (values)",
    "scores": "Q K^T (one dot product per query and key)",
    "scores_scaled": "Q K^T / sqrt(d_k)",
    "scores_masked": "scaled scores with hidden keys set to -inf (padding, future positions)",
    "weights": "softmax over keys: each row sums to 1",
    "output": "head_h = weights V",
    "concat": "Concat(head_1, ..., head_h)",
    "attn_output": "Concat(heads) W^O + b^O: the attention sub-layer's output",
    "residual1": "x + Sublayer(x) (residual around sub-layer 1)",
    "residual2": "x + Sublayer(x) (residual around sub-layer 2)",
    "residual3": "x + Sublayer(x) (residual around sub-layer 3)",
    "norm1": "LayerNorm(x + Sublayer(x)) after sub-layer 1",
    "norm2": "LayerNorm(x + Sublayer(x)) after sub-layer 2",
    "norm3": "LayerNorm(x + Sublayer(x)) after sub-layer 3",
    "ffn.hidden": "max(0, x W_1 + b_1): FFN hidden layer after ReLU (§3.3)",
    "ffn.output": "hidden W_2 + b_2: FFN output",
    "logits": "decoder output x the (tied) embedding matrix: pre-softmax scores (§3.4)",
    "probs": "softmax(logits): the next-token distribution",
}

PER_HEAD = ("q", "k", "v", "scores", "scores_scaled", "scores_masked", "weights", "heads")

# step{t}. decoder|encoder . {l}|embed . [self_attn|cross_attn . [head{h} .]] leaf
NAME_RE = re.compile(
    r"^(?:step(?P<step>\d+)\.)?(?P<stack>encoder|decoder)\.(?P<layer>\d+|embed)\."
    r"(?:(?P<attn>self_attn|cross_attn)\.(?:head(?P<head>\d+)\.)?)?(?P<leaf>.+)$"
)


@dataclass
class Entry:
    """One named intermediate, batch dimension removed.

    `value` is 1-D or 2-D (rows x cols). `rows` label the rows (tokens); `cols` label the
    columns when they are tokens (attention keys), None when they are model dimensions.
    """

    name: str
    value: Tensor
    rows: list[str]
    cols: list[str] | None = None
    row_start: int = 0  # position of the first row (a decoding step's query is at position t)

    @property
    def description(self) -> str:
        return describe(self.name)


@dataclass
class StepChoice:
    """Greedy decoding step t: the token fed in, the top-k next tokens, the one chosen."""

    t: int
    input_id: int
    input_piece: str
    top: list[tuple[int, str, float]]  # (id, piece, probability), best first
    chosen_id: int
    chosen_piece: str


@dataclass
class Trace:
    """A traced translation of one sentence: every intermediate under a stable name."""

    source: str
    src_ids: list[int]
    src_pieces: list[str]
    tgt_ids: list[int]  # generated ids, EOS included when produced
    tgt_pieces: list[str]
    translation: str
    config: dict[str, object]
    entries: dict[str, Entry] = field(default_factory=dict)
    steps: list[StepChoice] = field(default_factory=list)
    beam: BeamTrace | None = None  # when asked for (aiayn.explain_beam.trace_beam)

    def __getitem__(self, name: str) -> Tensor:
        try:
            return self.entries[name].value
        except KeyError:
            raise KeyError(f"no traced tensor {name!r}; see Trace.names()") from None

    def names(self) -> list[str]:
        return list(self.entries)


def describe(name: str) -> str:
    """The one-line description of a stable name (empty when unknown)."""
    m = NAME_RE.match(name)
    leaf = m.group("leaf") if m else name.rsplit(".", 1)[-1]
    if m and m.group("layer") == "embed":
        leaf = f"embed.{leaf}"
    if m and m.group("attn") and not m.group("head") and leaf == "output":
        leaf = "attn_output"
    return DESCRIPTIONS.get(leaf, "")


def stable_name(model_name: str) -> str:
    """Model trace name -> stable name: `encoder.layers.0.x` -> `encoder.0.x`, embeddings moved
    under their stack (`src_embed` -> `encoder.embed`, `tgt_embed` -> `decoder.embed`)."""
    step, name = "", model_name
    if model_name.startswith("step"):  # decoding steps are recorded under `step{t}.`
        head, _, name = model_name.partition(".")
        step = head + "."
    name = name.replace("src_embed.", "encoder.embed.").replace("tgt_embed.", "decoder.embed.")
    name = name.replace("encoder.layers.", "encoder.").replace("decoder.layers.", "decoder.")
    return step + name


def _add(
    trace: Trace, raw: dict[str, Tensor], queries: list[str], keys: dict[str, list[str]], t: int = 0
) -> None:
    """Turn the recorder's raw tensors into labelled entries (per head for (B, H, T, K) ones).

    `queries` label the rows of the stream (starting at position `t`), `keys` the keys of each
    kind of attention (starting at position 0).
    """
    for model_name, x in raw.items():
        x = x.cpu()  # what is shown (tables, JSON, pictures) is read on the CPU
        name = stable_name(model_name)
        base, _, leaf = name.rpartition(".")
        if leaf in PER_HEAD:
            attn = base.rsplit(".", 1)[-1]  # self_attn | cross_attn
            key_rows = keys[attn]
            for h in range(x.size(1)):
                out_leaf = "output" if leaf == "heads" else leaf
                cols = key_rows if leaf.startswith(("scores", "weights")) else None
                full = f"{base}.head{h + 1}.{out_leaf}"
                rows, start = (key_rows, 0) if leaf in ("k", "v") else (queries, t)
                trace.entries[full] = Entry(full, x[0, h], rows, cols, start)
        elif x.dim() == 3:  # (B, T, D)
            trace.entries[name] = Entry(name, x[0], queries, None, t)
        else:  # positions: (T, D), no batch dimension
            trace.entries[name] = Entry(name, x, queries, None, t)


def _check(model: object, tok: Tokenizer) -> Transformer:
    if not isinstance(model, Transformer):
        raise AiaynError(
            f"explain needs an encoder-decoder Transformer, got {type(model).__name__}"
        )
    if tok.vocab_size != model.cfg.vocab_size:
        raise AiaynError(
            f"tokenizer has {tok.vocab_size} pieces but the model's vocabulary is "
            f"{model.cfg.vocab_size}: they do not belong together"
        )
    return model


def source_ids(model: Transformer, tok: Tokenizer, sentence: str) -> list[int]:
    """Token ids of `sentence` as the model reads it (EOS appended), checked against max_len."""
    if not sentence.strip():
        raise AiaynError("the sentence to explain is empty")
    ids = tok.encode(sentence)
    if len(ids) > model.cfg.max_len:
        raise AiaynError(
            f"the sentence has {len(ids)} tokens, more than the model's max_len={model.cfg.max_len}"
        )
    return ids


def max_steps_for(model: Transformer, n_src: int, max_len: int | None) -> int:
    """Output length limit, as `aiayn.decode` sets it: `max_len` if given, else
    floor(a * source length + b) from `DecodeConfig` (source + 50, §6.1), within the model."""
    a, b = (
        (0.0, max_len) if max_len is not None else (DecodeConfig.max_len_a, DecodeConfig.max_len_b)
    )
    return int(max_output_lengths(torch.tensor([n_src]), a, b, model.cfg.max_len)[0])


def next_token(probs_V: Tensor) -> int:
    """Greedy choice as `aiayn.decode` makes it: the most probable token, never PAD or BOS."""
    allowed_V = probs_V.clone()
    allowed_V[[PAD_ID, BOS_ID]] = -1.0
    return int(allowed_V.argmax())


@torch.no_grad()
def explain(
    model: Transformer,
    tok: Tokenizer,
    sentence: str,
    *,
    top_k: int = 5,
    max_len: int | None = None,
) -> Trace:
    """Trace the greedy translation of `sentence` through `model`.

    Args:
        top_k: how many next-token candidates to keep per decoding step.
        max_len: most tokens to generate (default: source length + 50).
    Returns:
        A `Trace` with the encoder pass and every decoding step `step{t}.*`.
    """
    model = _check(model, tok)
    model.eval()
    ids = source_ids(model, tok, sentence)
    src_pieces = tok.pieces(ids)
    dev = next(model.parameters()).device  # what the model reads lives on its device
    src_BS = torch.tensor([ids], device=dev)
    trace = Trace(sentence, ids, src_pieces, [], [], "", _config_summary(model))
    with tracing() as rec:
        memory = model.encode(src_BS)
    _add(trace, rec.tensors, src_pieces, {"self_attn": src_pieces})

    n_steps = max_steps_for(model, len(ids), max_len)
    cache = model.init_cache(memory, capacity=n_steps)
    fed = [BOS_ID]
    for t in range(n_steps):
        with tracing(prefix=f"step{t}.") as rec:
            logits_1V, cache = model.decode_step(
                torch.tensor([[fed[-1]]], device=dev), memory, cache
            )
        logits_1V = logits_1V.cpu()
        fed_pieces = tok.pieces(fed)
        keys = {"self_attn": fed_pieces, "cross_attn": src_pieces}
        _add(trace, rec.tensors, [fed_pieces[-1]], keys, t)
        probs_V = torch.softmax(logits_1V[0].float(), dim=-1)
        for leaf, x in (("logits", logits_1V[0]), ("probs", probs_V)):
            trace.entries[f"step{t}.{leaf}"] = Entry(
                f"step{t}.{leaf}", x, [fed_pieces[-1]], None, t
            )
        p_k, i_k = probs_V.topk(min(top_k, probs_V.numel()))
        top = [(int(i), tok.pieces([int(i)])[0], float(p)) for p, i in zip(p_k, i_k, strict=True)]
        chosen = next_token(probs_V)
        piece = tok.pieces([chosen])[0]
        trace.steps.append(StepChoice(t, fed[-1], fed_pieces[-1], top, chosen, piece))
        fed.append(chosen)
        if chosen == EOS_ID:
            break
    trace.tgt_ids = fed[1:]
    trace.tgt_pieces = tok.pieces(trace.tgt_ids)
    trace.translation = tok.decode(trace.tgt_ids)
    return trace


def _config_summary(model: Transformer) -> dict[str, object]:
    cfg = model.cfg
    return {
        "d_model": cfg.d_model,
        "n_heads": cfg.n_heads,
        "d_k": cfg.d_k,
        "n_layers": cfg.n_layers,
        "d_ff": cfg.d_ff,
        "vocab_size": cfg.vocab_size,
        "norm": "pre-LN" if cfg.norm_first else "post-LN (paper)",
        "positional": cfg.positional,
        "embedding_scale": math.sqrt(cfg.d_model),
    }


def greedy_translate(
    model: Transformer, tok: Tokenizer, sentence: str, max_len: int | None = None
) -> tuple[list[int], list[int]]:
    """(source ids, generated ids incl. EOS when produced): `aiayn.decode`'s greedy search."""
    from aiayn.decode import greedy_search

    model = _check(model, tok)
    ids = source_ids(model, tok, sentence)
    cfg = DecodeConfig(beam_size=1)
    if max_len is not None:
        cfg = dataclasses.replace(cfg, max_len_a=0.0, max_len_b=max_len)
    device = next(model.parameters()).device
    hyp = greedy_search(model, torch.tensor([ids], device=device), cfg)[0]
    return ids, hyp.tokens + ([EOS_ID] if hyp.eos else [])
