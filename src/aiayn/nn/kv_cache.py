"""What incremental decoding carries between steps: the encoder `Memory` and the `KVCache`.

`Transformer.encode` makes a Memory once per batch; `Transformer.init_cache` fills a KVCache
with the cross-attention keys and values of that memory; every `decode_step` appends one
position of self-attention keys and values. Beam search reorders both with `index_select`.

Continuous batching (a server's search that sentences join while it runs) adds rows with
`join`: every row writes its next position at the same column (`length`), so a row that joins
at column c has `start_B` = c, sees only columns >= c, and its position in the sentence is
column - c (left padding, as in batched generation). A join also drops the leading columns no
live row sees any more, and grows the buffers when a joining row needs more room.

Greedy and sampling keep the same cache in slots (`SlotCache`): a row that ends hands its slot
to the last row, rows that join write into free slots, and the buffers are copied whole only
when they run out of room; beam search, which reorders every row at every step anyway, uses
`join` and `index_select`.
"""

from __future__ import annotations

from dataclasses import dataclass

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

    def join(self, *others: Memory) -> Memory:
        """These rows, then each of `others`', padded to the longest source (padding is not
        kept), in one copy."""
        every = (self, *others)
        S = max(m.keep_BS.size(1) for m in every)
        outs = [_pad_dim(m.out_BSD, 1, S) for m in every]
        keeps = [_pad_dim(m.keep_BS, 1, S) for m in every]
        return Memory(torch.cat(outs), torch.cat(keeps))


def _pad_dim(x: Tensor, dim: int, size: int) -> Tensor:
    """`x` with zeros (False) appended along `dim` up to `size`."""
    if x.size(dim) == size:
        return x
    shape = list(x.shape)
    shape[dim] = size - x.size(dim)
    return torch.cat([x, x.new_zeros(shape)], dim)


@dataclass
class KVCache:
    """Per-layer keys and values for incremental decoding, batch first.

    Self-attention K/V live in buffers preallocated to `capacity` positions and are written
    in place each step (no re-allocation); `length` positions are filled. Cross-attention K/V
    of the encoder output are computed once per sentence.
    """

    self_k: list[Tensor]  # (B, H, capacity, K) per layer
    self_v: list[Tensor]
    cross_k: list[Tensor]  # (B, H, S, K) per layer
    cross_v: list[Tensor]
    length: int = 0
    spare_k: list[Tensor] | None = None  # same shapes as self_k: the target of a reorder
    spare_v: list[Tensor] | None = None
    start_B: Tensor | None = None  # each row's first column (None: 0 for every row)

    def self_keep_B11C(self, end: int) -> Tensor | None:
        """Which of the first `end` columns each row may attend to (None: all of them)."""
        if self.start_B is None:
            return None
        cols_C = torch.arange(end, device=self.start_B.device)
        return (cols_C[None, :] >= self.start_B[:, None])[:, None, None, :]

    def join(self, other: KVCache, positions: int, keep_B: Tensor | None = None) -> KVCache:
        """These rows (those in `keep_B`, if given), then `other`'s (a fresh cache of the same
        sources: only its cross K/V are taken), with room for `positions` more columns, in one
        copy. The leading columns no row sees any more are dropped on the way (attention reads
        every column up to `length`); the new rows start at the new `length`. Cross K/V are
        padded to the longer source; what a row does not see is zero, so masked products stay
        finite."""
        b, device = other.cross_k[0].size(0), self.self_k[0].device
        start = self.start_B if self.start_B is not None else torch.zeros(
            self.self_k[0].size(0), dtype=torch.long, device=device)  # fmt: skip
        if keep_B is not None:
            start = start.index_select(0, keep_B)
        B = start.size(0)
        drop = int(start.min()) if B else self.length
        L = self.length - drop
        size = max(self.self_k[0].size(2) - drop, L + positions)

        def stack(mine: Tensor) -> Tensor:  # only the rows and columns someone sees are copied
            out = mine.new_empty(B + b, mine.size(1), size, mine.size(3))
            seen = mine[:, :, drop : self.length]
            if keep_B is None:
                out[:B, :, :L] = seen
            else:
                torch.index_select(seen, 0, keep_B, out=out[:B, :, :L])
            out[B:, :, :L] = 0  # what a new row does not see; it writes from column L on
            return out

        def cross(mine: list[Tensor], theirs: list[Tensor]) -> list[Tensor]:
            S = max(mine[0].size(2), theirs[0].size(2))
            kept = mine if keep_B is None else [a.index_select(0, keep_B) for a in mine]
            return [torch.cat([_pad_dim(a, 2, S), _pad_dim(o, 2, S)])
                    for a, o in zip(kept, theirs, strict=True)]  # fmt: skip

        return KVCache(
            [stack(k) for k in self.self_k],
            [stack(v) for v in self.self_v],
            cross(self.cross_k, other.cross_k),
            cross(self.cross_v, other.cross_v),
            L,
            start_B=torch.cat([start - drop, torch.full((b,), L, dtype=torch.long,
                                                         device=device)]),
        )  # fmt: skip

    def append_self(self, layer: int, k_BHTK: Tensor, v_BHTK: Tensor) -> tuple[Tensor, Tensor]:
        """Write the new positions' K/V; return views of everything so far (B, H, length+T, K)."""
        start, end = self.length, self.length + k_BHTK.size(2)
        if end > self.self_k[layer].size(2):
            raise ValueError(f"KV cache capacity {self.self_k[layer].size(2)} exceeded")
        self.self_k[layer][:, :, start:end] = k_BHTK
        self.self_v[layer][:, :, start:end] = v_BHTK
        return self.self_k[layer][:, :, :end], self.self_v[layer][:, :, :end]

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
        )


@dataclass
class SlotCache:
    """The cache and source mask of a search whose rows come and go (a server's continuous
    batching; any greedy search's rows that end), kept in slots: buffers with room for more rows
    and columns than are live. The live rows are the first `n` slots, and a step reads a view of
    them (`view`), from the first column a live row sees. So a row that ends costs a copy of one
    row (the last live row moves into its slot: `remove`), rows that join write into the free
    slots (`add`), and only running out of room copies every row (`reserve`, with headroom):
    `KVCache.join` and `index_select` copy every row each time.

    `buf.start_B` is each slot's first column. Columns a row does not see, and source positions
    past its own, hold zeros or what an earlier row left there: finite values that the masks
    weigh by exactly 0."""

    buf: KVCache  # R slots; C columns of self K/V; S source positions of cross K/V
    keep_RS: Tensor  # each slot's real source positions
    n: int  # live rows: slots 0 .. n-1
    starts: list[int]  # each live row's first column, on the host (their min is `first`)
    joined: bool = False  # a row started after column 0: steps need per-row masks

    @classmethod
    def of(cls, cache: KVCache, keep_BS: Tensor) -> SlotCache:
        """A fresh batch's cache (`init_cache`, every row at column 0) as slots, uncopied."""
        B = keep_BS.size(0)
        cache.start_B = torch.zeros(B, dtype=torch.long, device=keep_BS.device)
        return cls(cache, keep_BS, B, [0] * B)

    @property
    def first(self) -> int:
        return min(self.starts, default=self.buf.length)

    def view(self) -> tuple[KVCache, Tensor]:
        """(cache, source mask) of the live rows, for `decode_step`: views of the buffers, so
        what the step writes lands in the slots; the step moves `length` on (`advance`)."""
        n, f, b = self.n, self.first, self.buf
        assert b.start_B is not None
        return KVCache(
            [k[:n, :, f:] for k in b.self_k],
            [v[:n, :, f:] for v in b.self_v],
            [k[:n] for k in b.cross_k],
            [v[:n] for v in b.cross_v],
            b.length - f,
            start_B=b.start_B[:n] - f if self.joined else None,
        ), self.keep_RS[:n]

    def advance(self, positions: int = 1) -> None:
        self.buf.length += positions

    def remove(self, dead: list[int], keep_order: bool = False) -> list[int]:
        """Live rows `dead` leave; the live rows after the new end move into their slots (with
        `keep_order`, every row after the first that left moves up instead: the rows keep
        their order, for a reader). Returns each remaining slot's former slot (to reorder the
        caller's row state alike)."""
        n, gone = self.n - len(dead), set(dead)
        if keep_order:
            order = [i for i in range(self.n) if i not in gone]
        else:  # the rows left past the new end fill the holes before it, in order
            left = iter([i for i in range(n, self.n) if i not in gone])
            order = [next(left) if i in gone else i for i in range(n)]
        holes = [i for i in range(n) if order[i] != i]
        movers = [order[i] for i in holes]
        if holes:
            device = self.keep_RS.device
            to, frm = torch.tensor(holes, device=device), torch.tensor(movers, device=device)
            b, cols = self.buf, slice(self.first, self.buf.length)  # only the columns seen
            for x in b.self_k + b.self_v:
                x[:, :, cols].index_copy_(0, to, x[:, :, cols].index_select(0, frm))
            assert b.start_B is not None
            for x in [*b.cross_k, *b.cross_v, self.keep_RS, b.start_B]:
                x.index_copy_(0, to, x.index_select(0, frm))
            self.starts = [self.starts[i] for i in order]
        self.n = n
        del self.starts[n:]
        return order

    def reserve(self, rows: int, positions: int, cross: int, source: int) -> None:
        """Room for `rows` more rows that may write `positions` columns each, with `cross`
        cross-attention and `source` mask positions; when there is none, every live row is
        copied once into larger buffers (with headroom, so that this is rare) from its first
        seen column on."""
        b, n, f = self.buf, self.n, self.first
        R, C, S = b.self_k[0].size(0), b.self_k[0].size(2), b.cross_k[0].size(2)
        fits = n + rows <= R and b.length + positions <= C
        if fits and cross <= S and source <= self.keep_RS.size(1):
            return
        L = b.length - f
        # Headroom: a quarter more rows, and columns for two more admissions' limits.
        R2, C2, S2 = (
            max(R, n + rows + (n + rows) // 4),
            max(C - f, L + 2 * positions),
            max(S, cross),
        )

        def copy(x: Tensor, start: int, stop: int, size: int, dim: int) -> Tensor:
            """Rows 0..n-1 of `x`, its `start:stop` along `dim` moved to 0, in new buffers."""
            shape = list(x.shape)
            shape[0], shape[dim] = R2, size
            out = x.new_zeros(shape)  # finite where no row has written
            out[:n].narrow(dim, 0, stop - start).copy_(x[:n].narrow(dim, start, stop - start))
            return out

        assert b.start_B is not None
        start = b.start_B.new_zeros(R2)
        start[:n] = b.start_B[:n] - f
        Sk = self.keep_RS.size(1)
        self.buf = KVCache(
            [copy(x, f, b.length, C2, 2) for x in b.self_k],
            [copy(x, f, b.length, C2, 2) for x in b.self_v],
            [copy(x, 0, S, S2, 2) for x in b.cross_k],
            [copy(x, 0, S, S2, 2) for x in b.cross_v],
            L,
            start_B=start,
        )
        self.keep_RS = copy(self.keep_RS, 0, Sk, max(Sk, source), 1)
        self.starts = [s - f for s in self.starts]

    def add(self, fresh: KVCache, keep_BS: Tensor) -> None:
        """The rows of `fresh` (a cache of their sources: only its cross K/V are read) take
        the next slots and write from the current column on; `reserve` first."""
        b, n, B = self.buf, self.n, keep_BS.size(0)
        if n + B > b.self_k[0].size(0):
            raise ValueError(f"{B} rows do not fit {b.self_k[0].size(0) - n} free slots: reserve")
        new = slice(n, n + B)
        f, S = self.first, fresh.cross_k[0].size(2)  # no live row: `first` is `length`
        for x in b.self_k + b.self_v:  # columns they do not see: a slot never written is not
            x[new, :, f : b.length] = 0  # finite there (empty memory), and masks need finite
        for x, y in zip(b.cross_k + b.cross_v, fresh.cross_k + fresh.cross_v, strict=True):
            x[new, :, :S] = y
            x[new, :, S:] = 0
        self.keep_RS[new, : keep_BS.size(1)] = keep_BS
        self.keep_RS[new, keep_BS.size(1) :] = False
        assert b.start_B is not None
        b.start_B[new] = b.length
        self.joined = self.joined or b.length > 0
        self.starts += [b.length] * B
        self.n += B
