"""What a SentencePiece call costs by how many sentences it carries (why `JointTokenizer`
encodes a few sentences one call each, `aiayn.text.tokenizer.ONE_BY_ONE`). Prints JSON.

    python bench/tokenizer_calls.py --model quickstart/model

For calls of 1, 4, 16, 64, 256 and all sentences of `--corpus`: CPU microseconds per
sentence (`time.process_time`, the fastest of `--reps`) for SentencePiece's list call with
its default threads, the list call with one thread, one call per sentence, and
`encode_batch` as it is.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from datetime import date
from pathlib import Path

from serve_load import cpu_name

from aiayn.text.tokenizer import JointTokenizer, Tokenizer


def per_sentence_us(
    lines: list[str], n: int, call: Callable[[list[str]], object], reps: int
) -> float:
    groups = [lines[i : i + n] for i in range(0, len(lines), n)]
    best = float("inf")
    for _ in range(reps):
        t0 = time.process_time()
        for g in groups:
            call(g)
        best = min(best, time.process_time() - t0)
    return round(1e6 * best / len(lines), 2)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", type=Path, default=Path("quickstart/model"))
    p.add_argument("--corpus", type=Path, help="a sentence a line (default MODEL/../data/test.en)")
    p.add_argument("--reps", type=int, default=3)
    args = p.parse_args()
    corpus_path = args.corpus or args.model.parent / "data" / "test.en"
    lines = [s for s in corpus_path.read_text(encoding="utf-8").splitlines() if s.strip()]
    tok = Tokenizer.load(args.model)
    if not isinstance(tok, JointTokenizer):
        raise SystemExit(f"{args.model} has no joint SentencePiece tokenizer")
    sp = tok.sp
    calls: dict[str, Callable[[list[str]], object]] = {
        "list_default_threads": lambda g: sp.encode(g, out_type=int),
        "list_one_thread": lambda g: sp.encode(g, out_type=int, num_threads=1),
        "one_call_each": lambda g: [sp.encode(s, out_type=int) for s in g],
        "encode_batch": tok.encode_batch,
    }
    sizes = [n for n in (1, 4, 16, 64, 256) if n < len(lines)] + [len(lines)]
    table = {str(n): {name: per_sentence_us(lines, n, call, args.reps)
                      for name, call in calls.items()} for n in sizes}  # fmt: skip
    report = {"cpu": cpu_name(), "date": str(date.today()), "corpus": str(corpus_path),
              "sentences": len(lines), "cpu_us_per_sentence": table}  # fmt: skip
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
