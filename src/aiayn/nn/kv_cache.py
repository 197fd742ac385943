"""What incremental decoding carries between steps: the encoder `Memory` and the `KVCache`.

`Transformer.encode` makes a Memory once per batch; `Transformer.init_cache` fills a KVCache
with the cross-attention keys and values of that memory; every `decode_step` appends one
position of self-attention keys and values. Beam search reorders both with `index_select`.

`self_capacity` sizes a cache's self-attention buffers: a window's ring when it is shorter.

Rows may start at different columns (`start_B`, left padding as in batched generation): a
row that starts at column c sees only columns >= c, and its position in the sentence is
column - c. That is how a search adds sentences while it runs (`aiayn.search.slots`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor


@dataclass
class Memory:
    """The encoder output and which source positions are real (not PAD)."""

    out_BSD: Tensor
    keep_BS: Tensor

    @property
    def keep_B11S(self) -> Tensor:
        return self.keep_BS[:, None, None, :]

    def index_select(self, idx_B: Tensor) -> Memory:
        return Memory(self.out_BSD.index_select(0, idx_B), self.keep_BS.index_select(0, idx_B))

    def mask_only(self) -> Memory:
        """What a step with a filled `KVCache` reads: the mask (the cache holds the cross K/V
        made from `out_BSD`). A search that reorders or joins rows then copies no encoder
        output."""
        return Memory(self.out_BSD[:, :, :0], self.keep_BS)


@dataclass
class KVCache:
    """Per-layer keys and values for incremental decoding, batch first.

    Self-attention K/V live in buffers preallocated to `capacity` positions and are written
    in place each step (no re-allocation); `length` positions are filled. Cross-attention K/V
    of the encoder output are computed once per sentence.

    With `window` = W > 0 (local attention) the buffers are rings of W slots: column c lives in
    slot c % W, overwriting column c - W, which no query sees any more. Memory then stops
    growing with the context.
    """

    self_k: list[Tensor]  # (B, J, capacity, K) per layer (J K/V heads)
    self_v: list[Tensor]
    cross_k: list[Tensor]  # (B, J, S, K) per layer
    cross_v: list[Tensor]
    length: int = 0
    spare_k: list[Tensor] | None = None  # same shapes as self_k: the target of a reorder
    spare_v: list[Tensor] | None = None
    start_B: Tensor | None = None  # each row's first column (None: 0 for every row)
    window: int = 0  # > 0: the self K/V buffers are rings of this many slots
    # What every layer of one step computes alike (RoPE's angles, ALiBi's and the window's
    # masks), made by the first layer: kind -> (key, value). A new cache starts empty.
    memo: dict[str, tuple[Any, Any]] = field(default_factory=dict, repr=False)

    def memoised(self, kind: str, key: Any, make: Callable[[], Any]) -> Any:
        """`make()`, computed once for a `key` (e.g. this step's first column and length)."""
        held = self.memo.get(kind)
        if held is None or held[0] != key:
            held = self.memo[kind] = (key, make())
        return held[1]

    def self_keep_B11C(self, end: int, cols_C: Tensor | None = None) -> Tensor | None:
        """Which of the `end` keys a step reads each row may attend to (None: all of them):
        rows that start late (left padding) see their own columns only; a ring's slot not
        written yet (column < 0) no row sees. `cols_C`: each key's column (None: 0..end-1)."""
        keep_B11C: Tensor | None = None
        if self.start_B is not None:
            cols = torch.arange(end, device=self.start_B.device) if cols_C is None else cols_C
            keep_B11C = (cols[None, :] >= self.start_B[:, None])[:, None, None, :]
        if cols_C is not None:
            written_11C = (cols_C >= 0)[None, None, None]
            keep_B11C = written_11C if keep_B11C is None else keep_B11C & written_11C
        return keep_B11C

    def append_self(
        self, layer: int, k_BJTK: Tensor, v_BJTK: Tensor
    ) -> tuple[Tensor, Tensor, Tensor | None]:
        """Write the new positions' K/V; return the keys and values the new queries read and
        each one's column (None: columns 0.. in order, everything so far (B, J, length+T, K))."""
        if self.window:
            return self._append_ring(layer, k_BJTK, v_BJTK)
        start, end = self.length, self.length + k_BJTK.size(2)
        if end > self.self_k[layer].size(2):
            raise ValueError(f"KV cache capacity {self.self_k[layer].size(2)} exceeded")
        self.self_k[layer][:, :, start:end] = k_BJTK
        self.self_v[layer][:, :, start:end] = v_BJTK
        return self.self_k[layer][:, :, :end], self.self_v[layer][:, :, :end], None

    def _append_ring(
        self, layer: int, k_BJTK: Tensor, v_BJTK: Tensor
    ) -> tuple[Tensor, Tensor, Tensor | None]:
        """The ring's append. One position (a decoding step): written into its slot, then the
        whole ring is read, in slot order (attention does not care about the keys' order;
        their columns say where each sits). Several (a prompt): the last W - 1 columns before
        them, in order, then the new ones; the newest W are written."""
        W, start, T = self.window, self.length, k_BJTK.size(2)
        ring_k, ring_v = self.self_k[layer], self.self_v[layer]
        device = k_BJTK.device
        if T == 1:
            ring_k[:, :, start % W] = k_BJTK[:, :, 0]
            ring_v[:, :, start % W] = v_BJTK[:, :, 0]
            if start < W:  # not full yet: columns 0..start in slots 0..start. The slots after
                # them were never written (whatever the allocation left, NaN included: a
                # weight of 0 times NaN is NaN), so they are not read at all.
                return ring_k[:, :, : start + 1], ring_v[:, :, : start + 1], None
            # Every layer's ring holds the same columns: the first layer's are kept.
            cols_W = self.memoised(
                "ring", start, lambda: start - (start - torch.arange(W, device=device)) % W
            )
            return ring_k, ring_v, cols_W
        new_T = torch.arange(start, start + T, device=device)
        if start == 0:
            k_all, v_all, cols = k_BJTK, v_BJTK, None
        else:
            past = torch.arange(max(0, start - W + 1), start, device=device)
            k_all = torch.cat([ring_k.index_select(2, past % W), k_BJTK], 2)
            v_all = torch.cat([ring_v.index_select(2, past % W), v_BJTK], 2)
            cols = torch.cat([past, new_T])
        kept = new_T[-W:]
        ring_k.index_copy_(2, kept % W, k_BJTK[:, :, -W:])
        ring_v.index_copy_(2, kept % W, v_BJTK[:, :, -W:])
        return k_all, v_all, cols

    def index_select(self, idx_B: Tensor, *, cross: bool = True) -> KVCache:
        """Reorder (or select) batch rows, e.g. the surviving beams (fairseq's reorder).

        The cache it is called on must not be used afterwards: when the row count is unchanged
        (a beam reorder) the rows are gathered into a spare buffer that the two caches then
        swap, so a beam step allocates nothing (fresh large buffers each step cost page faults).
        Pass `cross=False` when rows are only permuted among beams of the same sentence: their
        cross-attention K/V are identical, so copying them would be wasted work.
        """
        same_rows = len(idx_B) == self.self_k[0].size(0)
        if same_rows and not self.self_k[0].requires_grad:  # out= cannot record gradients
            if self.spare_k is None or self.spare_v is None:
                self.spare_k = [torch.empty_like(b) for b in self.self_k]
                self.spare_v = [torch.empty_like(b) for b in self.self_v]
            # Only the `length` filled positions are copied: the rest is overwritten before it
            # is read, and copying the whole capacity would double a beam step's copy traffic.
            filled = slice(0, self.length)
            for src, dst in zip(
                self.self_k + self.self_v, self.spare_k + self.spare_v, strict=True
            ):
                torch.index_select(src[:, :, filled], 0, idx_B, out=dst[:, :, filled])
            self_k, self_v = self.spare_k, self.spare_v
            spare_k, spare_v = self.self_k, self.self_v
        elif not self.self_k[0].requires_grad:  # rows dropped: new buffers, filled part copied
            filled = slice(0, self.length)

            def gather(buf: Tensor) -> Tensor:
                out = buf.new_empty(len(idx_B), *buf.shape[1:])
                torch.index_select(buf[:, :, filled], 0, idx_B, out=out[:, :, filled])
                return out

            self_k, self_v = [gather(b) for b in self.self_k], [gather(b) for b in self.self_v]
            spare_k = spare_v = None  # type: ignore[assignment]  # no spare: built on demand
        else:  # autograd on: new buffers
            self_k = [b.index_select(0, idx_B) for b in self.self_k]
            self_v = [b.index_select(0, idx_B) for b in self.self_v]
            spare_k = spare_v = None  # type: ignore[assignment]  # no spare: built on demand
        keep_cross = not cross and same_rows
        return KVCache(
            self_k,
            self_v,
            self.cross_k if keep_cross else [b.index_select(0, idx_B) for b in self.cross_k],
            self.cross_v if keep_cross else [b.index_select(0, idx_B) for b in self.cross_v],
            self.length,
            spare_k,
            spare_v,
            None if self.start_B is None else self.start_B.index_select(0, idx_B),
            self.window,
        )


def self_capacity(window: int, capacity: int, max_len: int) -> tuple[int, int]:
    """(slots, ring size) of a self-attention cache for `capacity` positions: a model that
    attends locally always gets a ring, even when fewer positions are asked for now, since
    rows that join a running search may take it further (a plain buffer would then grow with
    the context); else plain. The ring holds at most `max_len` slots: a row's positions span
    fewer than max_len columns, so a wider window sees all of them anyway (and an
    `attn_window` of 10^9 must not allocate 10^9 slots)."""
    if window:
        ring = min(window, max_len)
        return ring, ring
    return capacity, 0
