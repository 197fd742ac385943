"""Encoder-only and decoder-only models from the Transformer's own blocks (the
tutorials' conclusion), and the registry of architectures a model directory may hold.

    EncoderClassifier   aiayn.nn.encoder_only: the encoder stack, pooled, a linear classifier
    EncoderMLM          aiayn.nn.encoder_only: the encoder pre-trained on masked tokens
    DecoderLM           the encoder block run causally (a GPT block), tied output layer
    MODEL_CLASSES       config.json's "architecture" -> class (aiayn.store.model_dir builds from it)
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from aiayn.config import ModelConfig
from aiayn.nn.embeddings import Embeddings
from aiayn.nn.encoder_only import EncoderClassifier, EncoderMLM
from aiayn.nn.kv_cache import KVCache, Memory, self_capacity
from aiayn.nn.model import Encoder, Transformer, _ModelBase
from aiayn.nn.tracing import tap
from aiayn.runtime.kernels import Linear


class DecoderLM(_ModelBase):
    """Decoder-only causal language model (GPT-style, for free generation): the encoder block
    with a causal mask (no cross-attention, since there is no source), tied output layer."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        tokens = nn.Embedding(cfg.vocab_size, cfg.d_model, padding_idx=cfg.pad_id)
        self.embed = Embeddings(cfg, tokens)
        self.decoder = Encoder(cfg)  # EncoderLayer + causal=True is exactly a GPT block
        self.generator = Linear(cfg.d_model, cfg.vocab_size, bias=cfg.logits_bias)
        self._init_weights()
        if cfg.tie_output:
            self.generator.weight = tokens.weight
        self._name_for_trace()

    def forward(self, ids_BT: Tensor) -> Tensor:
        """Next-token logits (B, T, V) at every position; position t sees tokens 0..t only."""
        self.check_ids(ids_BT, "input")
        logits_BTV = self.generator(self.decoder(self.embed(ids_BT), None, causal=True))
        tap("generator.logits", logits_BTV)
        return logits_BTV

    # --- the search's interface (aiayn.search.step.Decodable): a decoder with no memory ------
    # The "source" of a search is the prompt: right-padded rows of BOS + prompt ids. `encode`
    # only left-aligns them (every prompt ends at one column, so all rows take their next
    # token at the same step); `init_cache` runs all but each prompt's last token through the
    # stack into the KV cache (the prefill); the search's first step feeds that last token
    # (`first_tokens`) and takes the logits after it.

    def encode(self, prompt_BS: Tensor) -> Memory:
        self.check_ids(prompt_BS, "prompt")
        # A row's length: up to its last non-PAD token, and at least its first (BOS): where
        # PAD is BOS too (GPT-2's one <|endoftext|>), a token equal to PAD is not padding.
        S = prompt_BS.size(1)
        cols_S = torch.arange(1, S + 1, device=prompt_BS.device)
        n_B = ((prompt_BS != self.cfg.pad_id) * cols_S).amax(1).clamp(min=1)
        keep_BS = cols_S[None, :] <= n_B[:, None]
        # Row b's tokens move to columns S - n_b .. S - 1 (left padding).
        shift_BS = (torch.arange(S, device=prompt_BS.device) - (S - n_B)[:, None]) % S
        ids_BS = prompt_BS.gather(1, shift_BS)
        no_out_BS0 = keep_BS.new_zeros(*keep_BS.shape, 0, dtype=torch.float)  # nothing to attend
        return PromptMemory(no_out_BS0, keep_BS, ids_BS, S - n_B)

    def first_tokens(self, memory: Memory) -> Tensor:
        """(B, 1): what each row's first search step feeds, its prompt's last token."""
        assert isinstance(memory, PromptMemory)
        return memory.ids_BS[:, -1:]

    def output_room(self, memory: Memory) -> Tensor:
        """(B,): output tokens each row can take before its positions run out (max_len)."""
        return self.cfg.max_len - memory.keep_BS.sum(1)

    def init_cache(self, memory: Memory, capacity: int) -> KVCache:
        """A cache of the prompt's K/V (all but its last token) with room for `capacity` more."""
        assert isinstance(memory, PromptMemory)
        ids_BS, start_B = memory.ids_BS, memory.start_B
        B, S = ids_BS.shape
        J, K = self.cfg.n_kv_heads, self.cfg.d_k
        slots, window = self_capacity(self.cfg.attn_window, S - 1 + capacity, self.cfg.max_len)
        like = self.generator.weight
        shape = (B, J, slots, K)
        dtype = torch.get_autocast_dtype(like.device.type) if torch.is_autocast_enabled() else None
        k = [like.new_empty(shape, dtype=dtype) for _ in self.decoder.layers]
        v = [like.new_empty(shape, dtype=dtype) for _ in self.decoder.layers]
        # Rows that all start at column 0 need no mask of the columns they see.
        cache = KVCache(
            k, v, [], [], 0, start_B=start_B if bool(start_B.any()) else None, window=window
        )
        if S > 1:
            prefix_BT = ids_BS[:, :-1]
            x_BTD = self.embed(prefix_BT, start=-start_B)  # padding: positions < 0, unseen
            cols_T = torch.arange(S - 1, device=ids_BS.device)
            # A padding column sees itself only (finite values, never NaN, that no real
            # position sees); a real one, its row's columns (causality is the layer's).
            keep_B1TC = (cols_T[None, None, None, :] >= start_B[:, None, None, None]) | (
                torch.eye(S - 1, dtype=torch.bool, device=ids_BS.device)[None, None]
            )
            self.decoder.step(x_BTD, cache, keep_B1TC)
            cache.length = S - 1
        return cache

    def decode_step(
        self, tokens_BT: Tensor, memory: Memory, cache: KVCache
    ) -> tuple[Tensor, KVCache]:
        """Logits for the next token after feeding `tokens_BT` at cache.length (each row at its
        own position: column - start_B)."""
        start, T = cache.length, tokens_BT.size(1)
        if cache.start_B is None:
            pos: int | Tensor = start
            keep_B1TC = None
        else:
            pos = start - cache.start_B
            cols_C = torch.arange(start + T, device=tokens_BT.device)
            keep_B1TC = (cols_C[None, :] >= cache.start_B[:, None])[:, None, None, :]
        x_BTD = self.embed(tokens_BT, start=pos, most=start)
        y_BTD = self.decoder.step(x_BTD, cache, keep_B1TC)
        cache.length = start + T
        return self.generator(y_BTD[:, -1]), cache


@dataclass
class PromptMemory(Memory):
    """A decoder-only model's "memory": its prompts, left-aligned (`DecoderLM.encode`)."""

    ids_BS: Tensor = field(default_factory=lambda: torch.empty(0, 0, dtype=torch.long))
    start_B: Tensor = field(default_factory=lambda: torch.empty(0, dtype=torch.long))

    def index_select(self, idx_B: Tensor) -> Memory:
        return PromptMemory(
            self.out_BSD,
            self.keep_BS.index_select(0, idx_B),
            self.ids_BS.index_select(0, idx_B),
            self.start_B.index_select(0, idx_B),
        )


MODEL_CLASSES: dict[str, type[_ModelBase]] = {
    "Transformer": Transformer,
    "EncoderClassifier": EncoderClassifier,
    "EncoderMLM": EncoderMLM,
    "DecoderLM": DecoderLM,
}
