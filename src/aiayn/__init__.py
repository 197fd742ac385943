"""aiayn: the Transformer of "Attention Is All You Need", readable, tested and fast."""

from aiayn.config import Config, DecodeConfig, ModelConfig, TrainConfig, load_config
from aiayn.errors import AiaynError, CheckpointError, ConfigError, DataError
from aiayn.nn.attention import (
    MultiHeadAttention,
    attention,
    self_attention_unparameterised,
)
from aiayn.nn.model import AttentionMaps, KVCache, Memory, Transformer, sinusoidal_positions
from aiayn.nn.tracing import Trace, tracing
from aiayn.nn.variants import DecoderLM, EncoderClassifier

__version__ = "0.1.0"

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
