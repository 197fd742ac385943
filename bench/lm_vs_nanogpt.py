"""aiayn's character-level GPT (configs/lm_shakespeare_char_cpu.toml) beside nanoGPT's own
train.py on tiny Shakespeare, both on this CPU at the same time, one thread each.

    python bench/lm_vs_nanogpt.py --nanogpt .bench_peers/nanogpt --out runs/lm_vs_nanogpt

nanoGPT runs unmodified with its README's CPU example (config/train_shakespeare_char.py,
--device=cpu --compile=False --eval_iters=20 --log_interval=1 --block_size=64 --batch_size=12
--n_layer=4 --n_head=4 --n_embd=128 --max_iters=N --lr_decay_iters=N --dropout=0.0); its data
is prepared by its own data/shakespeare_char/prepare.py from a copy of --text (so that it does
not download). aiayn runs `aiayn train --config lm_shakespeare_char_cpu` in fp32 by default
(nanoGPT on CPU trains in float32; `--aiayn-dtype auto` lets aiayn pick bf16 autocast).

Prints one JSON object: each side's final validation loss (nats per char; nanoGPT's is its
last printed estimate from eval_iters=20 random batches, plus the full validation split scored
with its saved ckpt.pt; aiayn's is the full validation stream from metrics.jsonl), iterations
per second (median over iterations after the 10th), their ratio, the CPU and torch. The lab
log is docs/lab/lm.md. `--aiayn-only` runs aiayn's side alone (the test's quick check).

Equal time: `--minutes M` runs aiayn's budget recipe instead, `aiayn train --config lm
--set train.max_minutes=M` in its default dtype (auto), and nanoGPT's CPU example for
round(M * 60 * --nanogpt-it-per-s) iterations (max_iters = lr_decay_iters; --eval_interval
that many / 6 unless given). `--pair-gpt-block` runs two aiayn `--config lm` sides instead of
nanoGPT: the paper's block and the GPT block (pre-LN, learned positions, GELU, unscaled
embeddings, N(0, 0.02) init). In --minutes mode the last 10% of --text (the characters
nanoGPT's prepare.py puts in val.bin) is written to OUT/valid.txt and each aiayn side's best
model (OUT_DIR) and averaged model (OUT_DIR/averaged) are scored on it with `aiayn evaluate
--text --json` (up to model.max_len tokens of context).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_TEXT = ROOT.parent / "shared" / "data" / "tinyshakespeare" / "input.txt"
BATCH, BLOCK = 12, 64  # both sides' batch_size and block_size

STEP_RE = re.compile(r"^step (\d+): train loss ([\d.]+), val loss ([\d.]+)")
ITER_RE = re.compile(r"^iter (\d+): loss ([\d.]+), time ([\d.]+)ms")


def cpu_info() -> dict:
    model, flags = platform.processor() or "", set()
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=False).stdout
        for line in out.splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "Model name":
                model = value.strip()
            elif key.strip() == "Flags":
                flags = set(value.split())
    except OSError:
        pass
    return {
        "model": model,
        "avx512f": "avx512f" in flags,
        "avx512_bf16": "avx512_bf16" in flags,
        "amx_bf16": "amx_bf16" in flags,
        "cpus_usable": len(os.sched_getaffinity(0)),
    }


def thread_env(threads: int) -> dict:
    env = dict(os.environ)
    for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        env[name] = str(threads)
    env["WANDB_MODE"] = "disabled"  # nanoGPT's wandb_log is False already
    return env


def pinner(cpus: set[int] | None):
    if not cpus:
        return None
    return lambda: os.sched_setaffinity(0, cpus)


def prepare_nanogpt(nanogpt: Path, text: Path) -> None:
    data = nanogpt / "data" / "shakespeare_char"
    if (data / "train.bin").exists() and (data / "val.bin").exists():
        return
    if not (data / "input.txt").exists():  # prepare.py downloads only when this is absent
        shutil.copyfile(text, data / "input.txt")
    subprocess.run([sys.executable, "prepare.py"], cwd=data, check=True)


def nanogpt_cmd(steps: int, out_dir: Path, eval_interval: int | None = None) -> list[str]:
    extra = [f"--eval_interval={eval_interval}"] if eval_interval else []
    return [
        sys.executable, "train.py", "config/train_shakespeare_char.py", "--device=cpu",
        "--compile=False", "--eval_iters=20", "--log_interval=1", f"--block_size={BLOCK}",
        f"--batch_size={BATCH}", "--n_layer=4", "--n_head=4", "--n_embd=128",
        f"--max_iters={steps}", f"--lr_decay_iters={steps}", "--dropout=0.0",
        f"--out_dir={out_dir}", *extra,
    ]  # fmt: skip


GPT_BLOCK = ["model.norm_first=true", "model.positional=learned", "model.activation=gelu",
             "model.scale_embeddings=false", "model.init=normal"]  # fmt: skip


def aiayn_minutes_cmd(minutes: float, out_dir: Path, text: Path, threads: int,
                      extra: list[str]) -> list[str]:  # fmt: skip
    """aiayn's budget recipe as a user runs it: `--config lm`, its default dtype."""
    sets = [f"train.text={text}", f"train.max_minutes={minutes:g}", f"train.threads={threads}",
            f"train.out_dir={out_dir}", *extra]  # fmt: skip
    cmd = [sys.executable, "-m", "aiayn", "train", "--config", "lm"]
    for kv in sets:
        cmd += ["--set", kv]
    return [*cmd, "--no-progress", "--device", "cpu"]


def write_valid_text(text: Path, out: Path) -> Path:
    """The last 10% of the text: nanoGPT's prepare.py's val split (data[int(n * 0.9):])."""
    data = text.read_text(encoding="utf-8")
    path = out / "valid.txt"
    path.write_text(data[int(len(data) * 0.9) :], encoding="utf-8")
    return path


def aiayn_score(model: Path, valid: Path, threads: int) -> dict | None:
    if not model.is_dir():
        return None
    cmd = [sys.executable, "-m", "aiayn", "evaluate", "--model", str(model), "--text",
           str(valid), "--json", "--threads", str(threads), "--device", "cpu"]  # fmt: skip
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, check=False)
    if done.returncode:
        return {"error": done.stderr.strip()[-2000:]}
    return json.loads(done.stdout)


def aiayn_cmd(steps: int, out_dir: Path, text: Path, threads: int, dtype: str,
              valid_every: int) -> list[str]:  # fmt: skip
    sets = {
        "train.text": str(text),
        "train.out_dir": str(out_dir),
        "train.max_steps": str(steps),
        "train.threads": str(threads),
        "train.dtype": dtype,
        "train.valid_every": str(valid_every),
    }
    cmd = [sys.executable, "-m", "aiayn", "train", "--config", "lm_shakespeare_char_cpu"]
    for key, value in sets.items():
        cmd += ["--set", f"{key}={value}"]
    return [*cmd, "--no-progress", "--device", "cpu"]


def parse_nanogpt(log: str) -> dict:
    evals, iters = [], []
    for line in log.splitlines():
        if m := STEP_RE.match(line):
            evals.append((int(m[1]), float(m[2]), float(m[3])))
        elif m := ITER_RE.match(line):
            iters.append((int(m[1]), float(m[2]), float(m[3])))
    ms = [t for i, _, t in iters if i > 10] or [t for _, _, t in iters]
    median_ms = statistics.median(ms) if ms else math.nan
    last = evals[-1] if evals else (None, math.nan, math.nan)
    return {
        "final_eval_step": last[0],
        "train_loss_estimate": last[1],
        "valid_loss_estimate": last[2],  # eval_iters=20 random batches of 12 x 64
        "evals": [{"step": s, "train": t, "valid": v} for s, t, v in evals],
        "iterations": len(iters),
        "median_iter_ms": median_ms,
        "it_per_s": 1000 / median_ms if ms else math.nan,
        "last_train_loss": iters[-1][1] if iters else math.nan,
    }


def parse_aiayn(run_dir: Path, tokens_per_step: int = BATCH * BLOCK) -> dict:
    records = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x]
    train = [r for r in records if "loss" in r and "valid_loss" not in r]
    valid = [r for r in records if "valid_loss" in r]
    rates = [r["tokens_per_s"] for r in train if r["step"] > 10] or [
        r["tokens_per_s"] for r in train
    ]
    tok_s = statistics.median(rates) if rates else math.nan
    last = valid[-1] if valid else {}
    return {
        "final_valid_step": last.get("step"),
        "valid_loss": last.get("valid_loss", math.nan),  # the whole validation stream
        "best_valid_loss": last.get("best", math.nan),
        "valid": [{"step": r["step"], "valid": r["valid_loss"]} for r in valid],
        "last_train_loss": train[-1]["loss"] if train else math.nan,
        "median_tokens_per_s": tok_s,
        "it_per_s": tok_s / tokens_per_step,
        "last_step": max((r["step"] for r in records if "step" in r), default=None),
        "elapsed_s": records[-1].get("elapsed_s", math.nan) if records else math.nan,
    }


def nanogpt_full_valid(nanogpt: Path, out_dir: Path, threads: int) -> dict | None:
    """nanoGPT's saved ckpt.pt (its best by the 20-batch estimate) on the whole validation split,
    in non-overlapping windows of block_size: each window's targets scored with 1..64 characters
    of context, as its random windows are and as aiayn's validation stream is."""
    ckpt_path = out_dir / "ckpt.pt"
    if not ckpt_path.exists():
        return None
    import numpy as np
    import torch

    torch.set_num_threads(threads)
    sys.path.insert(0, str(nanogpt))
    try:
        from model import GPT, GPTConfig  # nanoGPT's model.py
    finally:
        sys.path.pop(0)
    ckpt = torch.load(ckpt_path, map_location="cpu", weights_only=False)
    with contextlib.redirect_stdout(sys.stderr):  # its "number of parameters" line
        model = GPT(GPTConfig(**ckpt["model_args"]))
    state = {k.removeprefix("_orig_mod."): v for k, v in ckpt["model"].items()}
    model.load_state_dict(state)
    model.eval()
    data = np.fromfile(nanogpt / "data/shakespeare_char/val.bin", dtype=np.uint16).astype(np.int64)
    data = torch.from_numpy(data)
    total, count = 0.0, 0
    with torch.no_grad():
        starts = list(range(0, len(data) - 1, BLOCK))
        for i in range(0, len(starts), 64):
            xs, ys = [], []
            for s in starts[i : i + 64]:
                n = min(BLOCK, len(data) - 1 - s)
                if n < BLOCK:  # the tail: scored alone
                    x, y = data[s : s + n][None], data[s + 1 : s + 1 + n][None]
                    logits, _ = model(x, y)
                    total += torch.nn.functional.cross_entropy(
                        logits.view(-1, logits.size(-1)), y.view(-1), reduction="sum"
                    ).item()
                    count += n
                    continue
                xs.append(data[s : s + BLOCK])
                ys.append(data[s + 1 : s + 1 + BLOCK])
            if xs:
                x, y = torch.stack(xs), torch.stack(ys)
                logits, _ = model(x, y)
                total += torch.nn.functional.cross_entropy(
                    logits.view(-1, logits.size(-1)), y.view(-1), reduction="sum"
                ).item()
                count += y.numel()
    return {"ckpt_iter": ckpt["iter_num"], "valid_loss": total / count, "tokens": count}


def commit_of(nanogpt: Path) -> str | None:
    marker = nanogpt / "COMMIT"  # written beside an exported tree (git archive has no .git)
    if marker.exists():
        return marker.read_text().strip()
    out = subprocess.run(["git", "-C", str(nanogpt), "rev-parse", "HEAD"], capture_output=True,
                         text=True, check=False)  # fmt: skip
    return out.stdout.strip() or None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nanogpt", type=Path, default=ROOT / ".bench_peers" / "nanogpt",
                    help="nanoGPT's checkout (unmodified)")  # fmt: skip
    ap.add_argument("--text", type=Path, default=DEFAULT_TEXT, help="tiny Shakespeare input.txt")
    ap.add_argument("--out", type=Path, required=True, help="a new folder for both runs")
    ap.add_argument("--steps", type=int, default=2000, help="training iterations, each side")
    ap.add_argument("--threads", type=int, default=1, help="torch threads, each side")
    ap.add_argument("--aiayn-dtype", default="fp32", help="aiayn's train.dtype (fp32 | auto)")
    ap.add_argument("--valid-every", type=int, default=250, help="aiayn's train.valid_every")
    ap.add_argument("--no-pin", action="store_true", help="don't pin each side to its own CPUs")
    ap.add_argument("--aiayn-only", action="store_true", help="run aiayn's side alone")
    ap.add_argument("--minutes", type=float, default=None,
                    help="equal time: aiayn --config lm for M minutes, nanoGPT for the iterations "
                    "it reaches in M minutes at --nanogpt-it-per-s")  # fmt: skip
    ap.add_argument(
        "--nanogpt-it-per-s",
        type=float,
        default=11.0,
        help="nanoGPT's speed on one core, for --minutes (docs/lab/lm.md: ~11)",
    )
    ap.add_argument(
        "--nanogpt-eval-interval",
        type=int,
        default=None,
        help="nanoGPT's --eval_interval (default with --minutes: its iterations / 6)",
    )
    ap.add_argument(
        "--aiayn-set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="more --set for aiayn's side(s) in --minutes mode (e.g. train.seed=2)",
    )
    ap.add_argument(
        "--pair-gpt-block",
        action="store_true",
        help="with --minutes: two aiayn sides, the paper's block and the GPT block",
    )
    ap.add_argument("--report-only", action="store_true",
                    help="train nothing: report the runs already in --out")  # fmt: skip
    args = ap.parse_args()

    text, out = args.text.resolve(), args.out.resolve()
    if not text.exists():
        sys.exit(f"no {text}: the tiny Shakespeare text is needed")
    out.mkdir(parents=True, exist_ok=True)
    env = thread_env(args.threads)
    cpus = sorted(os.sched_getaffinity(0))
    pins: list[set[int] | None] = [None, None]
    if not args.no_pin and len(cpus) >= 2 * args.threads:
        pins = [set(cpus[: args.threads]), set(cpus[args.threads : 2 * args.threads])]

    if args.pair_gpt_block and args.minutes is None:
        sys.exit("--pair-gpt-block needs --minutes")
    if args.minutes is not None:
        args.steps = round(args.minutes * 60 * args.nanogpt_it_per_s)
        if args.nanogpt_eval_interval is None:
            args.nanogpt_eval_interval = max(1, args.steps // 6)
    nanogpt = args.nanogpt.resolve()
    if not args.aiayn_only and not args.pair_gpt_block and not args.report_only:
        prepare_nanogpt(nanogpt, text)
    started = time.time()
    wall = {}
    if not args.report_only:
        wall = run_both(args, out, text, nanogpt, env, pins, started)
    report_runs(args, out, nanogpt, pins, wall)


def run_both(args, out, text, nanogpt, env, pins, started) -> dict:
    procs = {}
    nano_dir, aiayn_dir = out / "nanogpt", out / "aiayn"
    a_log = open(out / "aiayn.log", "w")  # noqa: SIM115
    if args.minutes is not None:
        a_cmd = aiayn_minutes_cmd(args.minutes, aiayn_dir, text, args.threads, args.aiayn_set)
    else:
        a_cmd = aiayn_cmd(args.steps, aiayn_dir, text, args.threads, args.aiayn_dtype,
                          args.valid_every)  # fmt: skip
    procs["aiayn"] = subprocess.Popen(
        a_cmd, cwd=ROOT, env=env, stdout=a_log, stderr=subprocess.STDOUT, preexec_fn=pinner(pins[1])
    )
    if args.pair_gpt_block:
        g_log = open(out / "aiayn_gpt.log", "w")  # noqa: SIM115
        g_cmd = aiayn_minutes_cmd(args.minutes, out / "aiayn_gpt", text, args.threads,
                                  [*GPT_BLOCK, *args.aiayn_set])  # fmt: skip
        procs["aiayn_gpt"] = subprocess.Popen(
            g_cmd,
            cwd=ROOT,
            env=env,
            stdout=g_log,
            stderr=subprocess.STDOUT,
            preexec_fn=pinner(pins[0]),
        )
    elif not args.aiayn_only:
        n_log = open(out / "nanogpt.log", "w")  # noqa: SIM115
        n_cmd = nanogpt_cmd(args.steps, nano_dir, args.nanogpt_eval_interval)
        procs["nanogpt"] = subprocess.Popen(n_cmd, cwd=nanogpt,
                                            env=env, stdout=n_log, stderr=subprocess.STDOUT,
                                            preexec_fn=pinner(pins[0]))  # fmt: skip
    wall = {}
    for name, proc in procs.items():
        _, status, usage = os.wait4(proc.pid, 0)  # its CPU time: the machine is shared
        proc.returncode = rc = os.waitstatus_to_exitcode(status)
        wall[name] = round(time.time() - started, 1)
        wall[f"{name}_cpu_s"] = round(usage.ru_utime + usage.ru_stime, 1)
        if rc:
            sys.exit(f"{name} failed ({rc}); see {out / (name + '.log')}")
    return wall


def report_runs(args, out, nanogpt, pins, wall) -> None:
    import torch

    report: dict = {
        "minutes": args.minutes,
        "nanogpt_it_per_s_assumed": args.nanogpt_it_per_s if args.minutes is not None else None,
        "nanogpt_eval_interval": args.nanogpt_eval_interval,
        "aiayn_set": args.aiayn_set,
        "steps": args.steps,
        "threads_each": args.threads,
        "pinned_cpus": [sorted(p) if p else None for p in pins],
        "concurrent": not args.aiayn_only,
        "cpu": cpu_info(),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "aiayn_dtype": args.aiayn_dtype if args.minutes is None else "auto (config lm)",
        "wall_s": wall,
        "load_after": os.getloadavg(),
    }
    nano_dir, aiayn_dir = out / "nanogpt", out / "aiayn"
    per_step = BATCH * BLOCK if args.minutes is None else 16 * 128  # lm.toml: 16 x 128
    report["aiayn"] = parse_aiayn(aiayn_dir, per_step)
    if args.minutes is not None:
        valid = write_valid_text(args.text.resolve(), out)
        sides = {"aiayn": aiayn_dir}
        if args.pair_gpt_block:
            report["aiayn_gpt"] = parse_aiayn(out / "aiayn_gpt", per_step)
            sides["aiayn_gpt"] = out / "aiayn_gpt"
        for name, run_dir in sides.items():
            report[name]["scored_best"] = aiayn_score(run_dir, valid, args.threads)
            report[name]["scored_averaged"] = aiayn_score(run_dir / "averaged", valid, args.threads)
            log = (out / f"{name}.log").read_text(errors="replace")
            report[name]["dtype_lines"] = [x for x in log.splitlines() if "autocast" in x
                                           or "dtype" in x.lower()][:3]  # fmt: skip
    if not args.aiayn_only and not args.pair_gpt_block:
        nano = parse_nanogpt((out / "nanogpt.log").read_text())
        nano["commit"] = commit_of(nanogpt)
        nano["full_valid"] = nanogpt_full_valid(nanogpt, nano_dir, args.threads)
        report["nanogpt"] = nano
        a, n = report["aiayn"], nano
        report["it_per_s_ratio_aiayn_over_nanogpt"] = a["it_per_s"] / n["it_per_s"]
        full = n["full_valid"]
        if args.minutes is not None:
            print(json.dumps(report))
            return
        report["goals"] = {
            "valid_le_nanogpt_estimate": a["valid_loss"] <= n["valid_loss_estimate"],
            "valid_le_nanogpt_full": a["valid_loss"] <= full["valid_loss"] if full else None,
            "valid_le_1.88": a["valid_loss"] <= 1.88,
            "it_per_s_ge_1.2x": report["it_per_s_ratio_aiayn_over_nanogpt"] >= 1.2,
        }
    print(json.dumps(report))


if __name__ == "__main__":
    main()
