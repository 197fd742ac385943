"""A beam step's candidates, by the rules aiayn.search.beam follows: the 2N best of each
sentence (`TopK`), which of them end at this step (`ending_candidates`, which the search itself
uses) and what became of every one (`candidate_fates`: live, finished or pruned, and why, for
the observer's `StepView`).
"""

from __future__ import annotations

from typing import NamedTuple

from torch import Tensor


class TopK(NamedTuple):
    """A beam step's 2N best candidates per live sentence (b sentences, C = 2N)."""

    scores_bC: Tensor  # total log-probability
    beam_bC: Tensor  # the beam (0..n-1) each extends
    tok_bC: Tensor
    is_eos_bC: Tensor


def ending_candidates(top: TopK, last_b: Tensor, N: int) -> Tensor:
    """Which candidates end this step: EOS among the N best, or any of the N best at the
    length limit (`last_b`: which sentences are there); never one with probability 0."""
    ends_bC = top.is_eos_bC.clone()
    ends_bC[:, N:] = False
    ends_bC[:, :N] |= last_b[:, None]
    return ends_bC & (top.scores_bC > float("-inf"))


def candidate_fates(
    ends: list[bool],
    alive: list[int],
    eos: list[bool],
    scores: list[float],
    n_new: int,
    last: bool,
    done: bool,
    N: int,
) -> list[tuple[str, str]]:
    """(fate, why) of one sentence's candidates, best first, as `_beam_search` decides them."""
    slot = {j: k for k, j in enumerate(alive)}
    out, taken = [], 0
    for j, (end, is_eos, lp) in enumerate(zip(ends, eos, scores, strict=True)):
        if end:  # ends, unless N hypotheses have ended already
            why = "eos" if is_eos else "length limit"
            out.append(("finished", why) if taken < n_new else ("pruned", "N already finished"))
            taken += 1
        elif j in slot and not done:
            out.append(("live", f"beam slot {slot[j] + 1} of {N}"))
        elif lp == float("-inf"):
            out.append(("pruned", "impossible"))
        elif j in slot:  # alive, but its sentence is done
            out.append(("pruned", "length limit" if last else "early termination"))
        elif is_eos:
            out.append(("pruned", "eos below the N best"))
        else:
            out.append(("pruned", "length limit" if last else "beam full"))
    return out
