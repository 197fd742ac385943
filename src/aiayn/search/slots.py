"""Searches whose rows come and go: sentences that join a running search (a server's
continuous batching) and rows that end early, over the model's `KVCache` and `Memory`.

Every row writes its next position at the same column (`length`), so a row that joins at
column c has `start_B` = c, sees only columns >= c, and its position in the sentence is
column - c (left padding, as in batched generation). `join_caches` also drops the leading
columns no live row sees any more, and grows the buffers when a joining row needs more room
(`pad_cols` grows a search's token buffer the same way).

Greedy and sampling keep the cache in slots (`SlotCache`): a row that ends hands its slot to
the last row, rows that join write into free slots, and the buffers are copied whole only
when they run out of room; beam search, which reorders every row at every step anyway, uses
`join_caches` and `KVCache.index_select`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from aiayn.nn.kv_cache import KVCache, Memory


def join_memories(first: Memory, *others: Memory) -> Memory:
    """`first`'s rows, then each of `others`', padded to the longest source (padding is not
    kept), in one copy."""
    every = (first, *others)
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


def pad_cols(x_RT: Tensor, width: int, value: int) -> Tensor:
    """`x_RT` with columns of `value` appended up to `width` (a search's token buffer when a
    joining row needs more room)."""
    if x_RT.size(1) >= width:
        return x_RT
    return torch.cat([x_RT, x_RT.new_full((x_RT.size(0), width - x_RT.size(1)), value)], 1)


def join_caches(
    cache: KVCache, other: KVCache, positions: int, keep_B: Tensor | None = None
) -> KVCache:
    """`cache`'s rows (those in `keep_B`, if given), then `other`'s (a fresh cache of the same
    sources: only its cross K/V are taken), with room for `positions` more columns, in one
    copy. The leading columns no row sees any more are dropped on the way (attention reads
    every column up to `length`); the new rows start at the new `length`. Cross K/V are
    padded to the longer source; what a row does not see is zero, so masked products stay
    finite."""
    b, device = other.cross_k[0].size(0), cache.self_k[0].device
    start = (
        cache.start_B
        if cache.start_B is not None
        else torch.zeros(cache.self_k[0].size(0), dtype=torch.long, device=device)
    )
    if keep_B is not None:
        start = start.index_select(0, keep_B)
    B = start.size(0)
    ring = cache.window > 0  # a ring's slots hold columns mod its size: none is dropped
    drop = 0 if ring else int(start.min()) if B else cache.length
    L = cache.length - drop
    size = cache.window if ring else max(cache.self_k[0].size(2) - drop, L + positions)

    def stack(mine: Tensor) -> Tensor:  # only the rows and columns someone sees are copied
        out = mine.new_empty(B + b, mine.size(1), size, mine.size(3))
        seen = mine if ring else mine[:, :, drop : cache.length]
        filled = seen.size(2)
        if keep_B is None:
            out[:B, :, :filled] = seen
        else:
            torch.index_select(seen, 0, keep_B, out=out[:B, :, :filled])
        out[B:, :, :filled] = 0  # what a new row does not see; it writes from column L on
        return out

    def cross(mine: list[Tensor], theirs: list[Tensor]) -> list[Tensor]:
        S = max(mine[0].size(2), theirs[0].size(2))
        kept = mine if keep_B is None else [a.index_select(0, keep_B) for a in mine]
        return [
            torch.cat([_pad_dim(a, 2, S), _pad_dim(o, 2, S)])
            for a, o in zip(kept, theirs, strict=True)
        ]

    return KVCache(
        [stack(k) for k in cache.self_k],
        [stack(v) for v in cache.self_v],
        cross(cache.cross_k, other.cross_k),
        cross(cache.cross_v, other.cross_v),
        L,
        start_B=torch.cat([start - drop, torch.full((b,), L, dtype=torch.long, device=device)]),
        window=cache.window,
    )


@dataclass
class SlotCache:
    """The cache and source mask of a search whose rows come and go (a server's continuous
    batching; any greedy search's rows that end), kept in slots: buffers with room for more rows
    and columns than are live. The live rows are the first `n` slots, and a step reads a view of
    them (`view`), from the first column a live row sees. So a row that ends costs a copy of one
    row (the last live row moves into its slot: `remove`), rows that join write into the free
    slots (`add`), and only running out of room copies every row (`reserve`, with headroom):
    `join_caches` and `index_select` copy every row each time.

    `buf.start_B` is each slot's first column. Columns a row does not see, and source positions
    past its own, hold zeros or what an earlier row left there: finite values that the masks
    weigh by exactly 0. A ring cache (local attention, `KVCache.window`) keeps its columns
    where they are (slot = column mod W): it is never shifted by `first`."""

    buf: KVCache  # R slots; C columns of self K/V; S source positions of cross K/V
    keep_RS: Tensor  # each slot's real source positions
    n: int  # live rows: slots 0 .. n-1
    starts: list[int]  # each live row's first column, on the host (their min is `first`)
    joined: bool = False  # a row started after column 0: steps need per-row masks

    @classmethod
    def of(cls, cache: KVCache, keep_BS: Tensor) -> SlotCache:
        """A fresh batch's cache (`init_cache`, every row at column 0) as slots, uncopied."""
        B = keep_BS.size(0)
        if cache.start_B is None:
            cache.start_B = torch.zeros(B, dtype=torch.long, device=keep_BS.device)
            return cls(cache, keep_BS, B, [0] * B)
        # left-padded rows (a decoder-only model's prompts): each from its own column
        starts = cache.start_B.tolist()
        return cls(cache, keep_BS, B, starts, joined=any(starts))

    @property
    def first(self) -> int:
        return min(self.starts, default=self.buf.length)

    @property
    def shift(self) -> int:
        """The columns before every live row's first, dropped from views and copies (none for
        a ring, whose slot of a column is fixed)."""
        return 0 if self.buf.window else self.first

    def view(self) -> tuple[KVCache, Tensor]:
        """(cache, source mask) of the live rows, for `decode_step`: views of the buffers, so
        what the step writes lands in the slots; the step moves `length` on (`advance`)."""
        n, f, b = self.n, self.shift, self.buf
        assert b.start_B is not None
        return KVCache(
            [k[:n, :, f:] for k in b.self_k],
            [v[:n, :, f:] for v in b.self_v],
            [k[:n] for k in b.cross_k],
            [v[:n] for v in b.cross_v],
            b.length - f,
            start_B=b.start_B[:n] - f if self.joined else None,
            window=b.window,
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
            b, cols = self.buf, slice(self.shift, self.buf.length)  # only the columns seen
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
        b, n, f = self.buf, self.n, self.shift
        R, C, S = b.self_k[0].size(0), b.self_k[0].size(2), b.cross_k[0].size(2)
        fits = n + rows <= R and (b.window > 0 or b.length + positions <= C)
        if fits and cross <= S and source <= self.keep_RS.size(1):
            return
        L = b.length - f
        # Headroom: a quarter more rows, and columns for two more admissions' limits (a
        # ring keeps its size).
        R2, C2, S2 = (
            max(R, n + rows + (n + rows) // 4),
            C if b.window else max(C - f, L + 2 * positions),
            max(S, cross),
        )
        filled = min(b.length, C) if b.window else b.length

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
            [copy(x, f, filled, C2, 2) for x in b.self_k],
            [copy(x, f, filled, C2, 2) for x in b.self_v],
            [copy(x, 0, S, S2, 2) for x in b.cross_k],
            [copy(x, 0, S, S2, 2) for x in b.cross_v],
            L,
            start_B=start,
            window=b.window,
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
        f, S = self.shift, fresh.cross_k[0].size(2)  # no live row: `first` is `length`
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
