"""Does masked-LM pre-training pay for aiayn's classifier on SST-2, at equal CPU time?

    python bench/classify_pretraining.py --out /tmp/clsbench/pre --pretrain-minutes 5 \
        --finetune-minutes 5

Arms, each a child process on one thread (OMP_NUM_THREADS=1), `--parallel` (2) at a time,
each pinned to its own CPU where there are enough:

    mlm              `aiayn train --config mlm` for P minutes on unlabelled text (below)
    pre_N            `aiayn train --config classify --set train.init_from=<mlm>` for F minutes
                     on N labelled sentences
    scratch_total_N  the same classifier from scratch for P + F minutes (pre-training's time
                     given to it instead)
    scratch_f_N      from scratch for F minutes (pre-training's time not counted)

N is every `--labels` size: the full 6,920 training sentences and a stratified, seeded sample
(500 by default). Every classifier validates on the dev set (train.valid_data), keeps its best
dev accuracy's model, trains in fp32 (train.dtype=fp32) and is scored on stsa.binary.test:
accuracy and macro-F1 with bootstrap 95% intervals. Each row says its wall and CPU seconds
(getrusage of each child; the "pre-train + fine-tune" rows add the pre-training's, which one
pre-training run serves for every N), and the load average before and after.

The unlabelled text (`--corpus`, written to OUT/unlabelled.txt, shuffled by --seed; the mlm
run holds out its last 10% of lines to validate on): `sst2` = SST-2's TRAINING sentences with
their labels removed (never dev or test), `multi30k` = the English side of Multi30k's training
captions (tok/train.lc.norm.tok.en: lowercased, tokenized as SST-2 is), `shakespeare` = tiny
Shakespeare's lines, lowercased (public domain). `--mlm-set` and `--ft-set` add overrides to
the mlm and the fine-tuning runs (train.mask_prob, train.encoder_lr, ...); `--mlm-dir` reuses
a pre-trained run instead of training one (its minutes still count as P). `--rows` picks the
arms. Prints one JSON object (also OUT/report.json); the lab log is docs/lab/classify.md.
"""

from __future__ import annotations

import os

for _name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
    os.environ.setdefault(_name, "1")

import argparse  # noqa: E402
import json  # noqa: E402
import random  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from dataclasses import dataclass, field  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from classify_baselines import (  # noqa: E402
    ROOT,
    SST2,
    TINY,
    Child,
    aiayn_curve,
    aiayn_test,
    aiayn_train_cmd,
    cpu_info,
    cpu_slots,
    limited_splits,
    load,
    need_data,
    stratified_sample,
    versions,
    write_pairs,
)

SHARED = ROOT.parent / "shared" / "data"
CORPORA = {
    "sst2": None,  # the training split's sentences, labels removed
    "multi30k": SHARED / "multi30k" / "tok" / "train.lc.norm.tok.en",
    "shakespeare": SHARED / "tinyshakespeare" / "input.txt",
}
ROWS = ("pre", "scratch_total", "scratch_f")


def unlabelled_text(names: list[str], train: Path, out: Path, seed: int, limit: int) -> dict:
    """OUT/unlabelled.txt: the chosen corpora's lines, lowercased, shuffled; and what went in."""
    from aiayn.atomic import atomic_write_text
    from aiayn.text.labelled import read_labelled

    lines: list[str] = []
    counts = {}
    for name in names:
        if name not in CORPORA:
            sys.exit(f"--corpus {name}: choose from {', '.join(CORPORA)}")
        path = CORPORA[name]
        if path is None:
            got = [text for _, text in read_labelled(train)]
        elif not path.is_file():
            sys.exit(f"--corpus {name}: no {path}")
        else:
            got = [x.strip().lower() for x in path.read_text(encoding="utf-8").splitlines()]
            got = [x for x in got if x]
        got = got[:limit] if limit else got
        counts[name] = {"lines": len(got), "source": str(path or train)}
        lines += got
    random.Random(seed).shuffle(lines)
    path = out / "unlabelled.txt"
    atomic_write_text(path, "".join(x + "\n" for x in lines))
    return {"path": str(path), "lines": len(lines), "corpora": counts}


@dataclass
class Job:
    """One arm: a child `aiayn train`, run when the jobs it needs have ended."""

    name: str
    config: str
    sets: list[str]
    needs: list[str] = field(default_factory=list)
    child: Child | None = None


def plan_jobs(args: argparse.Namespace, out: Path, paths: dict[str, Path],
              trains: dict[str, Path], text: Path | None) -> list[Job]:  # fmt: skip
    """The arms, in the order they are started (a free CPU takes the first ready one)."""
    common = ["train.dtype=fp32", "train.device=cpu", f"train.threads={args.threads}",
              f"train.seed={args.seed}", *([f"train.max_steps={args.steps}"] if args.steps
                                            else [])]  # fmt: skip
    p, f = args.pretrain_minutes, args.finetune_minutes
    jobs: list[Job] = []
    mlm_dir = args.mlm_dir.resolve() if args.mlm_dir else out / "mlm"
    if "pre" in args.rows and not args.mlm_dir:
        jobs.append(Job("mlm", "mlm", [f"train.text={text}", f"train.out_dir={mlm_dir}",
                                       f"train.max_minutes={p:g}", *common, *args.set,
                                       *args.mlm_set]))  # fmt: skip

    def classify(name: str, n: str, minutes: float, extra: list[str]) -> Job:
        sets = [f"train.data={trains[n]}", f"train.valid_data={paths['dev']}",
                f"train.out_dir={out / name}", f"train.max_minutes={minutes:g}"]  # fmt: skip
        return Job(name, "classify", [*sets, *common, *args.set, *extra])

    for n in trains:
        if "scratch_total" in args.rows:
            jobs.append(classify(f"scratch_total_{n}", n, p + f, []))
    for n in trains:
        if "pre" in args.rows:
            job = classify(f"pre_{n}", n, f, [f"train.init_from={mlm_dir}", *args.ft_set])
            job.needs = [] if args.mlm_dir else ["mlm"]
            jobs.append(job)
    for n in trains:
        if "scratch_f" in args.rows:
            jobs.append(classify(f"scratch_f_{n}", n, f, []))
    return jobs


def run_jobs(jobs: list[Job], out: Path, args: argparse.Namespace) -> None:
    """Run the jobs, `--parallel` at a time, each on its own CPU slot."""
    slots = cpu_slots(args.parallel, args.threads, not args.no_pin)
    free = list(range(args.parallel))
    running: dict[str, tuple[Job, int]] = {}
    done: set[str] = set()
    waiting = list(jobs)
    while waiting or running:
        for name, (job, slot) in list(running.items()):
            assert job.child is not None
            if job.child.poll() is not None:
                job.child.check()
                done.add(name)
                free.append(slot)
                del running[name]
                print(f"{time.strftime('%H:%M:%S')} {name} done", file=sys.stderr)
        for job in list(waiting):
            if not free:
                break
            if all(n in done for n in job.needs):
                slot = free.pop(0)
                job.child = Child(job.name, aiayn_train_cmd(job.sets, job.config),
                                  out / f"{job.name}.log", args.threads, slots[slot])  # fmt: skip
                running[job.name] = (job, slot)
                waiting.remove(job)
                print(f"{time.strftime('%H:%M:%S')} {job.name} started", file=sys.stderr)
        if waiting and not running:
            sys.exit(f"cannot start {[j.name for j in waiting]}: what they need did not run")
        time.sleep(1.0)


def mlm_curve(run_dir: Path) -> dict[str, Any]:
    records = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x]
    valid = [r for r in records if "valid_loss" in r]
    last = valid[-1] if valid else {}
    return {
        "steps": max((r.get("step", 0) for r in records), default=0),
        "train_s": round(max((r.get("elapsed_s", 0.0) for r in records), default=0.0), 1),
        "valid_loss": last.get("valid_loss"),
        "valid_masked_accuracy": last.get("valid_masked_accuracy"),
        "best_valid_loss": last.get("best"),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True, help="a folder for the runs")
    ap.add_argument("--pretrain-minutes", type=float, default=5.0, help="P: the mlm run's time")
    ap.add_argument("--finetune-minutes", type=float, default=5.0, help="F: a classifier's time")
    ap.add_argument("--labels", default="full,500",
                    help="training sizes: 'full' and/or numbers (stratified, seeded)")  # fmt: skip
    ap.add_argument("--corpus", default="sst2,multi30k,shakespeare",
                    help=f"unlabelled text for the mlm run, of: {', '.join(CORPORA)}")  # fmt: skip
    ap.add_argument("--rows", default=",".join(ROWS), help=f"the arms, of: {', '.join(ROWS)}")
    ap.add_argument("--mlm-dir", type=Path, help="a finished mlm run to fine-tune from")
    ap.add_argument("--mlm-set", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--ft-set", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="overrides for every run (model size, ...)")  # fmt: skip
    ap.add_argument("--data", type=Path, default=SST2, help="the folder of stsa.binary.*")
    ap.add_argument("--threads", type=int, default=1, help="torch threads, each arm")
    ap.add_argument("--parallel", type=int, default=2, help="arms run at once")
    ap.add_argument("--seed", type=int, default=1, help="train.seed, the sample, the shuffle")
    ap.add_argument("--no-pin", action="store_true", help="don't pin each arm to its own CPU")
    ap.add_argument("--tiny", action="store_true", help="a 32-wide model, 1,000 pieces (tests)")
    ap.add_argument("--steps", type=int, default=0, help="at most this many steps (0: no cap)")
    ap.add_argument("--limit", type=int, default=0,
                    help="N sentences of each split and of each corpus (tests)")  # fmt: skip
    args = ap.parse_args()
    args.rows = [r for r in args.rows.split(",") if r]
    if unknown := set(args.rows) - set(ROWS):
        sys.exit(f"--rows: unknown {sorted(unknown)}; choose from {', '.join(ROWS)}")
    if args.tiny:
        args.set = [*TINY, *args.set]
    need_data(args.data)
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    report = run(args, out)
    from aiayn.atomic import atomic_write_json

    atomic_write_json(out / "report.json", report)
    print(json.dumps(report))


def run(args: argparse.Namespace, out: Path) -> dict[str, Any]:
    from aiayn.text.labelled import read_labelled

    paths = limited_splits(args.data.resolve(), out, args.limit, args.seed)
    full = read_labelled(paths["train"])
    trains: dict[str, Path] = {}
    for size in [s for s in args.labels.split(",") if s]:
        if size == "full":
            trains[str(len(full))] = paths["train"]
        else:
            n = int(size)
            trains[str(n)] = write_pairs(out / f"train_{n}.txt",
                                         stratified_sample(full, n, args.seed))  # fmt: skip
    report: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
        "pretrain_minutes": args.pretrain_minutes,
        "finetune_minutes": args.finetune_minutes,
        "labels": list(trains),
        "mlm_set": args.mlm_set,
        "ft_set": args.ft_set,
        "set": args.set,
        "threads_each": args.threads,
        "parallel": args.parallel,
        "seed": args.seed,
        "cpu": cpu_info(),
        "versions": versions(),
        "load_before": load(),
    }
    text = None
    if "pre" in args.rows and not args.mlm_dir:
        corpus = [c for c in args.corpus.split(",") if c]
        report["unlabelled"] = unlabelled_text(corpus, paths["train"], out, args.seed, args.limit)
        text = Path(report["unlabelled"]["path"])
    jobs = plan_jobs(args, out, paths, trains, text)
    t0 = time.time()
    run_jobs(jobs, out, args)
    report["wall_s"] = round(time.time() - t0, 1)
    report["load_after_training"] = load()
    import torch

    torch.set_num_threads(args.threads)
    arms: dict[str, Any] = {}
    for job in jobs:
        assert job.child is not None and job.child.result is not None
        run_dir = out / job.name
        arms[job.name] = {**job.child.result}
        if job.config == "mlm":
            arms[job.name].update(mlm_curve(run_dir))
        else:
            arms[job.name].update(aiayn_curve(run_dir))
            arms[job.name]["test"] = aiayn_test(run_dir, paths["test"])
    report["arms"] = arms
    report["rows"] = rows(arms, trains, args)
    report["load_after"] = load()
    return report


def rows(arms: dict[str, Any], trains: dict[str, Path], args: argparse.Namespace) -> list[dict]:
    """The comparison: each label count's three rows, with the CPU seconds each row spent."""
    p, f = args.pretrain_minutes, args.finetune_minutes
    mlm = arms.get("mlm", {})
    out = []
    for n in trains:
        for kind, name, what in (
            ("pre", f"pre_{n}", f"pre-train {p:g} min + fine-tune {f:g} min"),
            ("scratch_total", f"scratch_total_{n}", f"scratch {p + f:g} min (P + F)"),
            ("scratch_f", f"scratch_f_{n}", f"scratch {f:g} min (F only)"),
        ):
            if name not in arms:
                continue
            arm = arms[name]
            cpu = arm["cpu_s"] + (mlm.get("cpu_s", 0.0) if kind == "pre" else 0.0)
            wall = arm["wall_s"] + (mlm.get("wall_s", 0.0) if kind == "pre" else 0.0)
            out.append({
                "labels": int(n), "row": what, "arm": name, "test": arm["test"],
                "best_dev_accuracy": arm["best_dev_accuracy"], "steps": arm["steps"],
                "cpu_s": round(cpu, 1), "wall_s": round(wall, 1),
            })  # fmt: skip
    return out


if __name__ == "__main__":
    main()
