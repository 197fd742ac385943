"""aiayn: the Transformer of "Attention Is All You Need", readable, tested and fast.

`import aiayn` loads the configuration and the errors only; every other name (the network of
aiayn.nn, search, storage, translation, training, the glass box) is imported on first use
(PEP 562), so `from aiayn import Transformer` works while `aiayn --help` and `aiayn data check`
never import torch (~1.6 s of a 2 s `aiayn --help`).
"""

import importlib
from typing import TYPE_CHECKING, Any

from aiayn.config import Config, DecodeConfig, ModelConfig, TrainConfig
from aiayn.config_files import load_config
from aiayn.errors import AiaynError, CheckpointError, ConfigError, DataError

if TYPE_CHECKING:  # what the lazy names below are, for type checkers and editors
    from aiayn.classify.classifier import Classifier
    from aiayn.cli.quickstart import quickstart_config
    from aiayn.generate.generator import Generator
    from aiayn.generate.scoring import score_text
    from aiayn.glassbox import seed_example
    from aiayn.glassbox.distribution import distribution_lines, next_token_distribution
    from aiayn.glassbox.explain import explain, source_ids, trace_beam
    from aiayn.glassbox.explain_lm import explain_lm, lm_attention
    from aiayn.glassbox.explanation import Explanation
    from aiayn.glassbox.notebook import (
        AttentionView,
        BeamView,
        ForwardPassView,
        MatrixView,
        SeedExampleView,
    )
    from aiayn.glassbox.seed_example import seed_example_json
    from aiayn.nn.attention import (
        MultiHeadAttention,
        attention,
        self_attention_unparameterised,
    )
    from aiayn.nn.embeddings import sinusoidal_positions
    from aiayn.nn.model import AttentionMaps, KVCache, Memory, Transformer
    from aiayn.nn.tracing import Trace, tracing
    from aiayn.nn.variants import DecoderLM, EncoderClassifier, EncoderMLM
    from aiayn.search.decode import beam_search, greedy_search, sample_search, search
    from aiayn.search.hypothesis import Hypothesis
    from aiayn.store.directory import ModelDir
    from aiayn.store.model_dir import load_model_dir, save_model_dir
    from aiayn.text.synthetic import write_corpus
    from aiayn.text.text_check import check_text_corpus
    from aiayn.text.tokenizer import Tokenizer
    from aiayn.training.curves import plot_training_log, read_metrics
    from aiayn.training.loop import train
    from aiayn.translate.translator import Translator

__version__ = "0.1.0"

# name -> the module that defines it (PEP 562: loaded when first asked for)
_LAZY = {
    "MultiHeadAttention": "aiayn.nn.attention",
    "attention": "aiayn.nn.attention",
    "self_attention_unparameterised": "aiayn.nn.attention",
    "AttentionMaps": "aiayn.nn.model",
    "KVCache": "aiayn.nn.model",
    "Memory": "aiayn.nn.model",
    "Transformer": "aiayn.nn.model",
    "sinusoidal_positions": "aiayn.nn.embeddings",
    "Trace": "aiayn.nn.tracing",
    "tracing": "aiayn.nn.tracing",
    "DecoderLM": "aiayn.nn.variants",
    "EncoderClassifier": "aiayn.nn.variants",
    "EncoderMLM": "aiayn.nn.variants",
    # a classifier (docs/classify.md)
    "Classifier": "aiayn.classify.classifier",
    "Tokenizer": "aiayn.text.tokenizer",
    "write_corpus": "aiayn.text.synthetic",
    "Hypothesis": "aiayn.search.hypothesis",
    "search": "aiayn.search.decode",
    "greedy_search": "aiayn.search.decode",
    "beam_search": "aiayn.search.decode",
    "sample_search": "aiayn.search.decode",
    "ModelDir": "aiayn.store.directory",
    "load_model_dir": "aiayn.store.model_dir",
    "save_model_dir": "aiayn.store.model_dir",
    "Translator": "aiayn.translate.translator",
    "train": "aiayn.training.loop",
    "quickstart_config": "aiayn.cli.quickstart",
    "explain": "aiayn.glassbox.explain",
    "trace_beam": "aiayn.glassbox.explain",
    "source_ids": "aiayn.glassbox.explain",
    "Explanation": "aiayn.glassbox.explanation",
    # a language model (docs/lm.md): generate, score, look inside, check its text
    "Generator": "aiayn.generate.generator",
    "score_text": "aiayn.generate.scoring",
    "explain_lm": "aiayn.glassbox.explain_lm",
    "lm_attention": "aiayn.glassbox.explain_lm",
    "next_token_distribution": "aiayn.glassbox.distribution",
    "distribution_lines": "aiayn.glassbox.distribution",
    "check_text_corpus": "aiayn.text.text_check",
    "read_metrics": "aiayn.training.curves",
    "plot_training_log": "aiayn.training.curves",
    # the notebooks' views (aiayn.glassbox.notebook) and the tutorials' worked example
    "MatrixView": "aiayn.glassbox.notebook",
    "AttentionView": "aiayn.glassbox.notebook",
    "ForwardPassView": "aiayn.glassbox.notebook",
    "BeamView": "aiayn.glassbox.notebook",
    "SeedExampleView": "aiayn.glassbox.notebook",
    "seed_example_json": "aiayn.glassbox.seed_example",
}
# name -> a module itself: `from aiayn import seed_example` (the tutorials' matrices, E, WQ, ...)
_LAZY_MODULES = {"seed_example": "aiayn.glassbox.seed_example"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    if name in _LAZY_MODULES:
        return importlib.import_module(_LAZY_MODULES[name])
    raise AttributeError(f"module 'aiayn' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *_LAZY, *_LAZY_MODULES])


# every name, eager or lazy (`from aiayn import Transformer` loads aiayn.nn on first use);
# a literal list, so that linters and type checkers read it
__all__ = [
    "AiaynError",
    "AttentionMaps",
    "AttentionView",
    "BeamView",
    "CheckpointError",
    "Classifier",
    "Config",
    "ConfigError",
    "DataError",
    "DecodeConfig",
    "DecoderLM",
    "EncoderClassifier",
    "EncoderMLM",
    "Explanation",
    "ForwardPassView",
    "Generator",
    "Hypothesis",
    "KVCache",
    "MatrixView",
    "Memory",
    "ModelConfig",
    "ModelDir",
    "MultiHeadAttention",
    "SeedExampleView",
    "Tokenizer",
    "Trace",
    "TrainConfig",
    "Transformer",
    "Translator",
    "attention",
    "beam_search",
    "check_text_corpus",
    "distribution_lines",
    "explain",
    "explain_lm",
    "greedy_search",
    "lm_attention",
    "load_config",
    "load_model_dir",
    "next_token_distribution",
    "plot_training_log",
    "quickstart_config",
    "read_metrics",
    "sample_search",
    "save_model_dir",
    "score_text",
    "search",
    "seed_example",
    "seed_example_json",
    "self_attention_unparameterised",
    "sinusoidal_positions",
    "source_ids",
    "trace_beam",
    "tracing",
    "train",
    "write_corpus",
]
