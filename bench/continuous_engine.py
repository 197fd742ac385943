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

`--clients C` models `bench/serve_load.py --concurrency C` instead (the regime of 8 or 32
clients, where the rows are not kept full): `--requests` requests of 1-`--most` sentences
(`serve_load.make_requests`, same seed), C of them in flight, each client's next request handed
to the server's own scheduler (`serve.streams.Streams`, as its model worker drives it, without
the worker thread and HTTP) as soon as its last is answered; the whole file is the same
sentences in one call. Its admitting / stepping split comes from timers around
`RowSearch.add` and `RowSearch.step` (greedy only).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import date
from pathlib import Path

import torch
from serve_load import cpu_name, make_requests

from aiayn.config import DecodeConfig
from aiayn.runtime.memory import keep_freed_memory
from aiayn.search.beam import BeamSearch
from aiayn.search.row_search import RowSearch
from aiayn.search.step import inference
from aiayn.serve.jobs import Job
from aiayn.serve.streams import Streams, part_slack
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


def whole_file(tr: Translator, lines: list[str], cfg: DecodeConfig) -> tuple[list, float]:
    """`translate_hyps` on all the lines in one call: (its result, CPU seconds)."""
    t0 = time.process_time()
    return tr.translate_hyps(lines, cfg), time.process_time() - t0


@contextmanager
def timed(owner: type, name: str, spent: list[float]) -> Iterator[None]:
    """Add the CPU time of every call of `owner.name` to spent[0] while the block runs."""
    method: Callable = getattr(owner, name)

    def wrapper(*args: object, **kwargs: object) -> object:
        t0 = time.process_time()
        try:
            return method(*args, **kwargs)
        finally:
            spent[0] += time.process_time() - t0

    setattr(owner, name, wrapper)
    try:
        yield
    finally:
        setattr(owner, name, method)


def closed_loop(
    tr: Translator, requests: list[list[str]], clients: int, rows: int, cfg: DecodeConfig
) -> tuple[list[list[str]], float, float, float]:
    """`clients` requests in `Streams` at a time, the next taken as one is answered: (texts by
    request, seconds in all, admitting, stepping)."""
    streams = Streams(tr, rows, lambda stats: None)
    streams.calibrate()
    answers: list[list[str]] = [[] for _ in requests]
    todo = iter(enumerate(requests))

    def send() -> tuple[int, Job] | None:
        nxt = next(todo, None)
        if nxt is None:
            return None
        job = Job(nxt[1], cfg, deadline=math.inf)
        streams.take(job, cfg)
        return nxt[0], job

    admitting, stepping = [0.0], [0.0]
    with timed(RowSearch, "add", admitting), timed(RowSearch, "step", stepping):
        t0 = time.process_time()
        flying = [f for f in (send() for _ in range(clients)) if f is not None]
        while flying:
            streams.step()
            waiting = []
            for i, job in flying:
                if not job.future.done():
                    waiting.append((i, job))
                    continue
                answers[i] = [t[0].text for t in job.future.result()]
                if (nxt := send()) is not None:
                    waiting.append(nxt)
            flying = waiting
        seconds = time.process_time() - t0
    return answers, seconds, admitting[0], stepping[0]


def main_clients(args: argparse.Namespace, tr: Translator, corpus: list[str]) -> None:
    cfg = tr.settings(beam=args.beam) if args.beam else tr.cfg
    requests = make_requests(corpus, args.requests, args.most, args.seed)
    lines = [line for r in requests for line in r]
    tr.translate_hyps(lines[:64], cfg)  # warm up
    whole_s = cont_s = float("inf")
    for _ in range(args.reps):
        whole, seconds = whole_file(tr, lines, cfg)
        whole_s = min(whole_s, seconds)
        got, seconds, admitting, stepping = closed_loop(tr, requests, args.clients, args.rows, cfg)
        if seconds < cont_s:
            cont_s, split = seconds, (admitting, stepping)
    served = [text for texts in got for text in texts]
    differ = sum(a != b[0].text for a, b in zip(served, whole, strict=True))
    print(json.dumps({
        "cpu": cpu_name(), "date": str(date.today()), "model": str(args.model),
        "threads": args.threads, "clients": args.clients, "requests": len(requests),
        "sentences": len(lines), "rows": args.rows, "beam": cfg.beam_size,
        "whole_file_sentences_per_cpu_s": round(len(lines) / whole_s, 1),
        "continuous_sentences_per_cpu_s": round(len(lines) / cont_s, 1),
        "continuous_over_whole_file": round(whole_s / cont_s, 3),
        "continuous_admitting_s": round(split[0], 3), "continuous_stepping_s": round(split[1], 3),
        "whole_file_s": round(whole_s, 3), "translations_differing": differ,
    }, indent=1))  # fmt: skip


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
    p.add_argument("--clients", type=int, default=0, help="a closed loop of this many clients")
    p.add_argument("--requests", type=int, default=1000, help="with --clients")
    p.add_argument("--most", type=int, default=8, help="with --clients: most sentences a request")
    p.add_argument("--seed", type=int, default=0, help="with --clients")
    args = p.parse_args()
    keep_freed_memory()  # malloc as aiayn's commands set it, for every side measured here
    torch.set_num_threads(args.threads)
    corpus_path = args.corpus or args.model.parent / "data" / "test.en"
    corpus = [s for s in corpus_path.read_text(encoding="utf-8").splitlines() if s.strip()]
    if args.clients < 0 or args.requests < 1 or args.most < 1:
        p.error("--clients takes 0 or more, --requests and --most 1 or more")
    if args.clients:
        if args.one_part:
            p.error("--one-part: the closed loop uses the server's own parts")
        return main_clients(args, Translator.load(args.model, device="cpu"), corpus)
    lines = [corpus[i % len(corpus)] for i in range(args.sentences)]
    tr = Translator.load(args.model, device="cpu")
    _, ids = tr.encode_lines(lines)
    cfg = tr.settings(beam=args.beam) if args.beam else tr.cfg
    slack = sys.maxsize if args.one_part else part_slack(tr)
    tr.translate_hyps(lines[:64], cfg)  # warm up
    whole_s = cont_s = float("inf")
    for _ in range(args.reps):
        whole, seconds = whole_file(tr, lines, cfg)
        whole_s = min(whole_s, seconds)
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
