"""Search: greedy, batched beam search and sampling over a narrow model interface (§6.1).

Search code sees only four things, so any model (including a scripted fake in the tests) that
provides them can be searched:

    memory = model.encode(src_BS)                               once per batch
    cache = model.init_cache(memory, capacity)                  preallocated KV buffers
    logits_RV, cache = model.decode_step(tokens_RT, memory, cache)
    cache = cache.index_select(rows_R, cross=...)               reorder / drop rows

plus `model.cfg.max_len` (the positional table bounds the output length).

Dimension key: B sentences, N beam, R = rows of the search batch (B * N for beam search),
T output length, V vocabulary, S source length.

Conventions (shared by every search here):
- A hypothesis's `tokens` exclude BOS and EOS; `eos` says whether it ended with EOS.
- `max_len` counts output tokens without EOS, per sentence `a * src_len + b` (src_len counts
  the source's real tokens, its EOS included), capped by the model's `max_len`. A hypothesis
  that reaches it stops there without EOS, as in Hugging Face `generate()`.
- PAD and BOS are never emitted; EOS is forbidden until a hypothesis has `min_len` tokens.
- `log_prob` is the sum of the model's log-probabilities of the tokens (and of EOS when the
  hypothesis ended with it); `score = log_prob / length_penalty(len(tokens) + eos, alpha)`.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Protocol

import torch
from torch import Tensor

from aiayn.config import BOS_ID, EOS_ID, PAD_ID, DecodeConfig, ModelConfig
from aiayn.errors import ConfigError
from aiayn.kv_cache import KVCache, Memory


class Decodable(Protocol):
    """The narrow interface search code uses (a `Transformer`, or a scripted fake in tests)."""

    cfg: ModelConfig  # only cfg.max_len is read: the positional table bounds the output

    def encode(self, src_BS: Tensor) -> Memory: ...

    def init_cache(self, memory: Memory, capacity: int) -> KVCache: ...

    def decode_step(
        self, tokens_BT: Tensor, memory: Memory, cache: KVCache
    ) -> tuple[Tensor, KVCache]: ...


# --- results and pure math -----------------------------------------------------------------------


@dataclass(frozen=True)
class Hypothesis:
    """One output sequence with its scores (see the module docstring for the conventions)."""

    tokens: list[int]
    log_prob: float
    score: float
    eos: bool


def length_penalty(length: int, alpha: float) -> float:
    """GNMT length penalty lp(Y) = ((5 + |Y|) / 6) ** alpha (Wu et al. 2016, §7; paper §6.1)."""
    return ((5 + length) / 6) ** alpha


def max_output_lengths(src_len_B: Tensor, a: float, b: int, cap: int) -> Tensor:
    """Per-sentence output limit: floor(a * src_len + b), clamped to [1, cap]."""
    return (src_len_B.double() * a + b).floor().long().clamp(1, cap)


def top_k_filter(logits_RV: Tensor, k: int) -> Tensor:
    """Keep the k highest logits of each row, set the rest to -inf (k <= 0: keep all)."""
    if k <= 0 or k >= logits_RV.size(-1):
        return logits_RV
    kth_R1 = logits_RV.topk(k, dim=-1).values[:, -1:]
    return logits_RV.masked_fill(logits_RV < kth_R1, float("-inf"))


def top_p_filter(logits_RV: Tensor, p: float) -> Tensor:
    """Nucleus filter (Holtzman et al. 2020): keep the smallest set of most probable tokens
    whose probability mass reaches p; the most probable token is always kept."""
    if p >= 1.0:
        return logits_RV
    sorted_RV, order_RV = logits_RV.sort(dim=-1, descending=True)
    probs_RV = sorted_RV.softmax(-1)
    mass_before_RV = probs_RV.cumsum(-1) - probs_RV  # mass of the strictly better tokens
    drop_sorted_RV = mass_before_RV >= p
    drop_RV = drop_sorted_RV.scatter(-1, order_RV, drop_sorted_RV)
    return logits_RV.masked_fill(drop_RV, float("-inf"))


def check_decode_config(cfg: DecodeConfig) -> None:
    """Raise a one-line ConfigError for settings no search can honour."""
    checks = [
        (cfg.beam_size >= 1, f"beam size must be at least 1, got {cfg.beam_size}"),
        (cfg.nbest >= 1, f"nbest must be at least 1, got {cfg.nbest}"),
        (
            cfg.sample or cfg.nbest <= cfg.beam_size,
            f"nbest={cfg.nbest} cannot exceed the beam size {cfg.beam_size}",
        ),
        (cfg.temperature > 0, f"temperature must be positive, got {cfg.temperature}"),
        (0.0 < cfg.top_p <= 1.0, f"top_p must be in (0, 1], got {cfg.top_p}"),
        (cfg.top_k >= 0, f"top_k must be >= 0 (0 = off), got {cfg.top_k}"),
        (cfg.min_len >= 0, f"min_len must be >= 0, got {cfg.min_len}"),
        (cfg.max_len_a >= 0 and cfg.max_len_b >= 0, "max_len_a and max_len_b must be >= 0"),
        (cfg.alpha >= 0, f"length penalty alpha must be >= 0, got {cfg.alpha}"),
    ]
    for ok, message in checks:
        if not ok:
            raise ConfigError(message)


@contextlib.contextmanager
def _inference(model: object) -> Iterator[None]:
    """Eval mode (no dropout) and no autograd for the duration; restores training mode."""
    was_training = bool(getattr(model, "training", False))
    if was_training:
        model.eval()  # type: ignore[attr-defined]
    try:
        with torch.inference_mode():
            yield
    finally:
        if was_training:
            model.train()  # type: ignore[attr-defined]


def _limits(model: Decodable, memory: Memory, cfg: DecodeConfig) -> Tensor:
    src_len_B, cap = memory.keep_BS.sum(1), model.cfg.max_len
    return max_output_lengths(src_len_B, cfg.max_len_a, cfg.max_len_b, cap)


def _forbid(scores_RV: Tensor, no_eos: bool) -> None:
    """Never emit PAD or BOS; no EOS before the minimum length. In place, after normalising."""
    scores_RV[:, PAD_ID] = float("-inf")
    scores_RV[:, BOS_ID] = float("-inf")
    if no_eos:
        scores_RV[:, EOS_ID] = float("-inf")


# --- one hypothesis per row: greedy and sampling --------------------------------------------------

# log-probabilities (R, V) -> (next token ids (R,), their log-probabilities (R,))
Pick = Callable[[Tensor], tuple[Tensor, Tensor]]


def _pick_best(lp_rV: Tensor) -> tuple[Tensor, Tensor]:
    """Greedy: the most probable token. `max` gives the value with its index in one pass over
    V (argmax, then gathering the value, costs a second op; both keep the first of equal maxima).
    """
    lp_r, next_r = lp_rV.max(-1)
    return next_r, lp_r


def _search_single(
    model: Decodable, src_BS: Tensor, cfg: DecodeConfig, pick: Pick, *, use_cache: bool = True
) -> list[Hypothesis]:
    """Extend one hypothesis per row until EOS or its length limit.

    Finished rows leave the batch at once (their memory and cache rows are dropped), so late
    steps only pay for sentences still being written.
    """
    R, device = src_BS.size(0), src_BS.device
    if R == 0:
        return []
    memory = model.encode(src_BS)
    max_len_R = _limits(model, memory, cfg)
    T = int(max_len_R.max())
    cache = model.init_cache(memory, T) if use_cache else None
    out_RT = src_BS.new_full((R, T), PAD_ID)
    log_prob_R = torch.zeros(R, dtype=torch.float64, device=device)
    length_R = torch.zeros(R, dtype=torch.long, device=device)
    eos_R = torch.zeros(R, dtype=torch.bool, device=device)
    rows_r = torch.arange(R, device=device)  # original row of each live row
    tok_r1 = src_BS.new_full((R, 1), BOS_ID)
    for t in range(T):
        if cache is not None:
            logits_rV, cache = model.decode_step(tok_r1, memory, cache)
        else:  # recompute the whole prefix (the benchmark's and tests' reference)
            bos_r1 = src_BS.new_full((len(rows_r), 1), BOS_ID)
            prefix_rt = torch.cat([bos_r1, out_RT[rows_r, :t]], 1)
            fresh = model.init_cache(memory, t + 1)
            logits_rV, _ = model.decode_step(prefix_rt, memory, fresh)
        lp_rV = logits_rV.float().log_softmax(-1)  # one fused pass (cheaper than logsumexp)
        _forbid(lp_rV, t < cfg.min_len)
        next_r, lp_r = pick(lp_rV)
        log_prob_R[rows_r] += lp_r.double()
        is_eos_r = next_r == EOS_ID
        out_RT[rows_r, t] = next_r
        done_r = is_eos_r | (t + 1 >= max_len_R[rows_r])
        if bool(done_r.any()):
            done_rows = rows_r[done_r]
            eos_R[rows_r[is_eos_r]] = True
            length_R[done_rows] = t + 1 - is_eos_r[done_r].long()
            keep_r = (~done_r).nonzero()[:, 0]
            if len(keep_r) == 0:
                break
            rows_r, next_r = rows_r[keep_r], next_r[keep_r]
            memory = memory.index_select(keep_r)
            if cache is not None:
                cache = cache.index_select(keep_r, cross=True)
        tok_r1 = next_r[:, None]
    hyps = []
    for row, n, eos, lp in zip(
        out_RT.tolist(), length_R.tolist(), eos_R.tolist(), log_prob_R.tolist(), strict=True
    ):
        hyps.append(Hypothesis(row[:n], lp, lp / length_penalty(n + eos, cfg.alpha), eos))
    return hyps


def greedy_search(
    model: Decodable, src_BS: Tensor, cfg: DecodeConfig | None = None, *, use_cache: bool = True
) -> list[Hypothesis]:
    """Argmax decoding, one `Hypothesis` per source row (uses cfg's length limits and alpha).

    Shapes: src_BS (B, S) right-padded source ids. `use_cache=False` recomputes the decoder
    over the whole prefix at every step (a reference for tests and the benchmark).
    """
    cfg = cfg or DecodeConfig()
    check_decode_config(cfg)
    with _inference(model):
        return _search_single(model, src_BS, cfg, _pick_best, use_cache=use_cache)


def greedy_decode(
    model: Decodable, src_BS: Tensor, max_len: int | None = None, *, min_len: int = 0
) -> list[list[int]]:
    """Greedy translations as token ids (no BOS/EOS), e.g. for validation BLEU in training.

    Args:
        model: a `Transformer` (switched to eval mode for the call, then restored).
        src_BS: (B, S) right-padded source ids, each ending in EOS.
        max_len: at most this many output tokens per sentence; default source length + 50.
        min_len: forbid EOS before this many tokens.
    Returns:
        B lists of target ids; `Tokenizer.decode` turns each into text.
    """
    cfg = DecodeConfig(beam_size=1, min_len=min_len)
    if max_len is not None:
        cfg = dataclasses.replace(cfg, max_len_a=0.0, max_len_b=max_len)
    return [h.tokens for h in greedy_search(model, src_BS, cfg)]


def sample_search(model: Decodable, src_BS: Tensor, cfg: DecodeConfig) -> list[list[Hypothesis]]:
    """`cfg.nbest` samples per sentence with temperature, top-k and top-p, seeded by cfg.seed.

    Scores are the model's own log-probabilities (temperature 1, unfiltered), so the samples
    of a sentence are ranked best first. The same input, seed and settings give the same output.
    """
    check_decode_config(cfg)
    device = src_BS.device
    gen = torch.Generator(device=device).manual_seed(cfg.seed)

    def pick(lp_rV: Tensor) -> tuple[Tensor, Tensor]:
        logits_rV = top_p_filter(top_k_filter(lp_rV / cfg.temperature, cfg.top_k), cfg.top_p)
        next_r = torch.multinomial(logits_rV.softmax(-1), 1, generator=gen)[:, 0]
        return next_r, lp_rV.gather(1, next_r[:, None])[:, 0]

    n = cfg.nbest
    rows = torch.arange(src_BS.size(0), device=device).repeat_interleave(n)
    with _inference(model):
        flat = _search_single(model, src_BS.index_select(0, rows), cfg, pick)
    groups = [flat[i : i + n] for i in range(0, len(flat), n)]
    return [sorted(g, key=lambda h: -h.score) for g in groups]


# --- beam search ----------------------------------------------------------------------------------


def beam_search(model: Decodable, src_BS: Tensor, cfg: DecodeConfig) -> list[list[Hypothesis]]:
    """Batched beam search: every sentence's beams in one (B * N)-row tensor (§6.1).

    Each step scores all N * V extensions of a sentence's beams by cumulative log-probability
    and takes the 2N best. An EOS among the N best ends a hypothesis, which is set aside with
    its length-penalised score and never extended; the N best non-EOS extensions stay alive.
    A sentence is done (early termination, as in fairseq) once N hypotheses have ended, or when
    its beams reach its length limit, where the N best candidates end as they are. Done
    sentences leave the batch. Returns, per sentence, the `cfg.nbest` best by score.
    """
    check_decode_config(cfg)
    with _inference(model):
        return _beam_search(model, src_BS, cfg)


def _beam_search(model: Decodable, src_BS: Tensor, cfg: DecodeConfig) -> list[list[Hypothesis]]:
    B, N, device = src_BS.size(0), cfg.beam_size, src_BS.device
    if B == 0:
        return []
    memory = model.encode(src_BS)
    max_len_b = _limits(model, memory, cfg)
    T = int(max_len_b.max())
    # The first step feeds only BOS, the same for every beam: it runs on one row per sentence,
    # and its N best tokens then fan out into N beams (cross-attention K/V copied, not redone).
    cache = model.init_cache(memory, T)
    tokens_rT = src_BS.new_full((B, T + 1), PAD_ID)
    tokens_rT[:, 0] = BOS_ID
    scores_bn = torch.zeros(B, 1, device=device)  # n = live beams per sentence: 1, then N
    sents = list(range(B))  # original index of each live sentence
    ended: list[list[Hypothesis]] = [[] for _ in range(B)]
    for t in range(T):
        b, n = scores_bn.shape
        logits_rV, cache = model.decode_step(tokens_rT[:, t : t + 1], memory, cache)
        lp_rV = logits_rV.float().log_softmax(-1)
        _forbid(lp_rV, t < cfg.min_len)
        V = lp_rV.size(-1)
        cand_bnV = scores_bn[:, :, None] + lp_rV.view(b, n, V)
        top_bK, idx_bK = cand_bnV.view(b, n * V).topk(min(2 * N, n * V), dim=-1)  # K = 2N
        beam_bK, tok_bK = idx_bK // V, idx_bK % V
        is_eos_bK = tok_bK == EOS_ID
        last = (t + 1 >= max_len_b).tolist()
        done = _set_aside(ended, sents, t, n, cfg, last, tokens_rT, top_bK, beam_bK, tok_bK)
        # The N best non-EOS candidates stay alive (a stable sort keeps their score order).
        alive_bN = is_eos_bK.sort(dim=1, stable=True).indices[:, :N]
        scores_bn = top_bK.gather(1, alive_bN)
        parent_bN = beam_bK.gather(1, alive_bN) + torch.arange(b, device=device)[:, None] * n
        parent_r, next_r = parent_bN.view(-1), tok_bK.gather(1, alive_bN).view(-1)
        if any(done):  # done sentences leave the batch
            keep_b = torch.tensor([i for i in range(b) if not done[i]], device=device)
            if len(keep_b) == 0:
                break
            sents = [s for s, d in zip(sents, done, strict=True) if not d]
            keep_r = (keep_b[:, None] * N + torch.arange(N, device=device)).view(-1)
            parent_r, next_r = parent_r[keep_r], next_r[keep_r]
            scores_bn, max_len_b = scores_bn[keep_b], max_len_b[keep_b]
        if any(done) or n != N:
            memory = memory.index_select(parent_r)
            cache = cache.index_select(parent_r, cross=True)
        else:  # beams only move within their sentence: cross-attention K/V stay as they are
            cache = cache.index_select(parent_r, cross=False)
        tokens_rT = tokens_rT.index_select(0, parent_r)
        tokens_rT[:, t + 1] = next_r
    return [sorted(h, key=lambda h: -h.score)[: cfg.nbest] for h in ended]


def _set_aside(
    ended: list[list[Hypothesis]],
    sents: list[int],
    t: int,
    n: int,
    cfg: DecodeConfig,
    last: list[bool],
    tokens_rT: Tensor,
    top_bK: Tensor,
    beam_bK: Tensor,
    tok_bK: Tensor,
) -> list[bool]:
    """Move the hypotheses that end at step t into `ended`; return which sentences are done.

    A candidate ends if it is EOS and among its sentence's N best, or if it is among the N best
    when the sentence reaches its length limit. Few per step, so a Python loop is cheap.
    """
    N, alpha = cfg.beam_size, cfg.alpha
    is_eos_bK = tok_bK == EOS_ID
    ends_bK = is_eos_bK.clone()
    ends_bK[:, N:] = False
    ends_bK[torch.tensor(last, device=ends_bK.device), :N] = True
    ends_bK &= top_bK > float("-inf")
    for i, j in ends_bK.nonzero().tolist():
        s = sents[i]
        if len(ended[s]) >= N:
            continue
        eos = bool(is_eos_bK[i, j])
        row = i * n + int(beam_bK[i, j])
        toks = tokens_rT[row, 1 : t + 1].tolist() + ([] if eos else [int(tok_bK[i, j])])
        lp = float(top_bK[i, j])
        ended[s].append(Hypothesis(toks, lp, lp / length_penalty(t + 1, alpha), eos))
    return [last[i] or len(ended[s]) >= N for i, s in enumerate(sents)]


def search(model: Decodable, src_BS: Tensor, cfg: DecodeConfig) -> list[list[Hypothesis]]:
    """The search `cfg` asks for: sampling, greedy (beam 1, nbest 1) or beam search."""
    check_decode_config(cfg)
    if cfg.sample:
        return sample_search(model, src_BS, cfg)
    if cfg.beam_size == 1:
        return [[h] for h in greedy_search(model, src_BS, cfg)]
    return beam_search(model, src_BS, cfg)
