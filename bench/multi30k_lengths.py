"""Multi30k test scores with their lengths: BLEU, length ratio and brevity penalty, both metrics.

bench/multi30k_eval.py's two BLEUs (tokenized as the published figures, and cased detokenized
sacreBLEU), each with the hypothesis/reference length ratio and the brevity penalty that issue
#15's goal (BP >= 0.98, greedy and beam) is about, for each search asked for:

    python bench/multi30k_lengths.py --model runs/x/averaged --src en --tgt de \
        --beams 1,5 --alpha 1.0

Pick α on the validation set first (`aiayn evaluate --alphas ...` on val), never on test.
fp32 on the CPU, `--threads` (default 1). Prints a table and one JSON object on its last line.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import sacrebleu
import torch
from multi30k_eval import DATA, moses_lc_tok, read  # bench/, next to this script

from aiayn.translate.translator import Translator


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", required=True, help="a model directory")
    p.add_argument("--src", required=True, choices=["de", "en"])
    p.add_argument("--tgt", required=True, choices=["de", "en"])
    p.add_argument("--data", type=Path, default=DATA)
    p.add_argument("--tests", default="test_2016_flickr", help="comma list of test sets")
    p.add_argument("--beams", default="1,5", help="comma-separated beam sizes")
    p.add_argument("--alpha", type=float, help="length penalty (default: the model's [decode])")
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args()
    if not args.data.is_dir():
        sys.exit(f"multi30k_lengths: Multi30k not found at {args.data}")
    torch.set_num_threads(args.threads)
    translator = Translator.load(args.model, device="cpu", dtype="fp32")
    alpha = {} if args.alpha is None else {"alpha": args.alpha}
    rows = []
    for test in args.tests.split(","):
        src = read(args.data / "raw" / f"{test}.{args.src}")
        ref_raw = read(args.data / "raw" / f"{test}.{args.tgt}")
        ref_tok = read(args.data / "tok" / f"{test}.lc.norm.tok.{args.tgt}")
        for beam in (int(b) for b in args.beams.split(",")):
            t0 = time.monotonic()
            hyps = translator.translate(src, beam=beam, **alpha)
            seconds = time.monotonic() - t0
            tok = sacrebleu.corpus_bleu(
                moses_lc_tok(hyps, args.tgt), [ref_tok], tokenize="none", force=True
            )
            detok = sacrebleu.corpus_bleu(hyps, [ref_raw])
            rows.append({
                "test": test,
                "search": "greedy" if beam == 1 else f"beam{beam}",
                "alpha": translator.settings(beam, **alpha).alpha,
                "tok_bleu": round(tok.score, 2),
                "tok_ratio": round(tok.sys_len / tok.ref_len, 4),
                "tok_bp": round(tok.bp, 4),
                "sacrebleu": round(detok.score, 2),
                "ratio": round(detok.sys_len / detok.ref_len, 4),
                "bp": round(detok.bp, 4),
                "seconds": round(seconds, 1),
            })  # fmt: skip
    keys = list(rows[0])
    print("| " + " | ".join(keys) + " |")
    print("|" + "---|" * len(keys))
    for r in rows:
        print("| " + " | ".join(str(r[k]) for k in keys) + " |")
    print(json.dumps({"model": args.model, "direction": f"{args.src}-{args.tgt}", "rows": rows}))


if __name__ == "__main__":
    main()
