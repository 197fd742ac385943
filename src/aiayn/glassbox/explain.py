"""The glass box: one sentence through a trained model, every intermediate named.

`explain(model, tok, "sentence")` runs `aiayn.search.decode`'s own greedy search (or sampling) under
`aiayn.nn.tracing.tracing()` and watches it through the search's `on_step` hook: the encoder
once, then the decoder step by step with the KV cache, exactly as translation runs it. It
returns an `Explanation`: every recorded tensor under a stable name, with row and column labels
(tokens or dimensions), plus the top-k next tokens of every step and the token the search took.
`trace_beam` watches `aiayn.search.decode.beam_search` the same way: every step's candidates and
their fate. There is no second search here, so what is shown is what `aiayn translate` does.
`aiayn.glassbox.render` prints an `Explanation` as text tables, JSON or HTML.

The names and the data classes are in aiayn.glassbox.explanation.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Callable

import torch
from torch import Tensor

from aiayn.config import DecodeConfig
from aiayn.errors import AiaynError
from aiayn.glassbox.explanation import (
    KV_LEAVES,
    PER_HEAD,
    BeamCandidate,
    BeamHypothesis,
    BeamStep,
    BeamTrace,
    Entry,
    Explanation,
    StepChoice,
    describe,
    stable_name,
)
from aiayn.glassbox.switches import differs, kv_note, ring_labels, summary
from aiayn.nn.model import Transformer, _ModelBase
from aiayn.nn.positions import alibi_slopes
from aiayn.nn.tracing import Trace, TraceTooLargeError, tracing
from aiayn.search.decode import beam_search, greedy_search, sample_search
from aiayn.search.limits import max_output_lengths, output_cap
from aiayn.search.sampling import sample_seed
from aiayn.search.step_view import OnStep, StepView
from aiayn.text.corpus import source_text
from aiayn.text.tokenizer import Tokenizer

log = logging.getLogger(__name__)


def _add(
    out: Explanation,
    raw: dict[str, Tensor],
    queries: list[str],
    keys: dict[str, list[str]],
    t: int = 0,
) -> None:
    """Turn the recorder's raw tensors into labelled entries (per head for (B, H, T, K) ones).

    `queries` label the rows of the stream (starting at position `t`), `keys` the keys of each
    kind of attention (starting at position 0). K and V with J < H heads (grouped-query) are
    filed under every query head, as the shared K/V head that query head reads.
    """
    c = out.config
    n_heads = int(c["n_heads"])  # type: ignore[call-overload]
    for model_name, x in raw.items():
        x = x.cpu()  # what is shown (tables, JSON, pictures) is read on the CPU
        name = stable_name(model_name)
        base, _, leaf = name.rpartition(".")
        attn = base.rsplit(".", 1)[-1]  # self_attn | cross_attn (for attention's leaves)
        about = describe(name, c)
        if leaf in PER_HEAD:
            x_HR = x if leaf == "alibi_bias" else x[0]  # ALiBi's (H, T, S) has no batch
            n_keys = x_HR.size(1) if leaf in KV_LEAVES else x_HR.size(-1)  # (n, S, K) | (n, T, S)
            key_rows = _key_labels(out, keys[attn], n_keys, t, attn)
            n = x_HR.size(0)
            ring = key_rows is not keys[attn]  # rows of K/V labelled by their slots' positions
            # a step's new key before QK-norm or RoPE: its own position's, not the cache's
            new_key = leaf in ("k_raw", "k_unrotated") and attn == "self_attn"
            for h in range(n_heads if leaf in KV_LEAVES else n):
                out_leaf = "output" if leaf == "heads" else leaf
                cols = key_rows if leaf.startswith(("scores", "weights", "alibi")) else None
                full = f"{base}.head{h + 1}.{out_leaf}"
                keyed = leaf in KV_LEAVES and not new_key
                rows, start = (key_rows, 0) if keyed else (queries, t)
                head_about = describe(full, c)
                j = h // (n_heads // n) if n < n_heads else h
                if n < n_heads:  # grouped-query: the shared K/V head this query head reads
                    head_about += f"; {kv_note(h + 1, n_heads, n)}"
                if leaf == "alibi_bias":
                    head_about += f"; m_{h + 1} = {float(alibi_slopes(n_heads)[h]):.6g}"
                numbered = not (ring and keyed)
                out.entries[full] = Entry(full, x_HR[j], rows, cols, start, head_about, numbered)
        elif leaf == "band_mask":  # (T, S): which keys each query may see
            key_rows = _key_labels(out, keys[attn], x.size(-1), t, attn)
            out.entries[name] = Entry(name, x, queries, key_rows, t, about)
        elif leaf in ("rope_cos", "rope_sin"):  # (T, K), or (B, 1, T, K) with per-row starts
            out.entries[name] = Entry(name, x if x.dim() == 2 else x[0, 0], queries, None, t, about)
        elif x.dim() == 3:  # (B, T, D)
            out.entries[name] = Entry(name, x[0], queries, None, t, about)
        else:  # positions: (T, D), no batch dimension
            out.entries[name] = Entry(name, x, queries, None, t, about)


def _key_labels(out: Explanation, pieces: list[str], n_keys: int, t: int, attn: str) -> list[str]:
    """The keys' labels: `pieces`, or, when a window's ring cache holds the keys (a decoding
    step reading W slots, not the t + 1 positions fed), each slot's position and piece."""
    window = int(out.config.get("attn_window") or 0)  # type: ignore[call-overload]
    if attn != "self_attn" or not window or n_keys == len(pieces):
        return pieces
    return ring_labels(t, window, n_keys, pieces)


def _check(model: object, tok: Tokenizer) -> Transformer:
    if not isinstance(model, Transformer):
        raise AiaynError(
            f"explain needs an encoder-decoder Transformer, got {type(model).__name__}"
        )
    if tok.vocab_size != model.cfg.vocab_size:
        raise AiaynError(
            f"tokenizer has {tok.vocab_size} pieces but the model's vocabulary is "
            f"{model.cfg.vocab_size}: they do not belong together"
        )
    return model


def source_ids(model: Transformer, tok: Tokenizer, sentence: str, warn: bool = True) -> list[int]:
    """Token ids of `sentence` as the model reads it (EOS appended): a source longer than the
    positional table is cut to its first max_len - 1 tokens plus EOS, with a warning (unless
    `warn` is False: a second trace of the same sentence), as `aiayn translate` does (so what
    is explained is what is translated)."""
    if not isinstance(sentence, str):  # a list of sentences: 'list' has no attribute 'strip'
        raise TypeError(f"one sentence (a str) is explained at a time, got {type(sentence)}")
    text = source_text(sentence)
    if not text:
        raise AiaynError("the sentence to explain is empty")
    ids, limit = tok.encode(text), model.cfg.max_len
    if len(ids) > limit and warn:
        log.warning(
            "the sentence has %d tokens, more than the model's max_len=%d; explaining "
            "only its first %d tokens",
            len(ids) - 1,
            limit,
            limit - 1,
        )
    return tok.cut(ids, limit)


def _decode_config(cfg: DecodeConfig | None, max_len: int | None, **fields: object) -> DecodeConfig:
    """`cfg` (default: the paper's) with `fields` replaced; `max_len` fixes the output limit."""
    cfg = dataclasses.replace(cfg or DecodeConfig(), **fields)  # type: ignore[arg-type]
    if max_len is not None:
        cfg = dataclasses.replace(cfg, max_len_a=0.0, max_len_b=max_len)
    return cfg


def _encoder_part(raw: dict[str, Tensor]) -> dict[str, Tensor]:
    return {k: v for k, v in raw.items() if k.startswith(("src_embed.", "encoder."))}


def _decoder_part(raw: dict[str, Tensor], t: int) -> dict[str, Tensor]:
    return {f"step{t}.{k}": v for k, v in raw.items() if k.startswith(("tgt_embed.", "decoder."))}


def _recorder(
    out: Explanation,
    rec: Trace,
    tok: Tokenizer,
    top_k: int,
    bos_id: int,
    want: Callable[[str], bool] | None = None,
) -> OnStep:
    """An `on_step` observer for a one-sentence greedy or sampling search run under `rec`:
    each step, it files what was recorded since the last one (the encoder's at the first)."""

    def on_step(view: StepView) -> None:
        t = view.t
        raw = dict(rec.tensors)
        rec.tensors.clear()  # the next step records the same names again
        if t == 0:
            _add(out, _encoder_part(raw), out.src_pieces, {"self_attn": out.src_pieces})
        fed = [bos_id, *view.live[0].tokens]
        fed_pieces = tok.pieces(fed)
        keys = {"self_attn": fed_pieces, "cross_attn": out.src_pieces}
        _add(out, _decoder_part(raw, t), [fed_pieces[-1]], keys, t)
        logits_V = view.logits_RV[0].cpu()
        probs_V = torch.softmax(logits_V.float(), dim=-1)
        for leaf, x in (("logits", logits_V), ("probs", probs_V)):
            if want is None or want(f"step{t}.{leaf}"):
                rec.count(x.numel())  # the search's own logits: within the trace's budget
                out.entries[f"step{t}.{leaf}"] = Entry(
                    f"step{t}.{leaf}", x, [fed_pieces[-1]], None, t
                )
        p_k, i_k = probs_V.topk(min(top_k, probs_V.numel()))
        top = [(int(i), tok.pieces([int(i)])[0], float(p)) for p, i in zip(p_k, i_k, strict=True)]
        allowed_V = view.log_probs_RV[0].cpu() > float("-inf")
        banned = tuple(i for i, _, _ in top if not allowed_V[i])
        chosen = view.candidates[0].token
        piece = tok.pieces([chosen])[0]
        out.steps.append(StepChoice(t, fed[-1], fed_pieces[-1], top, chosen, piece, banned))

    return on_step


def _keeper(out: Explanation, want: Callable[[str], bool] | None) -> Callable[[str], bool]:
    """What a trace of `explain` copies, by the model's tap name: what `want` asks for (by
    stable name), never the generator's logits (the search's own are filed), and the
    cross-attention K and V only at step 0 (they are the encoder output's, the same at every
    step: copying them per step would cost steps x S x d_model numbers for nothing)."""

    def keep(model_name: str) -> bool:
        t, name = len(out.steps), stable_name(model_name)  # step t is being computed
        if name.startswith("generator."):
            return False
        if not name.startswith("decoder."):
            return want is None or want(name)
        if t > 0 and name.endswith((".cross_attn.k", ".cross_attn.v")):
            return False
        return want is None or want(f"step{t}.{name}")

    return keep


def explain(
    model: Transformer,
    tok: Tokenizer,
    sentence: str,
    *,
    top_k: int = 5,
    max_len: int | None = None,
    cfg: DecodeConfig | None = None,
    line_no: int = 1,
    want: Callable[[str], bool] | None = None,
    max_numel: int | None = None,
) -> Explanation:
    """Trace the greedy (or, with `cfg.sample`, sampled) translation of `sentence`.

    Args:
        top_k: how many next-token candidates to keep per decoding step.
        max_len: most tokens to generate (default: cfg's limit, source length + 50).
        cfg: search settings (default `DecodeConfig()`); beam size and nbest are taken as 1.
        line_no: the sentence's line number for sampling seeds (`aiayn translate` numbers the
            lines of its input from 1), so a sample here is the one `translate` draws.
        want: which intermediates to keep, by name (`View.shows`; default all): the rest are
            never copied.
        max_numel: the most numbers the trace may hold (TraceTooLargeError past it).
    Returns:
        An `Explanation` with the encoder pass and every decoding step `step{t}.*`.
    """
    model = _check(model, tok)
    model.eval()
    cfg = _decode_config(cfg, max_len, beam_size=1, nbest=1)
    ids = source_ids(model, tok, sentence)
    dev = next(model.parameters()).device  # what the model reads lives on its device
    src_BS = torch.tensor([ids], device=dev)
    search = "sample" if cfg.sample else "greedy"
    out = Explanation(sentence, ids, tok.pieces(ids), [], [], "", _config_summary(model))
    out.search = search
    with tracing(keep=_keeper(out, want), max_numel=max_numel) as rec:
        on_step = _recorder(out, rec, tok, top_k, model.cfg.bos_id, want)
        if cfg.sample:
            seed = sample_seed(cfg.seed, line_no)
            hyp = sample_search(model, src_BS, cfg, row_seeds=[seed], on_step=on_step)[0][0]
        else:
            hyp = greedy_search(model, src_BS, cfg, on_step=on_step)[0]
    out.hypothesis = hyp
    out.tgt_ids = hyp.tokens + ([model.cfg.eos_id] if hyp.eos else [])
    out.tgt_pieces = tok.pieces(out.tgt_ids)
    out.translation = tok.decode(hyp.tokens)
    return out


# What each of `aiayn.search.decode.Candidate`'s reasons means, in words (N = the beam size).
_REASONS = {
    ("finished", "eos"): "ends in </s> among the N best: final, ranked by score",
    ("finished", "length limit"): "length limit: among the N best, ends here without </s>",
    ("pruned", "N already finished"): "{N} hypotheses have already finished",
    ("pruned", "eos below the N best"): "ends in </s> but ranks below the N best: dropped",
    ("pruned", "length limit"): "length limit: ranks below the N best",
    ("pruned", "beam full"): "beam full: {N} extensions with higher log-probability took the slots",
    ("pruned", "early termination"): "{N} hypotheses have finished: the search stops here",
    ("pruned", "impossible"): "impossible (probability 0)",
}


# A beam trace holds every step's live hypotheses whole (N of them, each as long as the step),
# so it grows with N x steps^2: a beam of 1,024 over 1,000 steps would be ~500M tokens. Each
# token is kept as a Python int and its piece, ~77 bytes (measured with tracemalloc over
# 100-step traces of a random model at N = 16 and 128), where a traced tensor's number is 4: it
# is charged 20 numbers of the trace's budget, so `max_numel` bounds the beam trace's memory as
# it bounds the tensors'. A candidate is charged as 6 tokens (its fields).
BEAM_TOKEN_NUMBERS = 20
CANDIDATE_TOKENS = 6


class BeamTraceTooLargeError(TraceTooLargeError):
    """A beam trace would hold more than its budget: the beam or the output is what to narrow."""


def _reason(fate: str, why: str, beam_size: int) -> str:
    text = _REASONS.get((fate, why), f"kept: {why}" if fate == "live" else why)
    return text.replace("{N}", str(beam_size))


def trace_beam(
    model: Transformer,
    tok: Tokenizer,
    sentence: str,
    cfg: DecodeConfig,
    *,
    max_len: int | None = None,
    max_numel: int | None = None,
    warn: bool = True,
) -> BeamTrace:
    """Run `aiayn.search.decode.beam_search` on one sentence and record every decision it makes.

    Args:
        cfg: search settings (beam_size, alpha, min_len, length limits); nbest is the beam size.
        max_len: most output tokens (default: cfg's limit, source length + 50).
        max_numel: the most numbers the beam trace may hold, a token charged as
            BEAM_TOKEN_NUMBERS (`BeamTraceTooLargeError` past it, raised before the step that
            would pass it is kept).
        warn: say when the sentence is cut to the model's length (`source_ids`).
    Returns:
        A `BeamTrace`; `.best` is what beam search outputs (the highest score).
    """
    model = _check(model, tok)
    model.eval()
    cfg = _decode_config(cfg, max_len, sample=False, nbest=cfg.beam_size)
    ids = source_ids(model, tok, sentence, warn)
    src_len = torch.tensor([len(ids)])
    cap = output_cap(cfg, model.cfg.max_len)
    limit = int(max_output_lengths(src_len, cfg.max_len_a, cfg.max_len_b, cap)[0])
    out = BeamTrace(cfg.beam_size, cfg.alpha, limit, cfg.length_penalty)
    N = cfg.beam_size

    def hyp(tokens: list[int], log_prob: float, score: float) -> BeamHypothesis:
        return BeamHypothesis(tokens, tok.pieces(tokens), log_prob, score)

    held = 0  # tokens kept so far, candidates counted as CANDIDATE_TOKENS each

    def on_step(view: StepView) -> None:
        nonlocal held
        held += sum(len(h.tokens) + 1 for h in view.live) + sum(
            len(f.hyp.tokens) + 1 for f in view.finished
        )
        held += CANDIDATE_TOKENS * len(view.candidates)
        if max_numel is not None and held * BEAM_TOKEN_NUMBERS > max_numel:
            raise BeamTraceTooLargeError(
                f"the beam search's trace would hold more than {max_numel:,} numbers by step "
                f"{view.t}: ask for a narrower beam or fewer output tokens"
            )
        live = [hyp(list(h.tokens), h.log_prob, h.score) for h in view.live]
        cands = [
            BeamCandidate(
                c.rank,
                c.parent,
                c.token,
                tok.pieces([c.token])[0],
                c.log_prob,
                c.score,
                c.fate,
                _reason(c.fate, c.why, N),
            )
            for c in view.candidates
        ]
        out.steps.append(BeamStep(view.t, live, cands))
        for f in view.finished:
            done = hyp(f.hyp.tokens, f.hyp.log_prob, f.hyp.score)
            done.eos, done.reason = f.hyp.eos, _reason("finished", f.why, N)
            out.finished.append(done)
        for _sent, why in view.done:
            out.stop_reason = (
                f"length limit of {limit} output tokens reached at step {view.t}"
                if why == "length limit"
                else f"{N} hypotheses finished (= the beam size) by step {view.t}"
            )

    dev = next(model.parameters()).device
    beam_search(model, torch.tensor([ids], device=dev), cfg, on_step=on_step)
    return out


def _config_summary(model: _ModelBase) -> dict[str, object]:
    cfg = model.cfg
    return {
        "d_model": cfg.d_model,
        "n_heads": cfg.n_heads,
        "d_k": cfg.d_k,
        "n_layers": cfg.n_layers,
        "d_ff": cfg.d_ff,
        "vocab_size": cfg.vocab_size,
        "norm": "pre-LN" if cfg.norm_first else "post-LN (paper)",
        "positional": cfg.positional,
        "embedding_scale": math.sqrt(cfg.d_model),
        "differs": ", ".join(differs(cfg)),  # from the paper; "" for the paper's model
        **summary(cfg),  # the switches (norm_type, activation, kv_heads, attn_window...)
    }


def greedy_translate(
    model: Transformer, tok: Tokenizer, sentence: str, max_len: int | None = None
) -> tuple[list[int], list[int]]:
    """(source ids, generated ids incl. EOS when produced): the search's greedy run."""
    model = _check(model, tok)
    ids = source_ids(model, tok, sentence)
    cfg = _decode_config(None, max_len, beam_size=1)
    device = next(model.parameters()).device
    hyp = greedy_search(model, torch.tensor([ids], device=device), cfg)[0]
    return ids, hyp.tokens + ([model.cfg.eos_id] if hyp.eos else [])
