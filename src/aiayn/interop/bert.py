"""Open a Hugging Face `BertForSequenceClassification` directory as an aiayn `EncoderClassifier`
model directory (docs/import.md, "A BERT classifier").

    import_bert(hf_dir, out)   config.json -> ModelConfig and labels, model.safetensors ->
                               aiayn's state dict, the WordPiece (tokenizer.json, or vocab.txt)
                               -> hf_tokenizer.json; written to a temporary directory, then
                               renamed to `out`

BERT (Devlin et al., 2019) is the paper's encoder stack, post-LN as the paper, with these
differences, each a ModelConfig option: learned positions, token embeddings added unscaled
(`scale_embeddings = False`), a LayerNorm over the embedding sum (`embed_norm`), exact GELU in
the FFN (`activation = "gelu"`), and a sentence vector read at [CLS] (`pooling = "cls"`) through
a tanh(dense) layer (`pooler`). BERT also adds a segment ("token type") embedding; a classifier
input here is one segment, type 0, so that row is added into every row of the position table:
the same sum, with no new parameter. W^Q, W^K and W^V (BERT's query, key, value) stack into
aiayn's one in_proj, in that order.

The classes are config.json's id2label, in id order. Anything else a config may say that aiayn
cannot compute exactly is refused with one line naming it, and nothing is written unless the
whole import succeeds. Weights are read with safetensors only: a directory holding only
`pytorch_model.bin` is refused (a pickle is never opened).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from aiayn.atomic import check_new_dir
from aiayn.config import ModelConfig
from aiayn.errors import CheckpointError, ConfigError
from aiayn.interop.gpt2 import _int
from aiayn.interop.marian import WEIGHTS, _read_json, _take, read_weights, write_imported
from aiayn.nn.encoder_only import EncoderClassifier
from aiayn.store.model_dir import check_state_dict
from aiayn.text.bert_tokenizer import BertTokenizer

log = logging.getLogger(__name__)

INT_KEYS = (
    "vocab_size",
    "hidden_size",
    "num_attention_heads",
    "num_hidden_layers",
    "intermediate_size",
    "max_position_embeddings",
)
# bert-base's [CLS] and [SEP], every Google BERT vocabulary's: the ids a model imported without
# its tokenizer records, where the vocabulary is that large
CLS_ID, SEP_ID = 101, 102


@dataclass(frozen=True)
class ImportedClassifier:
    """What `import_bert` wrote, for the CLI to report."""

    out: Path
    model: ModelConfig
    labels: list[str]
    tokenizer: bool  # whether the directory had one (else the model works on ids only)


# --- reading the Hugging Face directory -----------------------------------------------------------


def read_bert_config(hf_dir: Path) -> dict[str, Any]:
    """config.json, checked to describe a BERT sequence classifier whose every option aiayn
    computes."""
    if not hf_dir.is_dir():
        raise CheckpointError(f"Hugging Face model directory not found: {hf_dir}")
    hf = _read_json(hf_dir / "config.json")
    kind, archs = hf.get("model_type"), hf.get("architectures") or []
    if kind != "bert":
        named = ", ".join(map(str, archs)) or "no architectures"
        raise CheckpointError(f"{hf_dir} holds a {kind!r} model ({named}), not a BERT")
    if archs and "BertForSequenceClassification" not in archs:
        raise CheckpointError(
            f"{hf_dir} holds a {', '.join(map(str, archs))}, not a "
            "BertForSequenceClassification (a BERT with a classifier head)"
        )
    act, pos = hf.get("hidden_act", "gelu"), hf.get("position_embedding_type", "absolute")
    refusals = [
        (act != "gelu", f"hidden_act={act!r}: aiayn imports BERT's exact GELU ('gelu') only"),
        (pos != "absolute", f"position_embedding_type={pos!r}: aiayn's positions are absolute"),
        (bool(hf.get("is_decoder")), "is_decoder=true: an EncoderClassifier reads both ways"),
        (bool(hf.get("add_cross_attention")), "add_cross_attention=true: an encoder has none"),
        (
            hf.get("problem_type") not in (None, "single_label_classification"),
            f"problem_type={hf.get('problem_type')!r}: aiayn's classifier picks one class "
            "(a softmax over them)",
        ),
    ]
    for refused, why in refusals:
        if refused:
            raise CheckpointError(f"{hf_dir}/config.json: {why}")
    try:
        for key in INT_KEYS:
            _int(hf, key)
        _int(hf, "type_vocab_size", 2)
        _int(hf, "pad_token_id", 0)
    except CheckpointError as e:
        raise CheckpointError(f"{hf_dir}/{e}") from None
    return hf


def read_labels(hf: dict[str, Any], where: Path) -> list[str]:
    """The class names of config.json's id2label, in id order (ids 0 .. C-1, each once)."""
    table = hf.get("id2label")
    if not isinstance(table, dict) or not table:
        n = hf.get("num_labels", 2)  # transformers' default: LABEL_0, LABEL_1
        if not isinstance(n, int) or isinstance(n, bool):
            raise CheckpointError(f"{where}/config.json: num_labels={n!r} is not an integer")
        table = {str(i): f"LABEL_{i}" for i in range(n)}
    try:
        by_id = {int(k): v for k, v in table.items()}
    except ValueError:
        raise CheckpointError(f"{where}/config.json: id2label's keys are not ids") from None
    if sorted(by_id) != list(range(len(by_id))) or len(by_id) < 2:
        raise CheckpointError(
            f"{where}/config.json: id2label must name classes 0 .. C-1 with C >= 2 "
            f"(it has ids {sorted(by_id)[:5]})"
        )
    labels = [str(by_id[i]) for i in range(len(by_id))]
    if len(set(labels)) != len(labels):
        raise CheckpointError(f"{where}/config.json: id2label names a class twice: {labels}")
    return labels


def model_config(hf: dict[str, Any], tok: BertTokenizer | None, where: Path) -> ModelConfig:
    """The ModelConfig of a checked BERT config.json: for inference (dropout 0). The special
    ids are the tokenizer's; without one, config.json's [PAD] and bert-base's [CLS] and [SEP]
    (or [PAD] for each, in a vocabulary too small for those)."""
    V, pad = hf["vocab_size"], hf.get("pad_token_id", 0)
    if tok is not None:
        bos, eos = tok.bos_id, tok.eos_id
    else:
        bos, eos = (CLS_ID, SEP_ID) if V > SEP_ID else (pad, pad)
        log.warning(
            "%s: without a tokenizer the model's [CLS] is taken as id %d and [SEP] as %d",
            where,
            bos,
            eos,
        )
    try:
        return ModelConfig(
            vocab_size=V,
            d_model=hf["hidden_size"],
            n_heads=hf["num_attention_heads"],
            n_layers=hf["num_hidden_layers"],
            d_ff=hf["intermediate_size"],
            dropout=0.0,
            attn_dropout=0.0,
            max_len=hf["max_position_embeddings"],
            positional="learned",
            norm_first=False,  # BERT is post-LN, as the paper
            layer_norm_eps=float(hf.get("layer_norm_eps", 1e-12)),
            activation="gelu",
            scale_embeddings=False,
            init="normal",  # BERT's N(0, 0.02), should the config ever start a model afresh
            pooling="cls",
            pooler=True,
            embed_norm=True,
            pad_id=pad,
            bos_id=bos,
            eos_id=eos,
        )
    except ConfigError as e:
        raise CheckpointError(f"{where}/config.json: {e}") from None


# --- mapping --------------------------------------------------------------------------------------


def _linear(
    hf: dict[str, Tensor], theirs: str, ours: str, d_in: int, d_out: int, where: Path
) -> dict[str, Tensor]:
    """nn.Linear's weight (out, in) and bias, stored by BERT as they are by aiayn."""
    return {
        f"{ours}.weight": _take(hf, f"{theirs}.weight", (d_out, d_in), where),
        f"{ours}.bias": _take(hf, f"{theirs}.bias", (d_out,), where),
    }


def _norm(hf: dict[str, Tensor], theirs: str, ours: str, d: int, where: Path) -> dict[str, Tensor]:
    """A LayerNorm's weight and bias (named gamma and beta in older files)."""
    out = {}
    for kind, old in (("weight", "gamma"), ("bias", "beta")):
        name = f"{theirs}.{kind}" if f"{theirs}.{kind}" in hf else f"{theirs}.{old}"
        out[f"{ours}.{kind}"] = _take(hf, name, (d,), where)
    return out


def map_weights(
    hf: dict[str, Tensor], cfg: ModelConfig, n_classes: int, where: Path
) -> dict[str, Tensor]:
    """aiayn's state dict from BertForSequenceClassification's tensors, every shape checked; a
    tensor left over is one such a BERT does not have, and is refused."""
    V, D, F, P = cfg.vocab_size, cfg.d_model, cfg.d_ff, cfg.max_len
    e = "bert.embeddings."
    for buffer in ("position_ids", "token_type_ids"):
        hf.pop(e + buffer, None)  # index buffers some versions save
    types = hf.get(f"{e}token_type_embeddings.weight")
    n_types = types.size(0) if types is not None and types.dim() == 2 else 1
    segment_ND = _take(hf, f"{e}token_type_embeddings.weight", (n_types, D), where)
    out = {
        "embed.tokens.weight": _take(hf, f"{e}word_embeddings.weight", (V, D), where),
        # every input is segment 0: its embedding is added at every position
        "embed.learned.weight": _take(hf, f"{e}position_embeddings.weight", (P, D), where)
        + segment_ND[0],
        **_norm(hf, f"{e}LayerNorm", "embed.norm", D, where),
    }
    for i in range(cfg.n_layers):
        h, a = f"bert.encoder.layer.{i}.", f"encoder.layers.{i}."
        q, k, v = (
            _linear(hf, f"{h}attention.self.{name}", name, D, D, where)
            for name in ("query", "key", "value")
        )
        for kind in ("weight", "bias"):  # [W^Q; W^K; W^V]: in_proj's order
            out[f"{a}self_attn.in_proj.{kind}"] = torch.cat(
                [q[f"query.{kind}"], k[f"key.{kind}"], v[f"value.{kind}"]]
            )
        out |= _linear(hf, f"{h}attention.output.dense", f"{a}self_attn.out_proj", D, D, where)
        out |= _norm(hf, f"{h}attention.output.LayerNorm", f"{a}norm1", D, where)
        out |= _linear(hf, f"{h}intermediate.dense", f"{a}ffn.w_1", D, F, where)
        out |= _linear(hf, f"{h}output.dense", f"{a}ffn.w_2", F, D, where)
        out |= _norm(hf, f"{h}output.LayerNorm", f"{a}norm2", D, where)
    out |= _linear(hf, "bert.pooler.dense", "pooler", D, D, where)
    out |= _linear(hf, "classifier", "classifier", D, n_classes, where)
    if hf:
        raise CheckpointError(
            f"{where} holds tensors a BertForSequenceClassification does not have: "
            f"{', '.join(sorted(hf)[:3])}"
        )
    return out


def read_tokenizer(hf_dir: Path, hf: dict[str, Any]) -> BertTokenizer | None:
    """The directory's WordPiece, checked against the model's size and [PAD]; None (with a
    warning) when it has none."""
    tok = BertTokenizer.from_hf_dir(hf_dir)
    if tok is None:
        log.warning(
            "%s has no tokenizer (tokenizer.json or vocab.txt): the model is imported alone "
            "and works on token ids",
            hf_dir,
        )
        return None
    if tok.vocab_size != hf["vocab_size"]:
        raise CheckpointError(
            f"{hf_dir}: the tokenizer has {tok.vocab_size} pieces but config.json says "
            f"vocab_size={hf['vocab_size']}"
        )
    if tok.pad_id != hf.get("pad_token_id", 0):
        raise CheckpointError(
            f"{hf_dir}: the tokenizer's [PAD] is {tok.pad_id} but config.json says "
            f"pad_token_id={hf.get('pad_token_id', 0)}"
        )
    return tok


# --- writing --------------------------------------------------------------------------------------


def import_bert(hf_dir: str | Path, out: str | Path) -> ImportedClassifier:
    """Convert the BertForSequenceClassification directory `hf_dir` into a new aiayn model
    directory `out`, which `aiayn.classify.classifier.Classifier.open(out)` runs.

    Everything is read and checked first; then the model directory is built in a temporary
    directory beside `out` and renamed to it, so `out` is either complete or absent.
    """
    hf_dir, out = Path(hf_dir), Path(out)
    check_new_dir(out)
    hf = read_bert_config(hf_dir)
    labels = read_labels(hf, hf_dir)
    tok = read_tokenizer(hf_dir, hf)
    cfg = model_config(hf, tok, hf_dir)
    state = map_weights(read_weights(hf_dir), cfg, len(labels), hf_dir / WEIGHTS)
    model = EncoderClassifier(cfg, len(labels), labels)
    check_state_dict(model, state, str(hf_dir / WEIGHTS))
    model.load_state_dict(state)
    write_imported(out, model, tok, "bert", hf_dir)
    return ImportedClassifier(out, cfg, labels, tok is not None)
