"""The one-hypothesis-per-row search (greedy, sampling) as a steppable object, `RowSearch`:
rows may join while it runs, which is what a server's continuous batching needs
(aiayn.serve.streams); aiayn.search.decode runs it whole for `greedy_search` and
`sample_search`.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from aiayn.config import DecodeConfig, check_decode_config
from aiayn.nn.kv_cache import Memory
from aiayn.search.hypothesis import Hypothesis, length_penalty
from aiayn.search.slots import SlotCache, join_memories, pad_cols
from aiayn.search.step import Decodable, check_stop, first_tokens, forbid, output_limits
from aiayn.search.step_view import OnStep, SingleRows, single_view

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
    hypotheses. Finished rows leave the batch at once, so late steps only pay for sentences
    still being written; `drop(ids)` removes rows nobody waits for. The cache is kept in slots
    (`SlotCache`): a row that leaves costs a copy of one row (the last row moves into its
    place, so the rows' order changes; each keeps its id), and rows added while others run
    (continuous batching: a server admits new sentences at every step) write into free slots
    from the current column on: each row keeps its own step, position and limits, and gets the
    hypothesis it gets alone, up to rounding.
    Observing (`on_step`) and `use_cache=False` need every row at the same step: no joins.
    Rows whose ids are r * per_sent .. (r + 1) * per_sent - 1 are one sentence's (for the
    observer).
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
    ) -> None:
        check_decode_config(cfg)
        self.model, self.cfg, self.pick = model, cfg, pick
        self.use_cache, self.on_step, self.kind, self.per_sent = use_cache, on_step, kind, per_sent
        self.steps = 0  # steps taken by this search (rows that joined late have taken fewer)
        self.next_id = 0
        self.live = 0  # rows being written
        self.slots: SlotCache | None = None  # with the cache
        self.memory: Memory | None = None  # without it: the encoder output, recomputed over

    def add(self, *parts: Tensor) -> list[int]:
        """Encode the rows of `parts` (right-padded ids, each part one encoder batch: parts of
        similar lengths spare the encoder padding) and let them take part from the next step,
        in that order."""
        parts = tuple(p for p in parts if p.size(0))
        if not parts:
            return []
        model, special = self.model, self.model.cfg
        if self.live and (self.on_step is not None or not self.use_cache):
            raise ValueError("rows can join a running search only with the cache, unobserved")
        if hasattr(model, "first_tokens") and self.use_cache and (self.live or len(parts) > 1):
            # a prompt's K/V fill the columns before the first step: prompts start together
            raise ValueError("a decoder-only model's prompts cannot join a running search")
        memories = [model.encode(src_BS) for src_BS in parts]
        limit_b = torch.cat([output_limits(model, m, self.cfg) for m in memories])
        device, b = limit_b.device, len(limit_b)
        first, self.next_id = self.next_id, self.next_id + b
        state = {
            "ids_r": torch.arange(first, self.next_id, device=device),
            "limit_r": limit_b,
            "t_r": torch.zeros(b, dtype=torch.long, device=device),
            "log_prob_r": torch.zeros(b, dtype=torch.float64, device=device),
            "tok_r1": torch.cat([first_tokens(model, m) for m in memories]),
        }
        state["first_r1"] = state["tok_r1"]
        T = int(limit_b.max())
        joining = memories
        if not self.use_cache:
            self.memory = memories[0] if len(memories) == 1 else join_memories(*memories)
            joining = []
        elif self.live == 0:  # a fresh batch: the paper's search, every row at step 0
            self.slots = SlotCache.of(model.init_cache(memories[0], T), memories[0].keep_BS)
            joining = memories[1:]
        if joining:  # into free slots: only their cross K/V are computed here
            assert self.slots is not None
            fresh = [model.init_cache(m, 0) for m in joining]
            self.slots.reserve(
                sum(m.keep_BS.size(0) for m in joining),
                T,
                max(c.cross_k[0].size(2) for c in fresh),
                max(m.keep_BS.size(1) for m in joining),
            )
            for cache, m in zip(fresh, joining, strict=True):
                self.slots.add(cache, m.keep_BS)
        if self.live == 0:
            self.out_rT = torch.full((b, T), special.pad_id, device=device)
            self.__dict__.update(state)
        else:
            width = max(self.out_rT.size(1), T)
            self.out_rT = torch.cat(
                [
                    pad_cols(self.out_rT, width, special.pad_id),
                    torch.full((b, width), special.pad_id, device=device),
                ]
            )
            for name, value in state.items():
                setattr(self, name, torch.cat([getattr(self, name), value]))
        self.live += b
        return list(range(first, self.next_id))

    ids_r: Tensor  # each live row's id
    limit_r: Tensor  # its output-length limit
    t_r: Tensor  # its step: tokens it has so far
    log_prob_r: Tensor  # float64
    tok_r1: Tensor  # its last token (before its first step: `first_tokens`, e.g. BOS)
    first_r1: Tensor  # what its first step fed
    out_rT: Tensor  # its tokens (PAD beyond t_r)

    def step(self) -> list[tuple[int, Hypothesis]]:
        """One token for every live row; the (id, hypothesis) of each row that finished."""
        if not self.live:  # every row ended or was dropped
            return []
        model, cfg, special = self.model, self.cfg, self.model.cfg
        t = self.steps
        check_stop(t)
        if self.slots is not None:
            cache, keep_rS = self.slots.view()
            no_out = keep_rS.new_empty(*keep_rS.shape, 0, dtype=torch.float)  # not read
            logits_rV, _ = model.decode_step(self.tok_r1, Memory(no_out, keep_rS), cache)
            self.slots.advance()
        else:  # recompute the whole prefix (the benchmark's and tests' reference)
            assert self.memory is not None
            prefix_rt = torch.cat([self.first_r1, self.out_rT[:, :t]], 1)
            fresh = model.init_cache(self.memory, t + 1)
            logits_rV, _ = model.decode_step(prefix_rt, self.memory, fresh)
        lp_rV = logits_rV.float().log_softmax(-1)  # one fused pass (cheaper than logsumexp)
        forbid(lp_rV, special, self.t_r < cfg.min_len)
        next_r, lp_r = self.pick(lp_rV, self.ids_r, self.t_r)
        is_eos_r = next_r == special.eos_id
        done_r = is_eos_r | (self.t_r + 1 >= self.limit_r)
        if self.on_step is not None:
            before = SingleRows(self.ids_r, self.out_rT[:, :t], self.log_prob_r, self.per_sent)
            picked = (next_r, lp_r, is_eos_r, done_r)
            self.on_step(single_view(self.kind, t, cfg, before, logits_rV, lp_rV, picked))
        self.log_prob_r += lp_r.double()
        self.out_rT.scatter_(1, self.t_r[:, None], next_r[:, None])  # t_r < limit_r <= width
        self.t_r = self.t_r + 1
        self.steps += 1
        self.tok_r1 = next_r[:, None]
        finished = []
        done = done_r.nonzero()[:, 0]  # read every step: the one wait for the device when none ends
        if len(done):
            eos_d = is_eos_r[done].long()
            # The rows that ended come to the host in two copies (integers, log-probabilities),
            # not one read per value: a tensor op each, and on a GPU a wait for the device each.
            head_d4 = torch.stack([done, self.ids_r[done], self.t_r[done] - eos_d, eos_d], 1)
            rows = torch.cat([head_d4, self.out_rT[done]], 1).tolist()
            for (_, i, n, eos, *out), lp in zip(rows, self.log_prob_r[done].tolist(), strict=True):
                score = lp / length_penalty(n + eos, cfg.alpha, cfg.length_penalty)
                hyp = Hypothesis(out[:n], lp, score, bool(eos))
                finished.append((i, hyp))
            self._remove([row[0] for row in rows])
        return finished

    def drop(self, ids: set[int]) -> None:
        """Rows whose result nobody waits for any more leave the batch."""
        if self.live and ids:
            dead = [r for r, i in enumerate(self.ids_r.tolist()) if i in ids]
            if dead:
                self._remove(dead)

    def _remove(self, dead: list[int]) -> None:
        """Live rows `dead` (their places in the batch) leave it."""
        self.live -= len(dead)
        if self.live == 0:  # the next `add` starts afresh
            self.slots = self.memory = None
            return
        if self.slots is not None:
            order = self.slots.remove(dead, keep_order=self.on_step is not None)
        else:
            gone = set(dead)
            order = [r for r in range(self.live + len(dead)) if r not in gone]
        keep_r = torch.tensor(order, device=self.ids_r.device)
        for name in ("ids_r", "limit_r", "t_r", "log_prob_r", "tok_r1", "first_r1", "out_rT"):
            setattr(self, name, getattr(self, name)[keep_r])
        if self.memory is not None:
            self.memory = self.memory.index_select(keep_r)
