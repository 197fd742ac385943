"""Multi30k test scores of a trained model, both ways the field reports them.

For each test set (test_2016_flickr, test_2017_flickr) and each search (`--beams`, default
greedy and beam 4; other search settings are the model's own, from its run's [decode]):
- cased, detokenized sacreBLEU on `raw/` (the figure a user would quote), with its signature;
- "tokenized BLEU" as the published Multi30k figures compute it: the hypotheses are
  lowercased, punctuation-normalised and Moses-tokenized exactly as the dataset's own
  `tok/` files were made (sacremoses; the same pipeline applied to the raw references
  reproduces all 1,000 lines of each `tok/` test file), then scored against `tok/` with no
  further tokenization (multi-bleu.perl's arithmetic).

    python bench/multi30k_eval.py --model runs/m30k_de_en --src de --tgt en
    python bench/multi30k_eval.py --model runs/m30k_en_de_avg10 --src en --tgt de --beams 1,4,5
    python bench/multi30k_eval.py --model M --src en --tgt de --tokenized   # a model of tok/

`--confidence`: each tokenized BLEU also with the half-width of its 95% bootstrap interval
(aiayn evaluate's `--confidence`: 1,000 resamples of the 1,000 sentences, seeded).

`--tokenized`: the model was trained on `tok/` (lowercased, tokenized text, as the published
figures' models were): it translates `tok/`'s test sources and its outputs are scored as they
are against `tok/` (no cased sacreBLEU: there is nothing cased to compare; chrF against `tok/`).

Prints one JSON object on its last line. Needs `pip install -e ".[bench]"` (sacremoses).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

import sacrebleu
from sacremoses import MosesPunctNormalizer, MosesTokenizer

from aiayn.runtime.memory import keep_freed_memory
from aiayn.translate.significance import significance
from aiayn.translate.translator import Translator

DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "multi30k"
TESTS = ("test_2016_flickr", "test_2017_flickr")


def moses_lc_tok(lines: list[str], lang: str) -> list[str]:
    """The dataset's tok/ pipeline: lowercase, normalize-punctuation, tokenizer (escaped)."""
    norm, tok = MosesPunctNormalizer(lang=lang), MosesTokenizer(lang=lang)
    return [tok.tokenize(norm.normalize(x.strip().lower()), escape=True, return_str=True)
            for x in lines]  # fmt: skip


def read(path: Path) -> list[str]:
    return [line.strip() for line in path.read_text(encoding="utf-8").splitlines()]


def subword_nmt(
    codes: Path | None,
) -> tuple[Callable[[list[str]], list[str]], Callable[[str], str]]:
    """(segment the sources, join an output) for a model of subword-nmt segmented text, or
    the identities without `codes`. Joining is fairseq's --remove-bpe for "@@ "."""
    if codes is None:
        return (lambda lines: lines), (lambda line: line)
    from subword_nmt.apply_bpe import BPE  # bench's dependency, only for such a model

    with codes.open(encoding="utf-8") as f:
        bpe = BPE(f)

    def segment(lines: list[str]) -> list[str]:
        return [bpe.process_line(line) for line in lines]

    def join(line: str) -> str:
        return (line + " ").replace("@@ ", "").rstrip()

    return segment, join


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", required=True, help="a model directory")
    p.add_argument("--src", required=True, choices=["de", "en"])
    p.add_argument("--tgt", required=True, choices=["de", "en"])
    p.add_argument("--data", type=Path, default=DATA)
    p.add_argument("--beams", default="1,4", help="comma-separated beam sizes")
    p.add_argument("--alpha", type=float, help="length penalty (default: the model's [decode])")
    p.add_argument("--length-penalty", choices=("gnmt", "power"),
                   help="its form (default: the model's [decode])")  # fmt: skip
    p.add_argument(
        "--tokenized",
        action="store_true",
        help="a model trained on tok/: tok/ sources, outputs scored as they are",
    )
    p.add_argument("--bpe-codes", type=Path,
                   help="with --tokenized, a model of subword-nmt segmented tok/ (a 'word' "
                        "vocabulary, bench/multi30k_bpe.py): sources segmented with these "
                        "codes, outputs joined back (fairseq's --remove-bpe)")  # fmt: skip
    p.add_argument("--confidence", action="store_true",
                   help="each tokenized BLEU's 95%% bootstrap interval too")  # fmt: skip
    args = p.parse_args()
    keep_freed_memory()  # malloc as aiayn's commands set it, for every side measured here
    if not args.data.is_dir():
        sys.exit(f"multi30k_eval: Multi30k not found at {args.data}")
    if args.bpe_codes is not None and not args.tokenized:
        sys.exit("multi30k_eval: --bpe-codes segments tok/ sources: give --tokenized too")
    segment, join = subword_nmt(args.bpe_codes)
    translator = Translator.load(args.model)
    given = {"alpha": args.alpha, "length_penalty": args.length_penalty}
    alpha = {k: v for k, v in given.items() if v is not None}
    results: dict[str, dict[str, dict[str, float | str | None]]] = {}
    for test in TESTS:
        ref_tok = read(args.data / "tok" / f"{test}.lc.norm.tok.{args.tgt}")
        if args.tokenized:
            src = read(args.data / "tok" / f"{test}.lc.norm.tok.{args.src}")
            ref_raw = ref_tok  # chrF's reference; no cased sacreBLEU
        else:
            src = read(args.data / "raw" / f"{test}.{args.src}")
            ref_raw = read(args.data / "raw" / f"{test}.{args.tgt}")
        for beam in (int(b) for b in args.beams.split(",")):
            t0 = time.monotonic()
            hyps = [join(h) for h in translator.translate(segment(src), beam=beam, **alpha)]
            seconds = time.monotonic() - t0
            as_tok = hyps if args.tokenized else moses_lc_tok(hyps, args.tgt)
            tok = sacrebleu.corpus_bleu(as_tok, [ref_tok], tokenize="none", force=True)
            detok = None if args.tokenized else sacrebleu.corpus_bleu(hyps, [ref_raw]).score
            chrf = sacrebleu.corpus_chrf(hyps, [ref_raw])
            name = "greedy" if beam == 1 else f"beam{beam}"
            ci = None
            if args.confidence:
                [row] = significance(as_tok, ref_tok, tokenize="none")["systems"]
                ci = round(row["bleu"]["ci95"], 2)
            results.setdefault(test, {})[name] = {
                "tok_bleu": round(tok.score, 2),
                "tok_bleu_ci95": ci,
                "sacrebleu": None if detok is None else round(detok, 2),
                "chrf": round(chrf.score, 2),
                "seconds": round(seconds, 1),
            }
            cased = "" if detok is None else f"  sacreBLEU {detok:5.2f}"
            interval = "" if ci is None else f" ±{ci:.2f}"
            print(f"{test} {name:7s} tokenized BLEU {tok.score:5.2f}{interval}{cased}  "
                  f"chrF {chrf.score:5.2f}"
                  f"  ({seconds:.0f} s)", flush=True)  # fmt: skip
            out = Path(args.model) / f"{test}.{name}.{args.tgt}"
            out.write_text("\n".join(hyps) + "\n", encoding="utf-8")
    metric = sacrebleu.BLEU()
    metric.corpus_score(["x"], [["x"]])  # a signature needs a scored corpus
    signature = str(metric.get_signature())
    print(json.dumps({"model": args.model, "direction": f"{args.src}-{args.tgt}",
                      "alpha": translator.settings(**alpha).alpha,
                      "length_penalty": translator.settings(**alpha).length_penalty,
                      "sacrebleu_signature": signature, "results": results,
                      "allocator": os.environ.get("LD_PRELOAD", "")}))  # fmt: skip


if __name__ == "__main__":
    main()
