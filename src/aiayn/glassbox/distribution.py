"""The next-token distribution of a language model, and how sampling reshapes it.

`next_token_distribution(logits_V, temperature=0.8, top_k=40, top_p=0.9)` follows the search's
own sampling step (`aiayn.search.decode.sample_search`): the tokens the search never emits
(PAD, BOS) are removed, the logits are divided by the temperature, then the top-k and top-p
filters of `aiayn.search.sampling` keep a set of tokens, and the softmax over that set is what
a sample is drawn from. What is shown is that very computation, not a copy of its rules.

    p_i       = softmax(logits)_i                       the model's own distribution
    p_i(T)    = softmax(logits / T)_i                   T < 1 sharpens it, T > 1 flattens it
    kept      = top_p(top_k(logits / T))                the k best, then the smallest best set
                                                        whose mass reaches p (the best always)
    q_i       = p_i(T) / sum_{j in kept} p_j(T)         renormalised over the kept set
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from aiayn.errors import ConfigError
from aiayn.search.sampling import top_k_filter, top_p_filter


@dataclass(frozen=True)
class TokenProb:
    """One token of the vocabulary under the three views of the distribution."""

    id: int
    piece: str
    prob: float  # softmax(logits): the model's own probability
    prob_t: float  # softmax(logits / temperature)
    kept: bool  # survives top-k and top-p
    renorm: float  # what sampling draws it with (0 when not kept)


@dataclass(frozen=True)
class NextTokenDistribution:
    """The top of the next-token distribution and the kept set of the sampling settings."""

    temperature: float
    top_k: int  # 0 = off
    top_p: float  # 1.0 = off
    vocab_size: int
    tokens: list[TokenProb]  # the `show` most probable, then any other kept one, best first
    n_kept: int  # size of the kept set
    kept_mass: float  # sum of p(T) over the kept set (before renormalising)
    entropy: float  # of softmax(logits), in nats
    banned: tuple[int, ...] = ()  # ids the search never emits (probability 0 everywhere)

    def kept_ids(self) -> list[int]:
        return [t.id for t in self.tokens if t.kept]

    def to_json(self) -> dict:
        return {
            "temperature": self.temperature,
            "top_k": self.top_k,
            "top_p": self.top_p,
            "vocab_size": self.vocab_size,
            "n_kept": self.n_kept,
            "kept_mass": self.kept_mass,
            "entropy": self.entropy,
            "banned": list(self.banned),
            "tokens": [vars(t) for t in self.tokens],
        }


MAX_KEPT_SHOWN = 1000  # a kept set larger than this is counted, its tail not listed


def check_sampling(temperature: float, top_k: int, top_p: float) -> None:
    """A one-line ConfigError for settings sampling cannot use (as `check_decode_config`)."""
    if not (temperature > 0 and temperature != float("inf")):
        raise ConfigError(f"temperature must be a positive number, got {temperature}")
    if top_k < 0:
        raise ConfigError(f"top_k must be >= 0 (0 = off), got {top_k}")
    if not 0.0 < top_p <= 1.0:
        raise ConfigError(f"top_p must be in (0, 1], got {top_p}")


def next_token_distribution(
    logits_V: Tensor,
    piece: Callable[[int], str] = str,
    *,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    banned: Sequence[int] = (),
    show: int = 10,
) -> NextTokenDistribution:
    """The distribution of `logits_V` (one position's logits, (V,)) as sampling reshapes it.

    `piece(id)` labels an id (default: the id as text); `banned` ids (the search's PAD and BOS)
    get probability 0 before anything else; `show` is how many of the most probable tokens
    are listed (every kept token is listed too, up to MAX_KEPT_SHOWN)."""
    check_sampling(temperature, top_k, top_p)
    logits_1V = logits_V.detach().double().reshape(1, -1).clone()
    V = logits_1V.size(1)
    if banned:
        logits_1V[0, list(banned)] = float("-inf")
    probs_V = logits_1V.softmax(-1)[0]
    # As the search: shifted so the best is 0, then divided (never overflowing into NaN).
    scaled_1V = (logits_1V - logits_1V.max()) / max(temperature, torch.finfo(torch.double).tiny)
    probs_t_V = scaled_1V.softmax(-1)[0]
    kept_V = top_p_filter(top_k_filter(scaled_1V, top_k), top_p)[0] > float("-inf")
    kept_mass = float(probs_t_V[kept_V].sum())
    renorm_V = torch.where(kept_V, probs_t_V / kept_mass, torch.zeros_like(probs_t_V))
    order = probs_V.argsort(descending=True, stable=True).tolist()
    listed = order[: max(show, 0)]
    seen = set(listed)
    extra = [i for i in order if bool(kept_V[i]) and i not in seen][:MAX_KEPT_SHOWN]
    tokens = [
        TokenProb(
            i,
            piece(i),
            float(probs_V[i]),
            float(probs_t_V[i]),
            bool(kept_V[i]),
            float(renorm_V[i]),
        )
        for i in listed + extra
    ]
    logp_V = probs_V.clamp_min(1e-300).log()
    entropy = float(-(probs_V * logp_V).sum())
    return NextTokenDistribution(
        temperature,
        top_k,
        top_p,
        V,
        tokens,
        int(kept_V.sum()),
        kept_mass,
        entropy,
        tuple(banned),
    )


def distribution_lines(d: NextTokenDistribution, precision: int = 4) -> list[str]:
    """The distribution as a text table: p, p at the temperature, kept, renormalised."""
    off = lambda on, text: text if on else "off"  # noqa: E731
    out = [
        f"temperature T = {d.temperature:g}, top-k = {off(d.top_k > 0, str(d.top_k))}, "
        f"top-p = {off(d.top_p < 1.0, f'{d.top_p:g}')}: {d.n_kept} of {d.vocab_size} tokens "
        f"kept, holding {d.kept_mass:.{precision}f} of softmax(logits / T); "
        f"entropy of softmax(logits) {d.entropy:.{precision}f} nats (z: the logits, without "
        "the tokens the search never emits)",
        "  rank  token             id       p = softmax(z)  p(T) = softmax(z/T)  kept  "
        "q = p(T) renormalised",
    ]
    for rank, t in enumerate(d.tokens, start=1):
        out.append(
            f"  {rank:>4}  {t.piece!r:<16} {t.id:<7}  {t.prob:14.{precision}f}  "
            f"{t.prob_t:19.{precision}f}  {'yes' if t.kept else 'no':>4}  "
            f"{t.renorm:.{precision}f}"
        )
    if d.n_kept > len(d.kept_ids()):
        out.append(f"  ... {d.n_kept - len(d.kept_ids())} more kept tokens not listed")
    if d.banned:
        out.append(f"  never emitted by the search (probability 0): ids {list(d.banned)}")
    return out
