"""Head-of-line blocking in `aiayn serve` (issue 22): one-sentence requests while 8-sentence
requests of long lines are in flight from 16 clients. Prints JSON.

    python bench/serve_head_of_line.py --model quickstart/model --chunk-rows 64 100000
    python bench/serve_head_of_line.py --model quickstart/model --device cuda   # on a GPU

For each `--chunk-rows` (the server's turn size; 100000 = one turn per merged batch, the
behaviour before turns), a fresh server on a free loopback port: first `--singles`
one-sentence requests one after another on the idle server; then `--clients` clients send
8-sentence requests of the corpus's longest lines in a loop while one more client sends
`--singles` one-sentence requests one after another. Reported: the singles' p50/p90/p99 idle
and under load (and their ratio), and the long requests' sentences/s while it lasted.
Goal (issue 22): p90 under load <= 3x idle, without lowering the long requests' throughput.

Also measured, in-process after the servers have stopped (`model_floor`): the model time a
short sentence takes alone, and sharing every step with `--clients` x 8 long sentences (the
batch the load keeps full), one greedy search (`RowSearch`), same threads. Their ratio is
what continuous batching cannot go under when it keeps the long requests' batch full: each
step costs what the whole batch costs, before any HTTP, queueing or encoder work.

And (`engine`) the same load through the server's own scheduler in-process: the model worker's
`Streams`, driven as the worker drives it, with `--clients` 8-sentence requests of long lines
resubmitted as they are answered and `--singles` one-sentence requests one after another, idle
then loaded; no HTTP, no event loop, no threads. Its ratio is what the scheduler gives before
HTTP: the long requests' admissions (their encoder passes) share every iteration a short
request waits through, which `model_floor` leaves out.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import math
import os
import time
from datetime import date
from pathlib import Path

import httpx
import torch
from serve_load import add_cpu_flags, cpu_name, launch, own_connections, percentiles, turn_flags

from aiayn.runtime.memory import keep_freed_memory
from aiayn.search.row_search import RowSearch
from aiayn.search.step import inference
from aiayn.serve.jobs import Job
from aiayn.serve.streams import Streams
from aiayn.translate.translator import Translator


async def singles(client: httpx.AsyncClient, lines: list[str], n: int) -> list[float]:
    out = []
    for i in range(n):
        t0 = time.perf_counter()
        r = await client.post("/v1/translate", json={"q": [lines[i % len(lines)]]})
        r.raise_for_status()
        out.append(time.perf_counter() - t0)
    return out


async def measure(url: str, short: list[str], long: list[str], args: argparse.Namespace) -> dict:
    async with contextlib.AsyncExitStack() as stack:  # each client its own connection
        client, *hog_clients = await own_connections(stack, url, 1 + args.clients, timeout=300)
        await singles(client, short, 5)  # warm up
        idle = await singles(client, short, args.singles)
        done, long_sentences = False, 0

        async def hog(k: int) -> None:
            nonlocal long_sentences
            at = k * 8
            while not done:
                batch = [long[(at + j) % len(long)] for j in range(8)]
                at += 8 * args.clients
                r = await hog_clients[k].post("/v1/translate", json={"q": batch})
                r.raise_for_status()
                if not done:
                    long_sentences += 8

        hogs = [asyncio.create_task(hog(k)) for k in range(args.clients)]
        await asyncio.sleep(1.0)  # the long requests are in flight
        t0 = time.perf_counter()
        loaded = await singles(client, short, args.singles)
        wall = time.perf_counter() - t0
        done = True
        await asyncio.gather(*hogs)
    return head_of_line(idle, loaded, long_sentences / wall)


def head_of_line(idle: list[float], loaded: list[float], long_per_s: float) -> dict:
    """The singles' latency percentiles idle and loaded, their p90 ratio (the goal's figure),
    and the long requests' sentences/s meanwhile."""
    p90 = (sorted(idle)[int(0.9 * len(idle))], sorted(loaded)[int(0.9 * len(loaded))])
    return {"singles_idle_s": percentiles(idle), "singles_under_load_s": percentiles(loaded),
            "p90_idle_s": round(p90[0], 4), "p90_under_load_s": round(p90[1], 4),
            "p90_ratio": round(p90[1] / p90[0], 2),
            "long_sentences_per_s": round(long_per_s, 1)}  # fmt: skip


def model_floor(
    translator: Translator, short: list[str], long: list[str], args: argparse.Namespace
) -> dict:
    """Median seconds for short sentences to finish alone, and in one batch with the
    clients x 8 long ones (added at the same step), over `--singles` short sentences."""
    _, long_ids = translator.encode_lines([long[i % len(long)] for i in range(8 * args.clients)])

    def finish_s(line: str, others: list[list[int]]) -> tuple[float, int]:
        run = RowSearch(translator.model, translator.settings())
        (ids,) = translator.encode_lines([line])[1]
        with inference(translator.model), translator.precision.autocast():
            run.add(translator.pad([ids, *others]))
            t0, steps = time.perf_counter(), 0
            while True:
                steps += 1
                if any(row == 0 for row, _ in run.step()):
                    return time.perf_counter() - t0, steps

    finish_s(short[0], long_ids)  # warm up
    alone, shared, steps = [], [], []
    for i in range(args.singles):
        line = short[i % len(short)]
        alone.append(finish_s(line, [])[0])
        t, n = finish_s(line, long_ids)
        shared.append(t)
        steps.append(n)
    a, b = sorted(alone)[len(alone) // 2], sorted(shared)[len(shared) // 2]
    return {"rows_shared": 1 + len(long_ids), "median_steps": sorted(steps)[len(steps) // 2],
            "alone_s": round(a, 5), "shared_s": round(b, 5), "ratio": round(b / a, 2)}  # fmt: skip


def engine(
    translator: Translator, short: list[str], long: list[str], args: argparse.Namespace
) -> dict:
    """The singles' latency (wall seconds) idle and under the long requests' load, through the
    model worker's scheduler (`Streams`, `--chunk-rows`' first value as its rows) in-process."""
    cfg = translator.cfg
    streams = Streams(translator, args.chunk_rows[0], lambda stats: None)
    streams.calibrate()
    taken = 0

    def job(lines: list[str]) -> Job:
        j = Job(lines, cfg, deadline=math.inf)
        streams.take(j, cfg)
        return j

    def long_job() -> Job:
        nonlocal taken
        taken += 8
        return job([long[(taken - 8 + j) % len(long)] for j in range(8)])

    def singles(n: int, hogs: list[Job]) -> tuple[list[float], int]:
        """Seconds each of n singles took, and the long sentences answered meanwhile."""
        seconds, answered = [], 0
        for i in range(n):
            t0 = time.perf_counter()
            single = job([short[i % len(short)]])
            while not single.future.done():
                streams.step()
                for k, hog in enumerate(hogs):
                    if hog.future.done():
                        answered += 8
                        hogs[k] = long_job()
            seconds.append(time.perf_counter() - t0)
        return seconds, answered

    singles(5, [])  # warm up
    idle, _ = singles(args.singles, [])
    hogs = [long_job() for _ in range(args.clients)]
    for _ in range(30):  # the long requests in flight, as the served run's 1 s of load
        streams.step()
    t0 = time.perf_counter()
    loaded, answered = singles(args.singles, hogs)
    return head_of_line(idle, loaded, answered / (time.perf_counter() - t0))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", type=Path, required=True)
    p.add_argument("--corpus", type=Path, help="a sentence a line (default MODEL/../data/test.en)")
    p.add_argument(
        "--chunk-rows",
        type=int,
        nargs="+",
        default=[128],
        help="turn sizes to compare (100000: one turn per merged batch)",
    )
    p.add_argument(
        "--batching",
        nargs="+",
        choices=("continuous", "turns"),
        default=["continuous", "turns"],
        help="the server's --batching, each compared",
    )
    p.add_argument("--window-ms", type=float, default=10.0, help="the server's --window-ms")
    p.add_argument("--clients", type=int, default=16, help="clients sending long requests")
    p.add_argument("--singles", type=int, default=60, help="one-sentence requests timed")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--device", default="auto", help="the server's and the floor's --device "
                   "(auto: a GPU if there is one)")  # fmt: skip
    add_cpu_flags(p)
    args = p.parse_args()
    keep_freed_memory()  # malloc as aiayn's commands set it, for every side measured here
    if args.client_cpus:
        os.sched_setaffinity(0, args.client_cpus)
    corpus_path = args.corpus or args.model.parent / "data" / "test.en"
    corpus = [s for s in corpus_path.read_text(encoding="utf-8").splitlines() if s.strip()]
    by_length = sorted(corpus, key=len)
    short, long = by_length[: len(corpus) // 4], by_length[-len(corpus) // 4 :]
    runs = []
    for batching, rows in itertools.product(args.batching, args.chunk_rows):
        proc, url = launch(args.model, ["--threads", str(args.threads), "--timeout", "300",
                                        "--device", args.device, "--batching", batching,
                                        "--window-ms", str(args.window_ms), *turn_flags(rows)],
                           args.server_cpus)  # fmt: skip
        try:
            found = asyncio.run(measure(url, short, long, args))
            runs.append(
                {"batching": batching, "chunk_rows": rows, "window_ms": args.window_ms, **found}
            )
        finally:
            proc.terminate()
            proc.wait(60)
    if args.server_cpus:  # the in-process floor where the server ran
        os.sched_setaffinity(0, args.server_cpus)
    torch.set_num_threads(args.threads)
    translator = Translator.load(args.model, device=args.device)  # for both in-process figures
    floor = model_floor(translator, short, long, args)
    replay = engine(translator, short, long, args) if "continuous" in args.batching else None
    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else None
    print(json.dumps({"cpu": cpu_name(), "gpu": gpu, "device": args.device,
                      "date": str(date.today()), "model": str(args.model),
                      "clients": args.clients, "threads": args.threads, "runs": runs,
                      "model_floor": floor, "engine": replay}, indent=1))  # fmt: skip


if __name__ == "__main__":
    main()
