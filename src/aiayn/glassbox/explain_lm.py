"""The glass box of a decoder-only language model (`aiayn.nn.variants.DecoderLM`).

`explain_lm(model, tok, "ROMEO:")` traces three things, all from the real code:

1. the forward pass over BOS + the prompt under `aiayn.nn.tracing.tracing()`: every
   embedding, Q/K/V, score, causal mask (position t sees 0..t: `scores_masked` is -inf above
   the diagonal, `weights` exactly 0 there), head, residual, LayerNorm and FFN, under the
   stable names `decoder.embed.*`, `decoder.{l}.*` (and `decoder.norm` for a pre-LN model);
2. the next-token distribution at the last position (`next.logits`, `next.probs`), and how
   temperature, top-k and top-p reshape it (aiayn.glassbox.distribution);
3. a few steps of the search `aiayn generate` runs (greedy or sampling, with the KV cache),
   watched through its `on_step` hook: the top-k of each step and the token it took.

It returns an `Explanation` of kind "lm" (its `source` is the prompt, `src_ids` BOS + the
prompt's ids, `translation` the continuation); aiayn.glassbox.render prints it.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable

import torch
from torch import Tensor

from aiayn.config import DecodeConfig, check_decode_config
from aiayn.errors import AiaynError
from aiayn.glassbox.distribution import check_sampling, next_token_distribution
from aiayn.glassbox.explain import _add, _config_summary
from aiayn.glassbox.explanation import Entry, Explanation, StepChoice, stable_name
from aiayn.nn.tracing import tracing
from aiayn.nn.variants import DecoderLM
from aiayn.search.decode import search
from aiayn.search.sampling import sample_seed
from aiayn.search.step_view import StepView
from aiayn.text.tokenizer import Tokenizer

log = logging.getLogger(__name__)

DEFAULT_STEPS = 8  # generation steps traced when none are asked for: "a few"


def check_lm(model: object, tok: Tokenizer) -> DecoderLM:
    if not isinstance(model, DecoderLM):
        raise AiaynError(f"explain_lm needs a DecoderLM, got {type(model).__name__}")
    if tok.vocab_size != model.cfg.vocab_size:
        raise AiaynError(
            f"tokenizer has {tok.vocab_size} pieces but the model's vocabulary is "
            f"{model.cfg.vocab_size}: they do not belong together"
        )
    return model


def lm_prompt_ids(model: DecoderLM, tok: Tokenizer, prompt: str, warn: bool = True) -> list[int]:
    """BOS + the prompt's ids (no EOS), as `aiayn generate` feeds them; a prompt longer than
    the context (max_len) keeps its last max_len tokens, with a warning. An empty prompt is
    BOS alone."""
    if not isinstance(prompt, str):
        raise TypeError(f"one prompt (a str) is explained at a time, got {type(prompt)}")
    ids = [tok.bos_id, *tok.encode(prompt, eos=False)] if prompt else [tok.bos_id]
    limit = model.cfg.max_len
    if len(ids) > limit:
        if warn:
            log.warning(
                "the prompt has %d tokens with BOS, more than the model's max_len=%d; "
                "explaining its last %d",
                len(ids),
                limit,
                limit,
            )
        ids = ids[-limit:]
    return ids


def lm_name(model_name: str) -> str:
    """A DecoderLM's trace name -> stable name: `embed.tokens` -> `decoder.embed.tokens`,
    `decoder.layers.0.x` -> `decoder.0.x`."""
    if model_name.startswith("embed."):
        model_name = "decoder." + model_name
    return stable_name(model_name)


def trace_forward(
    model: DecoderLM,
    ids: list[int],
    out: Explanation,
    want: Callable[[str], bool] | None = None,
    max_numel: int | None = None,
) -> Tensor:
    """Run `model` over `ids` under `tracing()`, file every intermediate (those `want` asks
    for, by stable name) into `out.entries`; return the last position's logits (V,)."""

    def keep(model_name: str) -> bool:  # the generator's (T, V) logits: the last row is filed
        name = lm_name(model_name)
        return not name.startswith("generator.") and (want is None or want(name))

    dev = next(model.parameters()).device
    with torch.no_grad(), tracing(keep=keep, max_numel=max_numel) as rec:
        logits_1TV = model(torch.tensor([ids], device=dev))
        logits_V = logits_1TV[0, -1].float().cpu()
        raw = {lm_name(k): v for k, v in rec.tensors.items()}
        rec.count(2 * logits_V.numel())  # the filed logits and probabilities
    pieces = out.src_pieces
    _add(out, raw, pieces, {"self_attn": pieces})
    last = [pieces[-1]]
    for name, x in (("next.logits", logits_V), ("next.probs", logits_V.softmax(-1))):
        if want is None or want(name):
            out.entries[name] = Entry(name, x, last, None, len(ids) - 1)
    return logits_V


def _watch(out: Explanation, tok: Tokenizer, prompt_ids: list[int], top_k: int) -> Callable:
    """An `on_step` observer of a one-row greedy or sampling search: each step's top-k and
    the token the search took, as `StepChoice`s."""

    def on_step(view: StepView) -> None:
        fed = [*prompt_ids, *view.live[0].tokens]
        probs_V = torch.softmax(view.logits_RV[0].float().cpu(), dim=-1)
        p_k, i_k = probs_V.topk(min(top_k, probs_V.numel()))
        top = [(int(i), tok.pieces([int(i)])[0], float(p)) for p, i in zip(p_k, i_k, strict=True)]
        allowed_V = view.log_probs_RV[0].cpu() > float("-inf")
        banned = tuple(i for i, _, _ in top if not allowed_V[i])
        chosen = view.candidates[0].token
        piece = tok.pieces([fed[-1]])[0]
        choice = StepChoice(view.t, fed[-1], piece, top, chosen, tok.pieces([chosen])[0], banned)
        out.steps.append(choice)

    return on_step


def explain_lm(
    model: DecoderLM,
    tok: Tokenizer,
    prompt: str,
    *,
    cfg: DecodeConfig | None = None,
    top_k: int = 5,
    max_len: int | None = None,
    show: int = 10,
    line_no: int = 1,
    want: Callable[[str], bool] | None = None,
    max_numel: int | None = None,
) -> Explanation:
    """Trace a language model's forward pass over BOS + `prompt`, its next-token distribution
    and a few steps of its search.

    Args:
        cfg: search settings (default: greedy); `cfg.sample` samples, with its temperature,
            top_k and top_p, which also reshape the shown distribution. Beam size is taken as 1.
        top_k: candidates shown per generation step.
        max_len: generation steps to trace (default DEFAULT_STEPS; 0: none), at most what the
            context leaves after the prompt.
        show: tokens listed in the next-token distribution (every kept one too).
        line_no: the prompt's line number for sampling seeds: the sample is the one
            `aiayn generate` draws for that line (its first context window).
        want, max_numel: what the forward trace keeps, and its budget (`explain.explain`).
    """
    model = check_lm(model, tok)
    model.eval()
    cfg = dataclasses.replace(cfg or DecodeConfig(sample=False), beam_size=1, nbest=1)
    check_decode_config(cfg, model.cfg.vocab_size)
    check_sampling(cfg.temperature, cfg.top_k, cfg.top_p)
    if top_k < 1:
        raise AiaynError(f"--top-k must be at least 1, got {top_k}")
    steps = DEFAULT_STEPS if max_len is None else max_len
    if steps < 0:
        raise AiaynError(f"--max-len must be >= 0, got {steps}")
    ids = lm_prompt_ids(model, tok, prompt)
    out = Explanation(prompt, ids, tok.pieces(ids), [], [], "", _config_summary(model))
    out.kind, out.search = "lm", "sample" if cfg.sample else "greedy"
    logits_V = trace_forward(model, ids, out, want, max_numel)
    out.distribution = next_token_distribution(
        logits_V,
        lambda i: tok.pieces([i])[0],
        temperature=cfg.temperature,
        top_k=cfg.top_k,
        top_p=cfg.top_p,
        banned=sorted({model.cfg.pad_id, model.cfg.bos_id}),  # as the search's `forbid`
        show=show,
    )
    steps = min(steps, model.cfg.max_len - len(ids))
    if steps > 0:
        step_cfg = dataclasses.replace(cfg, max_len_a=0.0, max_len_b=steps, max_tokens=0)
        # aiayn generate's seed of line `line_no`'s first sample, its first window
        seed = sample_seed(sample_seed(cfg.seed, line_no), 0)
        dev = next(model.parameters()).device
        src_BS = torch.tensor([ids], device=dev)
        on_step = _watch(out, tok, ids, top_k)
        hyp = search(model, src_BS, step_cfg, row_seeds=[seed], on_step=on_step)[0][0]
        out.hypothesis = hyp
        out.tgt_ids = hyp.tokens + ([model.cfg.eos_id] if hyp.eos else [])
        out.tgt_pieces = tok.pieces(out.tgt_ids)
        out.translation = tok.decode(hyp.tokens)
    return out


def attention_maps(out: Explanation) -> list[Tensor]:
    """Per layer, the (H, T, T) self-attention weights of a traced LM forward pass."""
    L, H = out.layers_and_heads()
    return [
        torch.stack([out[f"decoder.{layer}.self_attn.head{h}.weights"] for h in range(1, H + 1)])
        for layer in range(L)
    ]


def lm_attention(model: DecoderLM, tok: Tokenizer, prompt: str) -> tuple[list[Tensor], list[str]]:
    """(per layer (H, T, T) causal weights, the T pieces) of BOS + `prompt` (only the weights
    are recorded)."""
    model = check_lm(model, tok)
    model.eval()
    ids = lm_prompt_ids(model, tok, prompt)
    out = Explanation(prompt, ids, tok.pieces(ids), [], [], "", _config_summary(model))
    trace_forward(model, ids, out, want=lambda name: name.endswith(".weights"))
    return attention_maps(out), out.src_pieces
