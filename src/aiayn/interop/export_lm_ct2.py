"""Export a decoder-only language model (`DecoderLM`) to CTranslate2's generator, and run it
greedily behind aiayn's `Generator` (docs/export.md, "A language model").

CTranslate2's `TransformerDecoderModelSpec` (the spec its GPT-2 converter builds) is the
translator's decoder without cross-attention, and `DecoderLM` is exactly that: its layers map
as the translator's encoder layers do (`aiayn.interop.export_ct2`), with every `ModelConfig`
option the translator's spec takes (post-LN or pre-LN with its final norm, LayerNorm or
RMSNorm, learned, sinusoidal or no positions written out, RoPE, scaled or unscaled embeddings,
ReLU, swish, GELU, SwiGLU, GeGLU, biases or none, a logits bias, GQA/MQA) and more:
`LM_EXPRESSIBLE` (ALiBi, a window, qk_norm). The LLaMA/Mistral block is all of them. The
prompt is BOS + the prompt's pieces, as aiayn's.

Only greedy search is offered: CTranslate2's sampling draws from its own random streams (not
aiayn's per-row seeds), and its beam search ranks by another length penalty (engines.py).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from aiayn.config import DecodeConfig, ModelConfig
from aiayn.errors import CheckpointError, ConfigError
from aiayn.generate.generator import Generator
from aiayn.interop.export_ct2 import (
    _EXPRESSIBLE,
    QUANTIZATIONS,
    _encoder_layer,
    _linear,
    _norm,
    _np,
    _unk_token,
    block_options,
    check_expressible,
    import_ctranslate2,
    set_positions,
    vocabulary,
)
from aiayn.interop.export_dir import write_export
from aiayn.interop.export_lm import ARCHITECTURE, load_lm_source
from aiayn.nn.variants import DecoderLM
from aiayn.search.hypothesis import Hypothesis
from aiayn.search.step_view import StepView
from aiayn.store.directory import ModelDir
from aiayn.text.tokenizer import Tokenizer

if TYPE_CHECKING:
    from ctranslate2.specs import TransformerDecoderModelSpec


# What the decoder-only spec takes beyond the translator's (aiayn.interop.export_ct2): qk_norm
# (with rmsnorm: RMS norms of each head's Q and K, before RoPE as in aiayn), ALiBi
# (`alibi`, its slopes are aiayn's), local attention (`sliding_window`: the newest W keys of
# its cache, aiayn's 0 <= i - j < W while decoding; longer prompts are refused when run,
# `Ct2Generator`), and positions added by nothing ("none": a table of zeros).
LM_EXPRESSIBLE = _EXPRESSIBLE | {
    "positional": ("sinusoidal", "learned", "rope", "alibi", "none"),
    "activation": ("relu", "swish", "gelu", "gelu_tanh", "swiglu", "geglu"),
    "attn_window": None,
    "qk_norm": (False, True),  # with rmsnorm (check_expressible): self-attention's are per head
}


def check_lm_expressible(cfg: ModelConfig) -> None:
    """Raise a one-line ConfigError naming the first option the spec cannot express."""
    check_expressible(cfg, LM_EXPRESSIBLE, "TransformerDecoderModelSpec")


def decoder_lm_spec(model: DecoderLM, tok: Tokenizer) -> TransformerDecoderModelSpec:
    """The CTranslate2 spec of `model`, every variable set, vocabulary registered, validated."""
    ct2 = import_ctranslate2()
    from ctranslate2.specs import transformer_spec

    cfg = model.cfg
    check_lm_expressible(cfg)
    vocab = vocabulary(tok, cfg)
    spec = transformer_spec.TransformerDecoderModelSpec.from_config(
        cfg.n_layers,
        cfg.n_heads,
        alibi=cfg.positional == "alibi",  # slopes 2^(-8h/H), aiayn's (positions.alibi_slopes)
        sliding_window=cfg.attn_window or None,
        **block_options(cfg),
    )
    decoder, embed = spec.decoder, model.embed
    decoder.scale_embeddings = cfg.scale_embeddings  # x sqrt(d_model), §3.4
    decoder.embeddings.weight = _np(embed.tokens.weight)
    set_positions(decoder, embed)
    for layer_spec, layer in zip(decoder.layer, model.decoder.layers, strict=True):
        _encoder_layer(layer_spec, layer)  # type: ignore[arg-type]  # ModuleList items
    if cfg.norm_first:  # pre-LN: the final norm
        assert model.decoder.norm is not None
        _norm(decoder.layer_norm, model.decoder.norm)
    _linear(decoder.projection, model.generator.weight, model.generator.bias)
    spec.register_vocabulary(vocab)
    spec.config.layer_norm_epsilon = cfg.layer_norm_eps
    spec.config.bos_token = vocab[cfg.bos_id]
    spec.config.eos_token = vocab[cfg.eos_id]
    try:
        spec.config.unk_token = _unk_token(tok, vocab)
    except ConfigError:  # no unknown token (a byte-level vocabulary): the prompts are ids
        spec.config.unk_token = vocab[cfg.pad_id]
    try:
        spec.validate()
    except ValueError as e:  # a variable left unset: a bug here, said in one line
        raise ConfigError(f"CTranslate2 {ct2.__version__} rejected the spec: {e}") from None
    return spec


def export_lm_ctranslate2(model_dir: Path, out: Path, quantization: str = "float32") -> Path:
    """`aiayn export ctranslate2` of a DecoderLM: CTranslate2's model.bin, config.json and
    vocabulary.json, the tokenizer and aiayn_export.json."""
    if quantization not in QUANTIZATIONS:
        raise ConfigError(f"--quantization {quantization!r}: choose one of {list(QUANTIZATIONS)}")
    ct2 = import_ctranslate2()
    model, tok, decode = load_lm_source(model_dir, out)
    spec = decoder_lm_spec(model, tok)
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
        architecture=ARCHITECTURE,
    )


# --- running it ---------------------------------------------------------------------------------


class Ct2LM:
    """A CTranslate2 `Generator` with the aiayn model config and vocabulary it was built from."""

    training = False

    def __init__(self, engine: Any, cfg: ModelConfig, vocab: list[str]) -> None:
        self.engine, self.cfg, self.vocab = engine, cfg, vocab
        self.index = {piece: i for i, piece in enumerate(vocab)}
        # aiayn never emits PAD or BOS (aiayn.search.step.forbid); CTranslate2 must not either.
        self.suppress = [[vocab[cfg.pad_id]], [vocab[cfg.bos_id]]]

    def eval(self) -> Ct2LM:
        return self

    def greedy(self, starts: list[list[int]], limit: int) -> list[tuple[list[int], float, bool]]:
        """(tokens, log-probability, ended with EOS) of each start (BOS + prompt ids), with at
        most `limit` new tokens."""
        results = self.engine.generate_batch(
            [[self.vocab[i] for i in ids] for ids in starts],
            max_length=limit,
            sampling_topk=1,
            suppress_sequences=self.suppress,
            end_token=self.vocab[self.cfg.eos_id],
            return_end_token=True,
            include_prompt_in_result=False,
            return_scores=True,
            length_penalty=0.0,  # the scores: raw log-probabilities
        )
        found = []
        for result in results:
            pieces = result.sequences[0]
            eos = bool(pieces) and pieces[-1] == self.vocab[self.cfg.eos_id]
            tokens = [self.index[p] for p in (pieces[:-1] if eos else pieces)]
            found.append((tokens, float(result.scores[0]), eos))
        return found


class Ct2Generator(Generator):
    """aiayn's `Generator` over CTranslate2: greedy only (module docstring), one call per
    output-length limit; `on_token` hears each output whole, at its end."""

    @classmethod
    def load(  # type: ignore[override]  # an export, not a model directory
        cls, opened: ModelDir, cfg: DecodeConfig | None = None, threads: int = 0
    ) -> Ct2Generator:
        ct2 = import_ctranslate2()
        try:
            engine = ct2.Generator(str(opened.path), device="cpu", intra_threads=threads)
        except (RuntimeError, ValueError) as e:
            raise CheckpointError(f"CTranslate2 cannot load {opened.path}: {e}") from None
        tok = opened.tokenizer
        model = Ct2LM(engine, opened.model_cfg, vocabulary(tok, opened.model_cfg))
        return cls(model, tok, cfg)  # type: ignore[arg-type]  # searched by `_search` alone

    def _search(
        self,
        rows: list[list[int]],
        cfg: DecodeConfig,
        row_seeds: list[int],
        on_step: Callable[[StepView], None] | None,
    ) -> list[list[Hypothesis]]:
        """One window, greedily: `Generator`'s windows and prompts, CTranslate2's search."""
        if cfg.sample or cfg.beam_size > 1 or cfg.min_len > 0:
            raise ConfigError(
                "the CTranslate2 language model export searches greedily only (--sample, "
                "--beam and --min-len: generate with the aiayn model directory or an ONNX export)"
            )
        model: Ct2LM = self.model  # type: ignore[assignment]
        W = model.cfg.attn_window
        if W and max(map(len, rows)) > W:  # its prefill attends in chunks of the window
            raise ConfigError(
                f"the CTranslate2 export runs a prompt longer than the model's window "
                f"(attn_window={W} positions, BOS included) in chunks, not aiayn's band: "
                "shorten the prompt, or generate with the aiayn model directory or an ONNX export"
            )
        # One call per prompt length: CTranslate2 runs the prompts of a call into its cache up
        # to the shortest, and feeds the rest in its decoding loop, where they count as output.
        by_length: dict[int, list[int]] = {}
        for j, ids in enumerate(rows):
            by_length.setdefault(len(ids), []).append(j)
        out: list[list[Hypothesis]] = [[] for _ in rows]
        for length, group in sorted(by_length.items()):
            limit = min(cfg.max_len_b, model.cfg.max_len - length)  # asked for, or max_len
            found = model.greedy([rows[j] for j in group], limit)
            for j, (tokens, log_prob, eos) in zip(group, found, strict=True):
                out[j] = [Hypothesis(tokens, log_prob, log_prob, eos)]
        return out
