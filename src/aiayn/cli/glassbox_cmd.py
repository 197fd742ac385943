"""`aiayn explain`, `aiayn attend` and `aiayn plot-log`: the glass box from the terminal."""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from pathlib import Path

from aiayn.cli.flags import (
    MAX_FLAG,
    add_device_flag,
    add_length_penalty_flags,
    add_sampling_flags,
    given_search_settings,
    refuse_export_dir,
)
from aiayn.errors import AiaynError

# A trace grows with source x output length x layers (a 1,000-token sentence on a 2-layer model
# held 13 GB and printed 2 GB); what --layers/--heads/--steps leave out is never recorded.
MAX_TRACE_NUMBERS = 100_000_000


def add_explain(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "explain",
        help="every number of one translation: embeddings, Q/K/V, attention, FFN, next tokens "
        "(a language model's --prompt; a classifier's --text, with saliency and rollout)",
    )
    p.add_argument("sentence", nargs="?", help="the source sentence to translate and explain")
    p.add_argument("--model", type=Path, help="a model directory")
    p.add_argument(
        "--prompt",
        help="a language model's prompt (a DecoderLM directory; '' = BOS alone): its forward "
        "pass, next-token distribution and --max-len generation steps (default 8)",
    )
    p.add_argument(
        "--text",
        help="a classifier's text (an EncoderClassifier directory): its forward pass, class "
        "probabilities, gradient x input saliency and attention rollout per token",
    )
    p.add_argument(
        "--class",
        dest="class_label",
        metavar="LABEL",
        help="a classifier: the class whose logit the saliency explains (default: the predicted)",
    )
    p.add_argument("--json", action="store_true", help="the same as --format json")
    p.add_argument("--html", type=Path, metavar="OUT", help="--format html --out OUT")
    p.add_argument(
        "--greedy", action="store_true", help="a language model: trace greedy, not sampling"
    )
    p.add_argument(
        "--seed-example",
        action="store_true",
        help="replay the tutorials' worked example (docs/worked_example.md); no model needed",
    )
    p.add_argument(
        "--format",
        choices=("text", "json", "html"),
        default="text",
        help="text, json or html (--seed-example: text or json)",
    )
    p.add_argument("--out", type=Path, help="write to this file instead of stdout")
    p.add_argument("--layers", help="layers to show, counted from 0: '0,2' or '0-1' (default all)")
    p.add_argument("--heads", help="heads to show, counted from 1: '1,3' (default all)")
    p.add_argument("--steps", help="decoding steps shown in full, from 0 (default all)")
    p.add_argument("--dims", type=int, default=8, help="dimensions shown per vector (default 8)")
    p.add_argument("--precision", type=int, default=4, help="decimals (default 4)")
    p.add_argument("--top-k", type=int, default=5, help="next-token candidates shown per step")
    p.add_argument("--max-len", type=int, help="most output tokens (default source length + 50)")
    p.add_argument("--min-len", type=int, help="no EOS before this many tokens (default 0)")
    p.add_argument("--beam", type=int, default=0, help="also trace beam search of this size")
    add_length_penalty_flags(p)
    p.add_argument(
        "--max-trace-numbers",
        type=int,
        default=MAX_TRACE_NUMBERS,
        help="most numbers the trace may hold, and the --beam trace apart, a "
        "token of its counted as 20 (default %(default)s: ~400 MB; a "
        "paper_base model explains ~150 tokens in and out in full)",
    )
    add_sampling_flags(p, "--sample-top-k", "trace sampling instead of greedy")
    add_device_flag(p)


_EXPLAIN_SEARCH_FLAGS = {  # DecodeConfig field -> argparse dest
    "alpha": "alpha",
    "length_penalty": "length_penalty",
    "min_len": "min_len",
    "temperature": "temperature",
    "top_k": "sample_top_k",
    "top_p": "top_p",
    "seed": "seed",
}


def run_explain(args: argparse.Namespace) -> int:
    from aiayn.glassbox.explain import BeamTraceTooLargeError
    from aiayn.glassbox.explain_report import explain_report
    from aiayn.glassbox.render import View, parse_indices
    from aiayn.glassbox.seed_example import seed_example_json, seed_example_text
    from aiayn.nn.tracing import TraceTooLargeError

    if args.json or args.html:
        args.format = "html" if args.html else "json"
        args.out = args.html or args.out
    if args.seed_example:
        if args.format == "html":
            raise AiaynError(
                "--seed-example prints text or json (the page of `aiayn serve` shows it too)"
            )
        report = seed_example_text()
        if args.format == "json":
            report = json.dumps(seed_example_json(), ensure_ascii=False, allow_nan=False) + "\n"
    elif args.model is not None and (kind := _architecture(args.model, args.device)) in (
        "DecoderLM",
        "EncoderClassifier",
    ):
        report = _explain_lm(args) if kind == "DecoderLM" else _explain_cls(args)
    else:
        if args.text is not None or args.class_label is not None:
            refuse_export_dir(args.model, "explain")  # an exported classifier: said so
            raise AiaynError(
                "--text and --class are for a classifier (an EncoderClassifier directory); "
                "a translator explains a sentence: aiayn explain --model DIR 'sentence'"
            )
        if args.prompt is not None:
            raise AiaynError(
                "--prompt is for a language model (a DecoderLM directory); a translator "
                "explains a sentence: aiayn explain --model DIR 'sentence'"
            )
        if args.model is None or args.sentence is None:
            raise AiaynError("give --model DIR and a sentence (or --seed-example)")
        if not args.sentence.strip():  # said before the model is loaded
            raise AiaynError("the sentence to explain is empty")
        refuse_export_dir(args.model, "explain")
        view = View(
            parse_indices(args.layers),
            parse_indices(args.heads),
            parse_indices(args.steps),
            args.dims,
            args.precision,
        )
        overrides = given_search_settings(args, _EXPLAIN_SEARCH_FLAGS)
        if not 1 <= args.max_trace_numbers <= MAX_FLAG:
            raise AiaynError(f"--max-trace-numbers must be in [1, {MAX_FLAG:,}]")
        try:
            report = explain_report(
                str(args.model),
                args.sentence,
                fmt=args.format,
                view=view,
                top_k=args.top_k,
                max_len=args.max_len,
                beam=args.beam,
                device=args.device,
                overrides=overrides,
                max_numel=args.max_trace_numbers,
            )
        except BeamTraceTooLargeError:
            raise AiaynError(
                f"the beam search's trace would hold more than {args.max_trace_numbers:,} "
                "numbers (its hypotheses grow with the beam and the square of the steps): lower "
                "--beam or --max-len, or raise --max-trace-numbers"
            ) from None
        except TraceTooLargeError:
            raise AiaynError(
                f"the trace would hold more than {args.max_trace_numbers:,} numbers: show less "
                "with --layers, --heads or --steps, shorten the sentence or --max-len, or raise "
                "--max-trace-numbers"
            ) from None
    if args.out:
        from aiayn.atomic import atomic_write_text

        if args.out.is_dir():
            raise AiaynError(f"--out {args.out} is a directory; give a file name")
        atomic_write_text(args.out, report)
        print(f"wrote {args.out}")
    else:
        sys.stdout.write(report)
    return 0


def _architecture(model_dir: Path, device: str) -> str:
    """The architecture a model directory holds ("" for an export or an old directory)."""
    from aiayn.runtime.device import resolve_device
    from aiayn.store.directory import ModelDir, is_export_dir

    if is_export_dir(model_dir):
        return ""
    resolve_device(device)  # a missing device is said before any file is read
    return ModelDir.open(model_dir).architecture


def _explain_lm(args: argparse.Namespace) -> str:
    """`aiayn explain --model LM --prompt TEXT`: aiayn.glassbox.explain_lm, rendered."""
    from aiayn.glassbox.explain_report import explain_lm_report
    from aiayn.glassbox.render import View, parse_indices
    from aiayn.nn.tracing import TraceTooLargeError

    if args.text is not None or args.class_label is not None:
        raise AiaynError(
            "--text and --class are for a classifier; a language model explains a prompt: "
            "give --prompt TEXT"
        )
    if args.prompt is not None and args.sentence is not None:
        raise AiaynError("give the prompt once: --prompt TEXT or a positional argument")
    prompt = args.prompt if args.prompt is not None else args.sentence
    if prompt is None:
        raise AiaynError("a language model explains a prompt: give --prompt TEXT ('' = BOS)")
    if args.beam:
        raise AiaynError("--beam traces a translator's beam search; a language model's is not")
    if args.sample and args.greedy:
        raise AiaynError("--sample and --greedy: choose one")
    layers, heads = parse_indices(args.layers), parse_indices(args.heads)
    view = View(layers, heads, None, args.dims, args.precision)
    overrides = given_search_settings(args, _EXPLAIN_SEARCH_FLAGS)
    if args.greedy:
        overrides["sample"] = False
    if not 1 <= args.max_trace_numbers <= MAX_FLAG:
        raise AiaynError(f"--max-trace-numbers must be in [1, {MAX_FLAG:,}]")
    try:
        return explain_lm_report(
            str(args.model),
            prompt,
            fmt=args.format,
            view=view,
            top_k=args.top_k,
            max_len=args.max_len,
            device=args.device,
            overrides=overrides,
            max_numel=args.max_trace_numbers,
        )
    except TraceTooLargeError:
        raise AiaynError(
            f"the trace would hold more than {args.max_trace_numbers:,} numbers: show less "
            "with --layers or --heads, shorten the prompt, or raise --max-trace-numbers"
        ) from None


def _explain_cls(args: argparse.Namespace) -> str:
    """`aiayn explain --model CLS --text TEXT [--class LABEL]`: aiayn.glassbox.explain_cls,
    rendered as text (tokens shaded by saliency on a terminal) or JSON."""
    import os

    from aiayn.classify.classifier import Classifier
    from aiayn.glassbox.explain_cls import explain_classifier
    from aiayn.glassbox.render import View, parse_indices
    from aiayn.glassbox.render_cls import cls_to_json_text, cls_to_text
    from aiayn.nn.tracing import TraceTooLargeError

    if args.text is not None and args.sentence is not None:
        raise AiaynError("give the text once: --text TEXT or a positional argument")
    text = args.text if args.text is not None else args.sentence
    if text is None:
        raise AiaynError("a classifier explains a text: give --text TEXT")
    if args.prompt is not None:
        raise AiaynError("--prompt is for a language model; a classifier takes --text TEXT")
    if args.beam:
        raise AiaynError("--beam traces a translator's beam search; a classifier has none")
    searching = {
        "--steps": args.steps is not None,
        "--sample": bool(getattr(args, "sample", False)),
        "--max-len": args.max_len is not None,
        "--min-len": args.min_len is not None,
        "--top-k": args.top_k != 5,  # its default
    }
    given = [flag for flag, on in searching.items() if on]
    if given:
        raise AiaynError(
            f"{', '.join(given)} set a search's steps; a classifier has none (it shows every "
            "class's probability)"
        )
    if args.format == "html":
        raise AiaynError(
            "a classifier's explanation prints as text or json (`aiayn serve` draws it live)"
        )
    layers, heads = parse_indices(args.layers), parse_indices(args.heads)
    view = View(layers, heads, None, args.dims, args.precision)
    if view.dims < 1 or not 0 <= view.precision <= 12:  # said before the model is loaded
        raise AiaynError("--dims must be >= 1 and --precision between 0 and 12")
    if not 1 <= args.max_trace_numbers <= MAX_FLAG:
        raise AiaynError(f"--max-trace-numbers must be in [1, {MAX_FLAG:,}]")
    classifier = Classifier.open(args.model, args.device, "fp32")
    try:
        exp = explain_classifier(
            classifier,
            text,
            class_label=args.class_label,
            want=view.shows,
            max_numel=args.max_trace_numbers,
        )
    except TraceTooLargeError:
        raise AiaynError(
            f"the trace would hold more than {args.max_trace_numbers:,} numbers: show less "
            "with --layers or --heads, shorten the text, or raise --max-trace-numbers"
        ) from None
    if args.format == "json":
        return cls_to_json_text(exp, view)
    ansi = args.out is None and sys.stdout.isatty() and "NO_COLOR" not in os.environ
    return cls_to_text(exp, view, ansi=ansi)


def add_attend(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "attend",
        help="attention heatmaps (PNG) and an interactive page (HTML): translations, or the "
        "input of a classifier or language model",
    )
    p.add_argument("sentences", nargs="*", help="source sentences (or --input)")
    p.add_argument("--model", type=Path, required=True, help="a model directory")
    p.add_argument("--input", type=Path, help="a UTF-8 file, one source sentence per line")
    p.add_argument(
        "--prompt",
        help="a language model's prompt: draw its causal self-attention (every layer and "
        "head) into the image --out names",
    )
    p.add_argument(
        "--out",
        type=Path,
        required=True,
        help="directory for the PNGs and HTML (--prompt: an image file, e.g. attn.png)",
    )
    p.add_argument("--max-len", type=int, help="most output tokens (default source length + 50)")
    add_device_flag(p)


def run_attend(args: argparse.Namespace) -> int:
    from aiayn.atomic import atomic_write_text
    from aiayn.glassbox.attention_page import attention_page
    from aiayn.glassbox.viz import (
        MAX_SENTENCES,
        attention_figures,
        attention_for_model,
        write_figure,
    )
    from aiayn.runtime.device import resolve_device
    from aiayn.store.model_dir import load_model_dir
    from aiayn.text.corpus import read_lines
    from aiayn.text.tokenizer import Tokenizer

    if args.prompt is not None:
        return _attend_lm(args)
    # --out must be (or become) a directory: say so now, not after the model has run.
    existing = next(p for p in (args.out, *args.out.parents) if p.exists())
    if existing == args.out and not existing.is_dir():
        raise AiaynError(
            f"--out {args.out} is an existing file; attend writes a directory "
            "(PNGs and attention.html)"
        )
    if not existing.is_dir():
        raise AiaynError(f"--out {args.out}: {existing} is a file, not a directory")
    refuse_export_dir(args.model, "attend")
    sentences = list(args.sentences)
    if args.input:  # UTF-8, checked; read no further than one sentence past the bound
        with args.input.open("rb") as f:
            given = (s for s in read_lines(f, str(args.input)) if s.strip())
            sentences += itertools.islice(given, MAX_SENTENCES + 1)
    if not sentences:
        raise AiaynError("give at least one sentence (or --input FILE)")
    device = resolve_device(args.device)
    model, tok = load_model_dir(args.model, device), Tokenizer.load(args.model)
    examples = attention_for_model(model, tok, sentences, args.max_len)
    try:
        for i, ex in enumerate(examples):
            sub = args.out / (f"{i:03d}" if len(examples) > 1 else "")
            for name, fig in attention_figures(ex).items():
                write_figure(fig, sub / name, dpi=110)
            print(f"{sentences[i]} -> {ex.translation or '(input only)'}  ({sub}/*.png)")
        atomic_write_text(args.out / "attention.html", attention_page(examples))
    except (FileExistsError, NotADirectoryError) as e:  # e.g. a file named 000 in --out
        raise AiaynError(
            f"cannot write into --out {args.out}: {e.strerror}: {e.filename}"
        ) from None
    print(f"interactive view: {args.out / 'attention.html'}")
    return 0


def _attend_lm(args: argparse.Namespace) -> int:
    """`aiayn attend --model LM --prompt TEXT --out attn.png`: one grid of the causal maps."""
    from aiayn.glassbox.viz import figure_format, lm_attention_figure, write_figure
    from aiayn.nn.variants import DecoderLM
    from aiayn.runtime.device import resolve_device
    from aiayn.store.directory import ModelDir

    figure_format(args.out)  # a bad --out is said before the model runs
    if args.sentences or args.input:
        raise AiaynError("--prompt draws one prompt: give no sentences or --input with it")
    refuse_export_dir(args.model, "attend")
    opened = ModelDir.open(args.model)
    if opened.architecture != "DecoderLM":
        raise AiaynError(
            f"--prompt is for a language model (a DecoderLM); {args.model} holds a "
            f"{opened.architecture or 'Transformer'}: give sentences and an --out directory"
        )
    model = opened.load_model(DecoderLM, resolve_device(args.device))
    write_figure(lm_attention_figure(model, opened.tokenizer, args.prompt), args.out, dpi=110)
    print(f"wrote {args.out}")
    return 0


def add_plot_log(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("plot-log", help="training curves (loss, perplexity, lr, BLEU) as PNG")
    p.add_argument("run_dir", type=Path, help="a training run directory (or its metrics.jsonl)")
    p.add_argument(
        "--out",
        type=Path,
        help="image path, its format from the suffix: .png, "
        ".svg, .pdf, ... (default RUN_DIR/curves.png)",
    )


def run_plot_log(args: argparse.Namespace) -> int:
    from aiayn.glassbox.viz import figure_format, write_figure
    from aiayn.training.curves import plot_training_log

    run_dir = args.run_dir if args.run_dir.is_dir() else args.run_dir.parent
    out = args.out or run_dir / "curves.png"
    figure_format(out)  # a bad --out is said before the log is read
    fig = plot_training_log(args.run_dir)
    write_figure(fig, out, dpi=100)
    print(f"wrote {out}")
    return 0
