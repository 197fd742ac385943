"""What an observer of the search sees: one `StepView` per decoding step, built from the
search's own tensors only when someone watches (`on_step`), so the glass box shows the search
of aiayn.search.decode and no copy of it: `single_view` for a greedy or sampling step
(aiayn.search.row_search), `beam_view` for a beam step (aiayn.search.beam).

A beam step's candidates get their fates (live, finished, pruned, and why) from
aiayn.search.beam_candidates, by the rules the search itself follows;
tests/search/test_step_view.py checks the two agree.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch
from torch import Tensor

from aiayn.config import DecodeConfig
from aiayn.search.beam_candidates import TopK, candidate_fates, ending_candidates
from aiayn.search.hypothesis import Hypothesis, length_penalty


@dataclass(frozen=True)
class LiveHyp:
    """A hypothesis entering a step: row r of the step's `logits_RV` extends it."""

    sent: int  # index of its sentence in the searched `src_BS`
    tokens: tuple[int, ...]  # without BOS
    log_prob: float
    score: float  # log_prob / length_penalty(len(tokens), alpha, form)


@dataclass(frozen=True)
class Candidate:
    """One extension the search considered, and what became of it.

    fate / why:  live: "argmax" (greedy), "sampled", "beam slot k of N"
                 finished: "eos", "length limit"
                 pruned: "beam full" (N better non-EOS extensions), "eos below the N best",
                 "N already finished", "early termination" (the sentence ended this step),
                 "length limit" (below the N best at the limit), "impossible" (probability 0)
    """

    sent: int
    rank: int  # 1 = highest total log-probability among its sentence's candidates this step
    parent: int  # index in StepView.live of the hypothesis it extends
    token: int
    log_prob: float  # total log-probability of the extended hypothesis
    score: float  # log_prob / length_penalty(length with this token, alpha, form)
    fate: str  # "live" | "finished" | "pruned"
    why: str


@dataclass(frozen=True)
class Finished:
    """A hypothesis that ended at this step ("eos" or "length limit")."""

    sent: int
    hyp: Hypothesis
    why: str


@dataclass(frozen=True)
class StepView:
    """Decoding step t as the search saw it (passed to `on_step`; built only when observed).

    `logits_RV` are the model's outputs for the live rows; `log_probs_RV` what the search ranks
    (log-softmax, PAD/BOS and early EOS set to -inf; before temperature and top-k/top-p).
    `done` lists the sentences finished after this step: (sent, "eos" | "length limit" |
    "beam full"), "beam full" being early termination once N hypotheses have ended.
    """

    search: str  # "greedy" | "sample" | "beam"
    t: int
    live: tuple[LiveHyp, ...]
    logits_RV: Tensor
    log_probs_RV: Tensor
    candidates: tuple[Candidate, ...]
    finished: tuple[Finished, ...]
    done: tuple[tuple[int, str], ...]


OnStep = Callable[[StepView], None]


@dataclass(frozen=True)
class SingleRows:
    """The live rows of a one-hypothesis-per-row search before a step (for `single_view`)."""

    rows_r: Tensor  # original row of each live row
    prefix_rt: Tensor  # tokens so far
    log_prob_r: Tensor  # float64
    per_sent: int  # rows per sentence (nbest samples)


def single_view(
    kind: str,
    t: int,
    cfg: DecodeConfig,
    before: SingleRows,
    logits_rV: Tensor,
    lp_rV: Tensor,
    picked: tuple[Tensor, Tensor, Tensor, Tensor],
) -> StepView:
    """The StepView of greedy or sampling step t: one candidate per row, the token picked.

    `picked` is (next token, its log-probability, ended with EOS, done) per live row.
    """
    next_r, lp_r, is_eos_r, done_r = picked
    sent_r = [r // before.per_sent for r in before.rows_r.tolist()]
    live = tuple(
        LiveHyp(s, tuple(p), lp, lp / length_penalty(t, cfg.alpha, cfg.length_penalty))
        for s, p, lp in zip(
            sent_r, before.prefix_rt.tolist(), before.log_prob_r.tolist(), strict=True
        )
    )
    totals = (before.log_prob_r + lp_r.double()).tolist()  # summed as the search sums them
    lp_t = length_penalty(t + 1, cfg.alpha, cfg.length_penalty)
    cands, finished = [], []
    rows = zip(next_r.tolist(), totals, is_eos_r.tolist(), done_r.tolist(), strict=True)
    picked_why = "argmax" if kind == "greedy" else "sampled"
    for i, (tok, total, eos, done) in enumerate(rows):
        why = "eos" if eos else "length limit" if done else picked_why
        cands.append(
            Candidate(
                sent_r[i], 1, i, tok, total, total / lp_t, "finished" if done else "live", why
            )
        )
        if done:
            tokens = list(live[i].tokens) + ([] if eos else [tok])
            finished.append(Finished(sent_r[i], Hypothesis(tokens, total, total / lp_t, eos), why))
    still = {s for s, d in zip(sent_r, done_r.tolist(), strict=True) if not d}
    done = {f.sent: f.why for f in finished if f.sent not in still}  # its last row ended
    return StepView(
        kind, t, live, logits_rV, lp_rV, tuple(cands), tuple(finished), tuple(done.items())
    )


@dataclass(frozen=True)
class BeamState:
    """What `beam_view` reads of a beam step besides its candidates."""

    sents: list[int]
    tokens_rT: Tensor  # BOS, then the live hypotheses' tokens
    scores_bn: Tensor  # their total log-probabilities, before the step
    ended: Mapping[int, list[Hypothesis]]  # by sentence, after the step
    before: list[int]  # how many had ended per live sentence before the step
    last: list[bool]  # which sentences are at their length limit
    done: list[bool]


def beam_view(
    t: int,
    cfg: DecodeConfig,
    st: BeamState,
    logits_rV: Tensor,
    lp_rV: Tensor,
    top: TopK,
    alive_bN: Tensor,
) -> StepView:
    """The StepView of beam step t: the 2N candidates of every sentence and their fates."""
    N, alpha, form = cfg.beam_size, cfg.alpha, cfg.length_penalty
    n = st.scores_bn.size(1)
    live = tuple(
        LiveHyp(st.sents[r // n], tuple(toks), lp, lp / length_penalty(t, alpha, form))
        for r, (toks, lp) in enumerate(
            zip(st.tokens_rT[:, 1 : t + 1].tolist(), st.scores_bn.view(-1).tolist(), strict=True)
        )
    )
    last_b = torch.tensor(st.last, dtype=torch.bool, device=alive_bN.device)
    ends, alive = ending_candidates(top, last_b, N).tolist(), alive_bN.tolist()
    scores, beams, toks, eos = (x.tolist() for x in top)
    lp_t = length_penalty(t + 1, alpha, form)
    cands: list[Candidate] = []
    finished: list[Finished] = []
    for i, s in enumerate(st.sents):
        new = st.ended[s][st.before[i] :]
        finished += [Finished(s, h, "eos" if h.eos else "length limit") for h in new]
        fates = candidate_fates(
            ends[i], alive[i], eos[i], scores[i], len(new), st.last[i], st.done[i], N
        )
        for j, (fate, why) in enumerate(fates):
            lp = scores[i][j]
            cands.append(
                Candidate(s, j + 1, i * n + beams[i][j], toks[i][j], lp, lp / lp_t, fate, why)
            )
    done = tuple(
        (s, "length limit" if st.last[i] else "beam full")
        for i, s in enumerate(st.sents)
        if st.done[i]
    )
    return StepView("beam", t, live, logits_rV, lp_rV, tuple(cands), tuple(finished), done)
