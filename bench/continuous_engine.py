"""The server's continuous-batching engine without the server (issue 22): where the gap
between served and in-process throughput lies. Prints JSON.

    python bench/continuous_engine.py --model quickstart/model --threads 1

The same sentences two ways, in one process, CPU time (`time.process_time`), the fastest of
`--reps` rounds each, interleaved:
- **whole file**: `Translator.translate_hyps` on all of them (sorted by length, large batches);
- **continuous**: one greedy `RowSearch` (or, with `--beam N`, one `BeamSearch`: N rows a
  sentence) fed as `aiayn serve` feeds it: at most `--rows` rows in flight, sentences admitted
  in arrival order in groups once `--rows` / 4 rows are free (or all that wait fit), each group
  encoded in parts of similar length with the server's slack (`serve.streams.part_slack`;
  `--one-part`: one padded batch), finished rows leaving at once.

Both give the same translations (checked). Their ratio is the engine's share of the served /
in-process gap; `bench/serve_load.py` measures the rest (HTTP, JSON, clients). The continuous
side's time is split into admitting (encoder, cross K/V, cache join) and stepping.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from datetime import date
from pathlib import Path

import torch
from serve_load import cpu_name

from aiayn.config import DecodeConfig
from aiayn.runtime.memory import keep_freed_memory
from aiayn.search.beam import BeamSearch
from aiayn.search.rows import RowSearch
from aiayn.search.step import inference
from aiayn.serve.streams import part_slack
from aiayn.text.batches import padding_parts
from aiayn.translate.translator import Translator


def continuous(
    tr: Translator, ids: list[list[int]], rows: int, cfg: DecodeConfig, slack: int
) -> tuple[dict[int, list[int]], float, float, int]:
    """(tokens by sentence, seconds admitting, seconds stepping, admissions)."""
    N = cfg.beam_size
    run: RowSearch | BeamSearch = RowSearch(tr.model, cfg) if N == 1 else BeamSearch(tr.model, cfg)
    out: dict[int, list[int]] = {}
    sentence: dict[int, int] = {}  # by row id: its sentence
    at = admissions = 0
    admitting = stepping = 0.0
    with inference(tr.model), tr.precision.autocast():
        while at < len(ids) or run.live:
            free = (rows - run.live) // N  # sentences
            if at < len(ids) and free >= min(max(1, rows // 4 // N), len(ids) - at):
                n = min(free, len(ids) - at)
                t0 = time.process_time()
                group = list(range(at, at + n))
                cut = padding_parts([len(ids[i]) for i in group], slack)
                order = [group[i] for part in cut for i in part]  # the rows' sentences
                added = run.add(*[tr.pad([ids[group[i]] for i in part]) for part in cut])
                sentence.update(zip(added, order, strict=True))
                admitting += time.process_time() - t0
                at, admissions = at + n, admissions + 1
            t0 = time.process_time()
            for r, h in run.step():  # a beam's step gives each sentence's n-best list
                out[sentence[r]] = (h[0] if isinstance(h, list) else h).tokens
            stepping += time.process_time() - t0
    return out, admitting, stepping, admissions


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", type=Path, default=Path("quickstart/model"))
    p.add_argument("--corpus", type=Path, help="a sentence a line (default MODEL/../data/test.en)")
    p.add_argument("--sentences", type=int, default=6000, help="taken in order, cycling")
    p.add_argument("--rows", type=int, default=128, help="rows in flight (serve --chunk-rows)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--reps", type=int, default=2)
    p.add_argument("--beam", type=int, default=0, help="default: the model's setting")
    p.add_argument("--one-part", action="store_true", help="encode each group as one batch")
    args = p.parse_args()
    keep_freed_memory()  # malloc as aiayn's commands set it, for every side measured here
    torch.set_num_threads(args.threads)
    corpus_path = args.corpus or args.model.parent / "data" / "test.en"
    corpus = [s for s in corpus_path.read_text(encoding="utf-8").splitlines() if s.strip()]
    lines = [corpus[i % len(corpus)] for i in range(args.sentences)]
    tr = Translator.load(args.model, device="cpu")
    _, ids = tr.encode_lines(lines)
    cfg = tr.settings(beam=args.beam) if args.beam else tr.cfg
    slack = sys.maxsize if args.one_part else part_slack(tr)
    tr.translate_hyps(lines[:64], cfg)  # warm up
    whole_s = cont_s = float("inf")
    for _ in range(args.reps):
        t0 = time.process_time()
        whole = tr.translate_hyps(lines, cfg)
        whole_s = min(whole_s, time.process_time() - t0)
        t0 = time.process_time()
        got, admitting, stepping, admissions = continuous(tr, ids, args.rows, cfg, slack)
        if time.process_time() - t0 < cont_s:
            cont_s, split = time.process_time() - t0, (admitting, stepping, admissions)
    differ = sum(tr.tokenizer.decode(got[i]) != whole[i][0].text for i in range(len(lines)))
    print(json.dumps({
        "cpu": cpu_name(), "date": str(date.today()), "model": str(args.model),
        "threads": args.threads, "sentences": len(lines), "rows": args.rows,
        "beam": cfg.beam_size, "part_slack": None if args.one_part else slack,
        "whole_file_sentences_per_cpu_s": round(len(lines) / whole_s, 1),
        "continuous_sentences_per_cpu_s": round(len(lines) / cont_s, 1),
        "continuous_over_whole_file": round(whole_s / cont_s, 3),
        "continuous_admitting_s": round(split[0], 3), "continuous_stepping_s": round(split[1], 3),
        "admissions": split[2], "whole_file_s": round(whole_s, 3),
        "translations_differing": differ,
    }, indent=1))  # fmt: skip


if __name__ == "__main__":
    main()
