"""aiayn: the Transformer of "Attention Is All You Need", readable, tested and fast.

`import aiayn` loads the configuration and the network (aiayn.nn); the names of the later
stages (search, storage, translation, training, the glass box) are imported on first use, so
`from aiayn import Translator` works without making every `import aiayn` pay for them.
"""

import importlib
from typing import Any

from aiayn.config import Config, DecodeConfig, ModelConfig, TrainConfig, load_config
from aiayn.errors import AiaynError, CheckpointError, ConfigError, DataError
from aiayn.nn.attention import MultiHeadAttention, attention, self_attention_unparameterised
from aiayn.nn.model import AttentionMaps, KVCache, Memory, Transformer, sinusoidal_positions
from aiayn.nn.tracing import Trace, tracing
from aiayn.nn.variants import DecoderLM, EncoderClassifier

__version__ = "0.1.0"

# name -> the module that defines it (PEP 562: loaded when first asked for)
_LAZY = {
    "Tokenizer": "aiayn.text.tokenizer",
    "Hypothesis": "aiayn.search.settings",
    "search": "aiayn.search.decode",
    "greedy_search": "aiayn.search.decode",
    "beam_search": "aiayn.search.decode",
    "sample_search": "aiayn.search.decode",
    "load_model_dir": "aiayn.store.model_dir",
    "save_model_dir": "aiayn.store.model_dir",
    "Translator": "aiayn.translate.translator",
    "train": "aiayn.training.train",
    "explain": "aiayn.glassbox.explain",
    "trace_beam": "aiayn.glassbox.explain",
    "Explanation": "aiayn.glassbox.explanation",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'aiayn' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *_LAZY])


__all__ = [
    "AiaynError",
    "AttentionMaps",
    "CheckpointError",
    "Config",
    "ConfigError",
    "DataError",
    "DecodeConfig",
    "DecoderLM",
    "EncoderClassifier",
    "KVCache",
    "Memory",
    "ModelConfig",
    "MultiHeadAttention",
    "Trace",
    "TrainConfig",
    "Transformer",
    "attention",
    "load_config",
    "self_attention_unparameterised",
    "sinusoidal_positions",
    "tracing",
]
__all__ += sorted(_LAZY)  # importable as `from aiayn import Translator`, loaded on first use
