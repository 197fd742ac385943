"""Search: greedy, batched beam search and sampling over a narrow model interface (§6.1).

Search code sees only four things, so any model (including a scripted fake in the tests) that
provides them can be searched:

    memory = model.encode(src_BS)                               once per batch
    cache = model.init_cache(memory, capacity)                  preallocated KV buffers
    logits_RV, cache = model.decode_step(tokens_RT, memory, cache)
    cache = cache.index_select(rows_R, cross=...)               reorder / drop rows

plus `model.cfg`: `max_len` (the positional table bounds the output length) and the special
ids `pad_id`, `bos_id` (the token the decoder starts from) and `eos_id`.

Dimension key: B sentences, N beam, R = rows of the search batch (B * N for beam search),
T output length, V vocabulary, S source length, C = 2N candidates per sentence (K is d_k).

Conventions (shared by every search here):
- A hypothesis's `tokens` exclude BOS and EOS; `eos` says whether it ended with EOS.
- `max_len` counts output tokens without EOS, per sentence `a * src_len + b` (src_len counts
  the source's real tokens, its EOS included), capped by the model's `max_len` and by
  `cfg.max_tokens` when it is set (a server's work budget). A hypothesis
  that reaches it stops there without EOS, as in Hugging Face `generate()`.
- PAD and BOS are never emitted; EOS is forbidden until a hypothesis has `min_len` tokens.
- `log_prob` is the sum of the model's log-probabilities of the tokens (and of EOS when the
  hypothesis ended with it); `score = log_prob / length_penalty(len(tokens) + eos, alpha,
  form)`, the form `cfg.length_penalty` names (GNMT's by default).

Stopping a search: inside `with stop_when(condition):` every search calls `condition()` once
per decoding step and raises `SearchStoppedError` when it is true (a server abandons the work of a
client that left, or whose deadline passed, within one step).

Observing a search: every search takes `on_step`, a function called once per decoding step
with a `StepView` (what was live, what the model said, every candidate's fate). With
`on_step=None` nothing is built. `aiayn.glassbox.explain` is made this way, so what learners
are shown is this search and no copy of it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import torch
from torch import Tensor

from aiayn.config import DecodeConfig, check_decode_config
from aiayn.search.beam import BeamSearch, run_whole
from aiayn.search.hypothesis import Hypothesis
from aiayn.search.row_search import Pick, RowSearch, pick_best
from aiayn.search.sampling import inverse_cdf_sample, sample_seed, top_k_filter, top_p_filter
from aiayn.search.step import Decodable, inference
from aiayn.search.step_view import OnStep


def _search_single(
    model: Decodable,
    src_BS: Tensor,
    cfg: DecodeConfig,
    pick: Pick,
    *,
    use_cache: bool = True,
    on_step: OnStep | None = None,
    kind: str = "greedy",
    per_sent: int = 1,
) -> list[Hypothesis]:
    """Extend one hypothesis per row until EOS or its length limit (`RowSearch`, run whole)."""
    run = RowSearch(
        model, cfg, pick, use_cache=use_cache, on_step=on_step, kind=kind, per_sent=per_sent
    )
    run.add(src_BS)
    found: dict[int, Hypothesis] = {}
    while run.live:
        found.update(run.step())
    return [found[r] for r in range(src_BS.size(0))]


def greedy_search(
    model: Decodable,
    src_BS: Tensor,
    cfg: DecodeConfig | None = None,
    *,
    use_cache: bool = True,
    on_step: OnStep | None = None,
) -> list[Hypothesis]:
    """Argmax decoding, one `Hypothesis` per source row (uses cfg's length limits and alpha).

    Shapes: src_BS (B, S) right-padded source ids. `use_cache=False` recomputes the decoder
    over the whole prefix at every step (a reference for tests and the benchmark).
    `on_step` is called with a `StepView` after every step (module docstring).
    """
    cfg = cfg or DecodeConfig()
    check_decode_config(cfg)
    with inference(model):
        return _search_single(model, src_BS, cfg, pick_best, use_cache=use_cache, on_step=on_step)


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


def sample_search(
    model: Decodable,
    src_BS: Tensor,
    cfg: DecodeConfig,
    *,
    row_seeds: Sequence[int] | None = None,
    on_step: OnStep | None = None,
) -> list[list[Hypothesis]]:
    """`cfg.nbest` samples per sentence with temperature, top-k and top-p.

    Sentence i draws its samples from its own generator, seeded `row_seeds[i]` (default: every
    sentence `sample_seed(cfg.seed, 1)`, as if it were line 1 of a file), so its samples do not
    depend on the other sentences of the batch. Scores are the model's own log-probabilities
    (temperature 1, unfiltered), so the samples of a sentence are ranked best first.
    """
    check_decode_config(cfg)
    B, n, device = src_BS.size(0), cfg.nbest, src_BS.device
    seeds = [sample_seed(cfg.seed, 1)] * B if row_seeds is None else list(row_seeds)
    if len(seeds) != B:
        raise ValueError(f"{len(seeds)} row seeds for {B} sentences")
    u_RT = _uniforms(seeds, n, model.cfg.max_len).to(device)

    # A tiny temperature must not overflow into NaN: shifted so each row's best is 0, the
    # scaled scores are 0 for the best and -inf at worst (dividing by at least the type's
    # smallest normal number: a float64 temperature can be 0 in float32).
    def pick(lp_rV: Tensor, rows_r: Tensor, t_r: Tensor) -> tuple[Tensor, Tensor]:
        temperature = max(cfg.temperature, torch.finfo(lp_rV.dtype).tiny)
        scaled_rV = (lp_rV - lp_rV.max(-1, keepdim=True).values) / temperature
        logits_rV = top_p_filter(top_k_filter(scaled_rV, cfg.top_k), cfg.top_p)
        next_r = inverse_cdf_sample(logits_rV.softmax(-1), u_RT[rows_r, t_r])
        return next_r, lp_rV.gather(1, next_r[:, None])[:, 0]

    rows = torch.arange(B, device=device).repeat_interleave(n)
    with inference(model):
        flat = _search_single(
            model,
            src_BS.index_select(0, rows),
            cfg,
            pick,
            on_step=on_step,
            kind="sample",
            per_sent=n,
        )
    groups = [flat[i : i + n] for i in range(0, len(flat), n)]
    return [sorted(g, key=lambda h: -h.score) for g in groups]


def _uniforms(seeds: list[int], n: int, T: int) -> Tensor:
    """(len(seeds) * n, T) float64 uniforms in [0, 1): sentence i's n samples read the stream
    of a CPU generator seeded seeds[i] (one number per step), whatever the device."""
    per_sent = [
        torch.rand(n, T, generator=torch.Generator().manual_seed(s), dtype=torch.float64)
        for s in seeds
    ]
    return torch.cat(per_sent) if per_sent else torch.zeros(0, T, dtype=torch.float64)


def beam_search(
    model: Decodable, src_BS: Tensor, cfg: DecodeConfig, *, on_step: OnStep | None = None
) -> list[list[Hypothesis]]:
    """Batched beam search: every sentence's beams in one (B * N)-row tensor (§6.1), each
    step's 2N best candidates per sentence, early termination once N hypotheses have ended
    (`aiayn.search.beam.BeamSearch`, run whole). Returns, per sentence, the `cfg.nbest` best by
    score. `on_step` is called with a `StepView` after every step (module docstring).
    """
    with inference(model):
        return run_whole(BeamSearch(model, cfg, on_step=on_step), src_BS)


def search(
    model: Decodable,
    src_BS: Tensor,
    cfg: DecodeConfig,
    *,
    row_seeds: Sequence[int] | None = None,
    on_step: OnStep | None = None,
) -> list[list[Hypothesis]]:
    """The search `cfg` asks for: sampling, greedy (beam 1, nbest 1) or beam search.

    `row_seeds` (sampling only): one generator seed per source row (`sample_search`).
    """
    check_decode_config(cfg)
    if cfg.sample:
        return sample_search(model, src_BS, cfg, row_seeds=row_seeds, on_step=on_step)
    if cfg.beam_size == 1:
        return [[h] for h in greedy_search(model, src_BS, cfg, on_step=on_step)]
    return beam_search(model, src_BS, cfg, on_step=on_step)
