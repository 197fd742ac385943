"""`aiayn classify` (a classifier labels each line of a file) and `aiayn evaluate --data` (its
scores on labelled texts: accuracy and macro-F1 with 95% bootstrap intervals, each class's
precision, recall and F1, the confusion matrix as a table and optionally a picture)."""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO, TextIO

from aiayn.cli.flags import add_device_flag, add_dtype_flag
from aiayn.errors import AiaynError, DataError

if TYPE_CHECKING:  # imported when the command runs: `aiayn --help` stays fast
    from torch import Tensor
    from tqdm import tqdm

    from aiayn.classify.classifier import Classifier

# Lines read, classified and written at a time: memory stays bounded on any input, and the
# Classifier's length-sorted batches have enough lines to sort.
CHUNK_LINES = 1000
DEFAULT_BOOTSTRAP = 1000
BOOTSTRAP_SEED = 12345
MAX_BOOTSTRAP = 100_000
# Resamples x examples the bootstrap draws at once: it holds a few int64 arrays of this many
# (~400 MB each at the bound), so a huge test set asks for fewer resamples instead.
MAX_BOOTSTRAP_DRAWS = 50_000_000


def add_classify(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "classify",
        help="label each line of a file with a classifier (aiayn train --config classify)",
        description="One output line per input line, in order: the label, or with --json the "
        "class probabilities. Every input line is one text; an empty line is an error.",
    )
    p.add_argument("--model", type=Path, required=True, help="a classifier's directory")
    p.add_argument(
        "--input", required=True, metavar="FILE", help="UTF-8 texts, one a line; - reads stdin"
    )
    p.add_argument(
        "--output", type=Path, metavar="FILE", help="default stdout; a file is replaced atomically"
    )
    p.add_argument(
        "--json",
        action="store_true",
        help='one JSON object a line: {"label": ..., "probabilities": {label: p, ...}}',
    )
    p.add_argument(
        "--top-k",
        type=int,
        metavar="K",
        help="the K likeliest labels, best first: with --json, probabilities is a list of "
        "[label, p]; plain, tab-separated label and p pairs",
    )
    p.add_argument("--threads", type=int, default=0, help="torch threads; 0 = its default")
    add_device_flag(p)
    add_dtype_flag(p)


def run_classify(args: argparse.Namespace) -> int:
    from aiayn.atomic import atomic_open_text, same_file
    from aiayn.interop.cls_engines import load_classifier
    from aiayn.runtime.device import set_threads
    from aiayn.runtime.progress import interactive, progress

    if args.top_k is not None and args.top_k < 1:
        raise AiaynError(f"--top-k must be at least 1, got {args.top_k}")
    from_stdin = args.input == "-"
    if args.output is not None:  # checked before the model loads
        if same_file(Path("/dev/stdin") if from_stdin else Path(args.input), args.output):
            raise AiaynError(
                f"--output {args.output} is the input file; it would be replaced by its labels"
            )
        if args.output.is_dir():
            raise AiaynError(f"--output {args.output} is a directory; give a file name")
    name = "<stdin>" if from_stdin else args.input
    source: BinaryIO = sys.stdin.buffer if from_stdin else open(args.input, "rb")  # noqa: SIM115
    try:
        set_threads(args.threads)
        classifier = load_classifier(args.model, device=args.device, dtype=args.dtype)
        if args.top_k is not None and args.top_k > len(classifier.labels):
            raise AiaynError(
                f"--top-k {args.top_k}: the classifier has {len(classifier.labels)} labels"
            )
        typing = from_stdin and sys.stdin.isatty()  # each line answered as it is entered
        total = None if from_stdin or not interactive() else count_lines(Path(args.input))
        bar = progress(total=total, unit="line", desc="classify", disable=not interactive())
        writer = Writer(classifier.labels, args.json, args.top_k)
        lines = read_texts(source, name)
        chunk = 1 if typing else CHUNK_LINES
        try:
            if args.output is None:  # a reader that leaves early (`| head`): cli.main stops
                classify_to(classifier, lines, sys.stdout, writer, bar, chunk, flush=from_stdin)
            else:
                with atomic_open_text(args.output) as out:  # a failed run leaves no half file
                    classify_to(classifier, lines, out, writer, bar, chunk, flush=False)
        finally:
            bar.close()
    finally:
        if not from_stdin:
            source.close()
    return 0


def count_lines(path: Path) -> int | None:
    """The lines of a file (a last one without its newline counted), for the bar's ETA."""
    if not path.is_file():  # a pipe or a device: no total, the bar shows the rate
        return None
    n, last = 0, b"\n"
    with path.open("rb") as f:
        while block := f.read(1 << 20):
            n, last = n + block.count(b"\n"), block[-1:]
    return n + (last != b"\n")


def read_texts(source: BinaryIO, name: str) -> Iterator[str]:
    """The input's lines, each one text; an empty line is a DataError naming it (a line
    of output for it would have no text behind it, and skipping it would shift the rest)."""
    from aiayn.text.corpus import read_lines

    for n, line in enumerate(read_lines(source, name), 1):
        if not line.strip():
            raise DataError(f"{name}: line {n} is empty; every line is one text to classify")
        yield line


class Writer:
    """Output lines from (N, C) probabilities: the label, the top K, or JSON objects."""

    def __init__(self, labels: list[str], as_json: bool, top_k: int | None) -> None:
        self.labels, self.as_json, self.top_k = labels, as_json, top_k

    def lines(self, probs_NC: Tensor) -> list[str]:
        if self.top_k is not None:
            p_NK, i_NK = probs_NC.topk(self.top_k, dim=-1)
            tops = [
                [(self.labels[c], q) for q, c in zip(row_p, row_i, strict=True)]
                for row_p, row_i in zip(p_NK.tolist(), i_NK.tolist(), strict=True)
            ]
            if self.as_json:
                return [
                    json.dumps({"label": top[0][0], "probabilities": [[lab, q] for lab, q in top]})
                    for top in tops
                ]
            return ["\t".join(f"{lab}\t{q:.4f}" for lab, q in top) for top in tops]
        best = probs_NC.argmax(dim=-1).tolist()
        if not self.as_json:
            return [self.labels[c] for c in best]
        return [
            json.dumps(
                {"label": self.labels[c], "probabilities": dict(zip(self.labels, row, strict=True))}
            )
            for c, row in zip(best, probs_NC.tolist(), strict=True)
        ]


def classify_to(
    classifier: Classifier,
    lines: Iterator[str],
    out: TextIO,
    writer: Writer,
    bar: tqdm,
    chunk: int,
    *,
    flush: bool,
) -> int:
    """Classify `lines` a chunk at a time into `out`, one line each; return the count."""
    n = 0
    while texts := list(itertools.islice(lines, chunk)):
        out.writelines(line + "\n" for line in writer.lines(classifier.probabilities(texts)))
        if flush:
            out.flush()  # a stream's reader sees each chunk as soon as it exists
        bar.update(len(texts))
        n += len(texts)
    return n


def run_evaluate_data(args: argparse.Namespace) -> int:
    """`aiayn evaluate --model CLASSIFIER --data FILE`: the classifier's scores on it."""
    from aiayn.classify.metrics import bootstrap, confusion, scores
    from aiayn.classify.report import confusion_table, image_format, score_lines, write_confusion
    from aiayn.interop.cls_engines import load_classifier
    from aiayn.runtime.device import set_threads
    from aiayn.text.labelled import label_set, read_labelled

    samples = DEFAULT_BOOTSTRAP if args.bootstrap is None else args.bootstrap
    if not 0 <= samples <= MAX_BOOTSTRAP:
        raise AiaynError(f"--bootstrap must be in [0, {MAX_BOOTSTRAP:,}] (0: none), got {samples}")
    if args.confusion is not None:  # said before the model loads
        image_format(args.confusion)
    pairs = read_labelled(args.data, args.label_column, args.text_column)
    if samples * len(pairs) > MAX_BOOTSTRAP_DRAWS:
        raise AiaynError(
            f"--bootstrap {samples:,} x {len(pairs):,} examples is more than "
            f"{MAX_BOOTSTRAP_DRAWS:,} draws at once; give a smaller --bootstrap (0: none)"
        )
    set_threads(args.threads)
    classifier = load_classifier(args.model, device=args.device, dtype=args.dtype)
    labels = classifier.labels
    index = {label: i for i, label in enumerate(labels)}
    unknown = label_set([label for label, _ in pairs if label not in index])
    if unknown:
        more = f" and {len(unknown) - 5} more" if len(unknown) > 5 else ""
        raise DataError(
            f"{args.data} has labels the classifier does not know: "
            f"{', '.join(map(repr, unknown[:5]))}{more} (its labels: {', '.join(labels)}); "
            "check --label-column, or evaluate a classifier trained on these labels"
        )
    y_true = [index[label] for label, _ in pairs]
    y_pred = predict(classifier, [text for _, text in pairs])
    conf = confusion(y_true, y_pred, len(labels))
    result: dict[str, Any] = {"model": str(args.model), "data": str(args.data)}
    result.update(scores(conf, labels))
    if samples:
        found = bootstrap(y_true, y_pred, len(labels), samples=samples, seed=BOOTSTRAP_SEED)
        result["intervals"] = {key: list(lo_hi) for key, lo_hi in found.items()}
        result["bootstrap"] = {"samples": samples, "seed": BOOTSTRAP_SEED, "level": 0.95}
    result["confusion"] = {"labels": labels, "matrix": conf.tolist()}
    if args.confusion is not None:
        title = f"accuracy {result['accuracy']:.4f}, macro-F1 {result['macro_f1']:.4f}"
        result["confusion_image"] = str(write_confusion(conf, labels, args.confusion, title))
    if args.json:
        print(json.dumps(result))
        return 0
    print("\n".join(score_lines(result)))
    print("confusion matrix (rows: true label, columns: predicted)")
    print("\n".join(confusion_table(conf, labels)))
    if samples:
        print(f"95% intervals: bootstrap, {samples:,} resamples of the examples")
    if args.confusion is not None:
        print(f"wrote {result['confusion_image']}")
    return 0


def predict(classifier: Classifier, texts: list[str]) -> list[int]:
    """Each text's likeliest class, a chunk at a time (with a bar on a terminal)."""
    from aiayn.runtime.progress import interactive, progress

    out: list[int] = []
    with progress(total=len(texts), unit="text", desc="evaluate", disable=not interactive()) as bar:
        for start in range(0, len(texts), CHUNK_LINES):
            chunk = texts[start : start + CHUNK_LINES]
            out.extend(classifier.probabilities(chunk).argmax(dim=-1).tolist())
            bar.update(len(chunk))
    return out
