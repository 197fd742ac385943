"""The Transformer of "Attention Is All You Need" (Vaswani et al., 2017), Figure 1, top to bottom.

The encoder-only and decoder-only models built from the same blocks are in `aiayn.nn.variants`.

Dimension key (shape suffixes on tensor names):
    B batch   S source / key length   T target / query length   D d_model   H heads
    K d_k = d_model / h               F d_ff                    V vocabulary   L layers
    N the real (unpadded) positions of a batch, flattened

Mask convention, everywhere in aiayn: a bool tensor where True = "may attend" (as in
`F.scaled_dot_product_attention`). Masks are built here from `pad_id`, nowhere else.

Sequences are right-padded. The decoder's causal mask therefore already hides target padding
from every real position, so decoder self-attention needs no padding mask (and can use the
fused causal kernel); outputs at PAD positions are computed but meaningless and never used.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import cast

import torch
from torch import Tensor, nn

from aiayn.config import ModelConfig
from aiayn.errors import ConfigError
from aiayn.nn.attention import MultiHeadAttention
from aiayn.nn.embeddings import Embeddings
from aiayn.nn.kv_cache import KVCache, Memory, self_capacity
from aiayn.nn.norms import Norm, make_norm
from aiayn.nn.packed import encode_packed, skips_padding
from aiayn.nn.tracing import Trace, is_tracing, tap
from aiayn.runtime.kernels import Activation, Linear

# --- position-wise FFN (§3.3) ---------------------------------------------------------------------


class PositionwiseFFN(nn.Module):
    """FFN(x) = max(0, x W_1 + b_1) W_2 + b_2, the same two layers at every position (§3.3).

    `activation="swish"` puts x * sigmoid(x) in place of max(0, x) (Marian's models); "relu2"
    squares the ReLU (Primer). A gated activation (Shazeer 2020, "GLU variants") multiplies
    the activated x W_1 by a second projection x W_3: swiglu = swish(x W_1) * x W_3 (LLaMA),
    geglu = gelu(x W_1) * x W_3."""

    def __init__(
        self, d_model: int, d_ff: int, activation: str = "relu", *, bias: bool = True
    ) -> None:
        super().__init__()
        self.w_1 = Linear(d_model, d_ff, bias=bias)
        self.w_2 = Linear(d_ff, d_model, bias=bias)
        self.w_3 = Linear(d_model, d_ff, bias=bias) if activation in GATES else None
        self.activation = activation
        self.trace_name = "ffn"

    def forward(self, x_BTD: Tensor) -> Tensor:
        if self.w_3 is not None:
            gate_BTF = self.w_1(x_BTD, activation=GATES[self.activation])
            up_BTF = self.w_3(x_BTD)
            hidden_BTF = gate_BTF * up_BTF
            if is_tracing():
                tap(f"{self.trace_name}.gate", gate_BTF)
                tap(f"{self.trace_name}.up", up_BTF)
        elif self.activation == "relu2":
            hidden_BTF = self.w_1(x_BTD, activation="relu").square()
        else:
            hidden_BTF = self.w_1(x_BTD, activation=cast(Activation, self.activation))
        out_BTD = self.w_2(hidden_BTF)
        if is_tracing():
            tap(f"{self.trace_name}.hidden", hidden_BTF)
            tap(f"{self.trace_name}.output", out_BTD)
        return out_BTD

    @classmethod
    def from_config(cls, cfg: ModelConfig) -> PositionwiseFFN:
        return cls(cfg.d_model, cfg.d_hidden, cfg.activation, bias=cfg.bias)


# A gated FFN's activation -> the one its gate x W_1 takes
GATES: dict[str, Activation] = {"swiglu": "swish", "geglu": "gelu"}


# --- layers and stacks (§3.1) ------------------------------------------------------------------


class _ResidualLayer(nn.Module):
    """What both layer types share: every sub-layer is wrapped in residual + LayerNorm (§3.1).

    Post-LN (paper): x = LN(x + Dropout(Sublayer(x))). Pre-LN: x = x + Dropout(Sublayer(LN(x))).
    Sub-layer i uses `self.norm{i}`, so the parameters keep their names (norm1, norm2, norm3).
    """

    norm_first: bool
    dropout: nn.Dropout
    trace_name: str

    def sublayer(self, x_BTD: Tensor, i: int, fn: Callable[[Tensor], Tensor]) -> Tensor:
        norm: Norm = getattr(self, f"norm{i}")
        name = f"{self.trace_name}.residual{i}"
        if self.norm_first:
            return _residual(x_BTD, _dropout(self.dropout, fn(norm(x_BTD))), name)
        x_BTD = norm(_residual(x_BTD, _dropout(self.dropout, fn(x_BTD)), name))
        tap(f"{self.trace_name}.norm{i}", x_BTD)
        return x_BTD


def _dropout(dropout: nn.Dropout, x: Tensor) -> Tensor:
    """Dropout while training (§5.4); in eval mode the identity, without the module call (7
    calls a decoding step of 2 layers: 3-5% of a one-row step on a CPU)."""
    return dropout(x) if dropout.training else x


def _residual(x: Tensor, sub: Tensor, name: str) -> Tensor:
    out = x + sub
    tap(name, out)
    return out


class EncoderLayer(_ResidualLayer):
    """Self-attention -> FFN, each wrapped in residual + LayerNorm (§3.1, Figure 1 left).

    With `causal=True` the same block is a decoder-only (GPT-style) layer.
    """

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.norm_first = cfg.norm_first
        self.self_attn = MultiHeadAttention.from_config(cfg, self_attention=True)
        self.ffn = PositionwiseFFN.from_config(cfg)
        self.norm1, self.norm2 = make_norm(cfg), make_norm(cfg)
        self.dropout = nn.Dropout(cfg.dropout)
        self.trace_name = "layer"

    def forward(self, x_BSD: Tensor, keep_B11S: Tensor | None, *, causal: bool = False) -> Tensor:
        x_BSD = self.sublayer(x_BSD, 1, lambda h: self.self_attn(h, h, keep_B11S, causal=causal))
        return self.sublayer(x_BSD, 2, self.ffn)

    def step(self, x_BTD: Tensor, cache: KVCache, layer: int, keep_B1TC: Tensor | None) -> Tensor:
        """The causal layer (a GPT block) for new positions only, reading and extending the KV
        cache; `keep_B1TC`: which cached columns each row may see (None: all)."""

        x_BTD = self.sublayer(
            x_BTD, 1, lambda h_BTD: self.self_attn.step_self(h_BTD, cache, layer, keep_B1TC)
        )
        return self.sublayer(x_BTD, 2, self.ffn)


class DecoderLayer(_ResidualLayer):
    """Masked self-attention -> cross-attention over the encoder output -> FFN (§3.1, Figure 1)."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.norm_first = cfg.norm_first
        self.self_attn = MultiHeadAttention.from_config(cfg, self_attention=True)
        self.cross_attn = MultiHeadAttention.from_config(cfg, self_attention=False)
        self.ffn = PositionwiseFFN.from_config(cfg)
        self.norm1, self.norm2, self.norm3 = make_norm(cfg), make_norm(cfg), make_norm(cfg)
        self.dropout = nn.Dropout(cfg.dropout)
        self.trace_name = "layer"

    def forward(self, y_BTD: Tensor, mem_BSD: Tensor, mem_keep_B11S: Tensor | None) -> Tensor:
        y_BTD = self.sublayer(y_BTD, 1, lambda h: self.self_attn(h, h, None, causal=True))
        y_BTD = self.sublayer(y_BTD, 2, lambda h: self.cross_attn(h, mem_BSD, mem_keep_B11S))
        return self.sublayer(y_BTD, 3, self.ffn)

    def step(
        self, y_BTD: Tensor, cache: KVCache, layer: int, mem_keep_B11S: Tensor | None
    ) -> Tensor:
        """The same layer for new positions only, reading and extending the KV cache."""

        def self_attn(h_BTD: Tensor) -> Tensor:
            end = cache.length + h_BTD.size(1)
            keep_B11C = cache.self_keep_B11C(end)  # rows that joined late
            return self.self_attn.step_self(h_BTD, cache, layer, keep_B11C)

        def cross_attn(h_BTD: Tensor) -> Tensor:
            q_BHTK = self.cross_attn.project_q(h_BTD)
            k_BHSK, v_BHSK = cache.cross_k[layer], cache.cross_v[layer]
            return self.cross_attn.attend(q_BHTK, k_BHSK, v_BHSK, mem_keep_B11S)

        y_BTD = self.sublayer(y_BTD, 1, self_attn)
        y_BTD = self.sublayer(y_BTD, 2, cross_attn)
        return self.sublayer(y_BTD, 3, self.ffn)


class Encoder(nn.Module):
    """N independent encoder layers; pre-LN adds a final LayerNorm (post-LN needs none)."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.layers = nn.ModuleList(EncoderLayer(cfg) for _ in range(cfg.n_layers))
        self.norm = make_norm(cfg) if cfg.norm_first else None
        self.trace_name = "stack"

    def forward(self, x_BSD: Tensor, keep_B11S: Tensor | None, *, causal: bool = False) -> Tensor:
        for layer in self.layers:
            x_BSD = layer(x_BSD, keep_B11S, causal=causal)
        if self.norm is not None:  # pre-LN: the final LayerNorm
            x_BSD = self.norm(x_BSD)
            tap(f"{self.trace_name}.norm", x_BSD)
        return x_BSD

    def step(self, x_BTD: Tensor, cache: KVCache, keep_B1TC: Tensor | None) -> Tensor:
        """Causal layers over new positions with the KV cache (a decoder-only model's step)."""
        layer: EncoderLayer
        for i, layer in enumerate(self.layers):  # type: ignore[assignment]  # ModuleList items
            x_BTD = layer.step(x_BTD, cache, i, keep_B1TC)
        if self.norm is not None:
            x_BTD = self.norm(x_BTD)
            tap(f"{self.trace_name}.norm", x_BTD)
        return x_BTD


class Decoder(nn.Module):
    """N independent decoder layers; pre-LN adds a final LayerNorm."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.n_layers))
        self.norm = make_norm(cfg) if cfg.norm_first else None
        self.trace_name = "stack"

    def forward(self, y_BTD: Tensor, mem_BSD: Tensor, mem_keep_B11S: Tensor | None) -> Tensor:
        for layer in self.layers:
            y_BTD = layer(y_BTD, mem_BSD, mem_keep_B11S)
        return self._final_norm(y_BTD)

    def step(self, y_BTD: Tensor, cache: KVCache, mem_keep_B11S: Tensor | None) -> Tensor:
        layer: DecoderLayer
        for i, layer in enumerate(self.layers):  # type: ignore[assignment]  # ModuleList items
            y_BTD = layer.step(y_BTD, cache, i, mem_keep_B11S)
        return self._final_norm(y_BTD)

    def _final_norm(self, y_BTD: Tensor) -> Tensor:
        if self.norm is not None:  # pre-LN: the final LayerNorm
            y_BTD = self.norm(y_BTD)
            tap(f"{self.trace_name}.norm", y_BTD)
        return y_BTD


# --- what the model returns --------------------------------------------------------------------


@dataclass
class AttentionMaps:
    """Every attention map of one forward pass: one (B, H, T_q, T_k) tensor per layer, read from
    the trace of that pass (the model computes them only when traced)."""

    enc_self: list[Tensor]
    dec_self: list[Tensor]
    cross: list[Tensor]

    @classmethod
    def from_trace(cls, trace: Trace) -> AttentionMaps:
        """The maps `model(...)` recorded under `tracing()`, by layer (a DecoderLM's causal
        self-attention is under its `decoder`: `dec_self`)."""

        def maps(stack: str, kind: str) -> list[Tensor]:
            prefix, suffix = f"{stack}.layers.", f".{kind}.weights"
            found = {
                int(name[len(prefix) : -len(suffix)]): w
                for name, w in trace.tensors.items()
                if name.startswith(prefix) and name.endswith(suffix)
            }
            return [found[i] for i in sorted(found)]

        return cls(
            maps("encoder", "self_attn"),
            maps("decoder", "self_attn"),
            maps("decoder", "cross_attn"),
        )


# --- the model ------------------------------------------------------------------------------------


def check_encoder_positions(cfg: ModelConfig) -> None:
    """Refuse `positional="none"` for a model with an encoder: a decoder-only model's causal
    mask tells its positions apart (each sees a different prefix), an encoder's attention is
    symmetric in its inputs, so without positions it cannot tell "dog bites man" from "man
    bites dog"."""
    if cfg.positional == "none":
        raise ConfigError(
            "ModelConfig: positional='none' is for a decoder-only model: an encoder without "
            "positions sees its input as a bag of tokens"
        )


class _ModelBase(nn.Module):
    """Input checks, initialisation and trace names, shared by all heads (aiayn.store.model_dir
    saves and loads them: `save_model_dir`, `load_model_dir`)."""

    cfg: ModelConfig

    def _init_weights(self) -> None:
        """The random start `cfg.init` names (the paper names none). Biases start at 0.

        "xavier": Xavier/Glorot for every projection, each from its own random draw
        (tensor2tensor, fairseq); embeddings N(0, d_model^-0.5) so that, multiplied by
        sqrt(d_model), they start at unit scale like the sinusoids (their choice for tied
        embeddings). "normal": N(0, 0.02) for every projection and embedding (BERT, Hugging
        Face's Marian), so the tokens start at 0.02 sqrt(d_model) beside the sinusoids.
        """
        # in_proj packs [W^Q; W^K; W^V] into one (3 d_model, d_model) Linear. Each block is a
        # d_model x d_model projection drawn U(-a, a) with a = sqrt(6 / (4 d_model)): Xavier
        # with gain 1/sqrt(2) per block, fairseq's scaled init for Q/K/V ("convergence much
        # better"; here too: the copy-task test learns markedly slower with gain 1). That is
        # exactly plain Xavier on the packed matrix (fan_in d + fan_out 3d = 4d), so one draw
        # initialises all three blocks, independently of each other (as does "normal").
        normal = self.cfg.init == "normal"
        embedding_std = 0.02 if normal else self.cfg.d_model**-0.5
        for module in self.modules():
            if isinstance(module, nn.Linear):
                if normal:
                    nn.init.normal_(module.weight, mean=0.0, std=0.02)
                else:
                    nn.init.xavier_uniform_(module.weight)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
            elif isinstance(module, nn.Embedding):
                nn.init.normal_(module.weight, mean=0.0, std=embedding_std)
                if module.padding_idx is not None:
                    with torch.no_grad():
                        module.weight[module.padding_idx].zero_()
        # The out_proj of MultiHeadAttention is an nn.Linear and was covered above.

    def _name_for_trace(self) -> None:
        for name, module in self.named_modules():
            if hasattr(module, "trace_name") and name:
                module.trace_name = name

    def check_ids(self, ids: Tensor, what: str) -> None:
        """Raise a clear ValueError for ids that are not a (B, T) long tensor inside the vocab."""
        if ids.dim() != 2:
            raise ValueError(
                f"{what} must be a (batch, length) tensor, got shape {tuple(ids.shape)}"
            )
        if ids.dtype not in (torch.int64, torch.int32):
            raise ValueError(f"{what} must hold integer token ids, got {ids.dtype}")
        if ids.size(1) > self.cfg.max_len:
            raise ValueError(
                f"{what} has length {ids.size(1)} > max_len={self.cfg.max_len} "
                f"(the positional table); shorten it or raise model.max_len"
            )
        # The range check reads values: that would split a torch.compile graph in two, and on
        # a GPU it would stop the host until the GPU catches up. Ids reach a GPU from the CPU
        # (tokenizer, batches), where they are checked; the embedding's own bound check stays.
        cheap = ids.device.type == "cpu" and not torch.compiler.is_compiling()
        if cheap and ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= self.cfg.vocab_size):
            raise ValueError(
                f"{what} holds ids in [{int(ids.min())}, {int(ids.max())}], outside the "
                f"vocabulary [0, {self.cfg.vocab_size})"
            )

    def extra_config(self) -> dict[str, int]:
        """Constructor arguments besides `cfg`, saved in config.json."""
        return {}


class Transformer(_ModelBase):
    """The encoder-decoder of Figure 1: `Transformer(cfg)(src_BS, tgt_in_BT) -> logits_BTV`."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        check_encoder_positions(cfg)
        self.cfg = cfg
        src_tokens = nn.Embedding(cfg.vocab_size, cfg.d_model, padding_idx=cfg.pad_id)
        tgt_tokens = (
            src_tokens
            if cfg.share_embeddings
            else nn.Embedding(cfg.vocab_size, cfg.d_model, padding_idx=cfg.pad_id)
        )
        self.src_embed = Embeddings(cfg, src_tokens)
        self.tgt_embed = Embeddings(cfg, tgt_tokens)
        self.encoder = Encoder(cfg)
        self.decoder = Decoder(cfg)
        # Pre-softmax; the paper's has no bias (Marian's final_logits_bias is `logits_bias`).
        self.generator = Linear(cfg.d_model, cfg.vocab_size, bias=cfg.logits_bias)
        self._init_weights()
        if cfg.tie_output:  # §3.4: the same matrix embeds target tokens and scores them
            self.generator.weight = tgt_tokens.weight
        self._name_for_trace()

    def encode(self, src_BS: Tensor) -> Memory:
        """Run the encoder once; decoding reuses the result for every step."""
        self.check_ids(src_BS, "source")
        keep_BS = src_BS != self.cfg.pad_id
        x_BSD = self.src_embed(src_BS)
        if skips_padding(self, keep_BS):  # inference on a CPU: the same bits, less work
            return Memory(encode_packed(self.encoder, x_BSD, keep_BS), keep_BS)
        return Memory(self.encoder(x_BSD, keep_BS[:, None, None, :]), keep_BS)

    def decode(self, tgt_in_BT: Tensor, memory: Memory) -> Tensor:
        """Decoder + output layer over a whole target prefix: logits_BTV."""
        self.check_ids(tgt_in_BT, "target")
        y_BTD = self.decoder(self.tgt_embed(tgt_in_BT), memory.out_BSD, memory.keep_B11S)
        logits_BTV = self.generator(y_BTD)
        tap("generator.logits", logits_BTV)
        return logits_BTV

    def forward(self, src_BS: Tensor, tgt_in_BT: Tensor) -> Tensor:
        """Logits (B, T, V) for every target position given the source and the shifted-right
        target. Attention maps and every other intermediate: run it under `tracing()`
        (`AttentionMaps.from_trace` collects the maps)."""
        memory = self.encode(src_BS)
        if tgt_in_BT.size(0) != src_BS.size(0):
            raise ValueError(f"source batch {src_BS.size(0)} != target batch {tgt_in_BT.size(0)}")
        return self.decode(tgt_in_BT, memory)

    # --- incremental decoding: the narrow interface search code uses ------------------------

    def init_cache(self, memory: Memory, capacity: int) -> KVCache:
        """An empty cache for up to `capacity` target positions, with cross K/V precomputed."""
        B = memory.out_BSD.size(0)
        J, K = self.cfg.n_kv_heads, self.cfg.d_k
        slots, window = self_capacity(self.cfg.attn_window, capacity, self.cfg.max_len)
        like = memory.out_BSD
        self_k, self_v, cross_k, cross_v = [], [], [], []
        layer: DecoderLayer
        for layer in self.decoder.layers:  # type: ignore[assignment]  # ModuleList items
            self_k.append(like.new_empty(B, J, slots, K))
            self_v.append(like.new_empty(B, J, slots, K))
            k_BHSK, v_BHSK = layer.cross_attn.project_kv(memory.out_BSD)
            cross_k.append(k_BHSK.contiguous())  # read at every step: pay the layout once
            cross_v.append(v_BHSK.contiguous())
        return KVCache(self_k, self_v, cross_k, cross_v, 0, window=window)

    def decode_step(
        self, tokens_BT: Tensor, memory: Memory, cache: KVCache
    ) -> tuple[Tensor, KVCache]:
        """Logits for the next token after feeding `tokens_BT` (usually T = 1) at cache.length.

        Returns (logits_BV for the last fed position, the cache extended by T positions).
        """
        start = cache.length
        if cache.start_B is not None and tokens_BT.size(1) != 1:
            raise ValueError("a cache that rows joined late takes one token per step")
        pos = start if cache.start_B is None else start - cache.start_B  # each row's position
        y_BTD = self.tgt_embed(tokens_BT, start=pos, most=start)  # start_B >= 0: pos <= start
        y_BTD = self.decoder.step(y_BTD, cache, memory.keep_B11S)
        cache.length = start + tokens_BT.size(1)
        logits_BV = self.generator(y_BTD[:, -1])
        return logits_BV, cache


def count_parameters(model: nn.Module) -> int:
    """Trainable parameters, each shared (tied) tensor counted once."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)
