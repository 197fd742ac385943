"""How fast aiayn classifies texts, against the Hugging Face `pipeline("text-classification")`
on a BertForSequenceClassification of the same size, in the same run, on the same threads.

    python bench/classify_speed.py --out /tmp/clsbench/speed --threads 1,2

The texts: `--n` (10,000) sentences, SST-2's train, dev and test texts in turn, repeated as
needed. aiayn's model: `--model DIR` (a classifier's run directory), or one trained here for
two steps at configs/classify's size (speed does not depend on the weights). The peer: a
BertForSequenceClassification of that size (hidden d_model, n_layers, n_heads, intermediate
d_ff, max_len positions, random weights) with a BertTokenizerFast over a WordPiece vocabulary
of aiayn's vocabulary's size trained here on the same texts with `tokenizers` (nothing is
downloaded), run through `pipeline("text-classification", ..., device="cpu")` with
truncation at max_len, at its default batch size (1; timed on the first `--bs1-n` = 2,000
texts, its rate being per text) and at `--hf-batch` (32).

Measured for each thread count (torch.set_num_threads; OMP_NUM_THREADS for the CLI), every
side `--repeats` times, interleaved, after one warm-up call; best and median sentences/s:

    aiayn_inprocess   Classifier.open(DIR, "cpu", "fp32").classify(texts)
    aiayn_cli         `aiayn classify --model DIR --input FILE --output FILE --threads T`,
                      the whole command (Python, torch and the model loaded; and an 8-line
                      run, so that the start-up cost can be told from the rate)
    hf_pipeline_bs1 / hf_pipeline_bsB
                      pipeline(texts, batch_size=..., truncation=True, max_length=max_len)

and where each side's time goes (one run each): tokenizing, the model's forward passes, the
rest (batching, padding, softmax, results). `--profile` adds cProfile's top functions of one
aiayn call. Prints one JSON object (also OUT/report.json); the lab log is docs/lab/classify.md.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from classify_baselines import (
    ROOT,
    SST2,
    TINY,
    aiayn_train_cmd,
    child_env,
    cpu_info,
    load,
    need_data,
    split_paths,
    versions,
)


def texts_of(data: Path, n: int) -> list[str]:
    from aiayn.text.labelled import read_labelled

    pool = [t for p in split_paths(data).values() for _, t in read_labelled(p)]
    return [pool[i % len(pool)] for i in range(n)]


def make_model(out: Path, data: Path, overrides: list[str]) -> Path:
    """A classifier of configs/classify's size, trained for two steps (its weights do not
    change its speed)."""
    run_dir = out / "model"
    if (run_dir / "model.safetensors").is_file():
        return run_dir
    sets = [f"train.data={split_paths(data)['train']}", f"train.out_dir={run_dir}",
            "train.max_minutes=0", "train.max_steps=2", "train.lr_schedule=constant",
            "train.valid_share=0", "train.dtype=fp32", "train.device=cpu", "train.threads=1",
            *overrides]  # fmt: skip
    done = subprocess.run(aiayn_train_cmd(sets), cwd=ROOT, env=child_env(1), capture_output=True,
                          text=True, check=False)  # fmt: skip
    if done.returncode:
        sys.exit(f"training the throwaway model failed:\n{done.stderr[-3000:]}")
    return run_dir


def hf_peer(model_dir: Path, texts: list[str], out: Path) -> tuple[Any, Any, int]:
    """(pipeline, tokenizer, max_len): BERT of the aiayn model's size, WordPiece trained here."""
    import torch
    from tokenizers import BertWordPieceTokenizer
    from transformers import (
        BertConfig,
        BertForSequenceClassification,
        BertTokenizerFast,
        pipeline,
    )

    from aiayn.store.model_dir import load_model_config

    cfg = load_model_config(model_dir)
    wp = BertWordPieceTokenizer(lowercase=True)
    wp.train_from_iterator(sorted(set(texts)), vocab_size=cfg.vocab_size, show_progress=False)
    vocab_dir = out / "wordpiece"
    vocab_dir.mkdir(parents=True, exist_ok=True)
    wp.save_model(str(vocab_dir))
    # transformers 5 takes the vocabulary file as `vocab` (4.x: `vocab_file`; 5.x ignores that
    # keyword and builds a 5-piece vocabulary of the special tokens).
    tok = BertTokenizerFast(vocab=str(vocab_dir / "vocab.txt"), do_lower_case=True)
    if len(tok) < 0.5 * cfg.vocab_size:
        sys.exit(f"the WordPiece vocabulary has {len(tok)} pieces, not ~{cfg.vocab_size}")
    torch.manual_seed(0)
    bert = BertConfig(
        vocab_size=len(tok),
        hidden_size=cfg.d_model,
        num_hidden_layers=cfg.n_layers,
        num_attention_heads=cfg.n_heads,
        intermediate_size=cfg.d_ff,
        max_position_embeddings=cfg.max_len,
        num_labels=2,
    )
    model = BertForSequenceClassification(bert).eval()
    pipe = pipeline("text-classification", model=model, tokenizer=tok, device="cpu")
    return pipe, tok, cfg.max_len


def timed(fn: Any) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def breakdown_aiayn(clf: Any, texts: list[str]) -> dict[str, float]:
    """Seconds for: tokenizing (ids), the forward passes over the same batches, everything."""
    import torch

    from aiayn.text.batches import pad_rows

    total = timed(lambda: clf.classify(texts))
    ids: list[list[int]] = []
    t_ids = timed(lambda: ids.extend(clf.ids(texts)))
    batches = [pad_rows([ids[i] for i in idx], clf.model.cfg.pad_id) for idx in clf.batches(ids)]

    def forward() -> None:
        with torch.inference_mode():
            for b in batches:
                clf.model(b)

    t_fwd = timed(forward)
    return {
        "total_s": round(total, 3),
        "tokenize_s": round(t_ids, 3),
        "forward_s": round(t_fwd, 3),
        "rest_s": round(total - t_ids - t_fwd, 3),
        "batches": len(batches),
        "padded_positions": sum(b.numel() for b in batches),
    }


def breakdown_hf(pipe: Any, tok: Any, texts: list[str], max_len: int, bs: int) -> dict:
    """The pipeline's time, and its tokenizer's and model's alone on the same batches."""
    import torch

    total = timed(lambda: pipe(texts, batch_size=bs, truncation=True, max_length=max_len))
    enc: list[Any] = []

    def tokenize() -> None:
        for a in range(0, len(texts), bs):
            enc.append(tok(texts[a : a + bs], truncation=True, max_length=max_len,
                           padding=True, return_tensors="pt"))  # fmt: skip

    t_tok = timed(tokenize)

    def forward() -> None:
        with torch.inference_mode():
            for e in enc:
                pipe.model(**e)

    t_fwd = timed(forward)
    return {
        "batch_size": bs,
        "total_s": round(total, 3),
        "tokenize_s": round(t_tok, 3),
        "forward_s": round(t_fwd, 3),
        "rest_s": round(total - t_tok - t_fwd, 3),
        "padded_positions": sum(int(e["input_ids"].numel()) for e in enc),
    }


def cli_seconds(model: Path, inp: Path, out: Path, threads: int) -> float:
    cmd = [sys.executable, "-m", "aiayn", "classify", "--model", str(model), "--input", str(inp),
           "--output", str(out), "--threads", str(threads), "--device", "cpu",
           "--dtype", "fp32"]  # fmt: skip
    t0 = time.perf_counter()
    done = subprocess.run(cmd, cwd=ROOT, env=child_env(threads), capture_output=True, text=True,
                          check=False)  # fmt: skip
    took = time.perf_counter() - t0
    if done.returncode:
        sys.exit(f"aiayn classify failed: {done.stderr.strip()[-2000:]}")
    return took


def rate(n: int, seconds: list[float]) -> dict[str, Any]:
    return {
        "seconds": [round(s, 3) for s in seconds],
        "best_per_s": round(n / min(seconds), 1),
        "median_per_s": round(n / statistics.median(seconds), 1),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True, help="a folder for the model and files")
    ap.add_argument("--model", type=Path, help="aiayn's classifier (default: trained here)")
    ap.add_argument("--data", type=Path, default=SST2, help="the folder of stsa.binary.*")
    ap.add_argument("--n", type=int, default=10_000, help="sentences to classify")
    ap.add_argument("--threads", default="1", help="comma-separated thread counts")
    ap.add_argument("--repeats", type=int, default=3, help="timed runs of each side")
    ap.add_argument("--hf-batch", type=int, default=32, help="the pipeline's batched size")
    ap.add_argument("--skip-bs1", action="store_true", help="leave out the batch-1 pipeline")
    ap.add_argument("--bs1-n", type=int, default=2000, help="texts the batch-1 pipeline gets")
    ap.add_argument("--no-cli", action="store_true", help="leave out `aiayn classify`")
    ap.add_argument("--profile", action="store_true", help="cProfile one aiayn call")
    ap.add_argument("--tiny", action="store_true", help="a 32-wide model (tests)")
    ap.add_argument("--no-pin", action="store_true",
                    help="don't hold the process to as many CPUs as threads")  # fmt: skip
    args = ap.parse_args()
    need_data(args.data)
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    import torch

    from aiayn.atomic import atomic_write_json, atomic_write_text
    from aiayn.classify.classifier import Classifier

    texts = texts_of(args.data.resolve(), args.n)
    inp = out / "texts.txt"
    atomic_write_text(inp, "".join(t + "\n" for t in texts))
    short = out / "texts8.txt"
    atomic_write_text(short, "".join(t + "\n" for t in texts[:8]))
    model_dir = args.model.resolve() if args.model else make_model(
        out, args.data.resolve(), TINY if args.tiny else [])  # fmt: skip
    report: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
        "sentences": len(texts),
        "model": str(model_dir),
        "repeats": args.repeats,
        "cpu": cpu_info(),
        "versions": versions(),
        "load_before": load(),
        "by_threads": {},
    }
    clf = Classifier.open(model_dir, "cpu", "fp32")
    pipe, tok, max_len = hf_peer(model_dir, texts, out)
    report["sizes"] = {
        "aiayn_parameters": sum(p.numel() for p in clf.model.parameters()),
        "hf_parameters": sum(p.numel() for p in pipe.model.parameters()),
        "aiayn_vocab": clf.tok.vocab_size,
        "hf_vocab": len(tok),
        "max_len": max_len,
    }
    hf_sizes = [args.hf_batch] if args.skip_bs1 else [1, args.hf_batch]
    # The batch-1 pipeline is timed on the first --bs1-n texts (its rate hardly depends on
    # how many: one text a call), so that a sweep fits in minutes.
    sample = {bs: texts[: args.bs1_n] if bs == 1 else texts for bs in hf_sizes}
    report["hf_bs1_texts"] = len(sample.get(1, []))
    cpus = sorted(os.sched_getaffinity(0))
    for threads in [int(t) for t in args.threads.split(",") if t]:
        torch.set_num_threads(threads)
        # The whole process (SentencePiece's and the Rust tokenizer's own threads too, and
        # the CLI's child) on `threads` CPUs: "one thread" means one core's worth of work.
        if not args.no_pin and len(cpus) >= threads:
            os.sched_setaffinity(0, set(cpus[:threads]))
        clf.classify(texts[:64])  # warm-up: first-call allocations, kernels chosen
        for bs in hf_sizes:
            pipe(texts[:64], batch_size=bs, truncation=True, max_length=max_len)
        times: dict[str, list[float]] = {"aiayn_inprocess": []}
        times.update({f"hf_pipeline_bs{bs}": [] for bs in hf_sizes})
        if not args.no_cli:
            times["aiayn_cli"], times["aiayn_cli_8_lines"] = [], []
        for _ in range(args.repeats):
            times["aiayn_inprocess"].append(timed(lambda: clf.classify(texts)))
            for bs in hf_sizes:
                times[f"hf_pipeline_bs{bs}"].append(timed(
                    lambda bs=bs: pipe(sample[bs], batch_size=bs, truncation=True,
                                       max_length=max_len)))  # fmt: skip
            if not args.no_cli:
                times["aiayn_cli"].append(cli_seconds(model_dir, inp, out / "labels.txt", threads))
                times["aiayn_cli_8_lines"].append(
                    cli_seconds(model_dir, short, out / "labels8.txt", threads)
                )
        counts = {"aiayn_cli_8_lines": 8, "hf_pipeline_bs1": len(sample.get(1, []))}
        got: dict[str, Any] = {
            name: rate(counts.get(name, len(texts)), s) for name, s in times.items()
        }
        peer = max(got[f"hf_pipeline_bs{bs}"]["best_per_s"] for bs in hf_sizes)
        got["ratio_inprocess_vs_best_pipeline"] = round(
            got["aiayn_inprocess"]["best_per_s"] / peer, 2
        )
        if not args.no_cli:
            got["ratio_cli_vs_best_pipeline"] = round(got["aiayn_cli"]["best_per_s"] / peer, 2)
        got["where_the_time_goes"] = {
            "aiayn": breakdown_aiayn(clf, texts),
            **{f"hf_bs{bs}": breakdown_hf(pipe, tok, sample[bs], max_len, bs) for bs in hf_sizes},
        }
        if args.profile:
            prof = cProfile.Profile()
            prof.runcall(clf.classify, texts)
            buf = io.StringIO()
            pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(12)
            got["aiayn_profile_top"] = buf.getvalue().splitlines()[-20:]
        got["cpus"] = sorted(os.sched_getaffinity(0))
        report["by_threads"][str(threads)] = got
    report["load_after"] = load()
    atomic_write_json(out / "report.json", report)
    print(json.dumps(report))


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main()
