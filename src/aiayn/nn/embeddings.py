"""Embeddings and positional encoding (§3.4, §3.5): what the stacks of Figure 1 read.

Dimension key (shape suffixes on tensor names):
    B batch   T sequence length   D d_model   P positions   I d_model / 2 (sin/cos pairs)
"""

from __future__ import annotations

import math
from typing import Literal

import torch
from torch import Tensor, nn

from aiayn.config import ModelConfig
from aiayn.nn.norms import make_norm
from aiayn.nn.tracing import is_tracing, tap

# Bytes per entry of a sinusoidal table while it is computed: float64 for the table, its angles
# (half as many), their sines and cosines, then the fp32 table kept.
TABLE_BYTES_PER_ENTRY = 24


def position_table_bytes(cfg: ModelConfig) -> int:
    """Memory that computing the sinusoidal table takes (0 for learned positions: parameters).
    No weight's shape bounds it, so whoever builds a model from an untrusted config checks it
    first (`aiayn.store.model_dir.check_position_table`)."""
    if cfg.positional != "sinusoidal":
        return 0
    return cfg.max_len * cfg.d_model * TABLE_BYTES_PER_ENTRY


def sinusoidal_positions(
    n_positions: int, d_model: int, layout: Literal["interleaved", "halves"] = "interleaved"
) -> Tensor:
    """PE(pos, 2i) = sin(pos / 10000^(2i/d)), PE(pos, 2i+1) = cos(pos / 10000^(2i/d)) (§3.5).

    Both dimensions of a sin/cos pair share one frequency (the seeds give the cos dimension
    the next pair's frequency; see docs/worked_example.md §2). Computed in float64, returned fp32.
    `layout="halves"` puts the d/2 sines first and their cosines after them (Marian's table).
    """
    if d_model % 2:
        raise ValueError(f"sinusoidal positions need an even d_model, got {d_model}")
    pos_P1 = torch.arange(n_positions, dtype=torch.float64)[:, None]
    two_i = torch.arange(0, d_model, 2, dtype=torch.float64)  # 2i for each pair
    angle_PI = pos_P1 / torch.pow(10000.0, two_i / d_model)
    if layout == "halves":
        return torch.cat([torch.sin(angle_PI), torch.cos(angle_PI)], dim=1).float()
    pe_PD = torch.empty(n_positions, d_model, dtype=torch.float64)
    pe_PD[:, 0::2] = torch.sin(angle_PI)
    pe_PD[:, 1::2] = torch.cos(angle_PI)
    return pe_PD.float()


class Embeddings(nn.Module):
    """Token embedding x sqrt(d_model) + positional encoding, then dropout (§3.4, §3.5, §5.4).

    `cfg.scale_embeddings=False` adds the token embeddings unscaled (GPT-2, BERT). Positions
    that act inside attention ("rope", "alibi") or none at all add nothing here."""

    def __init__(self, cfg: ModelConfig, tokens: nn.Embedding) -> None:
        super().__init__()
        self.tokens = tokens  # may be shared with the other side and the output layer
        self.scale = math.sqrt(cfg.d_model) if cfg.scale_embeddings else 1.0
        self.max_len = cfg.max_len
        self.learned: nn.Embedding | None = None
        self.adds_positions = cfg.positional in ("sinusoidal", "learned")
        if cfg.positional == "learned":
            self.learned = nn.Embedding(cfg.max_len, cfg.d_model)
        elif cfg.positional == "sinusoidal":  # a buffer, not a parameter: rebuilt, never saved
            table = sinusoidal_positions(cfg.max_len, cfg.d_model, cfg.positional_layout)
            self.register_buffer("pe", table, False)
        self.pe: Tensor
        # BERT normalises the sum before the first layer (cfg.embed_norm); the paper does not
        self.norm = make_norm(cfg) if cfg.embed_norm else None
        self.dropout = nn.Dropout(cfg.dropout)
        self.trace_name = "embed"

    def positions(self, start: int, length: int) -> Tensor:
        if start + length > self.max_len:
            raise ValueError(
                f"sequence of {start + length} positions is longer than max_len={self.max_len}"
            )
        if self.learned is not None:
            return self.learned.weight[start : start + length]
        return self.pe[start : start + length]

    def at(self, pos_BT: Tensor, most: int | None = None) -> Tensor:
        """The encodings of a position per row (rows that joined a running search late).
        `most`: a bound on the positions known on the host; below max_len it spares reading
        them (on a GPU, a wait for the device at every step)."""
        if (most is None or most >= self.max_len) and int(pos_BT.max()) >= self.max_len:
            n = int(pos_BT.max()) + 1
            raise ValueError(f"sequence of {n} positions is longer than max_len={self.max_len}")
        table = self.learned.weight if self.learned is not None else self.pe
        return table[pos_BT.clamp(min=0)]  # < 0: left padding, which no position sees

    def forward(self, ids_BT: Tensor, start: int | Tensor = 0, most: int | None = None) -> Tensor:
        """`start`: the first position, for every row (an int) or per row (a (B,) tensor, whose
        values are at most `most`, if given)."""
        tok_BTD = self.tokens(ids_BT)
        if self.scale != 1.0:  # x 1.0 would cost a copy of the (B, T, D) embeddings
            tok_BTD = tok_BTD * self.scale
        T = ids_BT.size(1)
        if not self.adds_positions:  # positions act in attention; the bound still holds
            if not isinstance(start, Tensor) and start + T > self.max_len:
                self.positions(start, T)  # raises
            sum_BTD = tok_BTD
            tap(f"{self.trace_name}.tokens", tok_BTD)
        else:
            if isinstance(start, Tensor):
                last = None if most is None else most + T - 1
                pos_TD = self.at(start[:, None] + torch.arange(T, device=start.device), last)
            else:
                pos_TD = self.positions(start, T)
            sum_BTD = tok_BTD + pos_TD
            if is_tracing():
                tap(f"{self.trace_name}.tokens", tok_BTD)
                tap(f"{self.trace_name}.positions", pos_TD)
                tap(f"{self.trace_name}.sum", sum_BTD)
        if self.norm is not None:
            sum_BTD = self.norm(sum_BTD)
            tap(f"{self.trace_name}.norm", sum_BTD)
        # In eval mode the identity, without the module call (as the layers' `_dropout`).
        return self.dropout(sum_BTD) if self.dropout.training else sum_BTD
