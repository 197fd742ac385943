"""`aiayn` command line: thin argparse subcommands over library functions.

Each subcommand is a pair: `_add_<name>(subparsers)` declares its flags and `_run_<name>(args)`
calls the library. Bad input (an `AiaynError`, a missing file) is printed as one line on
stderr with exit status 2; anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from aiayn import __version__
from aiayn.errors import AiaynError

# --- shared flags ---------------------------------------------------------------------------------


def _add_device_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--device", default="auto",
        help="auto | cpu | cuda | cuda:N | mps (default auto: a GPU if there is one, else CPU)",
    )  # fmt: skip


def _add_dtype_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--dtype", choices=("auto", "fp32", "bf16"), default="auto",
        help="arithmetic: auto = bf16 on a GPU with native bf16, else fp32 (docs/decoding.md)",
    )  # fmt: skip


# --- info -----------------------------------------------------------------------------------------


def _add_info(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("info", help="describe a preset or a model directory (sizes, parameters)")
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--preset", help="a ModelConfig preset, e.g. paper_base")
    g.add_argument("--model", type=Path, help="a model directory")
    p.add_argument("--vocab-size", type=int, default=37000, help="with --preset (default 37000)")


def _run_info(args: argparse.Namespace) -> int:
    from aiayn.config import ModelConfig, to_dict
    from aiayn.interop.export_dir import is_export_dir, read_export_meta
    from aiayn.nn.model import Transformer, count_parameters
    from aiayn.store.checkpoint import load_model_dir

    if args.model is not None and is_export_dir(args.model):  # aiayn export wrote it
        meta = read_export_meta(args.model)
        keys = ("engine", "quantization", "architecture", "files", "versions", "source_model")
        print(json.dumps({**{k: meta.get(k) for k in keys}, "config": meta["model"]}, indent=2))
        return 0
    model = (Transformer(ModelConfig.preset(args.preset, vocab_size=args.vocab_size))
             if args.preset else load_model_dir(args.model))  # fmt: skip
    info = {
        "architecture": type(model).__name__,
        "parameters": count_parameters(model),
        "config": to_dict(model.cfg),
    }
    print(json.dumps(info, indent=2))
    return 0


# --- data -----------------------------------------------------------------------------------------


def _add_data(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "data",
        help="make corpora (`data synth`: the built-in corpus) and check them (`data check`)",
    )
    data_sub = p.add_subparsers(dest="data_command", required=True, metavar="DATA_COMMAND")
    _add_data_check(data_sub)
    s = data_sub.add_parser(
        "synth",
        help="numbers or dates in words, as line-aligned parallel files (docs/synthetic.md)",
    )
    s.add_argument("--task", choices=("numbers", "dates"), required=True)
    s.add_argument("--src", required=True, help="source language, e.g. en")
    s.add_argument("--tgt", required=True, help="target language, e.g. de")
    s.add_argument("--n", type=int, required=True, help="training pairs")
    s.add_argument("--valid", type=int, default=1000, help="validation pairs (default 1000)")
    s.add_argument("--test", type=int, default=1000, help="test pairs (default 1000)")
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--out", type=Path, required=True, help="directory for {train,valid,test}.LANG")
    s.add_argument("--force", action="store_true", help="replace files of the same names")


def _run_data(args: argparse.Namespace) -> int:
    from aiayn.text.synthetic import write_corpus

    if args.data_command == "check":
        return _run_data_check(args)

    written = write_corpus(
        args.out,
        args.task,
        args.src,
        args.tgt,
        args.n,
        args.valid,
        args.test,
        args.seed,
        overwrite=args.force,
    )
    for split, (src_path, tgt_path, n) in written.items():
        print(f"{split}: {n} pairs  {src_path}  {tgt_path}")
    return 0


def _add_data_check(data_sub: argparse._SubParsersAction) -> None:
    c = data_sub.add_parser(
        "check",
        help="find what is wrong with a parallel corpus: duplicates, train/valid/test overlap, "
        "misaligned lines, copies, empty, control characters, over-long lines, wrong script "
        "(docs/data.md)",
    )
    c.add_argument("--src", type=Path, required=True, help="training source file, e.g. train.de")
    c.add_argument("--tgt", type=Path, required=True, help="training target file, e.g. train.en")
    for split in ("valid", "test"):
        c.add_argument(f"--{split}-src", type=Path, help=f"{split} source: checked for overlap")
        c.add_argument(f"--{split}-tgt", type=Path, help=f"{split} target")
    c.add_argument("--max-chars", type=int, default=1000, help="a longer side is over-long "
                   "(default 1000)")  # fmt: skip
    c.add_argument("--json", action="store_true", help="print one JSON object")
    c.add_argument("--write", type=Path, metavar="DIR", help="write the cleaned training pairs "
                   "into DIR (new or empty), under the training files' names")  # fmt: skip


def _run_data_check(args: argparse.Namespace) -> int:
    from aiayn.text.check import check_corpus, write_clean

    evals = {}
    for split in ("valid", "test"):
        es, et = getattr(args, f"{split}_src"), getattr(args, f"{split}_tgt")
        if (es is None) != (et is None):
            raise AiaynError(f"give both --{split}-src and --{split}-tgt, or neither")
        if es is not None:
            evals[split] = (es, et)
    if args.max_chars < 1:
        raise AiaynError(f"--max-chars must be at least 1, got {args.max_chars}")
    if args.write is not None:  # refused before the corpus is read
        from aiayn.atomic import check_new_dir

        check_new_dir(args.write)
    report = check_corpus(args.src, args.tgt, evals, max_chars=args.max_chars)
    written = write_clean(report, args.write) if args.write is not None else None
    if args.json:
        print(json.dumps({**report.to_json(), **({"written": written} if written else {})}))
        return 0
    langs = report.languages
    print(f"{report.pairs} training pairs ({langs['src'] or '?'} -> {langs['tgt'] or '?'}): "
          f"{report.summary()}")  # fmt: skip
    for kind, n in report.counts.items():
        if n:
            ex = report.examples[kind][0]
            print(f"  {kind:16} {n:8d}   e.g. {ex['file']} line {ex['line']}: "
                  f"{ex['src'][:60]!r} ||| {ex['tgt'][:60]!r}")  # fmt: skip
    if written:
        print(f"wrote {written['kept']} pairs ({written['dropped']} dropped) to "
              f"{written['src']} and {written['tgt']}")  # fmt: skip
    return 0


# --- translate and evaluate (docs/decoding.md) ----------------------------------------------------


if TYPE_CHECKING:  # imported lazily at run time: `aiayn --help` stays fast
    from aiayn.config import DecodeConfig
    from aiayn.translate.translator import Translator


def _add_search_flags(p: argparse.ArgumentParser) -> None:
    # Search flags default to None: "the model's own settings", i.e. the [decode] table of the
    # run that made it (docs/decoding.md), falling back to the paper's beam 4, alpha 0.6.
    p.add_argument(
        "--model", type=Path, required=True,
        help="a model directory (aiayn train), or one written by aiayn export (runs in its engine)",
    )  # fmt: skip
    p.add_argument("--beam", type=int, help="beam size; 1 = greedy (default: the model's, or 4)")
    p.add_argument("--alpha", type=float, help="length penalty α (default: the model's, or 0.6)")
    p.add_argument("--min-len", type=int, help="no EOS before this many tokens (default 0)")
    p.add_argument("--max-len-a", type=float, help="max length = a * src_len + b (default 1.0)")
    p.add_argument("--max-len-b", type=int, help="(default 50)")
    p.add_argument("--max-tokens", type=int, help="at most this many output tokens per sentence "
                   "(default 0: the model's max_len)")  # fmt: skip
    _add_sampling_flags(p, "--top-k", "sample instead of searching")
    p.add_argument("--batch-tokens", type=int, default=2048, help="source tokens per batch")
    p.add_argument("--threads", type=int, default=0,
                   help="torch (or the export's engine) threads; 0 = its default")  # fmt: skip
    _add_device_flag(p)
    _add_dtype_flag(p)


def _add_sampling_flags(p: argparse.ArgumentParser, top_k_flag: str, sample_help: str) -> None:
    """The sampling flags translate, evaluate and explain share (explain's --top-k counts the
    candidates it shows, so its sampling top-k is --sample-top-k)."""
    p.add_argument("--sample", action="store_true", help=sample_help)
    p.add_argument("--temperature", type=float, help="with --sample (default 1.0)")
    p.add_argument(top_k_flag, type=int, help="with --sample; 0 = off (default)")
    p.add_argument("--top-p", type=float, help="with --sample; 1.0 = off (default)")
    p.add_argument("--seed", type=int, help="with --sample (default 0); line n samples from "
                   "(seed, n)")  # fmt: skip


def _given_search_settings(args: argparse.Namespace, flags: dict[str, str]) -> dict[str, Any]:
    """The DecodeConfig fields the command line set (`flags`: field -> argparse dest)."""
    given: dict[str, Any] = {
        f: getattr(args, a) for f, a in flags.items() if getattr(args, a, None) is not None
    }
    if args.sample:
        given["sample"] = True
    return given


_SEARCH_FLAGS = {  # DecodeConfig field -> argparse dest
    "beam_size": "beam", "alpha": "alpha", "min_len": "min_len", "max_len_a": "max_len_a",
    "max_len_b": "max_len_b", "max_tokens": "max_tokens", "nbest": "nbest",
    "temperature": "temperature", "top_k": "top_k", "top_p": "top_p", "seed": "seed",
}  # fmt: skip


def _decode_setup(args: argparse.Namespace) -> tuple[Translator, DecodeConfig]:
    """The flags given, over the model's saved search settings; checked before the model loads."""
    import dataclasses
    import logging

    import torch

    from aiayn.interop.engines import exported_decode_config, load_translator
    from aiayn.interop.export_dir import is_export_dir
    from aiayn.search.settings import check_decode_config
    from aiayn.translate.translator import Translator, saved_decode_config

    given = _given_search_settings(args, _SEARCH_FLAGS)
    exported = is_export_dir(args.model)
    saved = exported_decode_config(args.model) if exported else saved_decode_config(args.model)
    cfg = dataclasses.replace(saved, **given)
    check_decode_config(cfg)
    if args.batch_tokens < 1:
        raise AiaynError(f"--batch-tokens must be at least 1, got {args.batch_tokens}")
    if args.threads:
        torch.set_num_threads(args.threads)
    logging.basicConfig(level=logging.INFO, format="aiayn: %(message)s")  # show warnings
    if exported:  # aiayn export wrote it: CTranslate2 or ONNX Runtime runs it (docs/export.md)
        translator = load_translator(args.model, cfg, device=args.device, dtype=args.dtype,
                                     threads=args.threads)  # fmt: skip
        return translator, cfg
    return Translator.load(args.model, cfg, device=args.device, dtype=args.dtype), cfg


def _add_translate(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "translate", help="translate a file or stdin: exactly one output line per input line"
    )
    _add_search_flags(p)
    p.add_argument("--input", type=Path, help="UTF-8 text, one sentence per line (default stdin)")
    p.add_argument("--output", type=Path, help="default stdout; a file is replaced atomically")
    p.add_argument("--nbest", type=int, help="N best per line, 'i ||| text ||| score'")
    p.add_argument(
        "--buffer-size", type=int, default=0, help="lines per sorted batch group (default 1024)"
    )


def _run_translate(args: argparse.Namespace) -> int:
    import os

    from aiayn.atomic import atomic_open_text, same_file
    from aiayn.translate.translator import translate_to

    if args.output is not None:  # checked before the model loads
        # `--input a.txt --output a.txt` (or `< a.txt`) would replace the text with its
        # translation; /dev/stdin names whatever stdin is, a file included.
        if same_file(args.input or Path("/dev/stdin"), args.output):
            raise AiaynError(
                f"--output {args.output} is the input file; it would be replaced by its translation"
            )
        if args.output.is_dir():
            raise AiaynError(f"--output {args.output} is a directory; give a file name")
    translator, cfg = _decode_setup(args)
    interactive = args.input is None and sys.stdin.isatty()
    buffer_size = args.buffer_size or (1 if interactive else 1024)
    kw = dict(batch_tokens=args.batch_tokens, buffer_size=buffer_size)
    if args.output is None:
        try:
            translate_to(translator, cfg, sys.stdout, args.input, **kw)
        except BrokenPipeError:  # the reader left early (`| head`): stop quietly
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    with atomic_open_text(args.output) as out:  # a failed run leaves no half-written output
        translate_to(translator, cfg, out, args.input, **kw)
    return 0


def _add_evaluate(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("evaluate", help="translate --src and score against --ref: BLEU, chrF")
    _add_search_flags(p)
    p.add_argument("--src", type=Path, required=True, help="source sentences, one per line")
    p.add_argument("--ref", type=Path, required=True, help="reference translations")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--hyps", type=Path, help="also write the translations to this file")
    p.add_argument(
        "--alphas",
        help="choose the length penalty: score each α of a comma list ('0.6,1.0,1.4') with "
        "beam search and name the best (docs/decoding.md)",
    )


def _parse_alphas(text: str) -> list[float]:
    try:
        alphas = [float(a) for a in text.split(",") if a.strip()]
    except ValueError:
        raise AiaynError(f"--alphas {text!r}: expected numbers separated by commas") from None
    if not alphas or any(not a >= 0 for a in alphas):
        raise AiaynError(f"--alphas {text!r}: expected one or more numbers >= 0")
    return alphas


def _run_alpha_sweep(args: argparse.Namespace) -> int:
    """`evaluate --alphas`: a table (or JSON list) of BLEU per α, and the best one."""
    from aiayn.errors import DataError
    from aiayn.translate.translator import read_file_lines, sweep_alpha

    alphas = _parse_alphas(args.alphas)  # checked before the model loads
    if args.alpha is not None or args.hyps is not None:
        raise AiaynError("--alphas chooses alpha itself: leave out --alpha and --hyps")
    src, refs = read_file_lines(args.src), read_file_lines(args.ref)
    if len(src) != len(refs):
        raise DataError(f"{args.src} has {len(src)} lines but {args.ref} has {len(refs)}")
    translator, cfg = _decode_setup(args)
    rows = sweep_alpha(translator, cfg, src, refs, alphas, batch_tokens=args.batch_tokens)
    if args.json:
        print(json.dumps(rows))
        return 0
    print(f"{'alpha':>6} {'BLEU':>6} {'length ratio':>12} {'BP':>5}   (beam {cfg.beam_size})")
    for r in rows:
        mark = "  <- best" if r["best"] else ""
        print(
            f"{r['alpha']:6.2f} {r['bleu']:6.2f} {r['length_ratio']:12.3f} "
            f"{r['brevity_penalty']:5.3f}{mark}"
        )
    best = next(r["alpha"] for r in rows if r["best"])
    print(
        f"best alpha = {best:g}: pass --alpha {best:g} to translate, or train with "
        f"--set decode.alpha={best:g} to save it in the model"
    )
    return 0


def _run_evaluate(args: argparse.Namespace) -> int:
    from aiayn.atomic import atomic_write_text, same_file
    from aiayn.translate.translator import evaluate_files

    if args.alphas is not None:
        return _run_alpha_sweep(args)
    if args.hyps is not None:  # checked before the model loads
        for flag, path in (("--src", args.src), ("--ref", args.ref)):
            if same_file(path, args.hyps):
                raise AiaynError(f"--hyps {args.hyps} is the {flag} file; it would be overwritten")
        if args.hyps.is_dir():
            raise AiaynError(f"--hyps {args.hyps} is a directory; give a file name")
    translator, cfg = _decode_setup(args)
    result = evaluate_files(translator, cfg, args.src, args.ref, batch_tokens=args.batch_tokens)
    hyps = result.pop("hypotheses")
    if args.hyps is not None:
        atomic_write_text(args.hyps, "".join(h + "\n" for h in hyps))
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
    return 0


# --- explain, attend, plot-log: the glass box (docs/explain.md) -----------------------------------


def _add_explain(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "explain",
        help="every number of one translation: embeddings, Q/K/V, attention, FFN, next tokens",
    )
    p.add_argument("sentence", nargs="?", help="the source sentence to translate and explain")
    p.add_argument("--model", type=Path, help="a model directory")
    p.add_argument(
        "--seed-example",
        action="store_true",
        help="replay the tutorials' worked example (docs/worked_example.md); no model needed",
    )
    p.add_argument("--format", choices=("text", "json", "html"), default="text",
                   help="text, json or html (--seed-example: text or json)")  # fmt: skip
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
    p.add_argument("--alpha", type=float, help="length penalty α (default: the model's, or 0.6)")
    _add_sampling_flags(p, "--sample-top-k", "trace sampling instead of greedy")
    _add_device_flag(p)


_EXPLAIN_SEARCH_FLAGS = {  # DecodeConfig field -> argparse dest
    "alpha": "alpha", "min_len": "min_len", "temperature": "temperature",
    "top_k": "sample_top_k", "top_p": "top_p", "seed": "seed",
}  # fmt: skip


def _run_explain(args: argparse.Namespace) -> int:
    from aiayn.glassbox.render import View, explain_report, parse_indices
    from aiayn.glassbox.seed import seed_example_json, seed_example_text

    if args.seed_example:
        if args.format == "html":
            raise AiaynError("--seed-example prints text or json (the page of `aiayn serve` "
                             "shows it too)")  # fmt: skip
        report = seed_example_text()
        if args.format == "json":
            report = json.dumps(seed_example_json(), ensure_ascii=False, allow_nan=False) + "\n"
    else:
        if args.model is None or not args.sentence:
            raise AiaynError("give --model DIR and a sentence (or --seed-example)")
        _refuse_export_dir(args.model, "explain")
        view = View(
            parse_indices(args.layers),
            parse_indices(args.heads),
            parse_indices(args.steps),
            args.dims,
            args.precision,
        )
        overrides = _given_search_settings(args, _EXPLAIN_SEARCH_FLAGS)
        report = explain_report(str(args.model), args.sentence, fmt=args.format, view=view,
                                top_k=args.top_k, max_len=args.max_len, beam=args.beam,
                                device=args.device, overrides=overrides)  # fmt: skip
    if args.out:
        from aiayn.atomic import atomic_write_text

        if args.out.is_dir():
            raise AiaynError(f"--out {args.out} is a directory; give a file name")
        atomic_write_text(args.out, report)
        print(f"wrote {args.out}")
    else:
        sys.stdout.write(report)
    return 0


def _add_attend(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "attend", help="attention heatmaps (PNG) and an interactive page (HTML) for translations"
    )
    p.add_argument("sentences", nargs="*", help="source sentences (or --input)")
    p.add_argument("--model", type=Path, required=True, help="a model directory")
    p.add_argument("--input", type=Path, help="a UTF-8 file, one source sentence per line")
    p.add_argument("--out", type=Path, required=True, help="directory for the PNGs and HTML")
    p.add_argument("--max-len", type=int, help="most output tokens (default source length + 50)")
    _add_device_flag(p)


def _run_attend(args: argparse.Namespace) -> int:
    from aiayn.atomic import atomic_write_text
    from aiayn.glassbox.viz import attention_figures, attention_for_model, write_figure
    from aiayn.glassbox.viz_html import attention_page
    from aiayn.runtime.device import resolve_device
    from aiayn.store.checkpoint import load_model_dir
    from aiayn.text.tokenizer import Tokenizer

    # --out must be (or become) a directory: say so now, not after the model has run.
    existing = next(p for p in (args.out, *args.out.parents) if p.exists())
    if existing == args.out and not existing.is_dir():
        raise AiaynError(
            f"--out {args.out} is an existing file; attend writes a directory "
            "(PNGs and attention.html)"
        )
    if not existing.is_dir():
        raise AiaynError(f"--out {args.out}: {existing} is a file, not a directory")
    _refuse_export_dir(args.model, "attend")
    sentences = list(args.sentences)
    if args.input:
        sentences += [s for s in args.input.read_text(encoding="utf-8").splitlines() if s.strip()]
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


def _add_plot_log(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("plot-log", help="training curves (loss, perplexity, lr, BLEU) as PNG")
    p.add_argument("run_dir", type=Path, help="a training run directory (or its metrics.jsonl)")
    p.add_argument("--out", type=Path, help="PNG path (default RUN_DIR/curves.png)")


def _run_plot_log(args: argparse.Namespace) -> int:
    from aiayn.glassbox.viz import plot_training_log, write_figure

    fig = plot_training_log(args.run_dir)
    run_dir = args.run_dir if args.run_dir.is_dir() else args.run_dir.parent
    out = args.out or run_dir / "curves.png"
    write_figure(fig, out, dpi=100)
    print(f"wrote {out}")
    return 0


# --- train and average (docs/training.md) ---------------------------------------------------------


def _add_train(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "train",
        help="train (or resume) a translation model into train.out_dir; torchrun-aware",
    )
    p.add_argument("--config", type=Path, required=True, help="a TOML preset, e.g. configs/X.toml")
    p.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="SECTION.FIELD=VALUE",
        help="override one field, e.g. --set train.max_tokens=4096 (repeatable)",
    )
    p.add_argument("--no-progress", action="store_true", help="no tqdm bar (logs only)")
    p.add_argument(
        "--device",
        help="auto | cpu | cuda | cuda:N | mps; the same as --set train.device=... "
        "(under torchrun, cuda means cuda:LOCAL_RANK)",
    )


def _run_train(args: argparse.Namespace) -> int:
    import logging
    import os

    from aiayn.config import load_config
    from aiayn.training.train import train

    rank = int(os.environ.get("RANK", "0"))
    logging.basicConfig(
        level=logging.INFO if rank == 0 else logging.WARNING,
        format="%(asctime)s %(levelname)s %(message)s",
        datefmt="%H:%M:%S",
    )
    overrides = [*args.overrides, *([f"train.device={args.device}"] if args.device else [])]
    result = train(load_config(args.config, overrides), progress=not args.no_progress)
    if rank == 0:
        print(f"stopped ({result.stopped}) at step {result.step}; model: {result.out_dir}")
    return 130 if result.stopped == "signal" else 0


def _add_average(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("average", help="average checkpoints into a new model directory (§6.1)")
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--inputs", type=Path, nargs="+", help="model/checkpoint directories")
    g.add_argument("--run", type=Path, help="a run directory: average its last --last checkpoints")
    p.add_argument("--last", type=int, default=5, help="with --run: how many, >= 1 (default 5)")
    p.add_argument("--out", type=Path, required=True, help="new model directory")


def _run_average(args: argparse.Namespace) -> int:
    from aiayn.errors import CheckpointError
    from aiayn.store.checkpoint import list_checkpoints, write_average

    dirs = list(args.inputs or [])
    if args.run is not None:
        found = list_checkpoints(args.run)
        if args.last < 1:
            raise CheckpointError(f"--last must be at least 1, got {args.last}")
        if len(found) < args.last:
            raise CheckpointError(f"{args.run} has {len(found)} checkpoints, --last {args.last}")
        dirs = found[-args.last :]
    write_average(dirs, args.out)
    print(f"averaged {len(dirs)} checkpoints into {args.out}: {', '.join(d.name for d in dirs)}")
    return 0


# --- import (docs/import.md) ----------------------------------------------------------------------


def _add_import(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("import", help="open another toolkit's model as an aiayn model directory")
    import_sub = p.add_subparsers(dest="import_command", required=True, metavar="FORMAT")
    m = import_sub.add_parser(
        "marian",
        help="a local Hugging Face MarianMT (OPUS-MT) directory (docs/import.md)",
        description="Convert HF_DIR (config.json, model.safetensors, source.spm, target.spm, "
        "vocab.json) into a new aiayn model directory that translate, evaluate, explain, "
        "attend, average and train (train.init_from) accept. Nothing is downloaded.",
    )
    m.add_argument("hf_dir", type=Path, metavar="HF_DIR", help="the Hugging Face directory")
    m.add_argument("--out", type=Path, required=True, help="new model directory (must not exist "
                   "or be empty)")  # fmt: skip


def _run_import(args: argparse.Namespace) -> int:
    from aiayn.interop.marian import import_marian

    done = import_marian(args.hf_dir, args.out)
    cfg, dec = done.model, done.decode
    langs = f"{done.source_lang or '?'} -> {done.target_lang or '?'}"
    print(
        f"imported {args.hf_dir} ({langs}) into {done.out}: d_model {cfg.d_model}, "
        f"{cfg.n_layers}+{cfg.n_layers} layers, {cfg.n_heads} heads, d_ff {cfg.d_ff}, "
        f"vocabulary {cfg.vocab_size}, {cfg.activation} FFN; search: beam {dec.beam_size}, "
        f"alpha {dec.alpha:g}"
    )
    return 0


# --- quickstart -----------------------------------------------------------------------------------


def _add_quickstart(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "quickstart",
        help="no download: generate English->German numbers, train, evaluate, draw attention",
        description="Generate a numbers corpus (num2words), train the cpu_tiny Transformer for "
        "a few minutes, score held-out pairs, write a cross-attention picture and a model "
        "directory. Writes OUT/metrics.json.",
    )
    p.add_argument("--out", type=Path, default=Path("quickstart"), help="output directory")
    p.add_argument("--minutes", type=float, default=3.5, help="training budget (default 3.5)")
    p.add_argument("--n-train", type=int, default=50_000, help="training pairs (default 50000)")
    p.add_argument("--n-test", type=int, default=1000, help="held-out test pairs (default 1000)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--json", action="store_true", help="print metrics.json instead of a report")
    _add_device_flag(p)


def _run_quickstart(args: argparse.Namespace) -> int:
    import logging

    from aiayn.cli.quickstart import format_summary, run_quickstart, summary_json
    from aiayn.errors import ConfigError

    if args.minutes <= 0 or args.n_train < 100 or args.n_test < 1:
        raise ConfigError("--minutes must be > 0, --n-train >= 100 and --n-test >= 1")
    logging.basicConfig(level=logging.INFO, format="aiayn: %(message)s")
    summary = run_quickstart(
        args.out,
        minutes=args.minutes,
        n_train=args.n_train,
        n_test=args.n_test,
        seed=args.seed,
        device=args.device,
    )
    print(summary_json(summary) if args.json else format_summary(summary))
    return 0


# --- export (docs/export.md) ---------------------------------------------------------------------


def _add_export(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "export", help="write a model for another engine: CTranslate2 (int8) or ONNX Runtime"
    )
    engines = p.add_subparsers(dest="engine", required=True, metavar="ENGINE")
    c = engines.add_parser(
        "ctranslate2",
        help="a CTranslate2 model (+ tokenizer); translate/evaluate --model OUT run it",
    )
    c.add_argument(
        "--quantization", choices=("float32", "int8", "int16", "bfloat16"), default="float32",
        help="weight type (default float32; int8 is the fast one on a CPU)",
    )  # fmt: skip
    o = engines.add_parser(
        "onnx", help="encoder + decoder-with-past ONNX graphs; translate/evaluate run them"
    )
    for q in (c, o):
        q.add_argument("--model", type=Path, required=True, help="an aiayn model directory")
        q.add_argument("--out", type=Path, required=True, help="a new (or empty) directory")


def _run_export(args: argparse.Namespace) -> int:
    if args.engine == "ctranslate2":
        from aiayn.interop.export_ct2 import export_ctranslate2

        out = export_ctranslate2(args.model, args.out, args.quantization)
        what = f"CTranslate2 ({args.quantization})"
    else:
        from aiayn.interop.export_onnx import export_onnx

        out = export_onnx(args.model, args.out)
        what = "ONNX (encoder.onnx, decoder.onnx)"
    print(f"exported {args.model} as {what} to {out}; run it: aiayn translate --model {out}")
    return 0


def _refuse_export_dir(directory: Path | None, command: str) -> None:
    """The glass box needs aiayn's own model: say so for an exported directory."""
    from aiayn.interop.export_dir import is_export_dir

    if directory is not None and is_export_dir(directory):
        raise AiaynError(
            f"{command} needs an aiayn model directory; {directory} was written by aiayn "
            "export (translate and evaluate run it)"
        )


# --- serve (docs/serving.md) ----------------------------------------------------------------------


def _add_serve(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "serve",
        help="an HTTP translation server (LibreTranslate-compatible) and the live glass box page",
        description="Serve a model directory over HTTP: GET / is the glass box page, POST "
        "/translate speaks LibreTranslate's API, /v1/translate and /v1/explain are aiayn's own, "
        "/metrics is Prometheus. Needs the serve extra: pip install -e '.[serve]'.",
    )
    p.add_argument("--model", type=Path, required=True, help="a model directory, or one "
                   "written by aiayn export (served by its engine; nothing to trace)")  # fmt: skip
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1; "
                   "any other needs an API key)")  # fmt: skip
    p.add_argument("--port", type=int, default=8000, help="port (default 8000; 0 = any free)")
    p.add_argument("--api-key", default=os.environ.get("AIAYN_API_KEY"),
                   help="needed on every request but /health (default $AIAYN_API_KEY)")  # fmt: skip
    p.add_argument("--max-chars-per-request", type=int, default=20_000, help="(default 20000)")
    p.add_argument("--max-chars-per-sentence", type=int, default=1_000, help="(default 1000)")
    p.add_argument("--max-sentences", type=int, default=128, help="per request (default 128)")
    p.add_argument("--max-beam", type=int, default=8, help="largest beam/nbest (default 8)")
    p.add_argument("--max-output-tokens", type=int, default=256,
                   help="output tokens per sentence, and decoding steps an explanation traces "
                   "(default 256; the model's max_len caps it too)")  # fmt: skip
    p.add_argument("--max-rows", type=int, default=512,
                   help="search rows (sentences x beam) of one request (default 512)")  # fmt: skip
    p.add_argument("--max-trace-numbers", type=int, default=2_000_000,
                   help="numbers one /v1/explain trace may hold (default 2000000)")  # fmt: skip
    p.add_argument("--turn-tokens", type=int, default=8192,
                   help="search rows x their output-length limit in one turn of the model "
                   "worker (default 8192)")  # fmt: skip
    p.add_argument("--chunk-rows", type=int, default=128,
                   help="search rows in one turn of the model worker: requests take turns "
                   "(default 128)")  # fmt: skip
    p.add_argument("--allowed-host", action="append", default=[], metavar="NAME",
                   help="a Host name clients may use besides loopback and --host (repeat; '*' "
                   "= any; a wildcard --host accepts any without it)")  # fmt: skip
    p.add_argument("--cors-origin", action="append", default=[], metavar="ORIGIN",
                   help="a web origin that may call the API (repeat; default none)")  # fmt: skip
    p.add_argument("--timeout", type=float, default=30.0,
                   help="seconds a request may take, queueing included (default 30)")  # fmt: skip
    p.add_argument("--window-ms", type=float, default=10.0,
                   help="how long the model waits to batch requests (default 10)")  # fmt: skip
    p.add_argument("--batch-tokens", type=int, default=2048, help="source tokens per batch")
    p.add_argument("--max-connections", type=int, default=1024,
                   help="connections and requests at once, then 503 (default 1024)")  # fmt: skip
    p.add_argument("--max-queue", type=int, default=1000,
                   help="requests waiting before 503 busy (default 1000)")  # fmt: skip
    p.add_argument("--source-lang", help="the model's source language code (default: from "
                   "the training files' suffixes, e.g. train.en; none = accept any)")  # fmt: skip
    p.add_argument("--target-lang", help="the model's target language code")
    p.add_argument("--examples", type=Path, help="a file of example sentences for the page")
    p.add_argument("--threads", type=int, default=0,
                   help="torch (or the export's engine) threads; 0 = its default")  # fmt: skip
    p.add_argument("--no-access-log", action="store_true", help="no line per request")
    _add_device_flag(p)
    _add_dtype_flag(p)


def _run_serve(args: argparse.Namespace) -> int:
    try:
        from aiayn.serve.app import Limits, ServeOptions
        from aiayn.serve.run import serve
    except ImportError as e:  # the serve extra is optional
        raise AiaynError(f"serve needs the serve extra (pip install -e '.[serve]'): {e}") from None
    positive = ("max_chars_per_request", "max_chars_per_sentence", "max_sentences", "max_beam",
                "timeout", "batch_tokens", "max_queue", "max_output_tokens", "max_rows",
                "max_trace_numbers", "chunk_rows", "turn_tokens", "max_connections")  # fmt: skip
    for name in positive:
        if getattr(args, name) <= 0:
            raise AiaynError(f"--{name.replace('_', '-')} must be positive")
    if args.window_ms < 0 or args.threads < 0 or not 0 <= args.port < 65536:
        raise AiaynError("--window-ms and --threads must be >= 0, --port in 0..65535")
    if bool(args.source_lang) != bool(args.target_lang):
        raise AiaynError("give both --source-lang and --target-lang, or neither")
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    limits = Limits(args.max_chars_per_request, args.max_chars_per_sentence, args.max_sentences,
                    args.max_beam, args.timeout, args.max_output_tokens, args.max_rows,
                    args.max_trace_numbers)  # fmt: skip
    opts = ServeOptions(
        args.host, args.port, args.api_key or None, limits, args.window_ms, args.batch_tokens,
        args.max_queue, args.source_lang, args.target_lang, args.examples,
        access_log=not args.no_access_log, allowed_hosts=tuple(args.allowed_host),
        cors_origins=tuple(args.cors_origin), chunk_rows=args.chunk_rows,
        turn_tokens=args.turn_tokens,
        max_connections=args.max_connections,
    )  # fmt: skip
    counts = serve(args.model, opts, device=args.device, dtype=args.dtype, threads=args.threads,
                   announce=lambda line: print(line, flush=True))  # fmt: skip
    print(f"aiayn serve: stopped; answered {counts['answered']} of {counts['accepted']} "
          "accepted requests", flush=True)  # fmt: skip
    return 0


# --- main -----------------------------------------------------------------------------------------

COMMANDS: dict[str, tuple[Callable[[argparse._SubParsersAction], None], Callable[..., int]]] = {
    "explain": (_add_explain, _run_explain),
    "attend": (_add_attend, _run_attend),
    "plot-log": (_add_plot_log, _run_plot_log),
    "info": (_add_info, _run_info),
    "data": (_add_data, _run_data),
    "translate": (_add_translate, _run_translate),
    "evaluate": (_add_evaluate, _run_evaluate),
    "train": (_add_train, _run_train),
    "average": (_add_average, _run_average),
    "export": (_add_export, _run_export),
    "import": (_add_import, _run_import),
    "quickstart": (_add_quickstart, _run_quickstart),
    "serve": (_add_serve, _run_serve),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="aiayn",
        description="The Transformer of 'Attention Is All You Need': train, translate, explain.",
    )
    parser.add_argument("--version", action="version", version=f"aiayn {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for add, _ in COMMANDS.values():
        add(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return COMMANDS[args.command][1](args)
    except AiaynError as e:
        print(f"aiayn {args.command}: error: {e}", file=sys.stderr)
        return 2
    except (FileNotFoundError, IsADirectoryError, PermissionError) as e:
        print(f"aiayn {args.command}: error: {e.strerror}: {e.filename}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"aiayn {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
