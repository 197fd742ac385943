"""Load on `aiayn serve`: 1,000 requests of 1-8 sentences at 32 concurrent clients, against the
same sentences translated in-process by `Translator` in one call. Prints JSON. `--model` may be
an `aiayn export` directory (CTranslate2, ONNX Runtime): then both sides run its engine.

    python bench/serve_load.py --model quickstart/model            # corpus: quickstart/data/test.en
    python bench/serve_load.py --model M --corpus FILE --sigterm-at 500
    python bench/serve_load.py --model M --threads 1 --server-cpus 0 --client-cpus 1
    python bench/serve_load.py --model M --beam 4 [--batching turns]   # beam requests
    python bench/serve_load.py --model M --threads 1 --server-cpus 0 --client-cpus 1 --overhead

`--server-cpus` pins the server (and the in-process side, which runs after it) and
`--client-cpus` the load generator: on a shared core the clients' own CPU time is taken from
the server's, most of it at 128 clients.

The server runs as a subprocess on a free loopback port (`python -m aiayn serve`). Reported:
errors (any answer but 200, any failed request), latency percentiles (all requests, the
single-sentence ones, and by request size), served sentences/s over the whole load, the
in-process sentences/s of `Translator.translate_hyps` on all the sentences at once (after the
server has stopped, so the two never share the CPU; the fastest of `--reps` runs), their ratio,
the in-process figure at the batch the load offers (the sentences of the requests in flight, at
most `--chunk-rows`, in arrival order), how many served translations differ from the in-process
ones, the server's merged batch sizes and its garbage-collector pauses during the load
(/metrics). Throughput is also given per CPU second
(the server process's user + system time over the load, against the in-process call's), which
other jobs on a shared machine disturb far less than wall time, and that CPU time split
(`server_threads`, Linux): the main thread, which runs uvicorn's event loop (HTTP, JSON,
validation), against the others (the model worker, chiefly).

`--overhead` then sends the same requests again with every sentence empty (answered without
the model): the server's CPU per request apart from the model, and from it the highest
served / in-process ratio per CPU second the server could reach if its model work cost what
it costs in-process (`ceiling_served_over_in_process_per_cpu_s`; an upper bound, since an
empty request skips the tokenizer and its answer is short).

`--sigterm-at N` sends SIGTERM once N answers have come back: requests refused after that
(or written into a keep-alive connection as the server closed it, unread) are counted, not
errors; `lost` is the number the server accepted but whose client got no
answer (the server prints how many it accepted as it exits). Goals (issue 13): 0 errors,
served >= 80% of in-process throughput, p99 < 1 s for single-sentence requests, 0 lost.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import random
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx


def cpu_name() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
        return re.search(r"Model name:\s*(.+)", out).group(1).strip()
    except (OSError, subprocess.CalledProcessError, AttributeError):
        return platform.processor() or "unknown"


def make_requests(corpus: list[str], n: int, most: int, seed: int) -> list[list[str]]:
    """n requests of 1..most sentences, taken in order from the corpus (cycling)."""
    rng, at, out = random.Random(seed), 0, []
    for _ in range(n):
        k = rng.randint(1, most)
        out.append([corpus[(at + i) % len(corpus)] for i in range(k)])
        at += k
    return out


def start_server(args: argparse.Namespace) -> tuple[subprocess.Popen, str]:
    from aiayn.store.directory import is_export_dir

    device = [] if is_export_dir(args.model) else ["--device", args.device]
    return launch(args.model, ["--threads", str(args.threads), "--window-ms", str(args.window_ms),
                               "--max-sentences", "64", "--timeout", "120", "--max-queue",
                               "100000", "--batching", args.batching, *device,
                               *turn_flags(args.chunk_rows)], args.server_cpus)  # fmt: skip


def cpu_set(text: str) -> set[int]:
    """'0' or '0,2' -> {0} or {0, 2} (for os.sched_setaffinity)."""
    try:
        return {int(c) for c in text.split(",")}
    except ValueError:
        msg = f"expected CPU numbers like 0 or 0,2, got {text!r}"
        raise argparse.ArgumentTypeError(msg) from None


def add_cpu_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--server-cpus", type=cpu_set, help="pin the server, and the in-process "
                   "side after it, to these CPUs (e.g. 0)")  # fmt: skip
    p.add_argument("--client-cpus", type=cpu_set, help="pin the load generator (this process, "
                   "while the load runs) to these CPUs (e.g. 1), off the server's")  # fmt: skip


def turn_flags(chunk_rows: int) -> list[str]:
    """The server's turn size: `--chunk-rows N` with its default --turn-tokens; 100000 or more
    means one turn per merged batch (the behaviour before turns), for comparison."""
    if chunk_rows >= 100_000:
        return ["--chunk-rows", str(chunk_rows), "--turn-tokens", str(10**9)]
    return ["--chunk-rows", str(chunk_rows)]


def launch(
    model: Path, flags: list[str], cpus: set[int] | None = None
) -> tuple[subprocess.Popen, str]:
    """`python -m aiayn serve --model MODEL --port 0 --no-access-log FLAGS`: (process, URL),
    pinned to `cpus` if given."""
    cmd = [sys.executable, "-m", "aiayn", "serve", "--model", str(model), "--port", "0",
           "--no-access-log", *flags]  # fmt: skip
    err = tempfile.TemporaryFile("w+")  # noqa: SIM115  (read only when the server fails)
    pin = None if cpus is None else (lambda: os.sched_setaffinity(0, cpus))
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, text=True, preexec_fn=pin)
    while line := proc.stdout.readline():
        if m := re.search(r"on (http://127\.0\.0\.1:\d+)/", line):
            return proc, m.group(1)
    err.seek(0)
    raise SystemExit(f"the server did not start:\n{err.read()[-3000:]}")


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far (Linux /proc), all its threads."""
    return stat_cpu_seconds(Path(f"/proc/{pid}/stat"))


def stat_cpu_seconds(stat: Path) -> float:
    """User + system CPU seconds in a /proc stat file (a process's or one thread's)."""
    fields = stat.read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def thread_cpu_seconds(pid: int) -> dict[int, float]:
    """User + system CPU time of each live thread of a process so far, by thread id (Linux)."""
    out = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError):  # a thread that ended meanwhile
            out[int(task.name)] = stat_cpu_seconds(task / "stat")
    return out


def thread_split(pid: int, before: dict[int, float]) -> dict[str, float]:
    """CPU seconds since `before` of the server's main thread (uvicorn's event loop: HTTP,
    JSON, validation) and of its other threads (the model worker, chiefly)."""
    now = thread_cpu_seconds(pid)
    spent = {tid: s - before.get(tid, 0.0) for tid, s in now.items()}
    main, others = spent.get(pid, 0.0), sum(s for tid, s in spent.items() if tid != pid)
    share = round(main / (main + others), 3) if main + others else 0.0
    return {"event_loop_cpu_s": round(main, 2), "other_threads_cpu_s": round(others, 2),
            "event_loop_share": share}  # fmt: skip


def percentiles(xs: list[float]) -> dict[str, float | None]:
    if not xs:
        return {"p50": None, "p95": None, "p99": None, "max": None}
    s = sorted(xs)

    def at(q: float) -> float:
        return round(s[min(len(s) - 1, int(q * len(s)))], 4)

    return {"p50": at(0.50), "p95": at(0.95), "p99": at(0.99), "max": round(s[-1], 4)}


async def own_connections(
    stack: contextlib.AsyncExitStack, url: str, n: int, timeout: float = 120
) -> list[httpx.AsyncClient]:
    """`n` clients of one connection each, closed with `stack`. Not one shared pool: httpx
    assigns a pool's requests to connections by scans that grow with both counts, and at 128
    clients on one core that bookkeeping, not the server, set the pace (the client at 100%
    CPU for seconds while the server idled, in bursts; measured on a CTranslate2 export,
    2026-11-25)."""
    one = httpx.Limits(max_connections=1, max_keepalive_connections=1)
    made = (httpx.AsyncClient(base_url=url, timeout=timeout, limits=one) for _ in range(n))
    return [await stack.enter_async_context(client) for client in made]


async def load(url: str, requests: list[list[str]], concurrency: int, sigterm_at: int,
               proc: subprocess.Popen, settings: dict) -> dict:  # fmt: skip
    results: list[dict | None] = [None] * len(requests)
    todo: asyncio.Queue[int] = asyncio.Queue()
    for i in range(len(requests)):
        todo.put_nowait(i)
    answered = 0
    async with contextlib.AsyncExitStack() as stack:
        clients = await own_connections(stack, url, concurrency)

        async def worker(client: httpx.AsyncClient) -> None:
            nonlocal answered
            while not todo.empty():
                i = todo.get_nowait()
                t0 = time.perf_counter()
                try:
                    body = {"q": requests[i], **settings}
                    r = await client.post("/v1/translate", json=body)
                    results[i] = {"status": r.status_code, "seconds": time.perf_counter() - t0,
                                  "texts": [t["text"] for t in r.json()["translations"]]
                                  if r.status_code == 200 else None}  # fmt: skip
                    answered += 1
                    if sigterm_at and answered == sigterm_at:
                        proc.send_signal(signal.SIGTERM)
                except httpx.ConnectError:
                    results[i] = {"status": "refused"}  # nothing listens: never accepted
                except httpx.HTTPError as e:
                    # After SIGTERM the server closes its idle keep-alive connections; a
                    # request written into one as it closes was never read (`lost` counts
                    # any accepted request left unanswered).
                    late = sigterm_at and answered >= sigterm_at
                    results[i] = {"status": "closed" if late else f"failed: {type(e).__name__}"}

        t0 = time.perf_counter()
        await asyncio.gather(*(worker(c) for c in clients))
        wall = time.perf_counter() - t0
        metrics = "" if sigterm_at else (await clients[0].get("/metrics")).text
    return {"results": results, "wall": wall, "metrics": metrics}


def metric(text: str, name: str) -> float | None:
    """A sample's value in Prometheus text (`name` with its labels, if any)."""
    m = re.search(rf"^{re.escape(name)} (\S+)$", text, re.M)
    return float(m.group(1)) if m else None


def gc_pauses(before: str, after: str) -> dict:
    """The server's garbage-collector pauses between two scrapes of /metrics: the full
    (generation 2) collections, their seconds, and the longest pause of any generation since
    the server started (aiayn.runtime.gc_pauses)."""
    full = 'aiayn_gc_pause_seconds_{}{{generation="2"}}'
    count = (metric(after, full.format("count")) or 0) - (metric(before, full.format("count")) or 0)
    total = (metric(after, full.format("sum")) or 0) - (metric(before, full.format("sum")) or 0)
    longest = [metric(after, f'aiayn_gc_pause_max_seconds{{generation="{g}"}}') for g in range(3)]
    return {"full_collections": int(count), "full_collection_s": round(total, 4),
            "longest_pause_s": round(max((x or 0.0) for x in longest), 4),
            "frozen_objects": int(metric(after, "aiayn_gc_frozen_objects") or 0)}  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", type=Path, default=Path("quickstart/model"))
    p.add_argument("--corpus", type=Path, help="a sentence a line (default MODEL/../data/test.en)")
    p.add_argument("--requests", type=int, default=1000)
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--most", type=int, default=8, help="most sentences per request")
    p.add_argument("--threads", type=int, default=0, help="torch threads, server and in-process")
    p.add_argument(
        "--chunk-rows",
        type=int,
        default=128,
        help="the server's search rows per turn (its default 128)",
    )
    p.add_argument("--window-ms", type=float, default=10.0)
    p.add_argument(
        "--batching",
        choices=("continuous", "turns"),
        default="continuous",
        help="the server's --batching (greedy and beam requests; its default continuous)",
    )
    p.add_argument(
        "--beam",
        type=int,
        default=0,
        help="every request asks for this beam (default: the model's setting)",
    )
    p.add_argument("--device", default="auto", help="an aiayn model's device, served and "
                   "in-process (auto: a GPU if there is one); exports run on the CPU")  # fmt: skip
    p.add_argument("--sigterm-at", type=int, default=0, help="SIGTERM after this many answers")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--reps", type=int, default=2, help="in-process runs; the fastest counts")
    p.add_argument("--overhead", action="store_true", help="then the same requests with empty "
                   "sentences: the server's CPU per request apart from the model, and the "
                   "served / in-process ratio that leaves at most")  # fmt: skip
    add_cpu_flags(p)
    args = p.parse_args()
    if args.client_cpus:
        os.sched_setaffinity(0, args.client_cpus)
    corpus_path = args.corpus or args.model.parent / "data" / "test.en"
    corpus = [s for s in corpus_path.read_text(encoding="utf-8").splitlines() if s.strip()]
    requests = make_requests(corpus, args.requests, args.most, args.seed)

    proc, url = start_server(args)
    settings = {"beam": args.beam} if args.beam else {}
    httpx.post(url + "/v1/translate", json={"q": corpus[:8], **settings}, timeout=120)  # warm up
    metrics_before = httpx.get(url + "/metrics", timeout=30).text
    cpu0, threads0 = cpu_seconds(proc.pid), thread_cpu_seconds(proc.pid)
    run = asyncio.run(load(url, requests, args.concurrency, args.sigterm_at, proc, settings))
    server_cpu = cpu_seconds(proc.pid) - cpu0 if proc.poll() is None else None
    threads = thread_split(proc.pid, threads0) if server_cpu is not None else None
    overhead = None
    if args.overhead and server_cpu is not None and not args.sigterm_at:
        # The same requests with every sentence empty: an empty line is answered without the
        # model (no tokenizer, no search), so this is what the server spends on a request
        # apart from the model: HTTP, JSON, validation, the queue and the answer's future.
        empty = [[""] * len(q) for q in requests]
        cpu1 = cpu_seconds(proc.pid)
        bare = asyncio.run(load(url, empty, args.concurrency, 0, proc, settings))
        bare_cpu = cpu_seconds(proc.pid) - cpu1
        bad = sum(1 for r in bare["results"] if not r or r["status"] != 200)
        overhead = {"requests_per_s": round(len(empty) / bare["wall"], 1),
                    "server_cpu_ms_per_request": round(1000 * bare_cpu / len(empty), 3),
                    "errors": bad}  # fmt: skip
    if proc.poll() is None and not args.sigterm_at:  # (--sigterm-at has sent it already)
        proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=300)
    exit_code = proc.returncode
    accepted = re.search(r"answered (\d+) of (\d+) accepted", out)

    results = run["results"]
    ok = [r for r in results if r and r["status"] == 200]
    refused = sum(1 for r in results if r and r["status"] == "refused")
    closed = sum(1 for r in results if r and r["status"] == "closed")
    errors = [r["status"] for r in results if r and r["status"] not in (200, "refused", "closed")]
    single = [r["seconds"] for r, q in zip(results, requests, strict=True)
              if r and r["status"] == 200 and len(q) == 1]  # fmt: skip
    served_sentences = sum(len(q) for r, q in zip(results, requests, strict=True)
                           if r and r["status"] == 200)  # fmt: skip

    # In-process, after the server has gone: the same sentences in one call.
    import torch

    if args.server_cpus:  # where the server ran
        os.sched_setaffinity(0, args.server_cpus)
    from aiayn.interop.engines import load_translator
    from aiayn.runtime.memory import keep_freed_memory
    from aiayn.store.directory import is_export_dir
    from aiayn.translate.translator import Translator

    keep_freed_memory()  # the malloc settings the served side runs with (`aiayn serve`)

    if args.threads:
        torch.set_num_threads(args.threads)
    if is_export_dir(args.model):  # a served export against its own engine in-process
        translator = load_translator(args.model, device="cpu", threads=args.threads)
    else:
        translator = Translator.load(args.model, device=args.device)
    every = [s for q in requests for s in q]
    cfg = translator.settings(beam=args.beam) if args.beam else translator.cfg
    translator.translate_hyps(corpus[:8], cfg)  # warm up
    local_s = local_cpu = float("inf")
    for _ in range(args.reps):  # the fastest run: the in-process side gets the benefit of doubt
        t0, c0 = time.perf_counter(), time.process_time()
        local = translator.translate_hyps(every, cfg)
        local_s = min(local_s, time.perf_counter() - t0)
        local_cpu = min(local_cpu, time.process_time() - c0)
    # The batch the load offers: the sentences of the requests in flight (concurrency x mean
    # request size), at most the server's rows in flight; translated in arrival order.
    rows = max(1, args.chunk_rows // cfg.beam_size)  # sentences the server's rows hold
    offered = max(1, min(rows, round(args.concurrency * len(every) / len(requests))))
    t0 = time.perf_counter()
    for i in range(0, len(every), offered):
        translator.translate_hyps(every[i : i + offered], cfg)
    offered_rate = len(every) / (time.perf_counter() - t0)
    local_texts, at, differ = [r[0].text for r in local], 0, 0
    for r, q in zip(results, requests, strict=True):
        if r and r["status"] == 200:
            differ += sum(a != b for a, b in zip(r["texts"], local_texts[at:], strict=False))
        at += len(q)

    served_rate = served_sentences / run["wall"]
    local_rate = len(every) / local_s
    if overhead:
        # At best the model costs what it costs in-process, and each request adds the bare
        # request's CPU: the served / in-process (per CPU s) ratio this server can reach.
        model_s = local_cpu / len(every)
        per_sentence = overhead["server_cpu_ms_per_request"] / 1000 * len(requests) / len(every)
        overhead["ceiling_served_over_in_process_per_cpu_s"] = round(
            model_s / (model_s + per_sentence), 3
        )
    m = run["metrics"]
    report = {
        "cpu": cpu_name(), "cores": os.cpu_count(), "torch_threads": torch.get_num_threads(),
        "device": str(getattr(translator, "device", "cpu")),
        "server_cpus": sorted(args.server_cpus or []),
        "client_cpus": sorted(args.client_cpus or []),
        "model": str(args.model), "corpus": str(corpus_path), "requests": len(requests),
        "concurrency": args.concurrency, "sentences": len(every), "window_ms": args.window_ms,
        "chunk_rows": args.chunk_rows, "batching": args.batching, "beam": cfg.beam_size,
        "errors": len(errors), "error_kinds": sorted(set(map(str, errors))),
        "answered_200": len(ok), "latency_s": percentiles([r["seconds"] for r in ok]),
        "single_sentence_latency_s": percentiles(single), "single_sentence_requests": len(single),
        "latency_by_request_size_s": {
            n: percentiles([r["seconds"] for r, q in zip(results, requests, strict=True)
                            if r and r["status"] == 200 and len(q) == n])
            for n in sorted({len(q) for q in requests})},
        "wall_s": round(run["wall"], 2), "served_sentences_per_s": round(served_rate, 1),
        "in_process_sentences_per_s": round(local_rate, 1),
        "served_over_in_process": round(served_rate / local_rate, 3),
        "offered_batch_sentences": offered,
        "in_process_at_offered_batch_per_s": round(offered_rate, 1),
        "served_over_in_process_at_offered_batch": round(served_rate / offered_rate, 3),
        # CPU seconds (all threads) are steadier than wall time on a shared machine: the
        # server's include its HTTP work; the client's (this process) are not counted.
        "served_sentences_per_cpu_s": round(served_sentences / server_cpu, 1)
        if server_cpu else None,
        "in_process_sentences_per_cpu_s": round(len(every) / local_cpu, 1),
        "served_over_in_process_per_cpu_s": round(served_sentences / server_cpu
                                                  / (len(every) / local_cpu), 3)
        if server_cpu else None,
        "translations_differing_from_in_process": differ,
        "overhead": overhead,
        "server_threads": threads,
        "server_exit_code": exit_code,
    }  # fmt: skip
    if m:
        batches = metric(m, "aiayn_batch_sentences_count") or 1
        report["mean_sentences_per_batch"] = round(metric(m, "aiayn_batch_sentences_sum")
                                                   / batches, 1)  # fmt: skip
        report["mean_requests_per_batch"] = round(metric(m, "aiayn_batch_requests_sum")
                                                  / batches, 1)  # fmt: skip
        report["server_gc"] = gc_pauses(metrics_before, m)
    if args.sigterm_at:
        got_answer = sum(1 for r in results if r and isinstance(r["status"], int))
        n_accepted = int(accepted.group(2)) if accepted else None
        report["sigterm"] = {
            "sent_after_answers": args.sigterm_at, "refused_after": refused,
            "connection_closed_unread_after": closed,
            "server_accepted": n_accepted,
            "server_answered": int(accepted.group(1)) if accepted else None,
            # the warm-up request is accepted and answered too
            "lost": None if n_accepted is None else n_accepted - (got_answer + 1),
        }  # fmt: skip
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
