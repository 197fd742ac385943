"""A run's recipe and its memory, checked before anything is written (`aiayn train` says
what cannot work in one line, not as a traceback an hour in):

    (the recipe's values: aiayn.config.check_recipe)
    check_model_fits  the parameters alone (weights, gradients, Adam's moments) vs the device
    check_batch_fits  the largest batch of the plan (its logits, its FFN inputs) on top
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from aiayn.config import ModelConfig, TrainConfig
from aiayn.errors import ConfigError
from aiayn.nn.model import Transformer, count_parameters
from aiayn.runtime.device import Precision, require_memory
from aiayn.store.model_dir import check_position_table
from aiayn.text.batches import Example, batch_plan

# What training holds per parameter at the least: fp32 weights, gradients and Adam's two
# moments (activations come on top). A model past the device's memory by this count alone
# cannot train: say so before anything is written (it was torch's allocation traceback).
TRAIN_BYTES_PER_PARAM = 16


def check_model_fits(
    model_cfg: ModelConfig,
    device: torch.device,
    copies: int = 1,
    build: Callable[[ModelConfig], nn.Module] = Transformer,
) -> None:
    """Refuse a model whose parameters alone, `copies` times (CPU ranks share the machine's
    memory), need more than `device` has; sized on the meta device, so nothing is allocated.
    `build`: the model trained (the encoder-decoder bounds the encoder-only models)."""
    check_position_table(model_cfg, ConfigError)
    with torch.device("meta"):
        n = count_parameters(build(model_cfg))
    per = f" x {copies} processes" if copies > 1 else ""
    require_memory(
        n * TRAIN_BYTES_PER_PARAM * copies,
        device,
        lambda need, have: (
            f"the model has {n:,} parameters: training holds at least {TRAIN_BYTES_PER_PARAM} "
            f"bytes each{per} (weights, gradients, Adam's moments), {need:,.1f} GiB, and "
            f"{device.type} has {have:,.1f} GiB; choose a smaller model "
            "(model.d_model, d_ff, n_layers) or train.vocab_size"
        ),
        ConfigError,
    )


def check_batch_fits(
    model_cfg: ModelConfig,
    train: list[Example],
    tc: TrainConfig,
    precision: Precision,
    copies: int = 1,
) -> None:
    """Refuse a `train.max_tokens` whose largest batch cannot fit. A lower bound of a step's
    memory, each part certainly held at once: the parameters' TRAIN_BYTES_PER_PARAM; the
    logits (target positions x vocabulary) and their gradient; and every FFN's two inputs
    (d_model and d_ff a position), which its backward keeps, in each layer of both stacks.
    `max_tokens = 10^7` on a 24 GiB machine was an allocation failure, or the kernel's OOM
    killer, after the tokenizer and the data were ready."""
    plan = batch_plan(train, tc.max_tokens, seed=tc.seed)
    if not plan:
        return
    itemsize = 2 if precision.dtype == "bf16" else 4

    def held(batch: list[int]) -> tuple[int, int, int]:  # (bytes, logits' bytes, target positions)
        tgt = len(batch) * max(train[i].tgt_positions for i in batch)
        src = len(batch) * max(len(train[i].src) for i in batch)
        logits = tgt * model_cfg.vocab_size * itemsize * 2  # the logits and their gradient
        ffn = model_cfg.n_layers * (src + tgt) * (model_cfg.d_model + model_cfg.d_ff) * itemsize
        return logits + ffn, logits, tgt

    step, logits, tgt = max(held(b) for b in plan)
    with torch.device("meta"):
        params = count_parameters(Transformer(model_cfg))
    require_memory(
        (step + params * TRAIN_BYTES_PER_PARAM) * copies,
        precision.device,
        lambda need, have: (
            f"train.max_tokens={tc.max_tokens:,} makes batches of up to {tgt:,} target "
            f"positions: their logits over {model_cfg.vocab_size:,} pieces and the gradient "
            f"hold {logits / 2**30:,.1f} GiB ({precision.dtype}), and a step at least "
            f"{need:,.1f} GiB, more than the {have:,.1f} GiB "
            f"{precision.device.type} has; lower train.max_tokens (and raise "
            "train.accum_steps to keep the update's size)"
        ),
        ConfigError,
    )
