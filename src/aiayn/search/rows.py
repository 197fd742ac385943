"""The one-hypothesis-per-row search (greedy, sampling) as a steppable object, `RowSearch`:
rows may join while it runs, which is what a server's continuous batching needs
(aiayn.serve.streams); aiayn.search.decode runs it whole for `greedy_search` and
`sample_search`.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from aiayn.config import DecodeConfig
from aiayn.search.settings import Hypothesis, check_decode_config, length_penalty
from aiayn.search.step import Decodable, check_stop, encode_parts, forbid, output_limits
from aiayn.search.views import OnStep, SingleRows, single_view

# (log-probabilities (R, V), id of each live row (R,), each row's step (R,))
#   -> (next token ids (R,), their log-probabilities (R,))
Pick = Callable[[Tensor, Tensor, Tensor], tuple[Tensor, Tensor]]


def pick_best(lp_rV: Tensor, rows_r: Tensor, t_r: Tensor) -> tuple[Tensor, Tensor]:
    """Greedy: the most probable token. `max` gives the value with its index in one pass over
    V (argmax, then gathering the value, costs a second op; both keep the first of equal maxima).
    """
    lp_r, next_r = lp_rV.max(-1)
    return next_r, lp_r


class RowSearch:
    """One hypothesis per row (greedy, sampling), a step at a time; rows may join between steps.

    `add(*parts)` encodes sentences and gives them row ids (0, 1, ... in order of arrival);
    `step()` extends every live row by one token and returns the rows that finished, with their
    hypotheses. Finished rows leave the batch (their memory and cache rows are dropped; see
    `compact`), so late steps only pay for sentences still being written; `drop(ids)` removes
    rows nobody waits for. Rows added while others run (continuous batching: a server admits
    new sentences at every step) join the cache at its current column (`KVCache.join`): each
    row keeps its own step, position and limits, and gets the hypothesis it gets alone, up to
    rounding.
    Observing (`on_step`) and `use_cache=False` need every row at the same step: no joins.
    Rows r * per_sent .. (r + 1) * per_sent - 1 are one sentence's (for the observer).

    `compact` > 0 lets finished (or dropped) rows stay in the batch, stepped but ignored,
    until they are more than that share of it (or until the next `add`, whose copy of the
    cache leaves them out): with many rows, some row ends at almost every step, and copying
    the whole cache each time costs more than stepping a few dead rows. 0 (the classic
    search) removes them at once.
    """

    def __init__(
        self,
        model: Decodable,
        cfg: DecodeConfig,
        pick: Pick = pick_best,
        *,
        use_cache: bool = True,
        on_step: OnStep | None = None,
        kind: str = "greedy",
        per_sent: int = 1,
        compact: float = 0.0,
    ) -> None:
        check_decode_config(cfg)
        if compact and on_step is not None:
            raise ValueError("an observed search removes finished rows at once (compact=0)")
        self.compact = compact
        self.model, self.cfg, self.pick = model, cfg, pick
        self.use_cache, self.on_step, self.kind, self.per_sent = use_cache, on_step, kind, per_sent
        self.steps = 0  # steps taken by this search (rows that joined late have taken fewer)
        self.next_id = 0
        self.live = 0  # rows still being written (the batch may also hold dead ones)

    def add(self, *parts: Tensor) -> list[int]:
        """Encode the rows of `parts` (right-padded ids, each part one encoder batch:
        `encode_parts`) and let them take part from the next step, in that order."""
        parts = tuple(p for p in parts if p.size(0))
        if not parts:
            return []
        special = self.model.cfg
        memory = encode_parts(self.model, parts)
        device, b = memory.keep_BS.device, memory.keep_BS.size(0)
        limit_b = output_limits(self.model, memory, self.cfg)
        first, self.next_id = self.next_id, self.next_id + b
        ids = torch.arange(first, self.next_id, device=device)
        state = {
            "ids_r": ids,
            "limit_r": limit_b,
            "t_r": torch.zeros(b, dtype=torch.long, device=device),
            "log_prob_r": torch.zeros(b, dtype=torch.float64, device=device),
            "tok_r1": torch.full((b, 1), special.bos_id, device=device),
            "alive_r": torch.ones(b, dtype=torch.bool, device=device),
        }
        T = int(limit_b.max())
        if self.live == 0:  # a fresh batch: the paper's search, every row at step 0
            self.cache = self.model.init_cache(memory, T) if self.use_cache else None
            self.memory = memory.mask_only() if self.use_cache else memory
            self.out_rT = torch.full((b, T), special.pad_id, device=device)
            self.__dict__.update(state)
        else:
            if self.on_step is not None or self.cache is None:
                raise ValueError("rows can join a running search only with the cache, unobserved")
            fresh = self.model.init_cache(memory, 1)  # its cross K/V; self K/V come from join
            all_alive = self.live == len(self.alive_r)  # counted on the host: no device read
            keep_r = None if all_alive else self.alive_r.nonzero()[:, 0]
            self.cache = self.cache.join(fresh, T, keep_r)  # dead rows are left out
            if keep_r is not None:
                self._select(keep_r)
            self.memory = self.memory.join(memory.mask_only())
            width = max(self.out_rT.size(1), T)
            self.out_rT = torch.cat([
                pad_cols(self.out_rT, width, special.pad_id),
                torch.full((b, width), special.pad_id, device=device),
            ])  # fmt: skip
            for name, value in state.items():
                setattr(self, name, torch.cat([getattr(self, name), value]))
        self.live += b
        return list(range(first, self.next_id))

    ids_r: Tensor  # each live row's id
    limit_r: Tensor  # its output-length limit
    t_r: Tensor  # its step: tokens it has so far
    log_prob_r: Tensor  # float64
    tok_r1: Tensor  # its last token (BOS before its first step)
    out_rT: Tensor  # its tokens (PAD beyond t_r)
    alive_r: Tensor  # False: finished or dropped, stepped until the batch is compacted

    def step(self) -> list[tuple[int, Hypothesis]]:
        """One token for every live row; the (id, hypothesis) of each row that finished."""
        if not self.live:  # every row ended or was dropped
            return []
        model, cfg, special = self.model, self.cfg, self.model.cfg
        t = self.steps
        check_stop(t)
        if self.cache is not None:
            logits_rV, self.cache = model.decode_step(self.tok_r1, self.memory, self.cache)
        else:  # recompute the whole prefix (the benchmark's and tests' reference)
            bos_r1 = self.tok_r1.new_full((self.live, 1), special.bos_id)
            prefix_rt = torch.cat([bos_r1, self.out_rT[:, :t]], 1)
            fresh = model.init_cache(self.memory, t + 1)
            logits_rV, _ = model.decode_step(prefix_rt, self.memory, fresh)
        lp_rV = logits_rV.float().log_softmax(-1)  # one fused pass (cheaper than logsumexp)
        forbid(lp_rV, special, self.t_r < cfg.min_len)
        next_r, lp_r = self.pick(lp_rV, self.ids_r, self.t_r)
        is_eos_r = next_r == special.eos_id
        done_r = (is_eos_r | (self.t_r + 1 >= self.limit_r)) & self.alive_r
        if self.on_step is not None:
            before = SingleRows(self.ids_r, self.out_rT[:, :t], self.log_prob_r, self.per_sent)
            picked = (next_r, lp_r, is_eos_r, done_r)
            self.on_step(single_view(self.kind, t, cfg.alpha, before, logits_rV, lp_rV, picked))
        self.log_prob_r += lp_r.double()
        at_r = self.t_r.clamp(max=self.out_rT.size(1) - 1)  # dead rows may run past their end
        self.out_rT.scatter_(1, at_r[:, None], next_r[:, None])
        self.t_r = self.t_r + 1
        self.steps += 1
        self.tok_r1 = next_r[:, None]
        finished = []
        done = done_r.nonzero()[:, 0]  # read every step: the one wait for the device when none ends
        if len(done):
            eos_d = is_eos_r[done].long()
            # The rows that ended come to the host in two copies (integers, log-probabilities),
            # not one read per value: a tensor op each, and on a GPU a wait for the device each.
            head_d3 = torch.stack([self.ids_r[done], self.t_r[done] - eos_d, eos_d], 1)
            rows = torch.cat([head_d3, self.out_rT[done]], 1).tolist()
            for (i, n, eos, *out), lp in zip(rows, self.log_prob_r[done].tolist(), strict=True):
                hyp = Hypothesis(out[:n], lp, lp / length_penalty(n + eos, cfg.alpha), bool(eos))
                finished.append((i, hyp))
            self._retire(done_r, len(done))
        return finished

    def drop(self, ids: set[int]) -> None:
        """Rows whose result nobody waits for any more leave the batch."""
        if self.live and ids:
            gone = [i in ids for i in self.ids_r.tolist()]
            gone_r = torch.tensor(gone, dtype=torch.bool, device=self.ids_r.device)
            gone_r &= self.alive_r
            count = int(gone_r.sum())
            if count:
                self._retire(gone_r, count)

    def _retire(self, ended_r: Tensor, count: int) -> None:
        """The `count` live rows `ended_r` are dead; the batch is compacted when too many are."""
        self.alive_r = self.alive_r & ~ended_r
        self.live -= count
        if self.live == 0:  # the next `add` starts afresh
            self.memory = self.cache = None  # type: ignore[assignment]
        elif len(self.alive_r) - self.live > self.compact * len(self.alive_r):
            keep_r = self.alive_r.nonzero()[:, 0]
            self._select(keep_r)
            if self.cache is not None:
                self.cache = self.cache.index_select(keep_r, cross=True)

    def _select(self, keep_r: Tensor) -> None:
        """Keep rows `keep_r` of the row state and memory (the cache is the caller's)."""
        for name in ("ids_r", "limit_r", "t_r", "log_prob_r", "tok_r1", "out_rT", "alive_r"):
            setattr(self, name, getattr(self, name)[keep_r])
        self.memory = self.memory.index_select(keep_r)


def pad_cols(x_RT: Tensor, width: int, value: int) -> Tensor:
    """`x_RT` with columns of `value` appended up to `width` (a search's token buffer when a
    joining row needs more room)."""
    if x_RT.size(1) >= width:
        return x_RT
    return torch.cat([x_RT, x_RT.new_full((x_RT.size(0), width - x_RT.size(1)), value)], 1)
