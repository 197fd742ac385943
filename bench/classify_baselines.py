"""aiayn's text classifier on SST-2 beside two peers, at equal wall time on this CPU:

    (a) aiayn from scratch: `aiayn train --config classify` (train.valid_data = the dev set,
        train.max_minutes = M, train.dtype = fp32), its run directory's model = the best dev
        accuracy's;
    (b) a plain Hugging Face `BertForSequenceClassification` of the same size (classify.toml's
        d_model, n_layers, n_heads, d_ff, max_len), from scratch, fed THE SAME ids (the
        SentencePiece vocabulary aiayn's run trains, read from its run directory once it is
        written, and `aiayn.text.labelled.classifier_ids`): AdamW, the same batch size, peak
        rate and warmup cap, a cosine over its own measured time budget of M minutes, the dev
        set every `valid_every` steps, the best dev accuracy's weights kept;
    (c) scikit-learn TF-IDF (word 1-2 grams) + LogisticRegression, C chosen on dev.

    python bench/classify_baselines.py --out /tmp/clsbench/base --minutes 20

(a) and (b) run at the same time as two child processes, one torch thread each
(OMP_NUM_THREADS=1), each pinned to its own CPU where there are two, so that they share the
machine's conditions; (c) runs after them, in this process, on one thread. Every system is
scored on stsa.binary.test: accuracy and macro-F1 with bootstrap 95% intervals
(`aiayn.classify.metrics.bootstrap`), its training seconds, its CPU seconds (getrusage of each
child; of this process for (c)) and the load average before and after. Prints one JSON object
(also written to OUT/report.json). The lab log is docs/lab/classify.md.

`--tiny` (a 32-wide model, a 1,000-piece vocabulary), `--steps N` and `--limit N` (N training,
dev and test sentences, stratified) make the quick check of tests/bench/test_classify_bench.py.
bench/classify_pretraining.py and bench/classify_speed.py import the helpers here.
"""

from __future__ import annotations

import os

for _name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
    os.environ.setdefault(_name, "1")  # this process too: NumPy's BLAS, scikit-learn, torch

import argparse  # noqa: E402
import copy  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import platform  # noqa: E402
import random  # noqa: E402
import resource  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
SST2 = ROOT.parent / "shared" / "data" / "sst2"
TINY = ["model.d_model=32", "model.d_ff=64", "model.n_layers=1", "model.n_heads=2",
        "train.vocab_size=1000"]  # fmt: skip


# --- the machine ---------------------------------------------------------------------------


def cpu_info() -> dict[str, Any]:
    """`lscpu`'s model name and the flags that decide bf16 speed, and the CPUs usable."""
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


def versions() -> dict[str, str]:
    import torch

    out = {"python": platform.python_version(), "torch": torch.__version__}
    for name in ("transformers", "sklearn"):
        try:
            out[name] = __import__(name).__version__
        except ImportError:
            out[name] = "absent"
    return out


def load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def child_env(threads: int) -> dict[str, str]:
    env = dict(os.environ)
    for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        env[name] = str(threads)
    env.pop("LD_PRELOAD", None)  # the same (glibc) allocator on every side
    return env


def cpu_slots(n: int, threads: int, pin: bool) -> list[set[int] | None]:
    """`n` disjoint sets of `threads` CPUs, one per side run at once; None each (no pinning)
    where the machine has too few or `pin` is off."""
    cpus = sorted(os.sched_getaffinity(0))
    if not pin or len(cpus) < n * threads:
        return [None] * n
    return [set(cpus[i * threads : (i + 1) * threads]) for i in range(n)]


class Child:
    """A child process whose CPU time is read when it ends (the machine is shared: its
    wall time alone would not say how much of the CPU it had)."""

    def __init__(self, name: str, cmd: list[str], log: Path, threads: int,
                 cpus: set[int] | None) -> None:  # fmt: skip
        self.name, self.cmd, self.log, self.cpus = name, cmd, log, cpus
        self.started = time.time()
        with open(log, "w") as f:
            self.proc = subprocess.Popen(
                cmd,
                cwd=ROOT,
                env=child_env(threads),
                stdout=f,
                stderr=subprocess.STDOUT,
                preexec_fn=(lambda: os.sched_setaffinity(0, cpus)) if cpus else None,
            )
        self.result: dict[str, Any] | None = None

    def poll(self) -> dict[str, Any] | None:
        """Its exit status, wall and CPU seconds once it has ended (None while it runs)."""
        if self.result is None:
            pid, status, usage = os.wait4(self.proc.pid, os.WNOHANG)
            if pid:
                self.proc.returncode = os.waitstatus_to_exitcode(status)
                self.result = self._done(usage)
        return self.result

    def wait(self) -> dict[str, Any]:
        if self.result is None:
            _, status, usage = os.wait4(self.proc.pid, 0)
            self.proc.returncode = os.waitstatus_to_exitcode(status)
            self.result = self._done(usage)
        return self.result

    def _done(self, usage: Any) -> dict[str, Any]:
        return {
            "rc": self.proc.returncode,
            "wall_s": round(time.time() - self.started, 1),
            "cpu_s": round(usage.ru_utime + usage.ru_stime, 1),
            "cpus": sorted(self.cpus) if self.cpus else None,
            "command": " ".join(self.cmd),
            "log": str(self.log),
        }

    def check(self) -> dict[str, Any]:
        got = self.wait()
        if got["rc"]:
            tail = self.log.read_text(errors="replace")[-3000:]
            sys.exit(f"{self.name} failed ({got['rc']}); {self.log}:\n{tail}")
        return got


# --- the data ------------------------------------------------------------------------------


def split_paths(data: Path) -> dict[str, Path]:
    return {split: data / f"stsa.binary.{split}" for split in ("train", "dev", "test")}


def need_data(data: Path) -> None:
    missing = [str(p) for p in split_paths(data).values() if not p.is_file()]
    if missing:
        sys.exit(f"no SST-2 at {data} ({', '.join(missing)}): ../shared/data/sst2 is needed")


def stratified_sample(pairs: list[tuple[str, str]], n: int, seed: int) -> list[tuple[str, str]]:
    """`n` of the pairs with each label's share kept (rounded), drawn by `seed`, in file order."""
    if n >= len(pairs):
        return list(pairs)
    from aiayn.text.labelled import stratified_split

    _, held = stratified_split(pairs, n / len(pairs), seed)
    return [pairs[i] for i in held]


def write_pairs(path: Path, pairs: list[tuple[str, str]]) -> Path:
    from aiayn.atomic import atomic_write_text

    atomic_write_text(path, "".join(f"{label} {text}\n" for label, text in pairs))
    return path


def limited_splits(data: Path, out: Path, limit: int, seed: int) -> dict[str, Path]:
    """SST-2's files, or (`limit`) stratified samples of `limit` sentences of each, in `out`."""
    paths = split_paths(data)
    if not limit:
        return paths
    from aiayn.text.labelled import read_labelled

    return {
        split: write_pairs(out / f"{split}.txt", stratified_sample(read_labelled(p), limit, seed))
        for split, p in paths.items()
    }


# --- scores --------------------------------------------------------------------------------


def score(y_true: list[int], y_pred: list[int], labels: list[str]) -> dict[str, Any]:
    """Accuracy and macro-F1 with their 95% bootstrap intervals."""
    from aiayn.classify.metrics import bootstrap, confusion, scores

    got = scores(confusion(y_true, y_pred, len(labels)), labels)
    ci = bootstrap(y_true, y_pred, len(labels))
    return {
        "examples": got["examples"],
        "accuracy": round(got["accuracy"], 4),
        "accuracy_95": [round(x, 4) for x in ci["accuracy"]],
        "macro_f1": round(got["macro_f1"], 4),
        "macro_f1_95": [round(x, 4) for x in ci["macro_f1"]],
    }


def aiayn_test(run_dir: Path, test: Path) -> dict[str, Any]:
    """An aiayn run directory's model (its best dev accuracy's) on the test file, fp32."""
    from aiayn.classify.classifier import Classifier
    from aiayn.text.labelled import read_labelled

    pairs = read_labelled(test)
    clf = Classifier.open(run_dir, "cpu", "fp32")
    index = {name: i for i, name in enumerate(clf.labels)}
    pred = clf.logits([t for _, t in pairs]).argmax(-1).tolist()
    return score([index[label] for label, _ in pairs], pred, clf.labels)


def aiayn_curve(run_dir: Path) -> dict[str, Any]:
    """From metrics.jsonl: steps, training seconds, the best dev accuracy and its step."""
    records = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x]
    valid = [r for r in records if "valid_accuracy" in r]
    best = max(valid, key=lambda r: r["valid_accuracy"], default={})
    return {
        "steps": max((r.get("step", 0) for r in records), default=0),
        "train_s": round(max((r.get("elapsed_s", 0.0) for r in records), default=0.0), 1),
        "validations": len(valid),
        "best_dev_accuracy": best.get("valid_accuracy"),
        "best_step": best.get("step"),
    }


def aiayn_train_cmd(sets: list[str], config: str = "classify") -> list[str]:
    cmd = [sys.executable, "-m", "aiayn", "train", "--config", config]
    for kv in sets:
        cmd += ["--set", kv]
    return [*cmd, "--no-progress"]


# --- (b) the Hugging Face side (a child process: --hf-child) --------------------------------


def wait_for_tokenizer(run_dir: Path, timeout_s: float = 600.0) -> Any:
    """The SentencePiece vocabulary aiayn's run trains, as soon as it has saved it."""
    from aiayn.text.tokenizer import Tokenizer

    path, deadline = run_dir / "tokenizer.model", time.time() + timeout_s
    while not path.is_file():
        if time.time() > deadline:
            sys.exit(f"no {path} after {timeout_s:.0f} s: aiayn's run did not start")
        time.sleep(0.2)
    return Tokenizer.load(run_dir)


def lr_at(elapsed_s: float, step: int, budget_s: float, warmup: int, peak: float) -> float:
    """The peak rate reached linearly over `warmup` steps, then a cosine to 0 over the rest of
    the time budget (the schedule is fitted to the time the machine gives, as aiayn's is)."""
    if step < warmup:
        return peak * (step + 1) / warmup
    return peak * 0.5 * (1 + math.cos(math.pi * min(1.0, elapsed_s / budget_s)))


def hf_child(args: argparse.Namespace) -> None:
    """Train BertForSequenceClassification on aiayn's ids for `--minutes` of wall time and
    write its dev and test scores to OUT/hf_result.json."""
    import torch
    from transformers import BertConfig, BertForSequenceClassification

    from aiayn.atomic import atomic_write_json
    from aiayn.config_files import load_config
    from aiayn.text.labelled import classifier_ids, label_set, read_labelled

    torch.set_num_threads(args.threads)
    cfg = load_config("classify", list(args.set))
    m, tc = cfg.model, cfg.train
    splits = {s: read_labelled(getattr(args, s)) for s in ("train", "dev", "test")}
    labels = label_set([label for label, _ in splits["train"]])
    index = {name: i for i, name in enumerate(labels)}
    t_wait = time.time()
    tok = wait_for_tokenizer(args.run_dir)
    waited = time.time() - t_wait
    ids = {s: classifier_ids(tok, [t for _, t in p], m.max_len) for s, p in splits.items()}
    ys = {s: [index[label] for label, _ in p] for s, p in splits.items()}
    torch.manual_seed(args.seed)
    random.seed(args.seed)
    bert = BertConfig(
        vocab_size=tok.vocab_size,
        hidden_size=m.d_model,
        num_hidden_layers=m.n_layers,
        num_attention_heads=m.n_heads,
        intermediate_size=m.d_ff,
        max_position_embeddings=m.max_len,
        pad_token_id=tok.pad_id,
        num_labels=len(labels),
        hidden_dropout_prob=m.dropout,  # BERT's other defaults kept (attention dropout 0.1)
    )
    model = BertForSequenceClassification(bert)
    opt = torch.optim.AdamW(model.parameters(), lr=tc.lr)  # torch's defaults otherwise
    pad = tok.pad_id

    def batch(rows: list[list[int]]) -> tuple[Any, Any]:
        width = max(map(len, rows))
        x = torch.full((len(rows), width), pad, dtype=torch.long)
        for i, r in enumerate(rows):
            x[i, : len(r)] = torch.tensor(r)
        return x, x != pad

    @torch.no_grad()
    def predict(split: str) -> list[int]:
        model.eval()
        rows = ids[split]
        order = sorted(range(len(rows)), key=lambda i: len(rows[i]))
        out = [0] * len(rows)
        for a in range(0, len(order), 256):
            idx = order[a : a + 256]
            x, mask = batch([rows[i] for i in idx])
            logits = model(input_ids=x, attention_mask=mask).logits
            for i, p in zip(idx, logits.argmax(-1).tolist(), strict=True):
                out[i] = int(p)
        model.train()
        return out

    def accuracy(pred: list[int], gold: list[int]) -> float:
        return sum(p == g for p, g in zip(pred, gold, strict=True)) / max(len(gold), 1)

    budget_s = 60 * args.minutes
    max_steps = args.steps or 10**9
    # The warmup: the config's, at most 10% of the steps the budget buys at the speed of the
    # first steps (aiayn's cosine_budget caps it the same way); fixed after 20 steps.
    warmup = tc.warmup_steps
    best: tuple[float, int, dict[str, Any]] = (-1.0, 0, {})
    step, epoch, valid_s, curve = 0, 0, 0.0, []
    start = time.time()
    model.train()
    done = False
    while not done:
        order = list(range(len(ids["train"])))
        random.Random(args.seed * 1_000_003 + epoch).shuffle(order)
        for a in range(0, len(order), tc.batch_size):
            idx = order[a : a + tc.batch_size]
            x, mask = batch([ids["train"][i] for i in idx])
            y = torch.tensor([ys["train"][i] for i in idx])
            elapsed = time.time() - start
            for g in opt.param_groups:
                g["lr"] = lr_at(elapsed, step, budget_s, warmup, tc.lr)
            loss = model(input_ids=x, attention_mask=mask, labels=y).loss
            opt.zero_grad(set_to_none=True)
            loss.backward()
            if tc.clip_norm:
                torch.nn.utils.clip_grad_norm_(model.parameters(), tc.clip_norm)
            opt.step()
            step += 1
            if step == 20:
                rate = step / max(time.time() - start, 1e-9)
                warmup = max(1, min(tc.warmup_steps, int(0.1 * rate * budget_s)))
            over = time.time() - start >= budget_s or step >= max_steps
            if step % tc.valid_every == 0 or over:
                t0 = time.time()
                acc = accuracy(predict("dev"), ys["dev"])
                valid_s += time.time() - t0
                curve.append({"step": step, "dev_accuracy": round(acc, 4), "loss": float(loss)})
                if acc > best[0]:
                    best = (acc, step, copy.deepcopy(model.state_dict()))
            if over:
                done = True
                break
        epoch += 1
    train_s = time.time() - start
    model.load_state_dict(best[2])
    test = score(ys["test"], predict("test"), labels)
    atomic_write_json(
        args.out / "hf_result.json",
        {
            "steps": step,
            "epochs": epoch,
            "train_s": round(train_s, 1),
            "valid_s": round(valid_s, 1),
            "waited_for_tokenizer_s": round(waited, 1),
            "warmup_steps": warmup,
            "best_dev_accuracy": round(best[0], 4),
            "best_step": best[1],
            "test": test,
            "parameters": sum(p.numel() for p in model.parameters()),
            "bert_config": {k: v for k, v in bert.to_dict().items() if not k.startswith("_")},
            "curve": curve[-50:],
        },
    )


# --- (c) TF-IDF + logistic regression -------------------------------------------------------


def tfidf_baseline(train: Path, dev: Path, test: Path) -> dict[str, Any]:
    """Word 1-2-gram TF-IDF and a logistic regression, C chosen by dev accuracy (fitted on the
    training set alone); this process's CPU seconds for the whole search."""
    from sklearn.feature_extraction.text import TfidfVectorizer
    from sklearn.linear_model import LogisticRegression

    from aiayn.text.labelled import label_set, read_labelled

    r0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.time()
    splits = {s: read_labelled(p) for s, p in (("train", train), ("dev", dev), ("test", test))}
    labels = label_set([label for label, _ in splits["train"]])
    index = {name: i for i, name in enumerate(labels)}
    ys = {s: [index[label] for label, _ in p] for s, p in splits.items()}
    vec = TfidfVectorizer(ngram_range=(1, 2), sublinear_tf=True, token_pattern=r"\S+")
    xs = {"train": vec.fit_transform([t for _, t in splits["train"]])}
    for s in ("dev", "test"):
        xs[s] = vec.transform([t for _, t in splits[s]])
    tried = {}
    best_c, best_acc, best_clf = 0.0, -1.0, None
    for c in (0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0):
        clf = LogisticRegression(C=c, max_iter=2000).fit(xs["train"], ys["train"])
        acc = float((clf.predict(xs["dev"]) == ys["dev"]).mean())
        tried[str(c)] = round(acc, 4)
        if acc > best_acc:
            best_c, best_acc, best_clf = c, acc, clf
    assert best_clf is not None
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    return {
        "C": best_c,
        "dev_accuracy_by_C": tried,
        "best_dev_accuracy": round(best_acc, 4),
        "features": xs["train"].shape[1],
        "train_s": round(time.time() - t0, 1),
        "cpu_s": round(r1.ru_utime + r1.ru_stime - r0.ru_utime - r0.ru_stime, 1),
        "test": score(ys["test"], best_clf.predict(xs["test"]).tolist(), labels),
    }


# --- the run -------------------------------------------------------------------------------


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True, help="a folder for the runs (new)")
    ap.add_argument("--minutes", type=float, default=20.0, help="training wall time, each side")
    ap.add_argument("--data", type=Path, default=SST2, help="the folder of stsa.binary.*")
    ap.add_argument("--threads", type=int, default=1, help="torch threads, each side")
    ap.add_argument("--seed", type=int, default=1, help="both sides' train.seed")
    ap.add_argument("--no-pin", action="store_true", help="don't pin each side to its own CPU")
    ap.add_argument("--tiny", action="store_true", help="a 32-wide model, 1,000 pieces (tests)")
    ap.add_argument("--steps", type=int, default=0, help="at most this many steps (0: no cap)")
    ap.add_argument("--limit", type=int, default=0, help="N sentences of each split (tests)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="more overrides of configs/classify, both sides")  # fmt: skip
    ap.add_argument("--skip", action="append", default=[], choices=["hf", "tfidf"],
                    help="leave a peer out")  # fmt: skip
    # The Hugging Face side's own process (run by main, not by hand).
    ap.add_argument("--hf-child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--run-dir", type=Path, help=argparse.SUPPRESS)
    for split in ("train", "dev", "test"):
        ap.add_argument(f"--{split}", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.tiny:
        args.set = [*TINY, *args.set]
    if args.hf_child:
        hf_child(args)
        return
    need_data(args.data)
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    report = run(args, out)
    from aiayn.atomic import atomic_write_json

    atomic_write_json(out / "report.json", report)
    print(json.dumps(report))


def run(args: argparse.Namespace, out: Path) -> dict[str, Any]:
    paths = limited_splits(args.data.resolve(), out, args.limit, args.seed)
    run_dir = out / "aiayn"
    sets = [
        f"train.data={paths['train']}",
        f"train.valid_data={paths['dev']}",
        f"train.out_dir={run_dir}",
        f"train.max_minutes={args.minutes:g}",
        "train.dtype=fp32",
        "train.device=cpu",
        f"train.threads={args.threads}",
        f"train.seed={args.seed}",
        *([f"train.max_steps={args.steps}"] if args.steps else []),
        *args.set,
    ]
    slots = cpu_slots(2, args.threads, not args.no_pin)
    report: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
        "minutes": args.minutes,
        "threads_each": args.threads,
        "seed": args.seed,
        "limit": args.limit,
        "steps_cap": args.steps,
        "overrides": args.set,
        "cpu": cpu_info(),
        "versions": versions(),
        "load_before": load(),
    }
    children = {"aiayn": Child("aiayn", aiayn_train_cmd(sets), out / "aiayn.log", args.threads,
                               slots[0])}  # fmt: skip
    if "hf" not in args.skip:
        hf_cmd = [sys.executable, str(Path(__file__).resolve()), "--hf-child", "--out", str(out),
                  "--run-dir", str(run_dir), "--minutes", f"{args.minutes:g}",
                  "--threads", str(args.threads), "--seed", str(args.seed),
                  "--steps", str(args.steps), "--train", str(paths["train"]),
                  "--dev", str(paths["dev"]), "--test", str(paths["test"])]  # fmt: skip
        for kv in args.set:
            hf_cmd += ["--set", kv]
        children["hf_bert"] = Child("hf_bert", hf_cmd, out / "hf_bert.log", args.threads,
                                    slots[1])  # fmt: skip
    procs = {name: child.check() for name, child in children.items()}
    report["load_after_training"] = load()
    import torch

    torch.set_num_threads(args.threads)
    report["aiayn"] = {
        **procs["aiayn"],
        **aiayn_curve(run_dir),
        "test": aiayn_test(run_dir, paths["test"]),
    }
    if "hf_bert" in procs:
        report["hf_bert"] = {**procs["hf_bert"], **json.loads((out / "hf_result.json").read_text())}
    if "tfidf" not in args.skip:
        report["tfidf_logreg"] = tfidf_baseline(paths["train"], paths["dev"], paths["test"])
    report["load_after"] = load()
    return report


if __name__ == "__main__":
    main()
