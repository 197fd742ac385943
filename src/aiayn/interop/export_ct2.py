"""Export a Transformer to CTranslate2 through its Python model-spec API (docs/export.md).

CTranslate2 describes a model as a `TransformerSpec`: a tree of named variables (embeddings,
each layer's projections and LayerNorms, the output projection) plus a few switches. We build
the spec from `ModelConfig`, set every variable from aiayn's weights, register the vocabulary
(the SentencePiece pieces, so CTranslate2's ids are aiayn's ids), validate, optionally quantize
(`spec.optimize`) and save. How aiayn's model maps onto the spec:

    aiayn                                   CTranslate2 spec
    norm_first (pre-LN + final LayerNorm)   pre_norm=True (encoder/decoder .layer_norm)
    activation relu | swish                 Activation.RELU | Activation.SWISH
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
    "positional": ("sinusoidal", "learned"),
    "rope_base": None,  # read with positional = "rope" only
    "norm": ("layernorm",),
    "ffn_match_params": None,  # read with a gated activation only
    "bias": (True,),
    "kv_heads": (0,),
    "attn_window": (0,),
    "qk_norm": (False,),
    "norm_first": (False, True),
    "layer_norm_eps": None,
    "share_embeddings": (False, True),
    "tie_output": (False, True),
    "activation": ("relu", "swish"),
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


def check_expressible(cfg: ModelConfig) -> None:
    """Raise a one-line ConfigError naming the first option the spec cannot express."""
    for f in dataclasses.fields(cfg):
        value = getattr(cfg, f.name)
        if f.name not in _EXPRESSIBLE:
            raise ConfigError(
                f"model option {f.name}={value!r} cannot be expressed in a CTranslate2 "
                "TransformerSpec"
            )
        allowed = _EXPRESSIBLE[f.name]
        if allowed is not None and value not in allowed:
            raise ConfigError(
                f"model option {f.name}={value!r} cannot be expressed in a CTranslate2 "
                f"TransformerSpec (it takes {', '.join(map(repr, allowed))})"
            )


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


def _norm(spec: Any, norm: Norm) -> None:
    assert isinstance(norm, torch.nn.LayerNorm)  # check_expressible refuses RMSNorm
    spec.gamma, spec.beta = _np(norm.weight), _np(norm.bias)


def _embeddings(side: Any, emb_spec: Any, model: Transformer, source: bool) -> None:
    embed = model.src_embed if source else model.tgt_embed
    emb_spec.weight = _np(embed.tokens.weight)
    side.scale_embeddings = model.cfg.scale_embeddings  # x sqrt(d_model), §3.4
    table = embed.learned.weight if embed.learned is not None else embed.pe
    side.position_encodings.encodings = _np(table)  # (max_len, D), aiayn's layout


def _encoder_layer(spec: Any, layer: EncoderLayer) -> None:
    attn = layer.self_attn
    _linear(spec.self_attention.linear[0], attn.in_proj.weight, attn.in_proj.bias)
    _linear(spec.self_attention.linear[1], attn.out_proj.weight, attn.out_proj.bias)
    _norm(spec.self_attention.layer_norm, layer.norm1)
    _ffn(spec.ffn, layer, layer.norm2)


def _decoder_layer(spec: Any, layer: DecoderLayer) -> None:
    D = layer.self_attn.d_model
    attn, cross = layer.self_attn, layer.cross_attn
    _linear(spec.self_attention.linear[0], attn.in_proj.weight, attn.in_proj.bias)
    _linear(spec.self_attention.linear[1], attn.out_proj.weight, attn.out_proj.bias)
    _norm(spec.self_attention.layer_norm, layer.norm1)
    w, b = cross.in_proj.weight, cross.in_proj.bias
    _linear(spec.attention.linear[0], w[:D], b[:D])  # W^Q
    _linear(spec.attention.linear[1], w[D:], b[D:])  # [W^K; W^V]
    _linear(spec.attention.linear[2], cross.out_proj.weight, cross.out_proj.bias)
    _norm(spec.attention.layer_norm, layer.norm2)
    _ffn(spec.ffn, layer, layer.norm3)


def _ffn(spec: Any, layer: EncoderLayer | DecoderLayer, norm: Norm) -> None:
    _linear(spec.linear_0, layer.ffn.w_1.weight, layer.ffn.w_1.bias)
    _linear(spec.linear_1, layer.ffn.w_2.weight, layer.ffn.w_2.bias)
    _norm(spec.layer_norm, norm)


def transformer_spec(model: Transformer, tok: Tokenizer) -> TransformerSpec:
    """The CTranslate2 spec of `model`, every variable set, vocabulary registered, validated."""
    ct2 = import_ctranslate2()
    from ctranslate2.specs import common_spec, transformer_spec

    cfg = model.cfg
    check_expressible(cfg)
    vocab = vocabulary(tok, cfg)
    activation = {"relu": common_spec.Activation.RELU, "swish": common_spec.Activation.SWISH}
    spec = transformer_spec.TransformerSpec.from_config(
        cfg.n_layers, cfg.n_heads, pre_norm=cfg.norm_first, activation=activation[cfg.activation]
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
