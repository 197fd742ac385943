"""Head-of-line blocking in `aiayn serve` (issue 22): one-sentence requests while 8-sentence
requests of long lines are in flight from 16 clients. Prints JSON.

    python bench/serve_head_of_line.py --model quickstart/model --chunk-rows 64 100000

For each `--chunk-rows` (the server's turn size; 100000 = one turn per merged batch, the
behaviour before turns), a fresh server on a free loopback port: first `--singles`
one-sentence requests one after another on the idle server; then `--clients` clients send
8-sentence requests of the corpus's longest lines in a loop while one more client sends
`--singles` one-sentence requests one after another. Reported: the singles' p50/p90/p99 idle
and under load (and their ratio), and the long requests' sentences/s while it lasted.
Goal (issue 22): p90 under load <= 3x idle, without lowering the long requests' throughput.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import time
from datetime import date
from pathlib import Path

import httpx
from serve_load import cpu_name, launch, percentiles, turn_flags


async def singles(client: httpx.AsyncClient, lines: list[str], n: int) -> list[float]:
    out = []
    for i in range(n):
        t0 = time.perf_counter()
        r = await client.post("/v1/translate", json={"q": [lines[i % len(lines)]]})
        r.raise_for_status()
        out.append(time.perf_counter() - t0)
    return out


async def measure(url: str, short: list[str], long: list[str], args: argparse.Namespace) -> dict:
    limits = httpx.Limits(max_connections=args.clients + 2)
    async with httpx.AsyncClient(base_url=url, timeout=300, limits=limits) as client:
        await singles(client, short, 5)  # warm up
        idle = await singles(client, short, args.singles)
        done, long_sentences = False, 0

        async def hog(k: int) -> None:
            nonlocal long_sentences
            at = k * 8
            while not done:
                batch = [long[(at + j) % len(long)] for j in range(8)]
                at += 8 * args.clients
                r = await client.post("/v1/translate", json={"q": batch})
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
    p_idle, p_load = percentiles(idle), percentiles(loaded)
    p90 = (sorted(idle)[int(0.9 * len(idle))], sorted(loaded)[int(0.9 * len(loaded))])
    return {"singles_idle_s": p_idle, "singles_under_load_s": p_load,
            "p90_idle_s": round(p90[0], 4), "p90_under_load_s": round(p90[1], 4),
            "p90_ratio": round(p90[1] / p90[0], 2),
            "long_sentences_per_s": round(long_sentences / wall, 1)}  # fmt: skip


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
    p.add_argument("--clients", type=int, default=16, help="clients sending long requests")
    p.add_argument("--singles", type=int, default=60, help="one-sentence requests timed")
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args()
    corpus_path = args.corpus or args.model.parent / "data" / "test.en"
    corpus = [s for s in corpus_path.read_text(encoding="utf-8").splitlines() if s.strip()]
    by_length = sorted(corpus, key=len)
    short, long = by_length[: len(corpus) // 4], by_length[-len(corpus) // 4 :]
    runs = []
    for batching, rows in itertools.product(args.batching, args.chunk_rows):
        proc, url = launch(args.model, ["--threads", str(args.threads), "--timeout", "300",
                                        "--batching", batching, *turn_flags(rows)])  # fmt: skip
        try:
            found = asyncio.run(measure(url, short, long, args))
            runs.append({"batching": batching, "chunk_rows": rows, **found})
        finally:
            proc.terminate()
            proc.wait(60)
    print(json.dumps({"cpu": cpu_name(), "date": str(date.today()), "model": str(args.model),
                      "clients": args.clients, "threads": args.threads, "runs": runs},
                     indent=1))  # fmt: skip


if __name__ == "__main__":
    main()
