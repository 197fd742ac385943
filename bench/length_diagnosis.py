"""Why are translations short? Model errors against search errors, on one source/reference pair.

For a model directory and a source/reference file pair (use the validation set: choices made
from this must not see the test set), it measures:

1. greedy and beam search (the model's beam size and α unless given): sacreBLEU, the length
   ratio and the brevity penalty, and the mean output length in subword tokens against the
   references' (the model's own tokenizer);
2. model or search: every reference is scored by the model the way the search scores a
   hypothesis (teacher forcing: summed log-probabilities, EOS included, divided by the GNMT
   penalty of the same α). A beam output shorter than its reference that scores *below* the
   reference is a search error (a longer, better-scoring output was missed); one that scores
   *above* it is a model error (the model prefers the shorter output), which no search
   setting short of a larger α can fix;
3. EOS as the model predicts it along the references: mean p(EOS) at positions before the
   reference's end, the share of those positions where EOS is the most probable token
   (where greedy search would stop early), and the mean p(EOS) at the end;
4. beam search without early termination (`--exhaustive`): each sentence searched up to its
   length limit, every ended hypothesis kept, the best by score returned. If this is longer
   and scores higher than the normal beam, stopping once N hypotheses ended cuts long outputs.

    python bench/length_diagnosis.py --model runs/x/averaged \
        --src ../shared/data/multi30k/raw/val.en --ref ../shared/data/multi30k/raw/val.de \
        --alphas 0.6,1.0 --exhaustive

Prints a table per measurement and one JSON object on its last line. fp32, `--threads`
(default 1) torch threads.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import math
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import torch
from torch import Tensor

from aiayn.config import DecodeConfig
from aiayn.search.beam import BeamSearch
from aiayn.search.beam_candidates import TopK
from aiayn.search.hypothesis import Hypothesis, length_penalty
from aiayn.text.batches import Example, collate
from aiayn.translate.files import read_file_lines
from aiayn.translate.metrics import bleu
from aiayn.translate.translator import Translator

EOS_KEYS = ("p_eos_before_end", "eos_argmax_before_end", "p_eos_at_end")


def forced_scores(translator: Translator, srcs: Sequence[str], refs: Sequence[str]) -> dict:
    """Per reference: summed log-probability (EOS included), its subword length, and the EOS
    statistics of item 3 of the module docstring, under teacher forcing."""
    tok, model = translator.tokenizer, translator.model
    pad, eos = model.cfg.pad_id, model.cfg.eos_id
    src_ids = tok.encode_batch(list(srcs), eos=True)
    tgt_ids = tok.encode_batch(list(refs), bos=True, eos=True)
    examples = [Example(tuple(s), tuple(t)) for s, t in zip(src_ids, tgt_ids, strict=True)]
    log_prob, length = [], []
    early_p, early_argmax, n_early, end_p = 0.0, 0, 0, 0.0
    with torch.inference_mode():
        for start in range(0, len(examples), 64):
            b = collate(examples, range(start, min(start + 64, len(examples))), pad)
            logp_BTV = model(b.src_BS, b.tgt_in_BT).float().log_softmax(-1)
            keep_BT = b.tgt_out_BT != pad
            gold_BT = logp_BTV.gather(-1, b.tgt_out_BT.clamp(min=0)[..., None])[..., 0]
            log_prob += (gold_BT * keep_BT).sum(1).double().tolist()
            n_B = keep_BT.sum(1)  # positions, EOS included
            length += (n_B - 1).tolist()
            p_eos_BT = logp_BTV[..., eos].exp()
            t_BT = torch.arange(keep_BT.size(1))[None, :]
            before_BT = t_BT < (n_B - 1)[:, None]  # reference positions before its EOS
            early_p += float(p_eos_BT[before_BT].sum())
            early_argmax += int((logp_BTV.argmax(-1) == eos)[before_BT].sum())
            n_early += int(before_BT.sum())
            end_p += float(p_eos_BT.gather(1, (n_B - 1)[:, None]).sum())
    return {
        "log_prob": log_prob,
        "length": length,
        "p_eos_before_end": early_p / max(n_early, 1),
        "eos_argmax_before_end": early_argmax / max(n_early, 1),
        "p_eos_at_end": end_p / max(len(examples), 1),
    }


def _set_aside_all(self: BeamSearch, last_b: Tensor, last: list[bool], top: TopK) -> list[bool]:
    """BeamSearch._set_aside without early termination: keep every ended hypothesis, and a
    sentence is done only at its length limit."""
    for i, hyp in self.ending(last_b, top):
        self.ended[self.sents[i]].append(hyp)
    return list(last)


@contextlib.contextmanager
def no_early_termination() -> Iterator[None]:
    original = BeamSearch._set_aside
    BeamSearch._set_aside = _set_aside_all  # type: ignore[method-assign]
    try:
        yield
    finally:
        BeamSearch._set_aside = original  # type: ignore[method-assign]


def run_search(
    translator: Translator, srcs: Sequence[str], refs: Sequence[str], cfg: DecodeConfig
) -> tuple[dict, list[Hypothesis]]:
    t0 = time.monotonic()
    found = translator.translate_hyps(list(srcs), cfg)
    seconds = time.monotonic() - t0
    hyps = [r[0].hyp for r in found]
    score = bleu([r[0].text for r in found], refs)
    return {
        "bleu": round(score.score, 2),
        "length_ratio": round(score.length_ratio or 0.0, 4),
        "brevity_penalty": round(score.brevity_penalty or 0.0, 4),
        "mean_tokens": round(sum(len(h.tokens) for h in hyps) / len(hyps), 3),
        "mean_score": round(sum(h.score for h in hyps) / len(hyps), 4),
        "no_eos": sum(not h.eos for h in hyps),
        "seconds": round(seconds, 1),
    }, hyps


def model_or_search(
    hyps: Sequence[Hypothesis], forced: dict, cfg: DecodeConfig
) -> dict[str, int | float]:
    """Item 2: among outputs shorter than their reference, search errors and model errors."""
    shorter = search_err = 0
    for h, lp, n in zip(hyps, forced["log_prob"], forced["length"], strict=True):
        if len(h.tokens) >= n:
            continue
        shorter += 1
        ref_score = lp / length_penalty(n + 1, cfg.alpha, cfg.length_penalty)
        search_err += ref_score > h.score
    return {
        "shorter_than_ref": shorter,
        "search_errors": search_err,
        "model_errors": shorter - search_err,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", required=True, help="a model directory")
    p.add_argument("--src", required=True, type=Path)
    p.add_argument("--ref", required=True, type=Path)
    p.add_argument("--beam", type=int, help="beam size (default: the model's)")
    p.add_argument("--alphas", default="", help="comma list (default: the model's α)")
    p.add_argument("--exhaustive", action="store_true", help="also beam without early stop")
    p.add_argument("--limit", type=int, default=0, help="only the first N lines (0 = all)")
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    translator = Translator.load(args.model, device="cpu", dtype="fp32")
    srcs, refs = read_file_lines(args.src), read_file_lines(args.ref)
    if args.limit:
        srcs, refs = srcs[: args.limit], refs[: args.limit]
    base = translator.settings(args.beam)
    alphas = [float(a) for a in args.alphas.split(",") if a] or [base.alpha]
    forced = forced_scores(translator, srcs, refs)
    ref_tokens = sum(forced["length"]) / len(refs)
    out: dict = {
        "model": args.model,
        "src": str(args.src),
        "sentences": len(srcs),
        "beam_size": base.beam_size,
        "ref_mean_tokens": round(ref_tokens, 3),
        "eos": {k: round(forced[k], 5) for k in EOS_KEYS},
        "runs": [],
    }
    print(f"{len(srcs)} sentences, reference mean {ref_tokens:.2f} subword tokens (+ EOS)")
    print("EOS along the references: " + ", ".join(f"{k} {v}" for k, v in out["eos"].items()))
    greedy, g_hyps = run_search(translator, srcs, refs, dataclasses.replace(base, beam_size=1))
    greedy |= model_or_search(g_hyps, forced, base)
    out["runs"].append({"search": "greedy", "alpha": base.alpha, **greedy})
    for alpha in alphas:
        cfg = dataclasses.replace(base, alpha=alpha)
        row, hyps = run_search(translator, srcs, refs, cfg)
        out["runs"].append({"search": f"beam{cfg.beam_size}", "alpha": alpha, **row,
                            **model_or_search(hyps, forced, cfg)})  # fmt: skip
        if args.exhaustive:
            with no_early_termination():
                row, hyps = run_search(translator, srcs, refs, cfg)
            out["runs"].append({"search": f"beam{cfg.beam_size}-no-early-stop", "alpha": alpha,
                                **row, **model_or_search(hyps, forced, cfg)})  # fmt: skip
    keys = ["bleu", "length_ratio", "brevity_penalty", "mean_tokens", "mean_score", "no_eos",
            "shorter_than_ref", "search_errors", "model_errors", "seconds"]  # fmt: skip
    print("| search | alpha | " + " | ".join(keys) + " |")
    print("|---|---:|" + "---:|" * len(keys))
    for r in out["runs"]:
        print(f"| {r['search']} | {r['alpha']} | " + " | ".join(str(r[k]) for k in keys) + " |")
    assert all(math.isfinite(x) for x in forced["log_prob"])
    print(json.dumps(out))


if __name__ == "__main__":
    main()
