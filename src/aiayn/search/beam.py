"""Beam search (§6.1) as a steppable object, `BeamSearch`: sentences may join while it runs,
which is what a server's continuous batching needs (aiayn.serve.streams); aiayn.search.decode
runs it whole for `beam_search`.

Dimension key as in aiayn.search.decode: b live sentences, n rows (beams) per sentence (1 at
a fresh batch's first step, then N), R = b * n rows, C = 2N candidates, V vocabulary, W the
width of the token buffer (BOS, then each hypothesis's tokens).
"""

from __future__ import annotations

import torch
from torch import Tensor

from aiayn.config import DecodeConfig, check_decode_config
from aiayn.search.beam_candidates import TopK, ending_candidates
from aiayn.search.hypothesis import Hypothesis, length_penalty
from aiayn.search.slots import join_caches, join_memories, pad_cols
from aiayn.search.step import (
    Decodable,
    check_stop,
    encode_parts,
    first_tokens,
    forbid,
    output_limits,
)
from aiayn.search.step_view import BeamState, OnStep, beam_view


class BeamSearch:
    """Every live sentence's N beams in one (b * N)-row batch, a step at a time.

    Each step scores all N * V extensions of a sentence's beams by cumulative log-probability
    and takes the 2N best. An EOS among the N best ends a hypothesis, which is set aside with
    its length-penalised score and never extended; the N best non-EOS extensions stay alive.
    A sentence is done (early termination, as in fairseq) once N hypotheses have ended, or when
    its beams reach its length limit, where the N best candidates end as they are. Done
    sentences leave the batch at once.

    `add(*parts)` encodes sentences and gives them ids (0, 1, ... in order of arrival);
    `step()` returns the (id, `cfg.nbest` best hypotheses) of each sentence done at that step;
    `drop(ids)` removes sentences nobody waits for. A fresh batch's first step feeds only BOS,
    the same for every beam, so it runs on one row per sentence whose N best tokens then fan
    out into N beams. A sentence that joins a running search (continuous batching) comes in
    with N rows at the cache's current column (`KVCache.join`), beam 0 at score 0 and the
    others at -inf: its first step's 2N best are then beam 0's, the candidates the fan-out
    would take, and it gets the hypotheses it gets alone, up to rounding. Each sentence keeps
    its own step, so its limits, `min_len` and length penalty are its own.
    Observing (`on_step`) needs every sentence at the same step: no joins.
    """

    def __init__(self, model: Decodable, cfg: DecodeConfig, *, on_step: OnStep | None = None):
        check_decode_config(cfg, model.cfg.vocab_size)
        self.model, self.cfg, self.on_step, self.N = model, cfg, on_step, cfg.beam_size
        self.steps = 0  # steps taken by this search (sentences that joined late took fewer)
        self.next_id = 0
        self.sents: list[int] = []  # id of each live sentence, in row order
        self.ended: dict[int, list[Hypothesis]] = {}  # by id: hypotheses set aside so far
        self.n = 1

    @property
    def live(self) -> int:
        """Rows the live sentences hold (N each, counted from their admission)."""
        return len(self.sents) * self.N

    tokens_rT: Tensor  # BOS, then the row's tokens (PAD beyond its sentence's step)
    scores_bn: Tensor  # total log-probability of each live beam
    t_b: Tensor  # each sentence's step: tokens its beams have
    limit_b: Tensor  # its output-length limit

    def add(self, *parts: Tensor) -> list[int]:
        """Encode the sentences of `parts` (right-padded ids, each part one encoder batch:
        `encode_parts`) and let them take part from the next step, in that order."""
        parts = tuple(p for p in parts if p.size(0))
        if not parts:
            return []
        special, N = self.model.cfg, self.N
        memory = encode_parts(self.model, parts)
        device, b = memory.keep_BS.device, memory.keep_BS.size(0)
        limit_b = output_limits(self.model, memory, self.cfg)
        ids = list(range(self.next_id, self.next_id + b))
        self.next_id += b
        self.ended.update({i: [] for i in ids})
        T = int(limit_b.max())
        if not self.sents:  # a fresh batch: the paper's search, every sentence at step 0
            self.cache = self.model.init_cache(memory, T)
            self.memory = memory.mask_only()  # a step with a filled cache reads only the mask
            self.tokens_rT = _bos_rows(device, b, T + 1, special.bos_id, special.pad_id)
            self.tokens_rT[:, :1] = first_tokens(self.model, memory)  # BOS, or a prompt's end
            self.scores_bn = torch.zeros(b, 1, device=device)
            self.t_b = torch.zeros(b, dtype=torch.long, device=device)
            self.limit_b, self.sents, self.n = limit_b, ids, 1
            return ids
        if self.on_step is not None:
            raise ValueError("sentences can join a running beam search only unobserved")
        if hasattr(self.model, "first_tokens"):  # its prompt's K/V fill the first columns
            raise ValueError("a decoder-only model's prompts cannot join a running search")
        if self.n == 1:  # the running sentences have not fanned out yet
            self._reorder(torch.arange(len(self.sents), device=device).repeat_interleave(N))
            self.scores_bn = _first_beam(self.scores_bn[:, :1], N)
            self.n = N
        rep_r = torch.arange(b, device=device).repeat_interleave(N)
        # Only the fresh cache's cross K/V are taken; copied per beam, not recomputed.
        fresh = self.model.init_cache(memory, 1).index_select(rep_r, cross=True)
        self.cache = join_caches(self.cache, fresh, T)
        self.memory = join_memories(self.memory, memory.mask_only().index_select(rep_r))
        width = max(self.tokens_rT.size(1), T + 1)
        self.tokens_rT = torch.cat(
            [
                pad_cols(self.tokens_rT, width, special.pad_id),
                _bos_rows(device, b * N, width, special.bos_id, special.pad_id),
            ]
        )
        self.scores_bn = torch.cat([self.scores_bn, _first_beam(self.scores_bn.new_zeros(b, 1), N)])
        self.t_b = torch.cat([self.t_b, torch.zeros(b, dtype=torch.long, device=device)])
        self.limit_b = torch.cat([self.limit_b, limit_b])
        self.sents = self.sents + ids
        return ids

    def step(self) -> list[tuple[int, list[Hypothesis]]]:
        """One token for every live beam; (id, best hypotheses) of each sentence done."""
        if not self.sents:
            return []
        model, cfg, special, N = self.model, self.cfg, self.model.cfg, self.N
        t = self.steps
        check_stop(t)
        b, n = self.scores_bn.shape
        device = self.t_b.device
        t_r = self.t_b.repeat_interleave(n)
        last_r1 = self.tokens_rT.gather(1, t_r[:, None])
        logits_rV, self.cache = model.decode_step(last_r1, self.memory, self.cache)
        lp_rV = logits_rV.float().log_softmax(-1)
        forbid(lp_rV, special, t_r < cfg.min_len)
        V = lp_rV.size(-1)
        cand_bnV = self.scores_bn[:, :, None] + lp_rV.view(b, n, V)
        top_bC, idx_bC = cand_bnV.view(b, n * V).topk(min(2 * N, n * V), dim=-1)  # C = 2N
        tok_bC = idx_bC % V
        top = TopK(top_bC, idx_bC // V, tok_bC, tok_bC == special.eos_id)
        last_b = self.t_b + 1 >= self.limit_b
        last = last_b.tolist()
        before = None if self.on_step is None else [len(self.ended[s]) for s in self.sents]
        done = self._set_aside(last_b, last, top)
        # The N best non-EOS candidates stay alive (a stable sort keeps their score order).
        alive_bN = top.is_eos_bC.sort(dim=1, stable=True).indices[:, :N]
        if self.on_step is not None and before is not None:
            state = BeamState(
                self.sents, self.tokens_rT, self.scores_bn, self.ended, before, last, done
            )
            self.on_step(beam_view(t, cfg, state, logits_rV, lp_rV, top, alive_bN))
        self.steps += 1
        finished = [(s, self._best(s)) for s, d in zip(self.sents, done, strict=True) if d]
        self.scores_bn = top_bC.gather(1, alive_bN)
        parent_bN = top.beam_bC.gather(1, alive_bN) + torch.arange(b, device=device)[:, None] * n
        parent_r, next_r = parent_bN.view(-1), tok_bC.gather(1, alive_bN).view(-1)
        self.t_b = self.t_b + 1
        if finished:  # done sentences leave the batch
            keep = [i for i in range(b) if not done[i]]
            keep_b = torch.tensor(keep, dtype=torch.long, device=device)
            self.sents = [s for s, d in zip(self.sents, done, strict=True) if not d]
            if not self.sents:
                self._close()
                return finished
            keep_r = (keep_b[:, None] * N + torch.arange(N, device=device)).view(-1)
            parent_r, next_r = parent_r[keep_r], next_r[keep_r]
            self.scores_bn, self.t_b = self.scores_bn[keep_b], self.t_b[keep_b]
            self.limit_b = self.limit_b[keep_b]
        # Beams only move within their sentence unless rows left or fanned out: then the
        # cross-attention K/V (the same for a sentence's beams) stay where they are.
        self._reorder(parent_r, cross=bool(finished) or n != N)
        self.tokens_rT.scatter_(1, self.t_b.repeat_interleave(N)[:, None], next_r[:, None])
        self.n = N
        return finished

    def drop(self, ids: set[int]) -> None:
        """Sentences whose result nobody waits for any more leave the batch."""
        gone = [s in ids for s in self.sents]
        if not any(gone):
            return
        for s in (s for s, g in zip(self.sents, gone, strict=True) if g):
            del self.ended[s]
        keep = [i for i, g in enumerate(gone) if not g]
        self.sents = [self.sents[i] for i in keep]
        if not self.sents:
            self._close()
            return
        device = self.t_b.device
        keep_b = torch.tensor(keep, dtype=torch.long, device=device)
        keep_r = (keep_b[:, None] * self.n + torch.arange(self.n, device=device)).view(-1)
        self.scores_bn, self.t_b = self.scores_bn[keep_b], self.t_b[keep_b]
        self.limit_b = self.limit_b[keep_b]
        self._reorder(keep_r)

    def _reorder(self, rows_r: Tensor, *, cross: bool = True) -> None:
        """Rows `rows_r` of the token buffer, memory and cache, in that order."""
        self.tokens_rT = self.tokens_rT.index_select(0, rows_r)
        if cross:
            self.memory = self.memory.index_select(rows_r)
        self.cache = self.cache.index_select(rows_r, cross=cross)

    def _close(self) -> None:
        """No sentence left: the next `add` starts afresh."""
        self.memory = self.cache = None  # type: ignore[assignment]
        self.n = 1

    def _best(self, s: int) -> list[Hypothesis]:
        return sorted(self.ended.pop(s), key=lambda h: -h.score)[: self.cfg.nbest]

    def _set_aside(self, last_b: Tensor, last: list[bool], top: TopK) -> list[bool]:
        """Move the hypotheses that end at this step into `ended`; return which sentences are
        done. A sentence keeps at most N ended hypotheses (the first N, in score order within a
        step)."""
        N = self.N
        for i, hyp in self.ending(last_b, top):
            ended = self.ended[self.sents[i]]
            if len(ended) < N:
                ended.append(hyp)
        return [last[i] or len(self.ended[s]) >= N for i, s in enumerate(self.sents)]

    def ending(self, last_b: Tensor, top: TopK) -> list[tuple[int, Hypothesis]]:
        """(sentence index, hypothesis) of every candidate that ends at this step, in order.
        Many may end in one step (an EOS among a sentence's 2N best is common), so their
        fields come to the host in three copies, not one read per value (a tensor op each, and
        on a GPU a wait for the device each: ~100 at a step where 25-30 hypotheses end)."""
        alpha, form, n = self.cfg.alpha, self.cfg.length_penalty, self.scores_bn.size(1)
        at_e2 = ending_candidates(top, last_b, self.N).nonzero()  # (sentence, candidate)
        if not len(at_e2):
            return []
        i_e, j_e = at_e2.unbind(1)
        beam_e, tok_e = top.beam_bC[i_e, j_e], top.tok_bC[i_e, j_e]
        fields = torch.stack([i_e, top.is_eos_bC[i_e, j_e].long(), tok_e, self.t_b[i_e]], 1)
        rows = self.tokens_rT.index_select(0, i_e * n + beam_e).tolist()
        scores = top.scores_bC[i_e, j_e].tolist()
        out = []
        for (i, eos, tok, t), row, lp in zip(fields.tolist(), rows, scores, strict=True):
            toks = row[1 : t + 1] if eos else [*row[1 : t + 1], tok]
            score = lp / length_penalty(t + 1, alpha, form)
            out.append((i, Hypothesis(toks, lp, score, bool(eos))))
        return out


def run_whole(search: BeamSearch, src_BS: Tensor) -> list[list[Hypothesis]]:
    """The classic batched search: every sentence of `src_BS` from step 0 to its end."""
    ids = search.add(src_BS)
    found: dict[int, list[Hypothesis]] = {}
    while search.sents:
        found.update(search.step())
    return [found[i] for i in ids]


def _bos_rows(device: torch.device, rows: int, width: int, bos_id: int, pad_id: int) -> Tensor:
    out = torch.full((rows, width), pad_id, device=device)
    out[:, 0] = bos_id
    return out


def _first_beam(scores_b1: Tensor, N: int) -> Tensor:
    """(b, N) scores of sentences entering with N rows: beam 0 as it was, the others -inf, so
    the first step's candidates are beam 0's alone (as if it had fanned out)."""
    out_bN = scores_b1.new_full((scores_b1.size(0), N), float("-inf"))
    out_bN[:, :1] = scores_b1
    return out_bN
