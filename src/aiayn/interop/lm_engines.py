"""A language model's export at work: `load_generator(dir)` is aiayn's `Generator` over the
export's engine (ONNX Runtime: `aiayn.interop.export_lm`; CTranslate2:
`aiayn.interop.export_lm_ct2`), what `aiayn generate --model EXPORT` runs."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from aiayn.config import DecodeConfig
from aiayn.generate.generator import Generator
from aiayn.interop.export_lm import OnnxGenerator, OnnxLM, check_lm_export
from aiayn.interop.export_lm_ct2 import Ct2Generator
from aiayn.store.directory import ModelDir, open_model_dir


def load_generator(
    directory: str | Path | ModelDir, cfg: DecodeConfig | None = None, threads: int = 0
) -> Generator:
    """The generator of a language model export (`aiayn export onnx|ctranslate2`)."""
    opened = open_model_dir(directory)
    check_lm_export(opened)
    cfg = cfg or opened.decode
    if opened.meta["engine"] == "onnxruntime":
        return OnnxGenerator(OnnxLM(opened.path, opened.model_cfg, threads), opened.tokenizer, cfg)
    return Ct2Generator.load(opened, cfg, threads)


def generate_onnx(
    export_dir: str | Path, prompts: Sequence[str], max_tokens: int, **overrides: Any
) -> list[list[int]]:
    """Greedy (or, with sample=True, seeded sampled) continuations' token ids of `prompts`."""
    gen = load_generator(export_dir)
    cfg = gen.settings(max_tokens, **({"sample": False} | overrides))
    return [g[0].tokens for g in gen.generate_all(prompts, cfg)]
