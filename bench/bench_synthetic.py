"""How fast is the built-in corpus? `synth_pairs` against the same sentences from plain num2words.

The peer renders exactly the values `synth_pairs` drew, with `num2words.num2words(v, lang=...)`
(the untouched converters), so the ratio isolates the trimmed number-word tables in
`synthetic._cardinal`. Rounds interleave ours and the peer. Last line: one JSON object.

    python bench/bench_synthetic.py [--n 50000] [--rounds 2]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time

from num2words import num2words

from aiayn.text.synthetic import split_pools, synth_pairs, synth_values


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=50_000)
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()

    t0 = time.perf_counter()
    split_pools("numbers"), split_pools("dates")
    pools_s = time.perf_counter() - t0

    results = {}
    for task, src, tgt in [("numbers", "en", "de"), ("numbers", "en", "fr"), ("dates", "en", "de")]:
        ours, peer = [], []
        for r in range(args.rounds):
            t0 = time.perf_counter()
            pairs = synth_pairs(task, src, tgt, args.n, seed=r)
            ours.append(time.perf_counter() - t0)
            if task == "numbers":  # dates have no trimmed path: babel is the only renderer
                t0 = time.perf_counter()
                values = synth_values(task, args.n, seed=r)
                plain = [(num2words(v, lang=src), num2words(v, lang=tgt)) for v in values]
                peer.append(time.perf_counter() - t0)
                assert plain == pairs, "trimmed converters changed a sentence"
        key = f"{task}_{src}_{tgt}"
        results[key] = {"ours_s": round(statistics.median(ours), 3)}
        if peer:
            results[key]["plain_num2words_s"] = round(statistics.median(peer), 3)
            results[key]["speedup"] = round(statistics.median(peer) / statistics.median(ours), 2)
        print(key, results[key], flush=True)

    print(json.dumps({
        "bench": "synthetic", "n_pairs": args.n, "rounds": args.rounds,
        "split_pools_first_call_s": round(pools_s, 3), "results": results,
        "python": platform.python_version(), "cpus": os.cpu_count(),
        "ld_preload": os.environ.get("LD_PRELOAD", ""),
    }))  # fmt: skip


if __name__ == "__main__":
    main()
