"""What the search tests run on: a scripted fake model (`TableModel`) whose probabilities
come from tables, with the batch (`SRC`) and settings (`SCRIPTED`) its expected searches are
worked out for; source batches for a real (random) Transformer (`random_batch`); and a
steppable search fed as a server feeds it (`feed_arrivals`). Shared by tests/search/ and
test_cuda.py; the real models themselves are fixtures (tests/search/conftest.py).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from aiayn.config import BOS_ID, EOS_ID, PAD_ID, DecodeConfig, ModelConfig
from aiayn.nn.kv_cache import KVCache, Memory
from aiayn.text.batches import padding_parts

A, B_, C = 4, 5, 6  # the fake model's word ids
V_FAKE = 7


# Next-token probabilities of each sentence (keyed by its first source token) after each prefix.
# Chosen without ties among the candidates that matter; the expected searches are worked out
# by hand in `test_beam_search_scripted`.
TABLES: dict[int, dict[tuple[int, ...], dict[int, float]]] = {
    A: {  # sentence 0
        (): {EOS_ID: 0.1, A: 0.5, B_: 0.4},
        (A,): {EOS_ID: 0.4, A: 0.35, B_: 0.25},
        (B_,): {EOS_ID: 0.1, A: 0.8, B_: 0.1},
        (B_, A): {EOS_ID: 0.5625, A: 0.25, B_: 0.1875},
        (A, A): {EOS_ID: 0.3, A: 0.5, B_: 0.2},
    },
    B_: {  # sentence 1: runs into its length limit of 4
        (): {EOS_ID: 0.1, A: 0.6, B_: 0.3},
        (A,): {EOS_ID: 0.1, A: 0.5, B_: 0.4},
        (B_,): {EOS_ID: 0.05, A: 0.7, B_: 0.25},
        (A, A): {EOS_ID: 0.25, A: 0.4, B_: 0.35},
        (A, B_): {EOS_ID: 0.2, A: 0.45, B_: 0.35},
        (A, A, A): {EOS_ID: 0.3, A: 0.5, B_: 0.2},
        (A, B_, A): {EOS_ID: 0.4, A: 0.35, B_: 0.25},
    },
}


class TableModel(nn.Module):
    """A fake model with the narrow decoding interface whose probabilities come from TABLES.

    It keeps each row's token history in the (real) KVCache, so a search that reorders the
    cache wrongly asks for the wrong prefix, and it fails if a row that ended is extended.
    """

    def __init__(self) -> None:
        super().__init__()
        self.cfg = ModelConfig(vocab_size=V_FAKE, d_model=8, n_heads=2)
        self.calls = 0

    def encode(self, src_BS: torch.Tensor) -> Memory:
        return Memory(src_BS.float()[:, :, None], src_BS != PAD_ID)

    def init_cache(self, memory: Memory, capacity: int) -> KVCache:
        B = memory.out_BSD.size(0)
        hist = torch.zeros(B, 1, capacity, 1)
        sent = memory.out_BSD[:, None, :1, :]
        return KVCache([hist], [hist.clone()], [sent], [sent.clone()], 0)

    def decode_step(self, tokens_BT: torch.Tensor, memory: Memory, cache: KVCache):
        self.calls += 1
        k = tokens_BT.float()[:, None, :, None]
        hist_BHLK, _, _ = cache.append_self(0, k, k)
        cache.length += tokens_BT.size(1)
        logits_BV = torch.full((tokens_BT.size(0), V_FAKE), float("-inf"))
        for r in range(tokens_BT.size(0)):
            ids = [int(x) for x in hist_BHLK[r, 0, :, 0]]
            assert ids[0] == BOS_ID
            assert EOS_ID not in ids, f"row {r} extended after EOS: {ids}"
            sent = int(cache.cross_k[0][r, 0, 0, 0])  # a cached step reads only memory's mask
            assert memory.keep_BS.size(0) == tokens_BT.size(0), "memory rows out of sync"
            for tok, p in TABLES[sent][tuple(ids[1:])].items():
                logits_BV[r, tok] = math.log(p)
        return logits_BV, cache


# Sentence 0 may be 5 tokens long, sentence 1 only 4 (max_len = 1 * src_len + 0).
SRC = torch.tensor([[A, 7, 7, 7, EOS_ID], [B_, 7, 7, EOS_ID, PAD_ID]])


SCRIPTED = DecodeConfig(beam_size=2, nbest=2, max_len_a=1.0, max_len_b=0)


VOCAB = 40


def random_batch(lengths: list[int], seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    src = torch.full((len(lengths), max(lengths)), PAD_ID)
    for i, n in enumerate(lengths):
        src[i, : n - 1] = torch.randint(4, VOCAB, (n - 1,), generator=g)
        src[i, n - 1] = EOS_ID
    return src


def feed_arrivals(
    run: Any,
    src: torch.Tensor,
    joins: list[int],
    drop_at: tuple[int, int] | None,
    split_first: bool = False,
    after_step: Callable[[], None] = lambda: None,
    slack: int | None = None,
) -> tuple[dict[int, Any], int | None]:
    """Run a steppable search (`RowSearch`, `BeamSearch`) as a server feeds it: sentence i of
    `src` joins at step `joins[i]` (an idle search takes the next arrival at once), the
    sentence admitted `drop_at[0]`-th is dropped at step `drop_at[1]`; `split_first` adds the
    first arrivals in two `add`s before any step. With `slack`, an `add` passes its sentences
    in parts of similar length, each trimmed to its longest (`padding_parts`), as the server
    does. Returns what each sentence ended with, and the dropped one (each ends once, never
    after its drop)."""
    order: list[int] = []
    got: dict[int, Any] = {}
    pending = sorted(range(src.size(0)), key=lambda i: joins[i])
    dropped = None
    with torch.inference_mode():
        step = 0
        while pending or run.live:
            now = [i for i in pending if joins[i] <= step]
            if not now and not run.live:
                now = pending[:1]
            if now:
                pending = [i for i in pending if i not in now]
                parts = [now[:1], now[1:]] if split_first and step == 0 else [now]
                for part in filter(None, parts):
                    if slack is None:
                        run.add(src[part])
                    else:
                        n = [int((src[i] != PAD_ID).sum()) for i in part]
                        cut = padding_parts(n, slack)
                        run.add(*[src[[part[j] for j in c], : n[c[0]]] for c in cut])
                        part = [part[j] for c in cut for j in c]  # the rows' order
                    order += part
            if drop_at is not None and drop_at[1] == step and drop_at[0] < len(order):
                dropped = order[drop_at[0]]
                run.drop({drop_at[0]})
            for row, found in run.step():
                assert order[row] != dropped and order[row] not in got
                got[order[row]] = found
            step += 1
            after_step()
    return got, dropped
