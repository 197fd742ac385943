"""What each of today's block switches buys at equal CPU time: every switch trained side by
side with the paper's block, one process per core, one torch thread each, started together.

    python bench/block_ablation.py --out runs/block_ablation --lm-minutes 3 --mt-minutes 4

Each arm is a pair run at the same time: the config as it is (the paper's block) pinned to the
first CPU, the same config with the arm's `--set model.<field>=<value>` pinned to the second,
both with the same `train.max_minutes`, seed, data order and allocator. The language model is
`aiayn train --config lm` on tiny Shakespeare (bench/lm_vs_nanogpt.py's budget recipe; its
averaged model scored with `aiayn evaluate --text --json` on the last 10% of the text, nats per
character); the translator is `aiayn train --config multi30k_tiny_budget` on Multi30k en -> de
with train.threads = 1, the per-step α sweep and validation BLEU off (they would spend the
budget's time on decoding) and `--mt-set` for anything else both sides share; its averaged
model is scored greedily with `aiayn evaluate --src val.en --ref val.de --beam 1 --json`
(sacreBLEU), its validation loss is the last one training logged (the whole validation set).

Equal time, not equal steps: each side's steps and steps/s are recorded, with the load average
sampled during the pair (other processes share the machine; pairing every switch with its own
simultaneous paper-block run keeps each comparison fair, and the repeated paper runs give the
noise floor). Each pair's JSON is written to OUT/pairs/ as it finishes, the whole report to
OUT/report.json and stdout; `--report-only` rebuilds it from OUT/pairs/, `--markdown` also
prints the tables. The lab log is docs/lab/blocks.md, the summary docs/blocks.md.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import time
import tomllib
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from lm_vs_nanogpt import cpu_info, pinner, thread_env, write_valid_text

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT.parent / "shared" / "data"
TEXT = DATA / "tinyshakespeare" / "input.txt"
M30K = DATA / "multi30k" / "raw"
CONFIGS = {"lm": "lm", "mt": "multi30k_tiny_budget"}
# the translator's run without decoding inside the budget (validation BLEU, the α sweep)
MT_QUIET = ["train.choose_alpha=false", "train.best_metric=loss", "train.bleu_samples=0"]


def config_dims(task: str) -> tuple[int, int]:
    """(n_heads, max_len) of the task's config: the GQA and window arms are sized from them."""
    with open(ROOT / "configs" / f"{CONFIGS[task]}.toml", "rb") as f:
        model = tomllib.load(f)["model"]
    return int(model["n_heads"]), int(model["max_len"])


def arms(task: str) -> dict[str, list[str]]:
    """Each arm's --set options (the paper's side has none). kv_heads = n_heads / 4 (1 with
    4 heads: multi-query); the LLaMA block keeps GQA real with n_heads / 2 when n_heads / 4 is 1."""
    heads, _ = config_dims(task)
    kv = max(1, heads // 4)
    llama_kv = kv if kv > 1 else max(1, heads // 2)
    gated = ["model.ffn_match_params=true"]
    llama = ["model.positional=rope", "model.norm=rmsnorm", "model.activation=swiglu", *gated,
             f"model.kv_heads={llama_kv}", "model.norm_first=true", "model.bias=false"]  # fmt: skip
    if task == "lm":
        window = config_dims(task)[1] // 4  # a quarter of the training block
        return {
            "rope": ["model.positional=rope"],
            "alibi": ["model.positional=alibi"],
            "nopos": ["model.positional=none"],
            "rmsnorm": ["model.norm=rmsnorm"],
            "swiglu": ["model.activation=swiglu", *gated],
            "geglu": ["model.activation=geglu", *gated],
            "relu2": ["model.activation=relu2"],
            "kv_heads": [f"model.kv_heads={kv}"],
            "window": [f"model.attn_window={window}"],
            "qk_norm": ["model.qk_norm=true"],
            "llama": llama,
            "paper": [],  # the paper's block on both cores: the noise floor of a pair's delta
        }
    return {
        "rope": ["model.positional=rope"],
        "alibi": ["model.positional=alibi"],
        "rmsnorm": ["model.norm=rmsnorm"],
        "swiglu": ["model.activation=swiglu", *gated],
        "kv_heads": [f"model.kv_heads={kv}"],
        "window": ["model.attn_window=8"],  # Multi30k sentences: ~12-15 words, ~15-20 pieces
        "qk_norm": ["model.qk_norm=true"],
        "llama": llama,
        "paper": [],
    }


def train_cmd(task: str, minutes: float, out_dir: Path, sets: list[str]) -> list[str]:
    base = [f"train.max_minutes={minutes:g}", "train.threads=1", f"train.out_dir={out_dir}"]
    if task == "lm":
        base.append(f"train.text={TEXT}")
    else:
        base += [f"train.src={M30K / 'train.en'}", f"train.tgt={M30K / 'train.de'}",
                 f"train.valid_src={M30K / 'val.en'}", f"train.valid_tgt={M30K / 'val.de'}",
                 *MT_QUIET]  # fmt: skip
    cmd = [sys.executable, "-m", "aiayn", "train", "--config", CONFIGS[task]]
    for kv in [*base, *sets]:
        cmd += ["--set", kv]
    return [*cmd, "--no-progress", "--device", "cpu"]


def eval_cmd(task: str, model: Path, valid_text: Path | None) -> list[str]:
    cmd = [sys.executable, "-m", "aiayn", "evaluate", "--model", str(model), "--json",
           "--threads", "1", "--device", "cpu"]  # fmt: skip
    if task == "lm":
        return [*cmd, "--text", str(valid_text)]
    return [*cmd, "--src", str(M30K / "val.en"), "--ref", str(M30K / "val.de"), "--beam", "1"]


def read_metrics(run_dir: Path) -> dict:
    """Steps, training seconds and the last validation loss from a run's metrics.jsonl."""
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return {"error": f"no {path}"}
    records = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
    train = [r for r in records if "loss" in r and "valid_loss" not in r]
    valid = [r for r in records if "valid_loss" in r]
    steps = train[-1]["step"] if train else 0
    seconds = train[-1]["elapsed_s"] if train else float("nan")
    return {
        "steps": steps,
        "train_s": seconds,  # from the first step's start to the last step's end
        "steps_per_s": steps / seconds if train and seconds > 0 else float("nan"),
        "last_train_loss": train[-1]["loss"] if train else None,
        "valid_loss": valid[-1]["valid_loss"] if valid else None,  # the last step's model
        "valid_step": valid[-1]["step"] if valid else None,
    }


def load_now() -> float:
    return os.getloadavg()[0]


def run_together(cmds: dict[str, list[str]], logs: dict[str, Path],
                 pins: dict[str, set[int] | None]) -> dict:  # fmt: skip
    """Start every command at once (each pinned), sample the 1-minute load average every 5 s
    until all have exited; each one's exit code, wall and CPU seconds (its rusage)."""
    env = thread_env(1)
    started = time.time()
    procs, handles = {}, {}
    for name, cmd in cmds.items():
        handles[name] = open(logs[name], "w")  # noqa: SIM115
        procs[name] = subprocess.Popen(
            cmd, cwd=ROOT, env=env, stdout=handles[name], stderr=subprocess.STDOUT,
            preexec_fn=pinner(pins[name]),
        )  # fmt: skip
    done: dict[str, dict] = {}
    loads = [load_now()]
    while len(done) < len(procs):
        time.sleep(1)
        if int(time.time() - started) % 5 == 0:
            loads.append(load_now())
        for name, proc in procs.items():
            if name in done:
                continue
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                proc.returncode = os.waitstatus_to_exitcode(status)
                done[name] = {"rc": proc.returncode, "wall_s": round(time.time() - started, 1),
                              "cpu_s": round(usage.ru_utime + usage.ru_stime, 1)}  # fmt: skip
                handles[name].close()
    return {"sides": done, "load": loads}


def code_state() -> dict:
    """The commit the runs start from, and the files under src/ that differ from it: the
    working tree is what `python -m aiayn` runs, so uncommitted edits count too."""

    def git(*args: str) -> str:
        done = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=False)
        return done.stdout.strip()

    dirty = [line[3:] for line in git("status", "--porcelain", "--", "src").splitlines()]
    return {"commit": git("rev-parse", "HEAD"), "src_changed": dirty}


def last_lines(path: Path, n: int = 3) -> list[str]:
    lines = path.read_text(errors="replace").splitlines() if path.exists() else []
    return lines[-n:]


def run_pair(task: str, arm: str, sets: list[str], shared: list[str], minutes: float, seed: int,
             out: Path, pins: list[set[int] | None], valid_text: Path | None) -> dict:  # fmt: skip
    """One arm: the paper's block (first CPU) and the switched block (second), then both scored
    at once. Returns the pair's record; a side that fails is recorded with its log's tail."""
    tag = f"{task}-{arm}-s{seed}"
    pair_dir = out / tag
    if pair_dir.exists():  # a run directory left there would be resumed, not trained afresh
        pair_dir.rename(out / f"{tag}.before-{int(pair_dir.stat().st_mtime)}")
    pair_dir.mkdir(parents=True)
    seed_set = [f"train.seed={seed}", *shared]
    sides = {"paper": seed_set, "switched": [*seed_set, *sets]}
    side_pins = {"paper": pins[0], "switched": pins[1]}
    cmds = {s: train_cmd(task, minutes, pair_dir / s, extra) for s, extra in sides.items()}
    logs = {s: pair_dir / f"{s}.log" for s in sides}
    stamp = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    code = code_state()
    trained = run_together(cmds, logs, side_pins)
    record: dict = {"task": task, "arm": arm, "sets": sets, "shared_sets": shared, "seed": seed,
                    "minutes": minutes,
                    "started_utc": stamp, "code": code, "load_during": trained["load"],
                    "commands": {s: " ".join(c) for s, c in cmds.items()}}  # fmt: skip
    models, eval_cmds = {}, {}
    for side in sides:
        run_dir = pair_dir / side
        side_rec = {**trained["sides"][side], **read_metrics(run_dir)}
        if side_rec["rc"]:
            side_rec["log_tail"] = last_lines(logs[side], 8)
        record[side] = side_rec
        averaged = run_dir / "averaged"
        models[side] = averaged if averaged.is_dir() else run_dir
        if (models[side] / "config.json").exists():
            eval_cmds[side] = eval_cmd(task, models[side], valid_text)
    eval_logs = {s: pair_dir / f"{s}.eval.json" for s in eval_cmds}
    scored = run_together(eval_cmds, eval_logs, {s: side_pins[s] for s in eval_cmds})
    for side in eval_cmds:
        record[side]["scored_model"] = str(models[side].relative_to(pair_dir))
        record[side]["eval_wall_s"] = scored["sides"][side]["wall_s"]
        try:
            record[side]["scored"] = json.loads(eval_logs[side].read_text().splitlines()[-1])
        except (ValueError, IndexError):
            record[side]["scored"] = {"error": last_lines(eval_logs[side], 5)}
    record["load_after"] = list(os.getloadavg())
    return record


def score_of(task: str, side: dict) -> dict:
    """The figures a table shows: the scored loss (LM) or validation loss and BLEU (MT)."""
    scored = side.get("scored") or {}
    figures = {"steps": side.get("steps"), "steps_per_s": side.get("steps_per_s"),
               "cpu_s": side.get("cpu_s")}  # fmt: skip
    if task == "lm":
        figures["loss"] = scored.get("nats_per_token")  # = nats per character (char tokenizer)
    else:
        figures["loss"] = side.get("valid_loss")
        bleu = scored.get("bleu")
        figures["bleu"] = bleu.get("score") if isinstance(bleu, dict) else None
        figures["length_ratio"] = scored.get("length_ratio")
    return figures


def summarize(pairs: list[dict]) -> list[dict]:
    rows = []
    for p in pairs:
        a, b = score_of(p["task"], p.get("paper", {})), score_of(p["task"], p.get("switched", {}))
        row = {"task": p["task"], "arm": p["arm"], "seed": p["seed"], "paper": a, "switched": b,
               "load_mean": round(statistics.fmean(p["load_during"]), 2)}  # fmt: skip
        if isinstance(a["loss"], float) and isinstance(b["loss"], float):
            row["loss_delta"] = b["loss"] - a["loss"]
        if a.get("bleu") is not None and b.get("bleu") is not None:
            row["bleu_delta"] = b["bleu"] - a["bleu"]
        if a["steps_per_s"] and b["steps_per_s"]:
            row["steps_per_s_ratio"] = b["steps_per_s"] / a["steps_per_s"]
        rows.append(row)
    return rows


def noise_floor(rows: list[dict], task: str) -> dict:
    """The paper's block repeated (one run per pair): the spread its score has from load and
    CPU share alone, the scale a switch's delta must clear."""
    losses = [r["paper"]["loss"] for r in rows if r["task"] == task and r["paper"]["loss"]]
    if len(losses) < 2:
        return {}
    out = {"runs": len(losses), "min": min(losses), "max": max(losses),
           "stdev": statistics.stdev(losses)}  # fmt: skip
    bleus = [r["paper"]["bleu"] for r in rows if r["task"] == task and r["paper"].get("bleu")]
    if len(bleus) >= 2:
        out["bleu_min"], out["bleu_max"] = min(bleus), max(bleus)
    return out


def markdown(rows: list[dict]) -> str:
    out = []
    for task in ("lm", "mt"):
        mine = [r for r in rows if r["task"] == task]
        if not mine:
            continue
        bleu = task == "mt"
        head = "| arm (seed) | paper loss | switched loss | delta | steps paper / switched"
        head += " | steps/s ratio |"
        head += " BLEU paper / switched | load |" if bleu else " load |"
        out += [head, "|---" * (8 if bleu else 7) + "|"]
        for r in mine:
            a, b = r["paper"], r["switched"]

            def f(x: float | None, d: int = 4) -> str:
                return "crashed" if x is None else f"{x:.{d}f}"

            line = (f"| {r['arm']} ({r['seed']}) | {f(a['loss'])} | {f(b['loss'])} | "
                    f"{r.get('loss_delta', float('nan')):+.4f} | {a['steps']} / {b['steps']} | "
                    f"{r.get('steps_per_s_ratio', float('nan')):.2f} |")  # fmt: skip
            if bleu:
                line += f" {f(a.get('bleu'), 2)} / {f(b.get('bleu'), 2)} |"
            out.append(line + f" {r['load_mean']} |")
        out.append("")
    return "\n".join(out)


def report(out: Path, args: argparse.Namespace) -> dict:
    import torch

    pairs = [json.loads(p.read_text()) for p in sorted((out / "pairs").glob("*.json"))]
    pairs.sort(key=lambda p: p["started_utc"])
    rows = summarize(pairs)
    result = {
        "date_utc": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "cpu": cpu_info(),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "malloc": os.environ.get("LD_PRELOAD", "") or "as aiayn sets it (same for both sides)",
        "command": " ".join(sys.argv),
        "summary": rows,
        "noise_floor": {t: noise_floor(rows, t) for t in ("lm", "mt")},
        "pairs": pairs,
    }
    return result


def write_json(path: Path, obj: object) -> None:
    from aiayn.atomic import atomic_write_text

    atomic_write_text(path, json.dumps(obj, indent=1))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True, help="a folder for every pair's runs")
    ap.add_argument("--tasks", default="lm,mt", help="lm, mt or both (default lm,mt)")
    ap.add_argument("--arms", default="", help="arm names, in the order to run (default: all)")
    ap.add_argument("--lm-minutes", type=float, default=3.0, help="train.max_minutes, LM")
    ap.add_argument("--mt-minutes", type=float, default=4.0, help="train.max_minutes, MT")
    ap.add_argument("--seed", type=int, default=1, help="train.seed of both sides")
    ap.add_argument("--mt-set", action="append", default=[], metavar="KEY=VALUE",
                    help="more --set for both translator sides")  # fmt: skip
    ap.add_argument("--report-only", action="store_true", help="train nothing: report OUT/pairs")
    ap.add_argument("--markdown", action="store_true", help="also print the tables (stderr)")
    args = ap.parse_args()

    out = args.out.resolve()
    (out / "pairs").mkdir(parents=True, exist_ok=True)
    cpus = sorted(os.sched_getaffinity(0))
    pins: list[set[int] | None] = [{cpus[0]}, {cpus[1]}] if len(cpus) >= 2 else [None, None]
    if not args.report_only:
        tasks = [t for t in args.tasks.split(",") if t]
        order = [a for a in args.arms.split(",") if a]  # run in this order
        valid_text = None
        for task in tasks:
            if task == "lm" and not TEXT.exists():
                print(f"skipping lm: no {TEXT} (tiny Shakespeare)", file=sys.stderr)
                continue
            if task == "mt" and not (M30K / "train.en").exists():
                print(f"skipping mt: no {M30K} (Multi30k raw)", file=sys.stderr)
                continue
            if task == "lm":
                valid_text = write_valid_text(TEXT, out)
            minutes = args.lm_minutes if task == "lm" else args.mt_minutes
            table = arms(task)
            for arm in [a for a in order if a in table] if order else list(table):
                extra = args.mt_set if task == "mt" else []
                rec = run_pair(task, arm, table[arm], extra, minutes, args.seed, out, pins,
                               valid_text)  # fmt: skip
                write_json(out / "pairs" / f"{task}-{arm}-s{args.seed}.json", rec)
                print(json.dumps(summarize([rec])[0]), file=sys.stderr, flush=True)
    result = report(out, args)
    write_json(out / "report.json", result)
    if args.markdown:
        print(markdown(result["summary"]), file=sys.stderr)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
