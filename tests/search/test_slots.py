"""slots.py: through any steps, joins and removals, the rows of a `SlotCache` keep what they
wrote."""

from __future__ import annotations

from typing import Any

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from aiayn.nn.kv_cache import KVCache


def _slot_rows(ids: list[int], S: int, capacity: int = 0) -> tuple[KVCache, torch.Tensor]:
    """A cache of rows `ids` (as `init_cache` makes one) whose cross K/V hold each row's id
    over its S source positions, and their source mask."""
    B = len(ids)
    cross = torch.tensor(ids, dtype=torch.float)[:, None, None, None].expand(B, 1, S, 1)
    self_k = [torch.full((B, 1, capacity, 1), float("nan"))]  # unwritten: never read
    cache = KVCache(self_k, [self_k[0].clone()], [cross.clone()], [cross.clone()], 0)
    return cache, torch.ones(B, S, dtype=torch.bool)


@settings(max_examples=500, deadline=None)
@given(
    first=st.tuples(st.integers(1, 6), st.integers(1, 6), st.integers(1, 12)),
    ops=st.lists(
        st.one_of(
            st.tuples(st.just("step"), st.integers(1, 3)),
            st.tuples(st.just("add"), st.integers(1, 4), st.integers(1, 8), st.integers(1, 8)),
            st.tuples(st.just("remove"), st.integers(0, 2**12)),
        ),
        max_size=25,
    ),
    keep_order=st.booleans(),
)
def test_slot_cache_rows_keep_what_they_wrote(
    first: tuple[int, int, int], ops: list[tuple[Any, ...]], keep_order: bool
) -> None:
    """Through any steps, joins and removals, every live row of a `SlotCache` view holds its own
    cross K/V and source mask and every key it wrote, from its own first column on; what it
    may not look at is finite (a mask weighs it by 0); `keep_order` keeps the rows' order."""
    from aiayn.search.slots import SlotCache

    wrote: dict[int, list[float]] = {}  # by row id: the keys it wrote, in order
    left: dict[int, int] = {}  # by row id: columns it may still write (its limit)
    source: dict[int, int] = {}
    next_id = 1

    def admit(rows: int, S: int, positions: int) -> list[int]:
        nonlocal next_id
        ids = list(range(next_id, next_id + rows))
        next_id += rows
        for i in ids:
            wrote[i], left[i], source[i] = [], positions, S
        return ids

    B, S, P = first
    cache, keep = _slot_rows(admit(B, S, P), S, P)
    slots = SlotCache.of(cache, keep)

    def live_ids() -> list[int]:
        view, _ = slots.view()
        return [int(x) for x in view.cross_k[0][:, 0, 0, 0]]

    def check() -> None:
        view, keep_rS = slots.view()
        assert sorted(live_ids()) == sorted(left)
        for r, i in enumerate(live_ids()):
            start = 0 if view.start_B is None else int(view.start_B[r])
            keys = view.self_k[0][r, 0, :, 0]
            assert keys[start : view.length].tolist() == wrote[i]
            assert keys[:start].isfinite().all()
            assert keep_rS[r, : source[i]].all() and not keep_rS[r, source[i] :].any()
            assert (view.cross_k[0][r, 0, : source[i], 0] == i).all()
            assert view.cross_k[0][r].isfinite().all() and view.cross_v[0][r].isfinite().all()

    def remove(dead: list[int]) -> None:
        before = live_ids()
        slots.remove(dead, keep_order=keep_order)
        for r in dead:
            del left[before[r]]
        if keep_order:
            assert live_ids() == [i for r, i in enumerate(before) if r not in dead]

    for op in ops:
        if not left:
            break
        if op[0] == "step":
            for _ in range(op[1]):
                view, _ = slots.view()
                k = torch.tensor([i * 100.0 + len(wrote[i]) for i in live_ids()])[
                    :, None, None, None
                ]
                view.append_self(0, k, k)
                slots.advance()
                for i in live_ids():
                    wrote[i].append(i * 100.0 + len(wrote[i]))
                    left[i] -= 1
                remove([r for r, i in enumerate(live_ids()) if left[i] == 0])  # as a search does
                if not left:
                    break
        elif op[0] == "add":
            _, rows, S, positions = op
            ids = admit(rows, S, positions)
            slots.reserve(rows, positions, S, S)
            slots.add(*_slot_rows(ids, S))
        else:
            remove([r for r in range(slots.n) if op[1] >> r & 1])
        check()
