"""row_search.py: rows that join a running `RowSearch` (into free slots), and the host reads
of a search step and of a join, for `RowSearch` (beam 1) and `BeamSearch` (beam 4) alike."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils._python_dispatch import TorchDispatchMode

from aiayn.config import DecodeConfig
from aiayn.nn.model import Transformer
from aiayn.search.decode import greedy_search
from search.models import feed_arrivals, random_batch


@settings(max_examples=25, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 9), min_size=2, max_size=7),
    joins=st.lists(st.integers(0, 8), min_size=7, max_size=7),
    min_len=st.integers(0, 1),
    seed=st.integers(0, 10_000),
    drop_at=st.one_of(st.none(), st.tuples(st.integers(0, 6), st.integers(0, 8))),
    slack=st.sampled_from([None, 0, 3]),
)
def test_rows_that_join_a_running_search_get_what_they_get_alone(
    eos_model: Transformer,
    lengths: list[int],
    joins: list[int],
    min_len: int,
    seed: int,
    drop_at: tuple[int, int] | None,
    slack: int | None,
) -> None:
    """Continuous batching: sentences admitted at later steps (their cache rows joining at the
    current column, in the slots of rows that ended) end with the hypotheses greedy search
    gives them in a batch of their own, whatever row is dropped meanwhile (`drop_at`: that
    sentence, at that step), and whether an admission is encoded as one batch or in parts of
    similar length (`slack`)."""
    from aiayn.search.row_search import RowSearch

    src = random_batch(lengths, seed)
    cfg = DecodeConfig(beam_size=1, max_len_a=1.0, max_len_b=4, min_len=min_len)
    alone = [greedy_search(eos_model, src[i : i + 1], cfg)[0] for i in range(len(lengths))]
    run = RowSearch(eos_model, cfg)

    def only_live_rows() -> None:  # rows that ended or were dropped left at once
        if run.live:
            assert len(run.ids_r) == run.live == run.slots.n == len(set(run.ids_r.tolist()))

    got, dropped = feed_arrivals(run, src, joins, drop_at, after_step=only_live_rows, slack=slack)
    if dropped is not None:
        got.setdefault(dropped, alone[dropped])  # it may have finished before its drop
    assert sorted(got) == list(range(len(lengths)))
    for i, want in enumerate(alone):
        assert (got[i].tokens, got[i].eos) == (want.tokens, want.eos)
        assert got[i].log_prob == pytest.approx(want.log_prob, abs=1e-4)
        assert got[i].score == pytest.approx(want.score, abs=1e-4)


def test_joining_rows_take_free_slots_and_steps_skip_the_columns_no_row_sees(
    eos_model: Transformer,
) -> None:
    from aiayn.search.row_search import RowSearch

    cfg = DecodeConfig(beam_size=1, max_len_a=0.0, max_len_b=6, min_len=6)
    run = RowSearch(eos_model, cfg)
    with torch.inference_mode():
        run.add(random_batch([3], 1))
        for _ in range(3):
            run.step()
        run.cfg = dataclasses.replace(cfg, max_len_b=20)  # a longer limit than the cache has
        run.add(random_batch([4], 2))
        slots = run.slots
        assert slots.buf.start_B[:2].tolist() == [0, 3] and slots.buf.length == 3
        assert slots.buf.self_k[0].size(2) >= 3 + 20  # grown for the newcomer
        finished = [run.step() for _ in range(3)]
        assert [row for f in finished for row, _ in f] == [0]  # the first row's limit: 6
        assert slots.n == 1 and slots.starts == [3] and run.ids_r.tolist() == [1]  # moved up
        R = slots.buf.self_k[0].size(0)
        run.add(random_batch([2], 3))  # into the slot row 0 left: no copy of the buffers
        assert slots.buf.self_k[0].size(0) == R and slots.n == 2 and slots.starts == [3, 6]
        cache, keep = slots.view()  # no row sees columns 0..2: a step reads from column 3
        assert cache.length == 3 and cache.start_B.tolist() == [0, 3]
        assert cache.self_k[0].size(0) == keep.size(0) == 2


class HostReads(TorchDispatchMode):
    """Counts the ops that read a tensor's values on the host (`int(t)`, `bool(t)`, `nonzero`'s
    size, indexing with a boolean mask, which runs `nonzero` inside the kernel; `tolist` is
    counted by `reading_host`): on a GPU each is a wait for the device."""

    READS = frozenset({"item", "_local_scalar_dense", "is_nonzero", "nonzero"})
    MASKED = frozenset({"index", "index_put", "index_put_"})

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        name = func.overloadpacket.__name__
        self.count += name in self.READS
        if name in self.MASKED and len(args) > 1:
            self.count += any(
                isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in args[1]
            )
        return func(*args, **(kwargs or {}))


def reading_host(monkeypatch: pytest.MonkeyPatch) -> HostReads:
    reads = HostReads()
    tolist = torch.Tensor.tolist

    def counted(t: torch.Tensor) -> Any:
        reads.count += 1
        return tolist(t)

    monkeypatch.setattr(torch.Tensor, "tolist", counted)
    return reads


@pytest.mark.parametrize("joined", [False, True])
@pytest.mark.parametrize("beam", [1, 4])
def test_a_step_reads_the_host_a_fixed_number_of_times(
    eos_model: Transformer, monkeypatch: pytest.MonkeyPatch, beam: int, joined: bool
) -> None:
    """However many hypotheses end at a step, a search step copies values to the host a fixed
    number of times (a GPU waits for the device at each), not once per value it reads; rows
    that joined late (`joined`: per-row positions and masks) cost no more."""
    from aiayn.search.beam import BeamSearch
    from aiayn.search.row_search import RowSearch

    src = random_batch([3, 9, 5, 7, 4, 8, 6, 9, 3, 5, 7, 8] * 2, seed=3)
    cfg = DecodeConfig(beam_size=beam, nbest=beam, max_len_a=1.0, max_len_b=4)
    run = BeamSearch(eos_model, cfg) if beam > 1 else RowSearch(eos_model, cfg)

    def set_aside() -> int:  # hypotheses that ended so far, returned or not
        return returned + sum(map(len, run.ended.values())) if beam > 1 else returned

    reads = reading_host(monkeypatch)
    most_reads, most_ended, returned = 0, 0, 0
    with torch.inference_mode():
        run.add(src[:4] if joined else src)
        if joined:  # the rest join at column 1, as a server admits them
            run.step()
            run.add(src[4:])
        while run.live:
            before, reads.count = set_aside(), 0
            with reads:
                done = run.step()
            returned += sum(len(h) for _, h in done) if beam > 1 else len(done)
            most_reads = max(most_reads, reads.count)
            most_ended = max(most_ended, set_aside() - before)
    assert most_ended >= 8  # steps where many end: one read per value would be dozens
    assert most_reads <= (5 if beam > 1 else 3)


@pytest.mark.parametrize("beam", [1, 4])
def test_joining_a_running_search_reads_the_host_a_fixed_number_of_times(
    eos_model: Transformer, monkeypatch: pytest.MonkeyPatch, beam: int
) -> None:
    """Sentences joining a running search (a server admits some every few steps) cost a fixed
    number of host reads, rows that ended or not."""
    from aiayn.search.beam import BeamSearch
    from aiayn.search.row_search import RowSearch

    src = random_batch([3, 9, 5, 7, 4, 8, 6, 9, 3, 5, 7, 8] * 2, seed=3)
    cfg = DecodeConfig(beam_size=beam, nbest=beam, max_len_a=1.0, max_len_b=4)
    run = BeamSearch(eos_model, cfg) if beam > 1 else RowSearch(eos_model, cfg)
    reads = reading_host(monkeypatch)
    with torch.inference_mode():
        run.add(src[:16])
        for at in range(16, 24, 4):
            run.step()
            reads.count = 0
            with reads:
                run.add(src[at : at + 4])
            # encoder's id check, whether there is padding and where the real positions are
            # (these three on the CPU only), limits, dead rows left out, columns dropped
            assert reads.count <= (6 if beam > 1 else 7)
