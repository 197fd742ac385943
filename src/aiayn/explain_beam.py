"""Beam search, step by step and out loud: which hypotheses lived, finished or were pruned, and why.

`aiayn.decode.beam_search` is batched and has no per-step hook, so `aiayn explain --beam N`
runs this one-sentence beam search instead. It follows decode.py's rules exactly (a test checks
that both return the same hypotheses and scores), written plainly so each decision can be
recorded. Every live hypothesis is extended by every token; the 2N best extensions by total
log-probability are examined in order:
- an extension ending in </s> among the N best finishes (if fewer than N have finished),
  scored with the GNMT length penalty; ranked below the N best, it is dropped;
- the N best extensions not ending in </s> stay live; the rest are pruned;
- at the length limit, the N best extensions finish as they are.
The search stops once N hypotheses have finished, or at the length limit (fairseq's early
termination). PAD and BOS are never emitted; </s> not before `min_len` tokens.

Dimension key: N live hypotheses (beam), V vocabulary.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from aiayn.config import BOS_ID, EOS_ID, PAD_ID
from aiayn.decode import length_penalty
from aiayn.errors import AiaynError
from aiayn.explain import _check, max_steps_for, source_ids
from aiayn.model import Transformer
from aiayn.tokenizer import Tokenizer


@dataclass
class Candidate:
    """One extension of a live hypothesis by one token, as the search saw it."""

    rank: int  # 1 = highest total log-probability among this step's candidates
    parent: int  # index of the extended hypothesis in the step's `live` list
    token: int
    piece: str
    logprob: float  # total log-probability of the extended hypothesis
    score: float  # logprob / lp(length): what finished hypotheses are ranked by
    status: str  # "live" | "finished" | "pruned"
    reason: str


@dataclass
class Hypothesis:
    tokens: list[int]  # generated tokens, without BOS and EOS (as in aiayn.decode)
    pieces: list[str]
    logprob: float
    score: float
    eos: bool = False
    reason: str = ""

    def text(self) -> str:
        return " ".join(self.pieces + (["</s>"] if self.eos else [])) or "<s>"


@dataclass
class BeamStep:
    t: int
    live: list[Hypothesis]  # hypotheses entering the step
    candidates: list[Candidate]


@dataclass
class BeamTrace:
    beam_size: int
    alpha: float
    max_len: int
    steps: list[BeamStep] = field(default_factory=list)
    finished: list[Hypothesis] = field(default_factory=list)
    stop_reason: str = ""

    @property
    def best(self) -> Hypothesis:
        return max(self.finished, key=lambda h: h.score)


@torch.no_grad()
def trace_beam(
    model: Transformer,
    tok: Tokenizer,
    sentence: str,
    *,
    beam_size: int = 4,
    alpha: float = 0.6,
    max_len: int | None = None,
    min_len: int = 0,
) -> BeamTrace:
    """Run beam search on one sentence and record every decision.

    Args:
        max_len: most output tokens (default: source length + 50, as in `aiayn.decode`).
    Returns:
        A `BeamTrace`; `.best` is what beam search outputs (the highest score).
    """
    if beam_size < 1:
        raise AiaynError(f"beam size must be at least 1, got {beam_size}")
    model = _check(model, tok)
    model.eval()
    ids = source_ids(model, tok, sentence)
    n_steps = max_steps_for(model, len(ids), max_len)
    out = BeamTrace(beam_size, alpha, n_steps)
    N = beam_size
    dev = next(model.parameters()).device  # everything the search makes lives with the model
    memory = model.encode(torch.tensor([ids], device=dev))
    cache = model.init_cache(memory, capacity=n_steps)
    live = [Hypothesis([], [], 0.0, 0.0)]
    rows = memory  # one memory row per live hypothesis
    for t in range(n_steps):
        last_N1 = torch.tensor([[h.tokens[-1] if h.tokens else BOS_ID] for h in live], device=dev)
        logits_NV, cache = model.decode_step(last_N1, rows, cache)
        logp_NV = torch.log_softmax(logits_NV.float(), dim=-1).cpu()
        logp_NV[:, [PAD_ID, BOS_ID]] = float("-inf")  # never emitted
        if t < min_len:
            logp_NV[:, EOS_ID] = float("-inf")
        total_NV = torch.tensor([h.logprob for h in live])[:, None] + logp_NV
        V = total_NV.size(1)
        best_k, flat_k = total_NV.view(-1).topk(min(2 * N, total_NV.numel()))
        step = BeamStep(t, live, [])
        kept: list[tuple[int, Hypothesis]] = []
        last_step = t + 1 == n_steps
        for rank, (lp, flat) in enumerate(zip(best_k.tolist(), flat_k.tolist(), strict=True)):
            parent, token = divmod(flat, V)
            eos = token == EOS_ID
            piece = tok.pieces([token])[0]
            toks = live[parent].tokens + ([] if eos else [token])
            hyp = Hypothesis(
                toks,
                live[parent].pieces + ([] if eos else [piece]),
                lp,
                lp / length_penalty(t + 1, alpha),
                eos,
            )
            status, why = _decide(rank, eos, lp, len(kept), len(out.finished), N, last_step)
            if status == "finished":
                hyp.reason = why
                out.finished.append(hyp)
            elif status == "live":
                kept.append((parent, hyp))
            step.candidates.append(
                Candidate(rank + 1, parent, token, piece, lp, hyp.score, status, why)
            )
        out.steps.append(step)
        if last_step:
            out.stop_reason = f"length limit of {n_steps} output tokens reached at step {t}"
            break
        if len(out.finished) >= N:
            out.stop_reason = f"{N} hypotheses finished (= the beam size) by step {t}"
            break
        cache = cache.index_select(torch.tensor([p for p, _ in kept], device=dev))  # survivors
        rows = memory.index_select(torch.zeros(len(kept), dtype=torch.long, device=dev))
        live = [h for _, h in kept]
    return out


def _decide(
    rank: int, eos: bool, lp: float, n_live: int, n_done: int, beam: int, last: bool
) -> tuple[str, str]:
    """The fate of the candidate of 0-based `rank` (by total log-probability) in its step."""
    if lp == float("-inf"):
        return "pruned", "impossible (probability 0)"
    if (eos or last) and rank < beam:
        if n_done >= beam:
            return "pruned", f"{beam} hypotheses have already finished"
        if eos:
            return "finished", "ends in </s> among the N best: final, ranked by score"
        return "finished", "length limit: among the N best, ends here without </s>"
    if eos:
        return "pruned", "ends in </s> but ranks below the N best: dropped"
    if last:
        return "pruned", "length limit: ranks below the N best"
    if n_live < beam:
        return "live", f"kept: beam slot {n_live + 1} of {beam}"
    return "pruned", f"beam full: {beam} extensions with higher log-probability took the slots"
