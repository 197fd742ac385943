"""What every search does at every step, one owner each: the narrow model interface it runs
over (`Decodable`), encoding a batch in parts, inference mode, per-sentence output limits,
stopping from outside (`stop_when`) and the tokens it never emits (`forbid`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from contextvars import ContextVar
from typing import Protocol

import torch
from torch import Tensor

from aiayn.config import DecodeConfig, ModelConfig
from aiayn.errors import AiaynError
from aiayn.nn.kv_cache import KVCache, Memory
from aiayn.search.limits import max_output_lengths, output_cap
from aiayn.search.slots import join_memories


class Decodable(Protocol):
    """The narrow interface search code uses (a `Transformer`, or a scripted fake in tests)."""

    cfg: ModelConfig  # max_len bounds the output; pad_id, bos_id, eos_id are the special ids

    def encode(self, src_BS: Tensor) -> Memory: ...

    def init_cache(self, memory: Memory, capacity: int) -> KVCache: ...

    def decode_step(
        self, tokens_BT: Tensor, memory: Memory, cache: KVCache
    ) -> tuple[Tensor, KVCache]:
        """Reads `memory.keep_BS` only: the cross K/V of `memory.out_BSD` are in `cache`
        (searches pass `Memory.mask_only()`)."""
        ...


@contextlib.contextmanager
def inference(model: object) -> Iterator[None]:
    """Eval mode (no dropout) and no autograd for the duration; restores training mode."""
    was_training = bool(getattr(model, "training", False))
    if was_training:
        model.eval()  # type: ignore[attr-defined]
    try:
        with torch.inference_mode():
            yield
    finally:
        if was_training:
            model.train()  # type: ignore[attr-defined]


def encode_parts(model: Decodable, parts: Sequence[Tensor]) -> Memory:
    """The memory of the rows of `parts` (right-padded ids) in their order, each part encoded
    as a batch of its own: parts of similar lengths (`text.batches.padding_parts`) spare the
    encoder the padding one batch of them all would carry."""
    first, *rest = [model.encode(src_BS) for src_BS in parts]
    return join_memories(first, *rest) if rest else first


def output_limits(model: Decodable, memory: Memory, cfg: DecodeConfig) -> Tensor:
    src_len_B, cap = memory.keep_BS.sum(1), output_cap(cfg, model.cfg.max_len)
    limit_B = max_output_lengths(src_len_B, cfg.max_len_a, cfg.max_len_b, cap)
    room = getattr(model, "output_room", None)  # a decoder-only model's prompt takes positions
    return limit_B if room is None else torch.minimum(limit_B, room(memory).clamp(min=1))


def first_tokens(model: Decodable, memory: Memory) -> Tensor:
    """(B, 1): what each row's first step feeds: BOS, or (a decoder-only model, whose "source"
    is its prompt) the prompt's last token (`DecoderLM.first_tokens`)."""
    own = getattr(model, "first_tokens", None)
    if own is not None:
        return own(memory)  # type: ignore[no-any-return]
    keep_BS = memory.keep_BS
    return torch.full((keep_BS.size(0), 1), model.cfg.bos_id, device=keep_BS.device)


class SearchStoppedError(AiaynError):
    """A search's `stop_when` condition became true: its results are abandoned."""


_STOP: ContextVar[Callable[[], bool] | None] = ContextVar("aiayn_stop", default=None)


@contextlib.contextmanager
def stop_when(condition: Callable[[], bool]) -> Iterator[None]:
    """Every search in the block asks `condition()` once per step and stops when it is true."""
    token = _STOP.set(condition)
    try:
        yield
    finally:
        _STOP.reset(token)


def check_stop(t: int) -> None:
    condition = _STOP.get()
    if condition is not None and condition():
        raise SearchStoppedError(f"search stopped at step {t}")


def forbid(scores_RV: Tensor, model_cfg: ModelConfig, no_eos: bool | Tensor) -> None:
    """Never emit PAD or BOS; no EOS before the minimum length (`no_eos`: for every row, or
    per row). In place, after normalising."""
    for never in {model_cfg.pad_id, model_cfg.bos_id} - {model_cfg.eos_id}:  # GPT-2: one id
        scores_RV[:, never] = float("-inf")
    if isinstance(no_eos, Tensor):  # masked_fill: a boolean index would wait for the GPU
        scores_RV[:, model_cfg.eos_id].masked_fill_(no_eos, float("-inf"))
    elif no_eos:
        scores_RV[:, model_cfg.eos_id] = float("-inf")
