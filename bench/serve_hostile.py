"""`aiayn serve` under hostile requests (issue 19): how fast each is refused or capped, how long
an ordinary request waits while the worst allowed one runs, and the server's peak memory.
Prints JSON.

    python bench/serve_hostile.py --model quickstart/model

For each `--chunk-rows` setting (default: the server's 64, and one turn per request as a
baseline), a fresh server on a free loopback port is sent:
- the hostile cases of issue 19, one after another: the seconds to each answer and its status;
- the worst /v1/translate the default limits allow (20,000 characters of long lines, beam 8,
  no EOS before the output-token limit), and 0.5 s later an ordinary one-sentence request
  from another client: both latencies, against the one-sentence request on the idle server;
- `--worst-clients` clients sending that worst request at once, with the worst /v1/explain
  (every tensor, up to the trace budget) beside them: the server's peak resident memory
  (sampled every 20 ms from /proc), against its memory after loading.
"""

from __future__ import annotations

import argparse
import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import date
from pathlib import Path

import httpx
from serve_load import cpu_name, launch, turn_flags

WORST_LINE = "seven hundred and seventy-seven thousand, seven hundred and seventy-seven " * 11


def worst_translate() -> dict:
    n = 20_000 // len(WORST_LINE)
    return {"q": [WORST_LINE] * n, "beam": 8, "min_len": 256, "max_len_b": 256}


HOSTILE = [  # (name, method, path, body or raw bytes, headers)
    ("explain steps 0-2e9", "post", "/v1/explain", {"q": "two", "steps": "0-2000000000"}, {}),
    ("explain steps [0, 2e9]", "post", "/v1/explain", {"q": "two", "steps": [0, 2 * 10**9]}, {}),
    ("explain all tensors, 256 steps", "post", "/v1/explain",
     {"q": WORST_LINE[:300], "min_len": 256}, {}),
    ("translate max_len_b 1e6", "post", "/v1/translate", {"q": "two", "max_len_b": 10**6}, {}),
    ("translate min_len 1e7", "post", "/v1/translate", {"q": "two", "min_len": 10**7}, {}),
    ("sample: 'yes'", "post", "/v1/translate", {"q": "two", "sample": "yes"}, {}),
    ("temperature Infinity", "post", "/v1/translate",
     b'{"q": "two", "sample": true, "temperature": Infinity}', {}),
    ("alpha 'inf'", "post", "/v1/translate", {"q": "two", "alpha": "inf"}, {}),
    ("text/plain cross-site POST", "post", "/v1/translate", b'{"q": "two"}',
     {"Content-Type": "text/plain"}),
    ("DNS rebinding Host", "get", "/v1/model", None, {"Host": "attacker.example"}),
    ("64 MB chunked body", "post", "/translate", "chunked", {"Content-Type": "text/plain"}),
]  # fmt: skip


def rss_mb(pid: int) -> float:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(status.split("VmRSS:")[1].split()[0]) / 1024


def send(url: str, method: str, path: str, body, headers: dict, timeout: float = 200):
    t0 = time.perf_counter()
    with httpx.Client(base_url=url, timeout=timeout) as c:
        if method == "get":
            r = c.get(path, headers=headers)
        elif body == "chunked":
            r = c.post(path, content=(b"x" * (1 << 20) for _ in range(64)), headers=headers)
        elif isinstance(body, bytes):
            r = c.post(path, content=body, headers={"Content-Type": "application/json",
                                                    **headers})  # fmt: skip
        else:
            r = c.post(path, json=body, headers=headers)
    return r.status_code, round(time.perf_counter() - t0, 4)


def one_server(args: argparse.Namespace, chunk_rows: int) -> dict:
    proc, url = launch(args.model, ["--threads", str(args.threads), "--timeout", "120",
                                    *turn_flags(chunk_rows)])  # fmt: skip
    try:
        idle = [send(url, "post", "/v1/translate", {"q": "two"}, {})[1] for _ in range(5)]
        hostile = {name: send(url, m, p, b, h) for name, m, p, b, h in HOSTILE}
        worst: dict = {}
        hog = threading.Thread(target=lambda: worst.update(
            r=send(url, "post", "/v1/translate", worst_translate(), {})))  # fmt: skip
        hog.start()
        time.sleep(0.5)
        ordinary = send(url, "post", "/v1/translate", {"q": "two"}, {})
        hog.join()
        base = rss_mb(proc.pid)
        peak, done = base, threading.Event()

        def sample() -> None:
            nonlocal peak
            while not done.is_set():
                peak = max(peak, rss_mb(proc.pid))
                time.sleep(0.02)

        sampler = threading.Thread(target=sample)
        sampler.start()
        explain = {"q": WORST_LINE[:300], "min_len": 256, "tensors": "all"}
        with ThreadPoolExecutor(args.worst_clients + 1) as pool:
            jobs = [pool.submit(send, url, "post", "/v1/translate", worst_translate(), {})
                    for _ in range(args.worst_clients)]  # fmt: skip
            jobs.append(pool.submit(send, url, "post", "/v1/explain", explain, {}))
            statuses = [j.result()[0] for j in jobs]
        done.set()
        sampler.join()
        return {
            "chunk_rows": chunk_rows,
            "idle_one_sentence_s": min(idle),
            "hostile": {k: {"status": s, "seconds": t} for k, (s, t) in hostile.items()},
            "worst_translate": {"status": worst["r"][0], "seconds": worst["r"][1]},
            "ordinary_during_worst": {"status": ordinary[0], "seconds": ordinary[1]},
            "rss_mb": {"after_load": round(base, 1), "peak_under_worst": round(peak, 1)},
            "worst_clients_statuses": statuses,
        }
    finally:
        proc.terminate()
        proc.wait(60)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", type=Path, required=True)
    p.add_argument("--threads", type=int, default=1, help="server torch threads (default 1)")
    p.add_argument("--chunk-rows", type=int, nargs="+", default=[128, 100_000])
    p.add_argument("--worst-clients", type=int, default=4)
    args = p.parse_args()
    runs = [one_server(args, c) for c in args.chunk_rows]
    print(json.dumps({"cpu": cpu_name(), "date": str(date.today()), "threads": args.threads,
                      "runs": runs}, indent=1))  # fmt: skip


if __name__ == "__main__":
    main()
