"""Frozen configuration: one dataclass per concern, passed whole, never mutated.

`ModelConfig` fixes the architecture (the paper's symbols: d_model, h, N, d_ff, P_drop).
`TrainConfig` and `DecodeConfig` hold the training recipe and the search settings.
`Config` bundles the three. Every check of their values is here, beside them: ModelConfig's
at construction, the recipe's (`check_recipe`) and the search's (`check_decode_config`) where
they are used. Reading them from TOML and `--set` overrides is `aiayn.config_files`'.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Literal

from aiayn.errors import ConfigError

# The special-id layout aiayn trains its SentencePiece vocabularies with (text/tokenizer.py), and
# ModelConfig's defaults. Nothing else reads these: a vocabulary owns its ids (Tokenizer.pad_id,
# ...), a model records them (ModelConfig.pad_id, ...), so a vocabulary with another layout (a
# Marian model's: eos 0, pad last) fits without remapping.
PAD_ID = 0
UNK_ID = 1
BOS_ID = 2
EOS_ID = 3


GATED = ("swiglu", "geglu")  # FFN activations that gate with a third matrix


@dataclass(frozen=True)
class ModelConfig:
    """The architecture of Figure 1. Defaults are the paper's base model (Table 3)."""

    vocab_size: int  # joint source/target vocabulary, filled from the tokenizer (§3.4)
    d_model: int = 512
    n_heads: int = 8  # h; d_k = d_v = d_model / h
    n_layers: int = 6  # N, for each of the encoder and decoder stacks
    d_ff: int = 2048
    dropout: float = 0.1  # P_drop on sub-layer outputs and embedding sums (§5.4)
    attn_dropout: float = 0.0  # on attention weights; not in the paper, used by tensor2tensor
    max_len: int = 1024  # rows of the positional table: the longest sequence the model accepts
    # §3.5 (the paper found sinusoidal and learned equal); after it: "rope" rotates Q and K by
    # their position (RoFormer, LLaMA), "alibi" biases each head's scores by distance (Press et
    # al.), "none" adds nothing (a decoder-only model's causal mask tells it where it is)
    positional: Literal["sinusoidal", "learned", "rope", "alibi", "none"] = "sinusoidal"
    rope_base: float = 10000.0  # RoPE's theta: head dimension pair i turns by pos / base^(2i/d_k)
    norm_first: bool = False  # the paper is post-LN; True = pre-LN with a final LayerNorm
    layer_norm_eps: float = 1e-5  # of every norm, LayerNorm or RMSNorm
    # "layernorm" (Ba et al.; the paper's) or "rmsnorm" (Zhang & Sennrich: no mean, no bias; LLaMA)
    norm: Literal["layernorm", "rmsnorm"] = "layernorm"
    share_embeddings: bool = True  # one embedding matrix for source and target (§3.4)
    tie_output: bool = True  # the pre-softmax projection reuses the target embedding (§3.4)
    # Where other toolkits differ from the paper (aiayn import marian and gpt2 need them):
    # the FFN's: max(0, .) in §3.3; Marian: swish; BERT: "gelu" (exact, erf); GPT-2:
    # "gelu_tanh" (the tanh approximation, Hugging Face's "gelu_new"); "relu2" = max(0, .)^2
    # (So et al.); gated (Shazeer 2020, a third matrix W_3): "swiglu" = swish(x W_1) * x W_3
    # (LLaMA), "geglu" = gelu(x W_1) * x W_3
    activation: Literal["relu", "swish", "gelu", "gelu_tanh", "relu2", "swiglu", "geglu"] = "relu"
    # a gated FFN's hidden width 2/3 d_ff, so its three matrices hold the paper's two's
    # parameters (Shazeer 2020's comparison); False: d_ff as given (an imported LLaMA's)
    ffn_match_params: bool = False
    bias: bool = True  # biases in attention and FFN projections (the paper's; LLaMA has none)
    # grouped-query attention (Ainslie et al.): kv_heads K/V heads, each shared by
    # n_heads / kv_heads query heads; 1 = multi-query (Shazeer 2019); 0 = n_heads (the paper's)
    kv_heads: int = 0
    # local attention: each self-attention query sees the last attn_window positions (itself
    # included; causal) or those within attn_window // 2 on either side (an encoder); the
    # decoding cache then holds attn_window positions (Longformer, Mistral); 0 = all positions
    attn_window: int = 0
    qk_norm: bool = False  # normalise each head's queries and keys before Q K^T (OLMo 2, Qwen3)
    # token embeddings x sqrt(d_model) before the positions are added (§3.4); GPT-2 and BERT
    # add them unscaled (False)
    scale_embeddings: bool = True
    # "interleaved": sin/cos alternate as in §3.5; "halves": all sines, then all cosines
    # (tensor2tensor, Marian, fairseq). The same function either way, its dimensions permuted.
    positional_layout: Literal["interleaved", "halves"] = "interleaved"
    logits_bias: bool = False  # a bias on the pre-softmax projection (Marian's final_logits_bias)
    # The weights' random start (the paper names none): "xavier" = Xavier-uniform projections
    # and N(0, d_model^-0.5) embeddings (tensor2tensor, fairseq); "normal" = N(0, 0.02) for
    # both (BERT, Hugging Face's Marian and BART). Read only when a model is built to train.
    init: Literal["xavier", "normal"] = "xavier"
    # An encoder-only classifier's: the sentence vector is the mean over real tokens ("mean")
    # or the first position's, where every input starts with BOS as BERT's [CLS] ("cls");
    # `pooler` passes it through a tanh(dense) layer first (BERT's pooler)
    pooling: Literal["mean", "cls"] = "mean"
    pooler: bool = False
    embed_norm: bool = False  # a LayerNorm over the embedding sum (BERT's; not the paper's)
    pad_id: int = PAD_ID
    bos_id: int = BOS_ID
    eos_id: int = EOS_ID

    def __post_init__(self) -> None:
        from aiayn.config_checks import model_problems  # the checks' own module: they are many

        for message in model_problems(self):
            raise ConfigError(f"ModelConfig: {message}")

    @property
    def d_k(self) -> int:
        return self.d_model // self.n_heads

    @property
    def n_kv_heads(self) -> int:
        """The K/V heads a layer computes and a decoding cache holds."""
        return self.kv_heads or self.n_heads

    @property
    def gated(self) -> bool:
        return self.activation in GATED

    @property
    def d_hidden(self) -> int:
        """The FFN's hidden width: d_ff, or 2/3 of it for a gated FFN that matches parameters."""
        return round(2 * self.d_ff / 3) if self.gated and self.ffn_match_params else self.d_ff

    @classmethod
    def preset(cls, name: str, **overrides: Any) -> ModelConfig:
        """A named architecture, e.g. `ModelConfig.preset("paper_base", vocab_size=37000)`."""
        if name not in MODEL_PRESETS:
            raise ConfigError(f"unknown preset {name!r}; choose one of {sorted(MODEL_PRESETS)}")
        if "vocab_size" not in overrides:
            raise ConfigError(f"preset {name!r} needs vocab_size=...")
        return cls(**{**MODEL_PRESETS[name], **overrides})


# Table 3 of the paper, plus a model small enough to train on a laptop CPU in minutes.
MODEL_PRESETS: dict[str, dict[str, Any]] = {
    "paper_base": dict(d_model=512, n_heads=8, n_layers=6, d_ff=2048, dropout=0.1),
    "paper_big": dict(d_model=1024, n_heads=16, n_layers=6, d_ff=4096, dropout=0.3),
    "cpu_small": dict(d_model=256, n_heads=4, n_layers=3, d_ff=1024, dropout=0.1),
    "cpu_tiny": dict(d_model=128, n_heads=4, n_layers=2, d_ff=512, dropout=0.1),
}


@dataclass(frozen=True)
class TrainConfig:
    """The training recipe (§5). Defaults are the paper's where it gives one."""

    # "translate": the encoder-decoder on sentence pairs (src/tgt); "lm": a decoder-only language
    # model on text (train.text), trained on contiguous blocks of model.max_len tokens;
    # "classify": an encoder-only classifier on labelled texts (train.data); "mlm": the encoder
    # pre-trained as a masked language model on unlabelled lines (train.text), BERT's way
    task: Literal["translate", "lm", "classify", "mlm"] = "translate"  # reads TASK_INPUTS
    src: str = ""  # training source file (or a TSV with both sides when tgt is empty)
    tgt: str = ""
    valid_src: str = ""
    valid_tgt: str = ""
    # lm: the training text (a file, a folder of *.txt, or comma-separated files), and its
    # validation text; without one the last valid_share of the training text is held out
    text: str = ""
    valid_text: str = ""
    valid_share: float = 0.1
    # lm: the vocabulary: "char" (one id per character, nanoGPT's shakespeare_char), "byte"
    # (UTF-8 bytes) or "bpe" (SentencePiece, train.vocab_size pieces); translate: always bpe
    tokenizer: Literal["bpe", "char", "byte"] = "bpe"
    batch_size: int = 0  # lm: blocks a batch; 0 = max_tokens // model.max_len
    # classify: labelled texts (TSV, CSV, JSON lines or SST's "LABEL TEXT" lines) and the
    # columns that hold them; without valid_data a stratified valid_share is held out
    data: str = ""
    valid_data: str = ""
    label_column: str = "label"
    text_column: str = "text"
    class_weights: bool = False  # weigh each class's loss by 1 / its share (imbalanced labels)
    # classify from init_from: the pre-trained layers' rate, times the head's; freeze_encoder
    # trains the linear head only (a linear probe)
    encoder_lr: float = 1.0
    freeze_encoder: bool = False
    mask_prob: float = (
        0.15  # mlm: the share of tokens predicted (80% [MASK] / 10% random / 10% kept)
    )
    out_dir: str = "runs/model"
    # continued training: start from this model directory's weights, tokenizer and whole
    # [model] architecture (e.g. an `aiayn import marian` one), with a fresh optimizer;
    # classify: its encoder (an mlm run's, a translator's or a classifier's), a new head
    init_from: str = ""
    vocab_size: int = 8000  # SentencePiece joint vocabulary
    # "word": the text comes segmented (pieces between spaces, e.g. subword-nmt's "@@ " BPE),
    # and each distinct piece is one entry, the vocab_size most frequent (unseen ones: bytes)
    spm_model_type: Literal["bpe", "unigram", "word"] = "bpe"
    max_tokens: int = 4096  # token budget per batch (source or target, whichever is longer)
    max_len: int = 256  # pairs with more tokens than this on either side are filtered (counted)
    label_smoothing: float = 0.1  # ε_ls (§5.4)
    # subword regularization: each epoch segments the training text afresh, sampling with
    # this SentencePiece alpha (BPE: each merge skipped with this probability, "BPE-dropout");
    # 0 = the one best segmentation, as the paper. Not the paper's; docs/training.md
    subword_alpha: float = 0.0
    # cosine_budget = cosine to 0 at a total fitted to max_minutes (or max_steps): training.md
    lr_schedule: Literal["noam", "inverse_sqrt", "cosine", "cosine_budget", "constant"] = "noam"
    lr: float = 1.0  # a multiplier on noam; the peak rate for the other schedules
    min_lr: float = 0.0  # cosine only: where it ends (nanoGPT's min_lr; 0 = to zero)
    # cosine_budget only: the rate holds at its peak after warmup and falls (half a cosine to
    # 0) over this last share of the steps left (warmup-stable-decay); 1.0 = a cosine over all
    budget_decay: float = 1.0
    warmup_steps: int = 4000
    adam_betas: tuple[float, float] = (0.9, 0.98)
    adam_eps: float = 1e-9
    weight_decay: float = 0.0
    clip_norm: float = 0.0  # 0 = no clipping
    accum_steps: int = 1
    max_steps: int = 100_000
    max_epochs: int = 0  # 0 = no limit
    max_minutes: float = 0.0  # wall-clock budget; 0 = no limit
    valid_every: int = 1000
    save_every: int = 1000
    keep_last: int = 5  # checkpoints kept for averaging (the paper averages the last 5 / 20)
    # average this many checkpoints into OUT_DIR/averaged at the end, its alpha chosen on
    # validation: cosine_budget saves them evenly spaced over the last 20% (times
    # budget_decay) of its schedule; other schedules take the last ones kept (save_every
    # apart, and the final step's), as `aiayn average --last`. 0 = off
    average_last: int = 0
    # choose the averaged model's decode.alpha on validation (False: it keeps the [decode]
    # table's, e.g. a published recipe's own length penalty)
    choose_alpha: bool = True
    patience: int = 0  # validations without improvement before stopping; 0 = never
    best_metric: Literal["loss", "bleu", "accuracy", "macro_f1"] = "loss"
    bleu_samples: int = 200  # validation sentences decoded greedily for BLEU; 0 = skip
    seed: int = 1
    # auto = bf16 autocast where the hardware has native bf16 (CUDA compute capability >= 8,
    # a CPU with AVX512-BF16 or AMX), else fp32; aiayn.runtime.device owns the choice
    dtype: Literal["auto", "fp32", "bf16"] = "auto"
    device: str = "auto"  # auto | cpu | cuda | cuda:N | mps; under torchrun, cuda = LOCAL_RANK
    deterministic: bool = False  # deterministic kernels: bit-exact resume on a GPU (slower)
    compile: bool = False  # torch.compile
    threads: int = 0  # torch threads; 0 = leave torch's default
    log_every: int = 50  # steps between training records (fewer on a short fitted budget)
    tensorboard: bool = False  # also write the curves as TensorBoard event files (out_dir/tb)


@dataclass(frozen=True)
class DecodeConfig:
    """Search settings (§6.1): beam 4, length penalty α = 0.6, max length = source + 50."""

    beam_size: int = 4
    alpha: float = 0.6  # the length penalty's exponent: score = log p(Y) / lp(Y)
    # lp(Y) = ((5 + |Y|) / 6) ** α, GNMT's (the paper's α = 0.6), or |Y| ** α ("power": fairseq's
    # --lenpen, Hugging Face's and CTranslate2's length_penalty, Marian's --normalize)
    length_penalty: Literal["gnmt", "power"] = "gnmt"
    max_len_a: float = 1.0  # max output length = a * source length + b
    max_len_b: int = 50
    max_tokens: int = 0  # a hard cap on output tokens per sentence (0 = the model's max_len)
    min_len: int = 0
    nbest: int = 1
    sample: bool = False
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int = 0


# A language model's search defaults where its directory saves none: sampling at temperature 1
# (the model's own distribution), 200 new tokens.
LM_DEFAULTS = DecodeConfig(beam_size=1, sample=True, max_len_a=0.0, max_len_b=200, alpha=0.0)


@dataclass(frozen=True)
class Config:
    """Everything one run needs: `configs/*.toml` files hold these three tables."""

    model: ModelConfig
    train: TrainConfig = field(default_factory=TrainConfig)
    decode: DecodeConfig = field(default_factory=DecodeConfig)


# --- checks of the values (ModelConfig's run in __post_init__: no model is built from a bad
# one; the recipe and the search settings are checked where they are used, before any
# work: training before anything is written, the server on every request) ---------------

# Past ~100 the penalty ((5 + |Y|) / 6) ** alpha overflows a float for long outputs; no
# published setting goes beyond 2 (fairseq, Marian, GNMT use 0.6-1.4).
MAX_ALPHA = 10.0
MAX_LENGTH = 2**31 - 1  # token counts in settings: more than any positional table holds
# One sentence's rows (beams, or samples) at most: `--sample --nbest 100000` held 8.9 GB for
# one word of the quick start model. Beams of 4-10 are usual; a thousand samples feed MBR.
MAX_ROWS = 1024
MAX_THREADS = 4096  # torch takes a C int; a count past it (or below 0) was a traceback


def check_threads(n: int, name: str = "--threads") -> None:
    """A thread count torch can take: 0 (its default) up to MAX_THREADS."""
    if not 0 <= n <= MAX_THREADS:
        raise ConfigError(f"{name}={n}: give 0 (torch's default) up to {MAX_THREADS}")


def check_recipe(tc: TrainConfig) -> None:
    """Refuse TrainConfig values, and combinations of them, that cannot work, before anything
    is written. Every range is written so that NaN fails it (its comparisons are false)."""
    inf = math.inf
    ranges = [  # a value out of its range trained silently (lr=inf: NaN loss for an hour)
        (tc.vocab_size >= 1 and tc.max_len >= 1, "vocab_size and max_len must be at least 1"),
        (0 <= tc.label_smoothing < 1, f"label_smoothing={tc.label_smoothing} must be in [0, 1)"),
        (0 <= tc.lr < inf, f"lr={tc.lr} must be a number >= 0"),  # 0: frozen (tests use it)
        (0 <= tc.min_lr <= tc.lr, f"min_lr={tc.min_lr} must be in [0, lr]"),
        (
            tc.warmup_steps >= (1 if tc.lr_schedule == "noam" else 0),  # noam divides by it
            f"warmup_steps={tc.warmup_steps} must be >= 0 (noam: >= 1)",
        ),
        (all(0 <= b < 1 for b in tc.adam_betas), f"adam_betas={tc.adam_betas} must be in [0, 1)"),
        (
            all(0 <= x < inf for x in (tc.adam_eps, tc.weight_decay, tc.clip_norm)),
            "adam_eps, weight_decay and clip_norm must be numbers >= 0",
        ),
        (tc.max_steps >= 1, f"max_steps={tc.max_steps} must be at least 1"),
        (0 <= tc.max_minutes < inf, f"max_minutes={tc.max_minutes} must be >= 0 (0 = no limit)"),
        (
            min(
                tc.max_epochs,
                tc.valid_every,
                tc.save_every,
                tc.patience,
                tc.bleu_samples,
                tc.keep_last,
                tc.average_last,
            )
            >= 0,
            "max_epochs, valid_every, save_every, patience, bleu_samples, keep_last and "
            "average_last must be >= 0",
        ),
        (tc.log_every >= 1, f"log_every={tc.log_every} must be at least 1"),
    ]
    for ok, message in ranges:
        if not ok:
            raise ConfigError(f"train.{message}")
    check_threads(tc.threads, "train.threads")  # the bound set_threads applies
    _check_task(tc)
    if tc.accum_steps < 1 or tc.max_tokens < 1:
        raise ConfigError("train.accum_steps and train.max_tokens must be at least 1")
    if tc.best_metric == "bleu" and tc.bleu_samples < 1:
        raise ConfigError("train.best_metric = 'bleu' needs train.bleu_samples >= 1")
    if not 0.0 < tc.budget_decay <= 1.0:
        raise ConfigError(f"train.budget_decay={tc.budget_decay} must be in (0, 1]")
    if not 0.0 <= tc.subword_alpha < 1.0:
        raise ConfigError(f"train.subword_alpha={tc.subword_alpha} must be in [0, 1)")
    if tc.subword_alpha and tc.spm_model_type == "word":
        raise ConfigError(
            "train.subword_alpha samples segmentations; a 'word' vocabulary "
            "(train.spm_model_type) keeps the text's own"
        )
    if tc.average_last == 0:
        return
    if tc.average_last < 2:
        raise ConfigError(f"train.average_last={tc.average_last}: average at least 2 (0 = off)")
    if tc.average_last > tc.keep_last:
        raise ConfigError(
            f"train.average_last={tc.average_last} exceeds train.keep_last={tc.keep_last}: "
            "the averaged checkpoints must all be kept"
        )


def _check_task(tc: TrainConfig) -> None:
    if tc.task not in TASK_INPUTS:
        raise ConfigError(f"train.task={tc.task!r}: choose one of {', '.join(TASK_INPUTS)}")
    if tc.tokenizer not in ("bpe", "char", "byte"):
        raise ConfigError(f"train.tokenizer={tc.tokenizer!r}: choose 'bpe', 'char' or 'byte'")
    given = {
        "train.src/train.tgt": bool(tc.src or tc.tgt),
        "train.text": bool(tc.text or tc.valid_text),
        "train.data": bool(tc.data or tc.valid_data),
    }
    reads = TASK_INPUTS[tc.task]
    for name, present in given.items():
        if present and name != reads:
            owner = next(t for t, n in TASK_INPUTS.items() if n == name and t != "mlm")
            raise ConfigError(
                f"train.task = {tc.task!r} reads {reads}, not {name} "
                f"(set train.task = {owner!r} for that)"
            )
    if tc.task != "lm" and tc.tokenizer != "bpe":
        raise ConfigError(f"train.tokenizer={tc.tokenizer!r} is for train.task = 'lm'")
    if not 0.0 <= tc.valid_share < 1.0:  # NaN fails too
        raise ConfigError(f"train.valid_share={tc.valid_share} must be in [0, 1)")
    if tc.batch_size < 0:
        raise ConfigError(f"train.batch_size={tc.batch_size} must be >= 0 (0 = from max_tokens)")
    metrics = {"translate": ("loss", "bleu"), "classify": ("loss", "accuracy", "macro_f1")}
    if tc.best_metric not in (allowed := metrics.get(tc.task, ("loss",))):
        raise ConfigError(
            f"train.best_metric = {tc.best_metric!r}: train.task = {tc.task!r} "
            "chooses by " + " or ".join(repr(m) for m in allowed)
        )
    if not 0.0 < tc.mask_prob < 1.0:
        raise ConfigError(f"train.mask_prob={tc.mask_prob} must be in (0, 1)")
    if not 0.0 <= tc.encoder_lr < math.inf:
        raise ConfigError(f"train.encoder_lr={tc.encoder_lr} must be a number >= 0")
    head = tc.freeze_encoder or tc.encoder_lr != 1.0
    if tc.task != "classify" and (head or tc.class_weights):
        raise ConfigError("train.freeze_encoder, class_weights and encoder_lr are a classifier's")
    if head and not tc.init_from:
        raise ConfigError(
            "train.freeze_encoder and encoder_lr need pre-trained layers: give "
            "train.init_from=DIR (an mlm run, a translator or a classifier)"
        )


TASK_INPUTS = {
    "translate": "train.src/train.tgt",
    "lm": "train.text",
    "classify": "train.data",
    "mlm": "train.text",
}


def search_rows(cfg: DecodeConfig) -> int:
    """The rows one sentence takes in the search: its beams, its samples, or one (greedy)."""
    return cfg.nbest if cfg.sample else cfg.beam_size


def check_decode_config(cfg: DecodeConfig, vocab_size: int = 0) -> None:
    """Raise a one-line ConfigError for settings no search can honour (with `vocab_size`, the
    model's: also a beam wider than its vocabulary, which has fewer tokens than beams to fill)."""
    # One `if` each, so a message is only formatted when it is raised: the server checks the
    # settings of every request.
    if cfg.beam_size < 1:
        raise ConfigError(f"beam size must be at least 1, got {cfg.beam_size}")
    if cfg.nbest < 1:
        raise ConfigError(f"nbest must be at least 1, got {cfg.nbest}")
    if search_rows(cfg) > MAX_ROWS:
        raise ConfigError(
            f"{'nbest (samples)' if cfg.sample else 'beam size'} {search_rows(cfg):,} is more "
            f"than {MAX_ROWS:,}: each is a row of the search, with its own caches and logits"
        )
    if not cfg.sample and cfg.nbest > cfg.beam_size:
        raise ConfigError(f"nbest={cfg.nbest} cannot exceed the beam size {cfg.beam_size}")
    if vocab_size and not cfg.sample and cfg.beam_size > vocab_size:
        raise ConfigError(
            f"beam size {cfg.beam_size} exceeds the model's vocabulary of {vocab_size} tokens"
        )
    if not all(map(math.isfinite, (cfg.alpha, cfg.temperature, cfg.top_p, cfg.max_len_a))):
        raise ConfigError("alpha, temperature, top_p and max_len_a must be finite numbers")
    if cfg.temperature <= 0:
        raise ConfigError(f"temperature must be positive, got {cfg.temperature}")
    if not 0.0 < cfg.top_p <= 1.0:
        raise ConfigError(f"top_p must be in (0, 1], got {cfg.top_p}")
    if cfg.top_k < 0:
        raise ConfigError(f"top_k must be >= 0 (0 = off), got {cfg.top_k}")
    if cfg.min_len < 0:
        raise ConfigError(f"min_len must be >= 0, got {cfg.min_len}")
    if cfg.max_len_a < 0 or cfg.max_len_b < 0:
        raise ConfigError("max_len_a and max_len_b must be >= 0")
    if cfg.max_tokens < 0:
        raise ConfigError(f"max_tokens must be >= 0 (0 = the model's), got {cfg.max_tokens}")
    if cfg.length_penalty not in ("gnmt", "power"):
        raise ConfigError(f"length_penalty={cfg.length_penalty!r}: choose 'gnmt' or 'power'")
    if not 0 <= cfg.alpha <= MAX_ALPHA:
        raise ConfigError(f"length penalty alpha must be in [0, {MAX_ALPHA:g}], got {cfg.alpha}")
    if max(cfg.min_len, cfg.max_len_b) > MAX_LENGTH:  # they become int64 tensors
        raise ConfigError(f"min_len and max_len_b must be at most {MAX_LENGTH:,} tokens")
