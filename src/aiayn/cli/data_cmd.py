"""`aiayn info` and `aiayn data` (synth, check): what a model or preset is, and the data."""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path

from aiayn.errors import AiaynError


def add_info(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("info", help="describe a preset or a model directory (sizes, parameters)")
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument(
        "model_dir",
        nargs="?",
        type=Path,
        metavar="MODEL",
        help="a model directory or export (the same as --model)",
    )
    g.add_argument("--preset", help="a ModelConfig preset, e.g. paper_base")
    g.add_argument("--model", type=Path, help="a model directory or export")
    p.add_argument("--vocab-size", type=int, default=37000, help="with --preset (default 37000)")


def run_info(args: argparse.Namespace) -> int:
    import torch

    from aiayn.config import MODEL_PRESETS, ModelConfig
    from aiayn.config_files import to_dict
    from aiayn.nn.model import Transformer, _ModelBase, count_parameters
    from aiayn.store.directory import ModelDir

    args.model = args.model or args.model_dir
    if args.model_dir is not None and not args.model_dir.exists():
        name = str(args.model_dir)  # `aiayn info paper_base`: the help says "a preset or a model"
        if name not in MODEL_PRESETS:
            raise AiaynError(
                f"{name}: no such model directory, nor a preset "
                f"({', '.join(sorted(MODEL_PRESETS))})"
            )
        args.preset, args.model = name, None
    opened = None if args.model is None else ModelDir.open(args.model)
    # what `aiayn translate --model` searches with when no flag is given
    decode = None if opened is None else dataclasses.asdict(opened.decode)
    if opened is not None and opened.is_export:  # aiayn export wrote it
        keys = ("engine", "quantization", "architecture", "files", "versions", "source_model")
        meta = {k: opened.meta.get(k) for k in keys}
        print(json.dumps({**meta, "config": opened.meta["model"], "decode": decode}, indent=2))
        return 0
    if args.preset:  # on the meta device: sizes without memory (a vocabulary of 10^11 is fine)
        cfg = ModelConfig.preset(args.preset, vocab_size=args.vocab_size)
        with torch.device("meta"):
            model: torch.nn.Module = Transformer(cfg)
    else:
        assert opened is not None  # the group requires a preset or a model
        model = opened.load_model(_ModelBase)
    info = {
        "architecture": type(model).__name__,
        "parameters": count_parameters(model),
        "config": to_dict(model.cfg),
    }
    if decode is not None and isinstance(model, Transformer):
        info["decode"] = decode
    print(json.dumps(info, indent=2))
    return 0


def add_data(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "data",
        help="make corpora (`data synth`: the built-in corpus) and check them (`data check`)",
    )
    data_sub = p.add_subparsers(dest="data_command", required=True, metavar="DATA_COMMAND")
    add_data_check(data_sub)
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


def run_data(args: argparse.Namespace) -> int:
    from aiayn.text.synthetic import write_corpus

    if args.data_command == "check":
        return run_data_check(args)

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


def add_data_check(data_sub: argparse._SubParsersAction) -> None:
    c = data_sub.add_parser(
        "check",
        help="find what is wrong with a parallel corpus (--src/--tgt: duplicates, train/valid/test "
        "overlap, misaligned lines, copies, empty, control characters, over-long lines, wrong "
        "script) or a language model's text (--text: binary, not UTF-8, control characters, "
        "duplicated lines, validation lines in the training text) (docs/data.md) or a "
        "classifier's labelled texts (--data: the label balance, duplicates, texts with two "
        "labels, texts also in --valid-data/--test-data) (docs/classify.md)",
    )
    c.add_argument("--src", type=Path, help="training source file, e.g. train.de")
    c.add_argument("--tgt", type=Path, help="training target file, e.g. train.en")
    c.add_argument(
        "--text",
        help="a language model's training text instead (train.text: a file, a folder of *.txt, "
        "or comma-separated files)",
    )
    c.add_argument(
        "--valid-text", help="with --text: its validation text, checked for training lines"
    )
    for split in ("valid", "test"):
        c.add_argument(f"--{split}-src", type=Path, help=f"{split} source: checked for overlap")
        c.add_argument(f"--{split}-tgt", type=Path, help=f"{split} target")
    c.add_argument(
        "--data",
        type=Path,
        help="a classifier's labelled training texts instead (TSV/CSV with a header, JSON "
        "lines, or 'LABEL TEXT' lines)",
    )
    for split in ("valid", "test"):
        c.add_argument(
            f"--{split}-data", type=Path, help=f"with --data: {split} texts, checked for overlap"
        )
    c.add_argument("--label-column", default="label", help="with --data (default label)")
    c.add_argument("--text-column", default="text", help="with --data (default text)")
    c.add_argument(
        "--max-chars", type=int, default=1000, help="a longer side is over-long (default 1000)"
    )
    c.add_argument("--json", action="store_true", help="print one JSON object")
    c.add_argument(
        "--write",
        type=Path,
        metavar="DIR",
        help="write the cleaned training pairs "
        "into DIR (new or empty), under the training files' names",
    )


def run_data_check(args: argparse.Namespace) -> int:
    from aiayn.text.check import check_corpus, write_clean

    if args.data is not None or args.valid_data is not None or args.test_data is not None:
        return run_labelled_check(args)
    if args.text is not None or args.valid_text is not None:
        return run_text_check(args)
    if args.src is None or args.tgt is None:
        raise AiaynError(
            "give --src and --tgt (a parallel corpus), --text (a language model's) or --data "
            "(a classifier's)"
        )
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

        check_new_dir(args.write, "--write")
    report = check_corpus(args.src, args.tgt, evals, max_chars=args.max_chars, bar=True)
    written = write_clean(report, args.write) if args.write is not None else None
    if args.json:
        print(json.dumps({**report.to_json(), **({"written": written} if written else {})}))
        return 0
    langs = report.languages
    print(
        f"{report.pairs} training pairs ({langs['src'] or '?'} -> {langs['tgt'] or '?'}): "
        f"{report.summary()}"
    )
    for kind, n in report.counts.items():
        if n:
            ex = report.examples[kind][0]
            print(
                f"  {kind:16} {n:8d}   e.g. {ex['file']} line {ex['line']}: "
                f"{ex['src'][:60]!r} ||| {ex['tgt'][:60]!r}"
            )
    if written:
        print(
            f"wrote {written['kept']} pairs ({written['dropped']} dropped) to "
            f"{written['src']} and {written['tgt']}"
        )
    return 0


# A parallel corpus's flags, which the checks of a text or of labelled texts refuse.
PARALLEL_FLAGS = (
    "--src",
    "--tgt",
    "--valid-src",
    "--valid-tgt",
    "--test-src",
    "--test-tgt",
    "--write",
)


def _given(args: argparse.Namespace, flags: tuple[str, ...]) -> list[str]:
    """Which of `flags` the command line set."""
    return [f for f in flags if getattr(args, f[2:].replace("-", "_")) is not None]


def run_text_check(args: argparse.Namespace) -> int:
    """`aiayn data check --text FILE [--valid-text FILE]`: a language model's text."""
    from aiayn.text.text_check import check_text_corpus

    if args.text is None:
        raise AiaynError("--valid-text needs --text, the training text it is checked against")
    parallel = _given(args, PARALLEL_FLAGS)
    if parallel:
        raise AiaynError(
            f"--text checks a language model's text: {', '.join(parallel)} is for a parallel corpus"
        )
    report = check_text_corpus(args.text, args.valid_text, bar=True)
    if args.json:
        print(json.dumps(report.to_json()))
        return 0
    size = report.sizes["train"]
    names = report.files["text"]
    where = Path(names[0]).name if len(names) == 1 else f"{len(names)} files"
    print(
        f"{size['characters']:,} characters ({size['distinct_characters']} distinct), "
        f"{size['lines']:,} lines, {size['bytes']:,} bytes in {where}: "
        f"{report.summary()}"
    )
    for kind, n in report.counts.items():
        if n:
            ex = report.examples[kind][0]
            at = f" byte {ex['byte']}" if "byte" in ex else ""
            print(
                f"  {kind:16} {n:8d}   e.g. {Path(ex['file']).name} line {ex['line']}{at}: "
                f"{ex['text'][:60]!r}"
            )
    if report.most_repeated:
        shown = ", ".join(f"{r['text'][:40]!r} x{r['count']}" for r in report.most_repeated)
        print(f"  most repeated: {shown}")
    if "valid" in report.sizes:
        v = report.sizes["valid"]
        unseen = v["unseen_characters"]
        print(
            f"validation: {v['characters']:,} characters, {v['lines']:,} lines"
            + (f", {unseen} characters not in the training text" if unseen else "")
        )
    tok = report.tokenizer
    print(f"tokenizer: {tok['suggested']} ({tok['why']})")
    return 0


# Characters of an example shown in a finding's line
EXAMPLE_CHARS = 70


def run_labelled_check(args: argparse.Namespace) -> int:
    """`aiayn data check --data FILE [--valid-data F] [--test-data F]`: a classifier's data.
    The findings are warnings (exit 0); a file with one label, or one that cannot be read, is
    an error (exit 2)."""
    from aiayn.errors import DataError
    from aiayn.text.label_check import KINDS, check_labelled
    from aiayn.text.labelled import class_balance, read_labelled

    if args.data is None:
        raise AiaynError("--valid-data and --test-data need --data, the training texts")
    others = _given(args, ("--text", "--valid-text", *PARALLEL_FLAGS))
    if others:
        raise AiaynError(f"--data checks a classifier's labelled texts: leave out {others[0]}")
    columns = (args.label_column, args.text_column)
    # strict=False: an empty text is a finding to count, not a reason to stop
    pairs = read_labelled(args.data, *columns, strict=False)
    evals = {
        split: read_labelled(path, *columns, strict=False)
        for split, path in (("valid", args.valid_data), ("test", args.test_data))
        if path is not None
    }
    report = check_labelled(pairs, evals)
    if len(report.labels) < 2:
        only = next(iter(report.labels), "")
        raise DataError(
            f"{args.data}: every example has the label {only!r}: a classifier needs two or "
            f"more (is --label-column {args.label_column!r} the label?)"
        )
    files = {"data": str(args.data)} | {
        f"{split}_data": str(getattr(args, f"{split}_data")) for split in evals
    }
    if args.json:
        sizes = {split: len(found) for split, found in evals.items()}
        print(json.dumps({"files": files, **report.to_json(), "evaluation_examples": sizes}))
        return 0
    names = list(report.labels)
    train_labels = [label for label, _ in pairs]
    print(
        f"{Path(args.data).name}: {report.examples:,} examples, {len(names)} labels: "
        f"{class_balance(train_labels, names)}"
    )
    for split, found in evals.items():
        labels = [label for label, _ in found]
        extra = sorted(set(labels) - set(names))
        print(
            f"{split}: {Path(files[f'{split}_data']).name}: {len(found):,} examples: "
            f"{class_balance(labels, names + extra)}"
        )
    print(f"findings: {report.summary()}")
    for kind, n in report.counts.items():
        shown = "; ".join(repr(ex[:EXAMPLE_CHARS]) for ex in report.samples.get(kind, []))
        print(f"  {kind:13} {n:8,}   {KINDS[kind]}, e.g. {shown}")
    return 0
