"""`aiayn translate` and `aiayn evaluate` (with the length-penalty sweep)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from aiayn.cli.flags import add_search_flags, decode_setup
from aiayn.errors import AiaynError


def add_translate(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "translate", help="translate a file or stdin: exactly one output line per input line"
    )
    add_search_flags(p)
    p.add_argument("--input", type=Path, help="UTF-8 text, one sentence per line (default stdin)")
    p.add_argument("--output", type=Path, help="default stdout; a file is replaced atomically")
    p.add_argument("--nbest", type=int, help="N best per line, 'i ||| text ||| score'")
    p.add_argument(
        "--buffer-size",
        type=int,
        default=0,
        help="lines per sorted batch group (default 0: 1024, or 1 when typing at a "
        "terminal, so each line is answered as it is entered)",
    )


def run_translate(args: argparse.Namespace) -> int:

    from aiayn.atomic import atomic_open_text, same_file
    from aiayn.translate.files import translate_to

    if args.output is not None:  # checked before the model loads
        # `--input a.txt --output a.txt` (or `< a.txt`) would replace the text with its
        # translation; /dev/stdin names whatever stdin is, a file included.
        if same_file(args.input or Path("/dev/stdin"), args.output):
            raise AiaynError(
                f"--output {args.output} is the input file; it would be replaced by its translation"
            )
        if args.output.is_dir():
            raise AiaynError(f"--output {args.output} is a directory; give a file name")
    if args.buffer_size < 0:
        raise AiaynError(
            f"--buffer-size must be >= 0 (0 = 1024, or 1 on a terminal), got {args.buffer_size}"
        )
    translator, cfg = decode_setup(args)
    interactive = args.input is None and sys.stdin.isatty()
    buffer_size = args.buffer_size or (1 if interactive else 1024)
    kw = dict(batch_tokens=args.batch_tokens, buffer_size=buffer_size)
    if args.output is None:  # a reader that leaves early (`| head`): cli.main stops quietly
        translate_to(translator, cfg, sys.stdout, args.input, **kw)
        return 0
    with atomic_open_text(args.output) as out:  # a failed run leaves no half-written output
        translate_to(translator, cfg, out, args.input, **kw)
    return 0


def add_evaluate(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "evaluate",
        help="translate --src and score against --ref: BLEU, chrF; or a language model's "
        "loss on --text; or a classifier's accuracy and macro-F1 on --data",
    )
    add_search_flags(p)
    p.add_argument("--src", type=Path, help="source sentences, one per line")
    p.add_argument("--ref", type=Path, help="reference translations")
    p.add_argument(
        "--text",
        type=Path,
        help="a language model's test text: nats per token, perplexity, bits per character "
        "and per byte (instead of --src/--ref)",
    )
    p.add_argument(
        "--data",
        type=Path,
        help="a classifier's labelled test texts (TSV/CSV with a header, JSON lines, or "
        "'LABEL TEXT' lines): accuracy, macro-F1, per-class scores, the confusion matrix",
    )
    p.add_argument("--label-column", default="label", help="with --data (default label)")
    p.add_argument("--text-column", default="text", help="with --data (default text)")
    p.add_argument(
        "--confusion",
        type=Path,
        metavar="PNG",
        help="with --data: also draw the confusion matrix into this image file",
    )
    p.add_argument(
        "--bootstrap",
        type=int,
        metavar="N",
        help="with --data: resamples for the 95%% intervals of accuracy and macro-F1 "
        "(default 1000; 0: none)",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--hyps", type=Path, help="also write the translations to this file")
    p.add_argument(
        "--alphas",
        help="choose the length penalty: score each α of a comma list ('0.6,1.0,1.4') and the "
        "model's own with beam search, and name the best, unless it is within chance of the "
        "model's α (docs/decoding.md)",
    )
    p.add_argument(
        "--confidence",
        action="store_true",
        help="also the 95%% confidence interval of BLEU and chrF: how far they would move on "
        "another test set like this one (bootstrap: 1,000 resamples of the sentences)",
    )
    p.add_argument(
        "--compare",
        type=Path,
        action="append",
        default=[],
        metavar="HYPS",
        help="another system's translations of --src, one line each (e.g. an earlier --hyps): "
        "is this model's difference from it more than chance? (paired approximate "
        "randomization, 10,000 trials; p < 0.05: unlikely to be chance); repeatable, at most "
        "10; implies --confidence",
    )


# Each α beam-searches the whole --src file once: a grid of a few values is what §6.1 did.
MAX_ALPHAS = 100
# Each compared system costs 10,000 rescorings of the test set (~5 s for 1,000 sentences).
MAX_COMPARE = 10


def parse_alphas(text: str) -> list[float]:
    """The distinct values of a comma list, in their order (a repeated α would translate the
    file again for the same row), checked before any run."""
    from aiayn.config import MAX_ALPHA

    try:
        alphas = list(dict.fromkeys(float(a) for a in text.split(",") if a.strip()))
    except ValueError:
        raise AiaynError(f"--alphas {text[:80]!r}: expected numbers separated by commas") from None
    if not alphas or any(not 0 <= a <= MAX_ALPHA for a in alphas):  # NaN too, before any run
        raise AiaynError(
            f"--alphas {text[:80]!r}: expected one or more numbers in [0, {MAX_ALPHA:g}]"
        )
    if len(alphas) > MAX_ALPHAS:  # each translates the whole file
        raise AiaynError(
            f"--alphas has {len(alphas):,} distinct values; at most {MAX_ALPHAS} (each "
            "beam-searches the whole --src file)"
        )
    return alphas


def run_alpha_sweep(args: argparse.Namespace) -> int:
    """`evaluate --alphas`: a table (or JSON list) of BLEU and chrF per α, and the best one."""
    from aiayn.translate.evaluate import (
        SIGNIFICANCE_LEVEL,
        alpha_choice_note,
        read_test_set,
        sweep_alpha,
    )

    alphas = parse_alphas(args.alphas)  # checked before the model loads
    if args.alpha is not None or args.hyps is not None:
        raise AiaynError("--alphas chooses alpha itself: leave out --alpha and --hyps")
    if args.confidence or args.compare:
        raise AiaynError(
            "--alphas scores one search per alpha: leave out --confidence and "
            "--compare (evaluate the chosen alpha with them)"
        )
    src, refs = read_test_set(args.src, args.ref)
    translator, cfg = decode_setup(args)
    rows = sweep_alpha(translator, cfg, src, refs, alphas, batch_tokens=args.batch_tokens)
    if args.json:
        print(json.dumps(rows))
        return 0
    print(
        f"{'alpha':>6} {'BLEU':>6} {'p':>6} {'chrF':>6} {'length ratio':>12} {'BP':>5}   "
        f"(beam {cfg.beam_size}, {cfg.length_penalty} length penalty)"
    )
    for r in rows:
        p = "-" if r["bleu_p_value"] is None else f"{r['bleu_p_value']:.3f}"
        best = "<- best (brevity)" if r["reason"] == "brevity" else "<- best"
        marks = [m for m, on in (("the model's", r["current"]), (best, r["best"])) if on]
        print(
            f"{r['alpha']:6.2f} {r['bleu']:6.2f} {p:>6} {r['chrf']:6.2f} "
            f"{r['length_ratio']:12.3f} {r['brevity_penalty']:5.3f}  {' '.join(marks)}".rstrip()
        )
    others = max(len(rows) - 1, 1)
    print(
        "p: paired approximate randomization against the model's alpha (10,000 trials); "
        f"the best moves from it only below {SIGNIFICANCE_LEVEL:g} / {others} other "
        f"alphas = {SIGNIFICANCE_LEVEL / others:.3g}"
    )
    note = alpha_choice_note(rows)  # outputs short: a larger alpha taken, or why not
    if note:
        print(note)
    print(sweep_advice(rows, cfg.length_penalty))
    return 0


def sweep_advice(rows: list[dict[str, Any]], length_penalty: str) -> str:
    """The sweep's last line: what to do with its choice (sweep_alpha's rows)."""
    from aiayn.translate.evaluate import best_alpha_row

    current = next(r for r in rows if r["current"])
    top = rows[best_alpha_row(rows)]  # the highest, whether or not it is chosen
    if current["best"] and top is not current and top["bleu"] != current["bleu"]:
        return (
            f"alpha {top['alpha']:g} scored highest, but within chance of the model's "
            f"{current['alpha']:g} (p = {top['bleu_p_value']:.3f}): keep {current['alpha']:g}, "
            "or decide on more sentences"
        )
    if current["best"]:
        return f"the model's alpha {current['alpha']:g} is the best: nothing to change"
    best = next(r["alpha"] for r in rows if r["best"])
    form = "" if length_penalty == "gnmt" else f" --length-penalty {length_penalty}"
    return (
        f"best alpha = {best:g}: pass --alpha {best:g}{form} to translate, or train with "
        f"--set decode.alpha={best:g} to save it in the model"
    )


def read_compared(args: argparse.Namespace, n: int) -> list[tuple[str, list[str]]]:
    """The --compare files, read and checked (n lines, as --src) before the model loads."""
    from aiayn.atomic import same_file
    from aiayn.errors import DataError
    from aiayn.translate.files import read_file_lines

    if len(args.compare) > MAX_COMPARE:
        raise AiaynError(f"--compare is given {len(args.compare)} times; at most {MAX_COMPARE}")
    compared = []
    for path in args.compare:
        if args.hyps is not None and same_file(path, args.hyps):
            raise AiaynError(f"--hyps {args.hyps} is a --compare file; it would be overwritten")
        if path.is_dir():
            raise AiaynError(f"--compare {path} is a directory; give a file of translations")
        lines = read_file_lines(path)
        if len(lines) != n:
            raise DataError(f"--compare {path} has {len(lines)} lines but {args.src} has {n}")
        compared.append((str(path), lines))
    return compared


def print_significance(result: dict[str, Any]) -> None:
    """One row per system: BLEU and chrF, the half-widths of their 95% intervals, p-values."""
    rows = result["systems"]
    width = max(len(r["name"]) for r in rows)
    print(f"{'':{width}} {'BLEU':>6} {'±95%':>5} {'p':>7}  {'chrF2':>6} {'±95%':>5} {'p':>7}")
    for r in rows:
        cells = [
            f"{r[k]['score']:6.2f} {r[k]['ci95']:5.2f} "
            + (f"{r[k]['p_value']:7.4f}" if "p_value" in r[k] else f"{'-':>7}")
            for k in ("bleu", "chrf")
        ]
        print(f"{r['name']:{width}} {cells[0]}  {cells[1]}")
    print(
        f"±95%: half the 95% interval by bootstrap ({result['bootstrap_resamples']:,} "
        f"resamples of the sentences, seed {result['seed']})"
    )
    if result["test"]:
        print(
            f"p: {result['test']} against the first row ({result['trials']:,} trials); "
            "below 0.05, the difference is unlikely to be chance"
        )


def run_evaluate(args: argparse.Namespace) -> int:
    from aiayn.atomic import atomic_write_text, same_file
    from aiayn.translate.evaluate import evaluate_lines, read_test_set
    from aiayn.translate.significance import significance

    if args.data is not None:
        if args.src is not None or args.ref is not None or args.text is not None:
            raise AiaynError(
                "--data scores a classifier; --src/--ref a translator, --text a language "
                "model: give one of them"
            )
        from aiayn.cli.classify_cmd import run_evaluate_data

        return run_evaluate_data(args)
    if args.confusion is not None or args.bootstrap is not None:
        raise AiaynError("--confusion and --bootstrap score a classifier: give --data")
    if args.text is not None:
        if args.src is not None or args.ref is not None:
            raise AiaynError("--text scores a language model; --src/--ref a translator: not both")
        from aiayn.cli.generate_cmd import run_evaluate_text

        return run_evaluate_text(args)
    if args.src is None or args.ref is None:
        raise AiaynError(
            "give --src and --ref (a translator), --text (a language model) or --data "
            "(a classifier)"
        )
    if args.alphas is not None:
        return run_alpha_sweep(args)
    if args.hyps is not None:  # checked before the model loads
        for flag, path in (("--src", args.src), ("--ref", args.ref)):
            if same_file(path, args.hyps):
                raise AiaynError(f"--hyps {args.hyps} is the {flag} file; it would be overwritten")
        if args.hyps.is_dir():
            raise AiaynError(f"--hyps {args.hyps} is a directory; give a file name")
    src, refs = read_test_set(args.src, args.ref)  # read once, checked before the model loads
    compared = read_compared(args, len(src))
    translator, cfg = decode_setup(args)
    result = evaluate_lines(translator, cfg, src, refs, batch_tokens=args.batch_tokens)
    hyps = result.pop("hypotheses")
    if args.hyps is not None:
        atomic_write_text(args.hyps, "".join(h + "\n" for h in hyps))
    if args.confidence or compared:
        result["significance"] = significance(hyps, refs, compared, name=str(args.model))
    if args.json:
        print(json.dumps(result))
        return 0
    for key in ("bleu", "chrf"):
        print(f"{result[key]['text']}\n  signature: {result[key]['signature']}")
    print(f"exact match = {result['exact_match']:.2f}% of {result['sentences']} sentences")
    for b in result["by_source_length"]:  # where short outputs (ratio < 1) cost BLEU
        print(
            f"  source {b['source_words']:>6} words: {b['sentences']:5d} sentences, "
            f"BLEU {b['bleu']:5.2f}, length ratio {b['length_ratio']:.3f}"
        )
    if "significance" in result:
        print_significance(result["significance"])
    return 0
