"""A classifier's data: labelled texts read and checked, the label set, the inputs' ids.

read_labelled      TSV or CSV with a header (columns `label` and `text`, or those named),
                   JSON lines (the same keys), or SST's "LABEL TEXT" lines: (label, text)
                   pairs, every one checked, one clear line for the first bad one
label_set          the labels found, in a stable order (numeric where they all are)
stratified_split   a held-out share of each label, drawn by a seed
classifier_ids     BOS + a text's ids + EOS, cut to the model's positions: the one way a
                   text becomes a classifier's (or a masked LM's) input
load_labelled      a run's examples: train, validation (given or held out), labels
"""

from __future__ import annotations

import csv
import io
import json
import logging
import random
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiayn.errors import ConfigError, DataError
from aiayn.text.tokenizer import Tokenizer

log = logging.getLogger(__name__)

Pair = tuple[str, str]  # (label, text)
JSON_SUFFIXES = (".jsonl", ".json", ".ndjson")
MAX_FIELD = 1 << 20  # csv's own limit is 128 KiB a field; a text past 1 MiB is not a sentence


def data_format(path: Path) -> str:
    """ "tsv", "csv", "jsonl" or "plain" ("LABEL TEXT" lines), from the file's suffix."""
    suffix = path.suffix.lower()
    if suffix in (".tsv", ".csv"):
        return suffix[1:]
    return "jsonl" if suffix in JSON_SUFFIXES else "plain"


def _read(path: Path) -> str:
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise ConfigError(f"no such file: {path}") from None
    except IsADirectoryError:
        raise ConfigError(f"{path} is a folder: give a file of labelled texts") from None
    if b"\x00" in data[: 1 << 16]:
        raise DataError(f"{path}: a binary file (NUL bytes), not text")
    try:
        return data.decode("utf-8-sig").replace("\r\n", "\n")
    except UnicodeDecodeError as e:
        line = data[: e.start].count(b"\n") + 1
        raise DataError(f"{path}: not UTF-8 (line {line}, byte {e.start})") from None


def read_labelled(
    path: str | Path, label_column: str = "label", text_column: str = "text", *, strict: bool = True
) -> list[Pair]:
    """The (label, text) pairs of a file. `strict`: an empty text or label is a DataError
    naming its line (training, evaluation); otherwise it is kept, for `aiayn data check` to
    count. Blank lines are skipped."""
    path = Path(path)
    text = _read(path)
    if not text.strip():
        raise DataError(f"{path}: no labelled text in it")
    fmt = data_format(path)
    rows: list[tuple[int, str, str]] = []  # (line, label, text)
    if fmt == "plain":
        for n, line in enumerate(text.split("\n"), 1):
            if line.strip():
                label, _, body = line.strip().partition(" ")
                rows.append((n, label, body.strip()))
    elif fmt == "jsonl":
        for n, line in enumerate(text.split("\n"), 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                raise DataError(f"{path}:{n}: not a JSON object ({e.msg})") from None
            if not isinstance(obj, dict):
                raise DataError(f"{path}:{n}: not a JSON object")
            for key in (label_column, text_column):
                if key not in obj:
                    raise DataError(
                        f"{path}:{n}: no {key!r} key (keys: {', '.join(map(str, obj))}); "
                        "name the columns with --label-column/--text-column"
                    )
            rows.append((n, _field(obj[label_column]), _field(obj[text_column])))
    else:
        rows = _read_table(path, text, "\t" if fmt == "tsv" else ",", label_column, text_column)
    if not rows:
        raise DataError(f"{path}: no labelled text in it")
    pairs = []
    for n, label, body in rows:
        if strict and not body.strip():
            raise DataError(f"{path}:{n}: an empty text (label {label!r})")
        if strict and not label.strip():
            raise DataError(f"{path}:{n}: an empty label")
        pairs.append((label.strip(), body))
    return pairs


def _field(value: object) -> str:
    return value if isinstance(value, str) else json.dumps(value)


def _read_table(
    path: Path, text: str, delimiter: str, label_column: str, text_column: str
) -> list[tuple[int, str, str]]:
    """A CSV's records follow RFC 4180, strictly: an unclosed quote is an error naming the
    line it opened on, not the rest of the file swallowed into one text. A TSV's are one line
    each, its cells as written unless a whole cell is quoted (as pandas writes them)."""
    csv.field_size_limit(MAX_FIELD)
    tsv = delimiter == "\t"
    lines = iter(text.split("\n")) if tsv else io.StringIO(text)
    reader: Any = _TsvReader(lines) if tsv else csv.reader(lines, delimiter=delimiter, strict=True)
    start = 1  # the line the record being read starts on
    try:
        header = next(reader, None)
        if header is None:
            raise DataError(f"{path}: no labelled text in it")
        columns = [c.strip() for c in header]
        missing = [c for c in (label_column, text_column) if c not in columns]
        if missing:
            raise DataError(
                f"{path}: no {' or '.join(map(repr, missing))} column in its header "
                f"(columns: {', '.join(columns)}); name them with --label-column/--text-column"
            )
        li, ti = columns.index(label_column), columns.index(text_column)
        rows: list[tuple[int, str, str]] = []
        while True:
            start = reader.line_num + 1
            record = next(reader, None)
            if record is None:
                return rows
            if not any(cell.strip() for cell in record):
                continue
            if len(record) <= max(li, ti):
                raise DataError(
                    f"{path}:{start}: {len(record)} columns, the header has {len(columns)}"
                )
            rows.append((start, record[li], record[ti]))
    except csv.Error as e:
        raise DataError(f"{path}:{start}: {e}") from None


class _TsvReader:
    """csv.reader's interface over TSV lines: cells split at tabs, a cell wholly in quotes
    (doubled quotes inside) unquoted, any other quote kept as a character."""

    def __init__(self, lines: Iterator[str]) -> None:
        self.lines, self.line_num = lines, 0

    def __iter__(self) -> _TsvReader:
        return self

    def __next__(self) -> list[str]:
        line = next(self.lines)
        self.line_num += 1
        return [_unquote(cell) for cell in line.split("\t")]


def _unquote(cell: str) -> str:
    inner = cell[1:-1]
    if len(cell) >= 2 and cell[0] == cell[-1] == '"' and '"' not in inner.replace('""', ""):
        return inner.replace('""', '"')
    return cell


def label_set(labels: Sequence[str]) -> list[str]:
    """The distinct labels, numerically sorted where they are all integers, else by name."""
    found = set(labels)
    try:
        return sorted(found, key=int)
    except ValueError:
        return sorted(found)


def class_balance(labels: Sequence[str], names: Sequence[str]) -> str:
    """ "0: 3,310 (47.8%), 1: 3,610 (52.2%)": each label's count and share."""
    counts = Counter(labels)
    total = max(len(labels), 1)
    return ", ".join(f"{n}: {counts[n]:,} ({counts[n] / total:.1%})" for n in names)


def stratified_split(pairs: Sequence[Pair], share: float, seed: int) -> tuple[list[int], list[int]]:
    """(kept, held out) indices: `share` of each label's examples held out (at least one of a
    label with two or more), the rest kept, both in file order."""
    by_label: dict[str, list[int]] = {}
    for i, (label, _) in enumerate(pairs):
        by_label.setdefault(label, []).append(i)
    rng = random.Random(seed)
    held: set[int] = set()
    for label in sorted(by_label):
        idx = by_label[label]
        n = min(max(round(share * len(idx)), 1 if len(idx) > 1 and share > 0 else 0), len(idx) - 1)
        held.update(rng.sample(idx, n))
    kept = [i for i in range(len(pairs)) if i not in held]
    return kept, sorted(held)


def classifier_ids(tok: Tokenizer, texts: Sequence[str], max_len: int) -> list[list[int]]:
    """Each text as BOS + its ids + EOS (BERT's [CLS] ... [SEP]), cut to `max_len` positions
    with its EOS kept."""
    return _wrapped(tok, texts, max_len)[0]


def _wrapped(tok: Tokenizer, texts: Sequence[str], max_len: int) -> tuple[list[list[int]], int]:
    """`classifier_ids`, and how many texts were cut."""
    out, cut = [], 0
    for body in tok.encode_batch(list(texts), eos=False):
        cut += len(body) > max_len - 2
        out.append([tok.bos_id, *body[: max_len - 2], tok.eos_id])
    return out, cut


@dataclass
class LabelledData:
    """A classifier run's examples: ids and label indices. `valid` is truthy when there is
    validation (the loop validates then)."""

    labels: list[str]
    train_ids: list[list[int]]
    train_y: list[int]
    valid_ids: list[list[int]]
    valid_y: list[int]
    heldout: dict[str, object] = field(default_factory=dict)  # run_config.json's record
    cut: int = 0  # texts longer than the model's positions, cut

    @property
    def valid(self) -> list[int]:
        return list(range(len(self.valid_ids)))


def training_pairs(
    data: str, valid_data: str, share: float, seed: int, label_column: str, text_column: str
) -> tuple[list[Pair], list[Pair], dict[str, object]]:
    """The training and validation pairs: `valid_data`'s, or a stratified `share` held out."""
    pairs = read_labelled(data, label_column, text_column)
    names = label_set([label for label, _ in pairs])
    if len(names) < 2:
        raise DataError(
            f"{data}: every example has the label {names[0]!r}: a classifier needs two or more"
        )
    if valid_data:
        return pairs, read_labelled(valid_data, label_column, text_column), {}
    if share <= 0:
        return pairs, [], {}
    kept, held = stratified_split(pairs, share, seed)
    record: dict[str, object] = {"examples": len(held), "share": share, "seed": seed}
    return [pairs[i] for i in kept], [pairs[i] for i in held], record


def load_labelled(
    train: list[Pair], valid: list[Pair], tok: Tokenizer, max_len: int, labels: list[str] | None
) -> LabelledData:
    """The examples as ids and label indices; `labels` fixes the classes' order (a model's, on
    fine-tuning a classifier), else they are the training data's."""
    names = labels or label_set([label for label, _ in train])
    index = {name: i for i, name in enumerate(names)}
    for where, pairs in (("training", train), ("validation", valid)):
        unknown = sorted({label for label, _ in pairs} - set(index))
        if unknown:
            raise DataError(
                f"the {where} data has labels the classifier does not know: "
                f"{', '.join(map(repr, unknown[:5]))} (its labels: {', '.join(names)})"
            )
    train_ids, cut = _wrapped(tok, [t for _, t in train], max_len)
    valid_ids = classifier_ids(tok, [t for _, t in valid], max_len)
    return LabelledData(
        names,
        train_ids,
        [index[label] for label, _ in train],
        valid_ids,
        [index[label] for label, _ in valid],
        cut=cut,
    )
