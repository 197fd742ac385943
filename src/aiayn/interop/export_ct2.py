"""Export a Transformer to CTranslate2 through its Python model-spec API (docs/export.md).

CTranslate2 describes a model as a `TransformerSpec`: a tree of named variables (embeddings,
each layer's projections and LayerNorms, the output projection) plus a few switches. We build
the spec from `ModelConfig`, set every variable from aiayn's weights, register the vocabulary
(the SentencePiece pieces, so CTranslate2's ids are aiayn's ids), validate, optionally quantize
(`spec.optimize`) and save. How aiayn's model maps onto the spec:

    aiayn                                   CTranslate2 spec
    norm_first (pre-LN + final norm)        pre_norm=True (encoder/decoder .layer_norm)
    norm layernorm | rmsnorm                rms_norm (a LayerNormSpec with gamma only)
    activation relu | swish                 Activation.RELU | SWISH (the language model's
                                            also gelu | gelu_tanh: GELU | GELUTanh)
    swiglu | geglu: act(x W_1) * x W_3      ffn_glu: linear_0 = W_1 (activated, the gate),
                                            linear_0_noact = W_3 (the up projection)
    bias=False                              no bias variables (they are optional)
    kv_heads J                              num_heads_kv (in_proj is [W^Q; W^K; W^V], J heads
                                            each for K and V, CTranslate2's fused layout)
    positional rope (halves layout)         rotary_dim=0 (every dimension),
                                            rotary_interleave=False, rotary_base=rope_base
    qk_norm (with rmsnorm; the language     qk_norm (CTranslate2's are RMS norms)
    model's spec only)
    token embedding * sqrt(d_model)         scale_embeddings=True (its default)
    sinusoidal / learned positions          position_encodings.encodings: aiayn's own table,
                                            written out (CTranslate2's built-in table uses
                                            tensor2tensor's frequencies, not the paper's)
    in_proj [W^Q; W^K; W^V]                 self_attention.linear[0] (fused QKV)
    cross in_proj rows Q | K,V              attention.linear[0] (Q), attention.linear[1] (KV)
    out_proj                                linear[1] (self) / linear[2] (cross)
    norm1, norm2, norm3                     self_attention / attention / ffn .layer_norm
    generator (+ logits_bias)               decoder.projection (weight, bias)
    layer_norm_eps, special ids             config.layer_norm_epsilon, bos/eos/unk tokens

Refused in one line (`check_expressible`): ALiBi and local attention (the encoder's are
two-sided; CTranslate2's encoder has neither), relu2 (no such activation), GELU (not
needed by a translator so far: the language model's spec takes it), qk_norm (its
cross-attention normalises queries over d_model, not per head; and its norms are RMS norms).
The language model's spec takes more (aiayn.interop.export_lm_ct2).

Shared and tied matrices are set once per use; `spec.optimize` stores equal tensors once.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from aiayn.config import ModelConfig
from aiayn.errors import AiaynError, ConfigError
from aiayn.interop.export_dir import load_source, source_architecture, write_export
from aiayn.nn.attention import MultiHeadAttention
from aiayn.nn.embeddings import Embeddings
from aiayn.nn.model import DecoderLayer, EncoderLayer, Transformer
from aiayn.nn.norms import Norm
from aiayn.text.tokenizer import JointTokenizer, MarianTokenizer, Tokenizer

if TYPE_CHECKING:
    from ctranslate2.specs import TransformerSpec

QUANTIZATIONS = ("float32", "int8", "int16", "bfloat16")

# ModelConfig fields and the values a CTranslate2 TransformerSpec can express. A field that is
# not listed here (a new model option) is refused by name rather than silently dropped.
_EXPRESSIBLE: dict[str, tuple[Any, ...] | None] = {  # None: any value
    "vocab_size": None,
    "d_model": None,
    "n_heads": None,
    "n_layers": None,
    "d_ff": None,
    "dropout": None,
    "attn_dropout": None,
    "init": None,  # training only
    "max_len": None,
    "positional": ("sinusoidal", "learned", "rope"),
    "rope_base": None,  # rotary_base
    "norm": ("layernorm", "rmsnorm"),
    "ffn_match_params": None,  # the weights' shapes say it
    "bias": (True, False),
    "kv_heads": None,  # num_heads_kv
    "attn_window": (0,),
    # CTranslate2 4.8 normalises a cross-attention's queries over all of d_model, not per head
    # (measured: log-probabilities off by 4); the language model's spec takes qk_norm
    "qk_norm": (False,),
    "norm_first": (False, True),
    "layer_norm_eps": None,
    "share_embeddings": (False, True),
    "tie_output": (False, True),
    "activation": ("relu", "swish", "swiglu", "geglu"),  # the LM's spec takes GELU too
    "positional_layout": ("interleaved", "halves"),
    "logits_bias": (False, True),
    "scale_embeddings": (False, True),
    "pooling": None,  # a classifier's only
    "pooler": None,
    "embed_norm": (False,),
    "pad_id": None,
    "bos_id": None,
    "eos_id": None,
}


def import_ctranslate2() -> Any:
    """The `ctranslate2` module, or a one-line error saying how to install it."""
    try:
        import ctranslate2
    except ImportError:
        raise AiaynError(
            "the CTranslate2 engine needs the ctranslate2 package: pip install 'aiayn[export]'"
        ) from None
    return ctranslate2


def check_expressible(
    cfg: ModelConfig,
    table: dict[str, tuple[Any, ...] | None] = _EXPRESSIBLE,
    spec: str = "TransformerSpec",
) -> None:
    """Raise a one-line ConfigError naming the first option the spec cannot express."""
    for f in dataclasses.fields(cfg):
        value = getattr(cfg, f.name)
        if f.name not in table:
            raise ConfigError(
                f"model option {f.name}={value!r} cannot be expressed in a CTranslate2 {spec}"
            )
        allowed = table[f.name]
        if allowed is not None and value not in allowed:
            raise ConfigError(
                f"model option {f.name}={value!r} cannot be expressed in a CTranslate2 "
                f"{spec} (it takes {', '.join(map(repr, allowed))})"
            )
    if cfg.qk_norm and cfg.norm != "rmsnorm":  # CTranslate2's q_norm/k_norm are RMS norms
        raise ConfigError(
            f"model option qk_norm=True with norm={cfg.norm!r} cannot be expressed in a "
            f"CTranslate2 {spec} (its query/key norms are RMS norms: norm='rmsnorm')"
        )


# aiayn's activation -> CTranslate2's (a gated one: the activation of its gate, linear_0)
ACTIVATIONS = {
    "relu": "RELU",
    "swish": "SWISH",
    "gelu": "GELU",
    "gelu_tanh": "GELUTanh",
    "swiglu": "SWISH",
    "geglu": "GELU",
}


def block_options(cfg: ModelConfig) -> dict[str, Any]:
    """The `from_config`/spec keyword arguments every CTranslate2 Transformer block takes
    from `cfg` (module docstring): activation, gated FFN, norm, K/V heads, RoPE, qk_norm."""
    from ctranslate2.specs import common_spec

    opts: dict[str, Any] = {
        "pre_norm": cfg.norm_first,
        "activation": common_spec.Activation[ACTIVATIONS[cfg.activation]],
        "ffn_glu": cfg.activation in ("swiglu", "geglu"),
        "rms_norm": cfg.norm == "rmsnorm",
        "num_heads_kv": cfg.n_kv_heads if cfg.n_kv_heads != cfg.n_heads else None,
        "qk_norm": cfg.qk_norm,
    }
    if cfg.positional == "rope":  # every dimension, the two halves of a head paired
        opts |= {"rotary_dim": 0, "rotary_interleave": False, "rotary_base": cfg.rope_base}
    return opts


def vocabulary(tok: Tokenizer, cfg: ModelConfig) -> list[str]:
    """The token strings by id: CTranslate2 looks tokens up by string, so they must be unique."""
    if tok.vocab_size != cfg.vocab_size:
        raise ConfigError(
            f"the tokenizer has {tok.vocab_size} pieces but the model expects {cfg.vocab_size}"
        )
    pieces = tok.pieces(range(tok.vocab_size))
    if len(set(pieces)) != len(pieces):
        dup = next(p for i, p in enumerate(pieces) if p in pieces[:i])
        raise ConfigError(
            f"the vocabulary holds the piece {dup!r} twice; CTranslate2 needs unique token strings"
        )
    return pieces


def _unk_token(tok: Tokenizer, vocab: list[str]) -> str:
    """The unknown token's string (CTranslate2 needs one in the vocabulary)."""
    if isinstance(tok, JointTokenizer):
        return vocab[tok.sp.unk_id()]
    if isinstance(tok, MarianTokenizer):
        return vocab[tok.unk_id]
    if "<unk>" in vocab:
        return "<unk>"
    raise ConfigError("the vocabulary has no unknown token; CTranslate2 needs one")


def _np(t: torch.Tensor) -> np.ndarray:
    return t.detach().to(torch.float32).cpu().numpy().copy()


def _linear(spec: Any, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
    spec.weight = _np(weight)
    if bias is not None:
        spec.bias = _np(bias)


def _norm(spec: Any, norm: Norm | torch.nn.Module | None) -> None:
    assert isinstance(norm, torch.nn.LayerNorm | torch.nn.RMSNorm)
    spec.gamma = _np(norm.weight)
    if isinstance(norm, torch.nn.LayerNorm):  # an RMS norm's spec has no beta
        spec.beta = _np(norm.bias)


def _qk_norms(spec: Any, attn: MultiHeadAttention) -> None:
    """qk_norm's per-head norms of Q and K (before RoPE in both)."""
    if attn.q_norm is not None:
        _norm(spec.q_norm, attn.q_norm)
        _norm(spec.k_norm, attn.k_norm)


def _embeddings(side: Any, emb_spec: Any, model: Transformer, source: bool) -> None:
    embed = model.src_embed if source else model.tgt_embed
    emb_spec.weight = _np(embed.tokens.weight)
    side.scale_embeddings = model.cfg.scale_embeddings  # x sqrt(d_model), §3.4
    set_positions(side, embed)


def set_positions(side: Any, embed: Embeddings) -> None:
    """The table the embeddings add: aiayn's own (max_len, D), or zeros for positional="none"
    (without one CTranslate2 adds its built-in sinusoids). RoPE and ALiBi add none: their
    specs have no position_encodings."""
    if not hasattr(side, "position_encodings"):
        return
    if embed.learned is not None:
        table = embed.learned.weight
    elif embed.adds_positions:
        table = embed.pe
    else:
        table = torch.zeros(embed.max_len, embed.tokens.embedding_dim)
    side.position_encodings.encodings = _np(table)


def _encoder_layer(spec: Any, layer: EncoderLayer) -> None:
    attn = layer.self_attn
    _linear(spec.self_attention.linear[0], attn.in_proj.weight, attn.in_proj.bias)
    _linear(spec.self_attention.linear[1], attn.out_proj.weight, attn.out_proj.bias)
    _qk_norms(spec.self_attention, attn)
    _norm(spec.self_attention.layer_norm, layer.norm1)
    _ffn(spec.ffn, layer, layer.norm2)


def _decoder_layer(spec: Any, layer: DecoderLayer) -> None:
    D = layer.self_attn.d_model
    attn, cross = layer.self_attn, layer.cross_attn
    _linear(spec.self_attention.linear[0], attn.in_proj.weight, attn.in_proj.bias)
    _linear(spec.self_attention.linear[1], attn.out_proj.weight, attn.out_proj.bias)
    _qk_norms(spec.self_attention, attn)
    _norm(spec.self_attention.layer_norm, layer.norm1)
    w, b = cross.in_proj.weight, cross.in_proj.bias
    _linear(spec.attention.linear[0], w[:D], None if b is None else b[:D])  # W^Q
    _linear(spec.attention.linear[1], w[D:], None if b is None else b[D:])  # [W^K; W^V]
    _linear(spec.attention.linear[2], cross.out_proj.weight, cross.out_proj.bias)
    _qk_norms(spec.attention, cross)
    _norm(spec.attention.layer_norm, layer.norm2)
    _ffn(spec.ffn, layer, layer.norm3)


def _ffn(spec: Any, layer: EncoderLayer | DecoderLayer, norm: Norm) -> None:
    ffn = layer.ffn
    _linear(spec.linear_0, ffn.w_1.weight, ffn.w_1.bias)  # the gate, activated, if gated
    if ffn.w_3 is not None:  # CTranslate2 multiplies by linear_0_noact: the up projection
        _linear(spec.linear_0_noact, ffn.w_3.weight, ffn.w_3.bias)
    _linear(spec.linear_1, ffn.w_2.weight, ffn.w_2.bias)
    _norm(spec.layer_norm, norm)


def transformer_spec(model: Transformer, tok: Tokenizer) -> TransformerSpec:
    """The CTranslate2 spec of `model`, every variable set, vocabulary registered, validated."""
    ct2 = import_ctranslate2()
    from ctranslate2.specs import transformer_spec

    cfg = model.cfg
    check_expressible(cfg)
    vocab = vocabulary(tok, cfg)
    # Built from its two halves: TransformerSpec.from_config takes no num_heads_kv or RoPE.
    opts = block_options(cfg)
    spec = transformer_spec.TransformerSpec(
        transformer_spec.TransformerEncoderSpec(cfg.n_layers, cfg.n_heads, **opts),
        transformer_spec.TransformerDecoderSpec(cfg.n_layers, cfg.n_heads, **opts),
    )
    _embeddings(spec.encoder, spec.encoder.embeddings[0], model, source=True)
    _embeddings(spec.decoder, spec.decoder.embeddings, model, source=False)
    for layer_spec, enc_layer in zip(spec.encoder.layer, model.encoder.layers, strict=True):
        _encoder_layer(layer_spec, enc_layer)  # type: ignore[arg-type]  # ModuleList items
    for layer_spec, dec_layer in zip(spec.decoder.layer, model.decoder.layers, strict=True):
        _decoder_layer(layer_spec, dec_layer)  # type: ignore[arg-type]
    if cfg.norm_first:  # pre-LN: the final LayerNorms
        assert model.encoder.norm is not None and model.decoder.norm is not None
        _norm(spec.encoder.layer_norm, model.encoder.norm)
        _norm(spec.decoder.layer_norm, model.decoder.norm)
    _linear(spec.decoder.projection, model.generator.weight, model.generator.bias)
    spec.register_source_vocabulary(vocab)
    spec.register_target_vocabulary(vocab)
    spec.config.layer_norm_epsilon = cfg.layer_norm_eps
    spec.config.bos_token = vocab[cfg.bos_id]
    spec.config.decoder_start_token = vocab[cfg.bos_id]  # the decoder starts from BOS
    spec.config.eos_token = vocab[cfg.eos_id]
    spec.config.unk_token = _unk_token(tok, vocab)
    try:
        spec.validate()
    except ValueError as e:  # a variable left unset: a bug here, said in one line
        raise ConfigError(f"CTranslate2 {ct2.__version__} rejected the spec: {e}") from None
    return spec


def export_ctranslate2(model_dir: Path, out: Path, quantization: str = "float32") -> Path:
    """`aiayn export ctranslate2`: write the CTranslate2 model of `model_dir` to `out`.

    `out` holds CTranslate2's `model.bin`, `config.json` and `shared_vocabulary.json`, the
    tokenizer and `aiayn_export.json`. Returns `out`.
    """
    if quantization not in QUANTIZATIONS:
        raise ConfigError(f"--quantization {quantization!r}: choose one of {list(QUANTIZATIONS)}")
    ct2 = import_ctranslate2()
    if source_architecture(model_dir, out) == "DecoderLM":  # export_lm_ct2 builds on this one
        raise ConfigError(
            f"{model_dir} holds a language model: aiayn.interop.export_lm_ct2."
            "export_lm_ctranslate2 exports it (`aiayn export ctranslate2` calls it)"
        )
    model, tok, decode = load_source(model_dir, out)
    spec = transformer_spec(model, tok)
    spec.optimize(quantization=quantization)
    return write_export(
        out,
        lambda d: spec.save(str(d)),
        tok,
        engine="ctranslate2",
        quantization=quantization,
        model_cfg=model.cfg,
        decode=decode,
        source=model_dir,
        files={"model": "model.bin"},
        versions={"ctranslate2": ct2.__version__},
    )
