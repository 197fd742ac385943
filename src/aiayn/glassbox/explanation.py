"""What the glass box returns: an `Explanation` (every recorded tensor of one sentence's forward
pass and search under a stable name, with labels) and a `BeamTrace` (every step of a beam search,
its candidates and their fate), plus what each name means in the paper's terms.

Stable names (docs/explain.md has the full list):
    encoder.embed.tokens | positions | sum          token embedding x sqrt(d_model), PE, their sum
    encoder.{l}.self_attn.head{h}.q | k | v | scores | scores_scaled | scores_masked | weights
        | output                                     one head (§3.2.1); l from 0, h from 1
    encoder.{l}.self_attn.concat | output           Concat(head_1..head_h), then x W^O (§3.2.2)
    encoder.{l}.residual1 | norm1 | ffn.hidden | ffn.output | residual2 | norm2
    step{t}.decoder.embed.* / step{t}.decoder.{l}.self_attn.* / .cross_attn.* / residual3 / norm3
    step{t}.logits | step{t}.probs                  the generator at decoding step t
A model with switches after the paper (aiayn.glassbox.switches) adds, per attention:
    .rope_cos | .rope_sin | .band_mask, and per head .q_raw | .k_raw (QK-norm),
    .q_unrotated | .k_unrotated (RoPE), .alibi_bias; per FFN .ffn.gate | .ffn.up (gated).
    With J < h K/V heads, head{h}.k / .v hold the shared K/V head query head h reads.
Layers count from 0 like the module paths (`encoder.layers.0`); heads count from 1 like the
paper's head_1..head_h.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from torch import Tensor

from aiayn.glassbox.distribution import NextTokenDistribution
from aiayn.glassbox.switches import switch_description
from aiayn.search.hypothesis import Hypothesis

# One line per leaf name: what the tensor is, in the paper's terms.
DESCRIPTIONS: dict[str, str] = {
    "embed.tokens": "token embedding x sqrt(d_model) (§3.4)",
    "embed.positions": "positional encoding PE(pos, i) (§3.5)",
    "embed.sum": "embedding + positional encoding: the input of layer 0",
    "q": "Q = x W^Q_h (queries of this head)",
    "k": "K = m W^K_h (keys; m = x for self-attention, the encoder output for cross: "
    "cross-attention's are shown at step 0 only, they are the same at every step)",
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
    "ffn.hidden": "act(x W_1 + b_1): FFN hidden layer after its activation (§3.3: ReLU)",
    "ffn.output": "hidden W_2 + b_2: FFN output",
    "logits": "decoder output x the (tied) embedding matrix: pre-softmax scores (§3.4)",
    "probs": "softmax(logits): the next-token distribution",
    "norm": "the final LayerNorm of a pre-LN stack (GPT-2's ln_f)",
    "next.logits": "the last position's logits: scores of the token after the prompt",
    "next.probs": "softmax of the last position's logits: the next-token distribution",
}
PER_HEAD = ("q_raw", "k_raw", "q_unrotated", "k_unrotated", "q", "k", "v", "alibi_bias",
            "scores", "scores_scaled", "scores_masked", "weights", "heads")  # fmt: skip
KV_LEAVES = ("k_raw", "k_unrotated", "k", "v")  # J heads: shared by h / J query heads each
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
    about: str = ""  # the description, when the model's switches or the entry add to it
    numbered: bool = True  # rows are positions row_start, row_start + 1...; False: as labelled

    @property
    def description(self) -> str:
        return self.about or describe(self.name)


@dataclass
class StepChoice:
    """Decoding step t: the token fed in, the top-k next tokens, the one the search took."""

    t: int
    input_id: int
    input_piece: str
    top: list[tuple[int, str, float]]  # (id, piece, probability), best first
    chosen_id: int
    chosen_piece: str
    banned: tuple[int, ...] = ()  # ids in `top` the search may not emit here (PAD, BOS, early EOS)


@dataclass
class BeamCandidate:
    """One extension of a live hypothesis by one token, as the search saw it."""

    rank: int  # 1 = highest total log-probability among this step's candidates
    parent: int  # index of the extended hypothesis in the step's `live` list
    token: int
    piece: str
    log_prob: float  # total log-probability of the extended hypothesis
    score: float  # log_prob / lp(length): what finished hypotheses are ranked by
    status: str  # "live" | "finished" | "pruned"
    reason: str


@dataclass
class BeamHypothesis:
    tokens: list[int]  # generated tokens, without BOS and EOS (as in aiayn.search.decode)
    pieces: list[str]
    log_prob: float
    score: float
    eos: bool = False
    reason: str = ""

    def text(self) -> str:
        return " ".join(self.pieces + (["</s>"] if self.eos else [])) or "<s>"


@dataclass
class BeamStep:
    t: int
    live: list[BeamHypothesis]  # hypotheses entering the step
    candidates: list[BeamCandidate]


@dataclass
class BeamTrace:
    beam_size: int
    alpha: float
    max_len: int
    length_penalty: str = "gnmt"  # DecodeConfig.length_penalty: lp(Y)'s form
    steps: list[BeamStep] = field(default_factory=list)
    finished: list[BeamHypothesis] = field(default_factory=list)
    stop_reason: str = ""

    @property
    def best(self) -> BeamHypothesis:
        return max(self.finished, key=lambda h: h.score)


@dataclass
class Explanation:
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
    search: str = "greedy"  # "greedy" | "sample": the search that was traced
    hypothesis: Hypothesis | None = None  # what that search returned (tokens, log_prob, score)
    beam: BeamTrace | None = None  # when asked for (`trace_beam`)
    # "translation" (a Transformer: source, search) | "lm" (a DecoderLM: `source` is the
    # prompt, `src_*` BOS + its ids, `translation` the continuation; aiayn.glassbox.explain_lm)
    kind: str = "translation"
    distribution: NextTokenDistribution | None = None  # an LM's next token after the prompt

    def __getitem__(self, name: str) -> Tensor:
        try:
            return self.entries[name].value
        except KeyError:
            raise KeyError(f"no traced tensor {name!r}; see Explanation.names()") from None

    def layers_and_heads(self) -> tuple[int, int]:
        """(layers, heads) of the explained model."""
        n_layers, n_heads = self.config["n_layers"], self.config["n_heads"]
        assert isinstance(n_layers, int) and isinstance(n_heads, int)
        return n_layers, n_heads

    def names(self) -> list[str]:
        return list(self.entries)


def describe(name: str, config: dict[str, object] | None = None) -> str:
    """The one-line description of a stable name (empty when unknown), in the words of the
    model's `config` (a trace's summary: RMSNorm, RoPE, ALiBi...) when given."""
    if name in DESCRIPTIONS:  # next.logits, next.probs
        return DESCRIPTIONS[name]
    m = NAME_RE.match(name)
    leaf = m.group("leaf") if m else name.rsplit(".", 1)[-1]
    if m and m.group("layer") == "embed":
        leaf = f"embed.{leaf}"
    if m and m.group("attn") and not m.group("head") and leaf == "output":
        leaf = "attn_output"
    switched = switch_description(leaf, m.group("attn") if m else None, config or {})
    if switched is not None:
        return switched
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
