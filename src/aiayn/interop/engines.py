"""Translators over exported models: CTranslate2 and ONNX Runtime behind `Translator`'s methods.

`aiayn translate --model OUT` and `aiayn evaluate --model OUT` on a directory written by
`aiayn export` (it holds `aiayn_export.json`) get one of these instead of a `Translator`: the
same line-in/line-out contract (empty lines stay empty, one result per line, input order), the
same `translate`, `translate_hyps` and `translate_stream`, the same search settings.

- `OnnxTranslator` is a `Translator` whose model is `OnnxModel`: search/decode.py's own searches
  (greedy, beam, sampling) run over the ONNX Runtime sessions.
- `Ct2Translator` hands each group of lines to CTranslate2's C++ search. Its beam search is
  aiayn's (2N candidates per step, an EOS among the N best ends a hypothesis, a sentence is
  done when N have ended or at its length limit), but its length penalty is score / |Y|^alpha
  only (aiayn's "power"), not GNMT's ((5 + |Y|) / 6)^alpha, aiayn's default. So CTranslate2
  searches with a negligible exponent (`NO_LENGTH_PENALTY`, which leaves scores as they are
  but, unlike exactly 0, does not turn on its stop-when-the-best-beam-ends shortcut), returns
  all N finished hypotheses with their log-probabilities, and they are ranked here with
  aiayn's `length_penalty`, either form. Per-sentence
  length limits (a * source length + b) are honoured by searching each limit's lines together.
  Sampling is refused (CTranslate2 cannot reproduce aiayn's per-line streams); n-best lists can
  differ below the best line (docs/export.md, "What parity means").

Both subclasses are built by `Translator.__init__` (an engine is no torch module: it runs on
the CPU in fp32 as far as `Translator` is concerned) and replace only what differs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from aiayn.config import DecodeConfig, ModelConfig
from aiayn.errors import CheckpointError, ConfigError
from aiayn.interop.export_ct2 import import_ctranslate2, vocabulary
from aiayn.interop.export_onnx import OnnxModel
from aiayn.search.hypothesis import Hypothesis, length_penalty
from aiayn.search.limits import max_output_lengths, output_cap
from aiayn.store.directory import ModelDir, open_model_dir
from aiayn.store.model_dir import EXPORT_FILE
from aiayn.text.tokenizer import Tokenizer
from aiayn.translate.translator import Translator

# CTranslate2 divides a finished hypothesis's log-probability by |Y| ** length_penalty; at
# exactly 0 its beam search also stops when the best beam ends. 1e-30 keeps |Y| ** x == 1.0f
# for any length, so scores stay raw log-probabilities, without that shortcut.
NO_LENGTH_PENALTY = 1e-30


class OnnxTranslator(Translator):
    """`Translator` over ONNX Runtime: aiayn.search's searches drive an `OnnxModel` (CPU, fp32)."""

    model: OnnxModel  # type: ignore[assignment]  # the Decodable interface, not a Transformer

    def __init__(self, model: OnnxModel, tokenizer: Tokenizer, cfg: DecodeConfig) -> None:
        super().__init__(model, tokenizer, cfg)  # type: ignore[arg-type]  # a Decodable


class Ct2Model:
    """A CTranslate2 `Translator` with the aiayn model config and vocabulary it was built from."""

    def __init__(self, engine: Any, cfg: ModelConfig, vocab: list[str]) -> None:
        self.engine = engine
        self.cfg = cfg
        self.vocab = vocab
        self.index = {piece: i for i, piece in enumerate(vocab)}
        self.eos = vocab[cfg.eos_id]
        # aiayn never emits PAD or BOS (aiayn.search.step.forbid); CTranslate2 must not either.
        self.suppress = [[vocab[cfg.pad_id]], [vocab[cfg.bos_id]]]

    def search(
        self, sources: list[list[int]], cfg: DecodeConfig, limit: int, batch_tokens: int
    ) -> list[list[Hypothesis]]:
        """The `cfg.nbest` best hypotheses of each source (ids ending in EOS), each with at
        most `limit` output tokens, ranked by aiayn's length-penalised score."""
        beam = cfg.beam_size
        results = self.engine.translate_batch(
            [[self.vocab[i] for i in ids] for ids in sources],
            beam_size=beam,
            num_hypotheses=beam,  # every finished hypothesis: they are ranked below
            length_penalty=NO_LENGTH_PENALTY if beam > 1 else 0.0,
            max_decoding_length=limit,
            min_decoding_length=min(cfg.min_len, limit),
            max_input_length=0,  # sources are already cut to the positional table (_fit)
            suppress_sequences=self.suppress,
            return_scores=True,
            return_end_token=True,
            max_batch_size=batch_tokens,
            batch_type="tokens",
        )
        found = []
        for result in results:
            pairs = zip(result.hypotheses, result.scores, strict=True)
            hyps = [self._hypothesis(pieces, log_prob, cfg) for pieces, log_prob in pairs]
            found.append(sorted(hyps, key=lambda h: -h.score)[: cfg.nbest])
        return found

    def _hypothesis(self, pieces: list[str], log_prob: float, cfg: DecodeConfig) -> Hypothesis:
        eos = bool(pieces) and pieces[-1] == self.eos
        tokens = [self.index[p] for p in (pieces[:-1] if eos else pieces)]
        lp = length_penalty(len(tokens) + eos, cfg.alpha, cfg.length_penalty)
        return Hypothesis(tokens, log_prob, log_prob / lp, eos)


class Ct2Translator(Translator):
    """`Translator`'s methods over a CTranslate2 model (module docstring)."""

    model: Ct2Model  # type: ignore[assignment]  # the engine with its config, not a Transformer

    def __init__(self, model: Ct2Model, tokenizer: Tokenizer, cfg: DecodeConfig) -> None:
        super().__init__(model, tokenizer, cfg)  # type: ignore[arg-type]  # the engine

    def _search(
        self, ids: list[list[int]], line_nos: list[int], cfg: DecodeConfig, batch_tokens: int
    ) -> list[list[Hypothesis]]:
        """CTranslate2's search, one call per output-length limit (its limit is per call)."""
        check_ct2_settings(cfg)
        lengths = torch.tensor([len(x) for x in ids], dtype=torch.long)
        cap = output_cap(cfg, self.model.cfg.max_len)
        limits = max_output_lengths(lengths, cfg.max_len_a, cfg.max_len_b, cap)
        by_limit: dict[int, list[int]] = {}
        for j, limit in enumerate(limits.tolist()):
            by_limit.setdefault(limit, []).append(j)
        found: list[list[Hypothesis]] = [[] for _ in ids]
        for limit, group in sorted(by_limit.items()):
            hyps = self.model.search([ids[j] for j in group], cfg, limit, batch_tokens)
            for j, h in zip(group, hyps, strict=True):
                found[j] = h
        return found


def check_ct2_settings(cfg: DecodeConfig) -> None:
    if cfg.sample:
        raise ConfigError(
            "--sample: CTranslate2 cannot reproduce aiayn's per-line sample streams; sample "
            "with the aiayn model directory or an ONNX export"
        )


# --- loading ------------------------------------------------------------------------------------


def _ct2_device(device: str) -> tuple[str, int]:
    kind, _, index = device.strip().lower().partition(":")
    if kind not in ("auto", "cpu", "cuda") or (index and not index.isdigit()):
        raise ConfigError(
            f"--device {device!r}: the CTranslate2 engine runs on auto, cpu, cuda[:N]"
        )
    return kind, int(index or 0)


def load_translator(
    directory: str | Path | ModelDir,
    cfg: DecodeConfig | None = None,
    *,
    device: str = "auto",
    dtype: str = "auto",
    threads: int = 0,
) -> Translator:
    """The translator of an exported directory: `Ct2Translator` or `OnnxTranslator`.

    `threads` is the engine's intra-op thread count (0 = its default). For CTranslate2,
    `dtype` auto keeps the exported weights' type (e.g. int8), fp32 / bf16 compute in that type.
    """
    opened = open_model_dir(directory)
    if not opened.is_export:
        raise CheckpointError(f"{opened.path} is not an exported model (no {EXPORT_FILE})")
    if opened.architecture == "DecoderLM":
        raise ConfigError(
            f"{opened.path} holds a language model (DecoderLM): aiayn generate runs it"
        )
    directory, meta, model_cfg = opened.path, opened.meta, opened.model_cfg
    cfg, tok = cfg or opened.decode, opened.tokenizer
    if meta["engine"] == "onnxruntime":
        if device.strip().lower() not in ("auto", "cpu") or dtype not in ("auto", "fp32"):
            raise ConfigError("the ONNX engine runs in fp32 on the CPU: drop --device/--dtype")
        return OnnxTranslator(OnnxModel(directory, model_cfg, threads), tok, cfg)
    check_ct2_settings(cfg)
    ct2 = import_ctranslate2()
    kind, index = _ct2_device(device)
    compute = {"auto": "default", "fp32": "float32", "bf16": "bfloat16"}[dtype]
    try:
        engine = ct2.Translator(
            str(directory),
            device=kind,
            device_index=index,
            compute_type=compute,
            inter_threads=1,
            intra_threads=threads,
        )
    except (RuntimeError, ValueError) as e:
        raise CheckpointError(f"CTranslate2 cannot load {directory}: {e}") from None
    return Ct2Translator(Ct2Model(engine, model_cfg, vocabulary(tok, model_cfg)), tok, cfg)
