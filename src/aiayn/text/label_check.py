"""What is wrong with a classifier's labelled data, counted (`aiayn data check --data`, and one
log line at the start of a classify run).

    check_labelled       duplicates, one text with two labels, texts shared with an evaluation
                         set, empty texts, a single label, severe imbalance, evaluation labels
                         the training data lacks
    log_labelled_check   the report in one line of a run's log
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiayn.config import TrainConfig
from aiayn.text.labelled import Pair, label_set, read_labelled

# A class with under 1/IMBALANCE of the largest class's examples is a severe imbalance:
# accuracy then says little (always predicting the large class scores high); macro-F1 and
# train.class_weights are the remedies.
IMBALANCE = 10


@dataclass
class LabelReport:
    """Counts of each finding, and a few examples of each (text, labels)."""

    examples: int
    labels: dict[str, int]  # label -> examples
    counts: dict[str, int] = field(default_factory=dict)
    samples: dict[str, list[str]] = field(default_factory=dict)

    def add(self, kind: str, example: str, n: int = 1) -> None:
        self.counts[kind] = self.counts.get(kind, 0) + n
        got = self.samples.setdefault(kind, [])
        if len(got) < 3:
            got.append(example)

    def summary(self) -> str:
        found = [f"{KINDS[k]}: {n:,}" for k, n in self.counts.items() if n]
        return "; ".join(found) if found else "nothing found"

    def to_json(self) -> dict[str, Any]:
        """The report as one JSON object (`aiayn data check --data ... --json`)."""
        return {
            "examples": self.examples,
            "labels": self.labels,
            "summary": self.summary(),
            "counts": self.counts,
            "samples": self.samples,
        }


KINDS = {
    "empty": "empty texts",
    "duplicate": "duplicate examples (text and label)",
    "conflict": "texts with two or more labels",
    "one_label": "a single label",
    "imbalance": f"classes under 1/{IMBALANCE} of the largest",
    "leak": "texts also in an evaluation set",
    "unseen_label": "evaluation examples whose label is not in the training data",
}


def _key(text: str) -> str:
    return " ".join(text.split()).lower()


def check_labelled(pairs: list[Pair], evals: dict[str, list[Pair]] | None = None) -> LabelReport:
    """Count the findings in `pairs` (and the texts each of `evals` shares with them)."""
    labels = Counter(label for label, _ in pairs)
    report = LabelReport(len(pairs), {name: labels[name] for name in label_set(list(labels))})
    seen: dict[str, set[str]] = {}
    exact: Counter[tuple[str, str]] = Counter()
    for label, text in pairs:
        if not text.strip():
            report.add("empty", f"(label {label})")
            continue
        key = _key(text)
        seen.setdefault(key, set()).add(label)
        exact[(label, key)] += 1
    for (label, key), n in exact.items():
        if n > 1:
            report.add("duplicate", f"{label}\t{key}", n - 1)
    for key, found in seen.items():
        if len(found) > 1:
            report.add("conflict", f"{'/'.join(sorted(found))}\t{key}")
    if len(labels) < 2:
        report.add("one_label", f"every example is {next(iter(labels), '?')!r}")
    elif labels:
        most = max(labels.values())
        for name, n in labels.items():
            if n * IMBALANCE < most:
                report.add("imbalance", f"{name}: {n:,} vs {most:,}")
    for name, other in (evals or {}).items():
        for label, text in other:
            if _key(text) in seen:
                report.add("leak", f"{name}: {label}\t{_key(text)}")
            if label not in labels:  # the classifier cannot predict it: always wrong
                report.add("unseen_label", f"{name}: {label}\t{_key(text)}")
    return report


def log_labelled_check(tc: TrainConfig, log: logging.Logger) -> None:
    """One line: what `check_labelled` finds in train.data (and train.valid_data)."""
    pairs = read_labelled(tc.data, tc.label_column, tc.text_column, strict=False)
    evals = {}
    if tc.valid_data:
        evals["valid"] = read_labelled(tc.valid_data, tc.label_column, tc.text_column)
    report = check_labelled(pairs, evals)
    if report.counts:
        flag = f"--data {tc.data}" + (f" --valid-data {tc.valid_data}" if tc.valid_data else "")
        log.warning(
            "data check: %s; `aiayn data check %s` shows examples (docs/classify.md)",
            report.summary(),
            flag,
        )
    else:
        log.info("data check: nothing found in %s", Path(tc.data).name)
