"""The O(L^2 d) cost of attention, measured, and what local attention and GQA buy.

Part A, one causal self-attention layer (batch 1, fp32, `--d-model` 256, `--heads` 8) at
sequence lengths L = 128 .. 16384, forward pass and training step (forward + backward of a
fixed random projection of the output), three ways:

    explicit  `aiayn.nn.attention.attention`: the L x L scores and weights materialised
    fused     `fused_attention(causal=True)`: PyTorch's fused kernel (what an untraced
              `MultiHeadAttention` runs)
    local     `local_attention` with a window of `--window` 256, causal: block by block

"module" times the whole layer, projections included: `MultiHeadAttention(...)` called as it
is for fused and local (a window module attends block by block once L > 2W, below that it
masks a dense band), and for explicit the same module's `project_qkv`, `attention` with the
causal mask, then `out_proj` (an untraced module never takes the explicit path for L > 1).
"attention" times the attention function alone on projected heads. Each case runs in a
forked child of this process (torch imported, nothing else allocated): its first call is the
memory measurement and warm-up, the peak RSS growth over it (VmHWM after the call minus
VmRSS before, the high-water mark reset through /proc/self/clear_refs); then `--reps` timed
calls of the module and of the attention alone, fewer where they would take longer than
`--case-seconds` (noted in the results as each case's "reps"). A length is run only when the
peak its predecessor measured, grown as L^2 (at the first length: a formula, explicit:
10 L^2 H fp32 numbers for training, 6 for a forward), stays below the memory then available
less `--margin-gib`; the first length that does not is recorded as "did not fit" and ends
that method (an allocation refused under the child's address-space limit, or the child
killed, is recorded the same way). Exponents: least squares of log(time) and log(memory)
against log(L) over the upper half of each method's measured lengths.

Part B, decoding: a DecoderLM (d_model 256, 8 heads, 4 layers, d_ff 1024, RoPE, vocab 512)
as MHA, GQA (kv_heads = heads / 4), MQA (kv_heads 1) and MHA with `--decode-window` 512.
At each context C the cache from `model.init_cache` is filled with random K/V (no prefill)
and its length set to C; then `--steps` greedy `decode_step`s at batch 1 are timed, the
variants interleaved, median of `--decode-reps`, in tokens per CPU second of this process
(one thread: what a core of its own gives, whatever the machine's load; per wall second
beside it). Cache bytes: the nbytes of every tensor of a cache made for exactly C positions.
Times in Part A are CPU seconds too (wall seconds beside them).

    python bench/attention_scaling.py [--out DIR] [--plots DIR] [--core N]
    python bench/attention_scaling.py --replot DIR/results.json --plots DIR   # plots only

One torch thread, pinned to one core. The last line printed is one JSON object.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import datetime
import gc
import hashlib
import io
import json
import math
import multiprocessing
import os
import re
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import device_info
import torch

from aiayn.atomic import atomic_write_bytes, atomic_write_text
from aiayn.config import BOS_ID, ModelConfig
from aiayn.nn.attention import MultiHeadAttention, attention, causal_mask, fused_attention
from aiayn.nn.local_attention import local_attention
from aiayn.nn.variants import DecoderLM
from aiayn.runtime.memory import keep_freed_memory

METHODS = ("explicit", "fused", "local")
MODES = ("forward", "train")
GIB = 2**30


def proc_status(key: str) -> int:
    """A /proc/self/status field in bytes (VmRSS, VmHWM, VmSize)."""
    with open("/proc/self/status") as f:
        return int(re.search(rf"{key}:\s+(\d+)", f.read()).group(1)) * 1024  # type: ignore[union-attr]


def mem_available() -> int:
    with open("/proc/meminfo") as f:
        return int(re.search(r"MemAvailable:\s+(\d+)", f.read()).group(1)) * 1024  # type: ignore[union-attr]


def lscpu_model() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10).stdout
        for line in out.splitlines():
            if line.startswith("Model name:"):
                return line.split(":", 1)[1].strip()
    except (OSError, subprocess.SubprocessError):
        pass
    return device_info.cpu_model()


def code_state() -> dict:
    """Which aiayn ran: the commit, and whether (and how) its working tree's src/aiayn differs
    from it (the tree is shared: a figure belongs to the code it measured)."""
    root = Path(__file__).resolve().parent.parent

    def git(*args: str) -> str:
        try:
            out = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True,
                                 timeout=30)  # fmt: skip
        except (OSError, subprocess.SubprocessError):
            return ""
        return out.stdout.strip()

    diff = git("diff", "HEAD", "--", "src/aiayn")
    return {
        "commit": git("rev-parse", "HEAD"),
        "src_aiayn_modified": bool(diff),
        "src_aiayn_diff_sha256": hashlib.sha256(diff.encode()).hexdigest() if diff else None,
        "src_aiayn_files_modified": git("diff", "HEAD", "--name-only", "--", "src/aiayn").split(),
    }


# --- Part A: one layer, one case per forked child ------------------------------------------


def layer_fns(
    method: str, L: int, a: argparse.Namespace
) -> tuple[MultiHeadAttention, Callable[[torch.Tensor], torch.Tensor], Callable[..., torch.Tensor]]:
    """(the module, module forward of x_BLD, attention of projected q, k, v)."""
    D, H, W = a.d_model, a.heads, a.window
    torch.manual_seed(0)
    mha = MultiHeadAttention(D, H, window=W if method == "local" else 0)

    def explicit_heads(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return attention(q, k, v, causal_mask(L, L, q.device))[0]

    def module(x_BLD: torch.Tensor) -> torch.Tensor:
        if method != "explicit":
            return mha(x_BLD, causal=True)
        q_BHLK, k_BHLK, v_BHLK = mha.project_qkv(x_BLD)
        heads_BHLK = explicit_heads(q_BHLK, k_BHLK, v_BHLK)
        return mha.out_proj(heads_BHLK.transpose(1, 2).reshape(1, L, D))

    attend: Callable[..., torch.Tensor] = {
        "explicit": explicit_heads,
        "fused": lambda q, k, v: fused_attention(q, k, v, causal=True),
        "local": lambda q, k, v: local_attention(q, k, v, W, causal=True),
    }[method]
    return mha, module, attend


def calls(
    method: str, mode: str, L: int, a: argparse.Namespace
) -> tuple[Callable[[], None], Callable[[], None]]:
    """(one call of the module, one of the attention function alone), as `mode` runs them."""
    mha, module, attend = layer_fns(method, L, a)
    g = torch.Generator().manual_seed(1)
    D, H, K = a.d_model, a.heads, a.d_model // a.heads
    x_BLD = torch.randn(1, L, D, generator=g)
    grad_BLD = torch.randn(1, L, D, generator=g)
    qkv = [torch.randn(1, H, L, K, generator=g) for _ in range(3)]
    grad_BHLK = torch.randn(1, H, L, K, generator=g)

    def module_call() -> None:
        if mode == "forward":
            with torch.no_grad():
                module(x_BLD)
            return
        mha.zero_grad(set_to_none=True)
        module(x_BLD).backward(grad_BLD)

    def attention_call() -> None:
        if mode == "forward":
            with torch.no_grad():
                attend(*qkv)
            return
        leaves = [t.detach().requires_grad_() for t in qkv]
        attend(*leaves).backward(grad_BHLK)

    return module_call, attention_call


def warm_up(a: argparse.Namespace) -> None:
    """Every call once at small sizes in the parent, so that code loaded and state set up on
    a first call (autograd, kernels) is resident before the children fork, not counted in
    their peaks. 3W: a window module's blocked path too."""
    for method in METHODS:
        for mode in MODES:
            for L in (min(a.lengths), 3 * a.window):
                for call in calls(method, mode, L, a):
                    call()
    trim_heap()


def trim_heap() -> None:
    """Hand the pages of freed heap blocks back to the kernel (glibc's `malloc_trim`), so that
    memory freed before a measured call cannot serve it unseen: its peak RSS growth is then
    what it allocates, small lengths included."""
    gc.collect()
    with contextlib.suppress(OSError, AttributeError):  # not glibc: small peaks may read low
        ctypes.CDLL(None).malloc_trim(0)


def run_case(method: str, mode: str, L: int, a: argparse.Namespace, limit: int) -> dict:
    """In the child: the peak RSS growth of one call, then the timed calls."""
    resource.setrlimit(resource.RLIMIT_AS, (proc_status("VmSize") + limit, resource.RLIM_INFINITY))
    try:
        for call in calls(method, mode, min(a.lengths), a):
            call()  # a child's first call sets up ~10-20 MiB of its own (measured), not L's
        module_call, attention_call = calls(method, mode, L, a)
        trim_heap()
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # the high-water mark back down to what is resident now
        rss = proc_status("VmRSS")
        first = timed(module_call)
        peak = proc_status("VmHWM") - rss
        reps = max(1, min(a.reps, int(a.case_seconds / max(first[1], 1e-9) / 2)))
        times: dict[str, list[float]] = {}
        attention_call()  # its warm-up
        for _ in range(reps):
            for name, call in (("module", module_call), ("attention", attention_call)):
                wall, cpu = timed(call)
                times.setdefault(f"{name}_s", []).append(wall)
                times.setdefault(f"{name}_cpu_s", []).append(cpu)
    except (RuntimeError, MemoryError) as e:  # refused under the address-space limit
        return {"fit": False, "why": f"allocation refused: {str(e).splitlines()[0][:120]}"}
    return {
        "fit": True,
        "peak_rss_bytes": peak,
        "first_call_wall_cpu_s": first,
        "reps": reps,
        **times,
    }


def timed(call: Callable[[], object]) -> tuple[float, float]:
    """(wall seconds, CPU seconds of this process) of one call. With one thread the CPU time
    is what the call costs on a core of its own: other processes' load does not count."""
    wall, cpu = time.perf_counter(), time.process_time()
    call()
    return time.perf_counter() - wall, time.process_time() - cpu


def _child(conn: object, *args: object) -> None:
    try:
        out = run_case(*args)  # type: ignore[arg-type]
    except BaseException as e:  # anything else: said in the results, the run goes on
        out = {"fit": False, "why": f"{type(e).__name__}: {str(e).splitlines()[0][:120]}"}
    conn.send(out)  # type: ignore[attr-defined]


def forked(method: str, mode: str, L: int, a: argparse.Namespace, limit: int) -> dict:
    parent, child = multiprocessing.get_context("fork").Pipe()
    p = multiprocessing.get_context("fork").Process(
        target=_child, args=(child, method, mode, L, a, limit)
    )
    p.start()
    out = None
    while out is None and (p.is_alive() or parent.poll()):  # killed (out of memory): no answer
        if parent.poll(1.0):
            out = parent.recv()
    p.join()
    if out is None:
        return {"fit": False, "why": f"child ended with exit code {p.exitcode} (killed?)"}
    return out


def formula_bytes(method: str, mode: str, L: int, a: argparse.Namespace) -> int:
    """A rough upper estimate of one call's peak (the fp32 numbers it holds at once)."""
    H, D, W = a.heads, a.d_model, a.window
    per_token = 40 * D * 4  # activations, projections and their gradients: O(L D)
    if method == "explicit":
        return (6 if mode == "forward" else 10) * H * L * L * 4 + L * per_token
    if method == "local":
        return 6 * H * L * 2 * W * 4 + L * per_token
    return L * per_token


def part_a(a: argparse.Namespace) -> dict:
    cases: dict[str, dict[str, list[dict]]] = {m: {mode: [] for mode in MODES} for m in METHODS}
    for method in a.methods:
        for mode in MODES:
            prev: tuple[int, int] | None = None
            for L in a.lengths:
                gc.collect()
                # what the previous length took, grown as L^2 (dense's rate: an upper bound)
                estimate = (
                    formula_bytes(method, mode, L, a)
                    if prev is None
                    else int(prev[1] * (L / prev[0]) ** 2)
                )
                room = mem_available() - int(a.margin_gib * GIB)
                row: dict = {"L": L, "estimate_bytes": estimate, "room_bytes": room}
                if estimate > room:
                    row.update(fit=False, why="estimated peak above the memory available")
                else:
                    row.update(forked(method, mode, L, a, room))
                cases[method][mode].append(row)
                msg = (f"{method:8s} {mode:7s} L={L:6d} " + (
                    f"module {statistics.median(row['module_cpu_s']) * 1e3:9.1f} ms  attention "
                    f"{statistics.median(row['attention_cpu_s']) * 1e3:9.1f} ms CPU  peak "
                    f"{row['peak_rss_bytes'] / 2**20:8.1f} MiB  reps {row['reps']}"
                    if row["fit"] else f"did not fit: {row['why']}"))  # fmt: skip
                print(msg, file=sys.stderr, flush=True)
                if not row["fit"]:
                    break
                prev = (L, max(row["peak_rss_bytes"], 1))
    return cases


def fit_exponent(xs: list[float], ys: list[float]) -> float | None:
    """Least-squares slope of log y on log x over the upper half of the points."""
    pts = [(math.log(x), math.log(y)) for x, y in zip(xs, ys, strict=True) if y > 0]
    pts = pts[len(pts) // 2 :]
    if len(pts) < 2:
        return None
    mx, my = statistics.fmean(p[0] for p in pts), statistics.fmean(p[1] for p in pts)
    sxx = sum((p[0] - mx) ** 2 for p in pts)
    return round(sum((p[0] - mx) * (p[1] - my) for p in pts) / sxx, 3)


def series(rows: list[dict], key: str) -> tuple[list[int], list[float]]:
    ok = [r for r in rows if r["fit"]]
    if key == "peak_rss_bytes":
        return [r["L"] for r in ok], [float(r[key]) for r in ok]
    return [r["L"] for r in ok], [statistics.median(r[key]) for r in ok]


def exponents(cases: dict) -> dict:
    out: dict = {}
    for method, modes in cases.items():
        for mode, rows in modes.items():
            out[f"{method}_{mode}"] = {
                what: fit_exponent(*series(rows, key))  # type: ignore[arg-type]
                for what, key in (("module_time", "module_cpu_s"),
                                  ("attention_time", "attention_cpu_s"),
                                  ("module_wall_time", "module_s"), ("memory", "peak_rss_bytes"))
            }  # fmt: skip
    return out


# --- Part B: decoding with the real cache ----------------------------------------------------


def decoder_variants(a: argparse.Namespace) -> dict[str, ModelConfig]:
    base = dict(
        vocab_size=512, d_model=a.d_model, n_heads=a.heads, n_layers=a.decode_layers,
        d_ff=4 * a.d_model, dropout=0.0, positional="rope", max_len=max(a.contexts) + a.steps + 8,
    )  # fmt: skip
    return {
        "mha": ModelConfig(**base),  # type: ignore[arg-type]
        "gqa": ModelConfig(**base, kv_heads=a.heads // 4),  # type: ignore[arg-type]
        "mqa": ModelConfig(**base, kv_heads=1),  # type: ignore[arg-type]
        "window": ModelConfig(**base, attn_window=a.decode_window),  # type: ignore[arg-type]
    }


def cache_bytes(cache: object) -> int:
    tensors = cache.self_k + cache.self_v + cache.cross_k + cache.cross_v  # type: ignore[attr-defined]
    return sum(t.nbytes for t in tensors)


def part_b(a: argparse.Namespace) -> dict:
    models = {}
    for name, cfg in decoder_variants(a).items():
        torch.manual_seed(0)
        models[name] = DecoderLM(cfg).eval()
    prompt = torch.tensor([[BOS_ID]])  # BOS only: no prefill, the cache starts empty
    out: dict = {n: {"kv_heads": m.cfg.n_kv_heads, "attn_window": m.cfg.attn_window,
                     "contexts": [], "tok_s": [], "tok_s_wall": [], "step_s": [],
                     "step_cpu_s": [], "cache_bytes": []}
                 for n, m in models.items()}  # fmt: skip
    with torch.inference_mode():
        for C in a.contexts:
            runs = {}
            for name, model in models.items():
                memory = model.encode(prompt)
                out[name]["cache_bytes"].append(cache_bytes(model.init_cache(memory, C)))
                cache = model.init_cache(memory, C + a.steps)
                g = torch.Generator().manual_seed(2)
                for t in cache.self_k + cache.self_v:  # random K/V in every slot
                    t.copy_(torch.randn(t.shape, generator=g))
                runs[name] = (model, memory, cache)

            def steps(model: DecoderLM, memory: object, cache: object, C: int = C) -> None:
                cache.length = C  # type: ignore[attr-defined]
                tok = torch.tensor([[7]])
                for _ in range(a.steps):
                    logits, _ = model.decode_step(tok, memory, cache)  # type: ignore[arg-type]
                    tok = logits.argmax(-1, keepdim=True)  # greedy

            wall: dict[str, list[float]] = {n: [] for n in runs}
            cpu: dict[str, list[float]] = {n: [] for n in runs}
            for rep in range(a.decode_reps + 1):  # the first round warms up, untimed
                for name, run in runs.items():
                    w, c = timed(lambda run=run: steps(*run))  # type: ignore[misc]
                    if rep:
                        wall[name].append(w)
                        cpu[name].append(c)
            for name in runs:
                out[name]["contexts"].append(C)
                out[name]["step_s"].append(wall[name])
                out[name]["step_cpu_s"].append(cpu[name])
                out[name]["tok_s"].append(round(a.steps / statistics.median(cpu[name]), 2))
                out[name]["tok_s_wall"].append(round(a.steps / statistics.median(wall[name]), 2))
            print(f"context {C:5d}: " + "  ".join(
                f"{n} {out[n]['tok_s'][-1]:7.1f} tok/s {out[n]['cache_bytes'][-1] / 2**20:6.1f} MiB"
                for n in runs), file=sys.stderr, flush=True)  # fmt: skip
    return out


# --- report --------------------------------------------------------------------------------


def goals(cases: dict, exps: dict, dec: dict, a: argparse.Namespace) -> dict:
    out: dict = {}
    for mode in MODES:
        peaks = {m: dict(zip(*series(cases[m][mode], "peak_rss_bytes"), strict=True))
                 for m in METHODS}  # fmt: skip
        both = sorted(set(peaks["explicit"]) & set(peaks["local"]))
        Lmax = max(a.lengths)
        if both:
            ratio = peaks["local"][both[-1]] / peaks["explicit"][both[-1]]
            out[f"local_memory_vs_explicit_{mode}"] = {
                "L": both[-1],
                "ratio": round(ratio, 4),
                "goal": "<= 1/8",
                "met": ratio <= 1 / 8,
                "local_runs_at_largest_L": Lmax in peaks["local"],
            }
        le = exps[f"local_{mode}"]["module_time"]
        out[f"local_time_exponent_{mode}"] = {
            "local": le, "explicit": exps[f"explicit_{mode}"]["module_time"],
            "fused": exps[f"fused_{mode}"]["module_time"], "goal": "local <= 1.2, dense ~2",
            "met": le is not None and le <= 1.2,
        }  # fmt: skip
    w = dec["window"]["tok_s"]
    out["window_decoding_flat"] = {
        "tok_s_last_over_first": round(w[-1] / w[0], 3), "goal": "within 20%",
        "cache_bytes": dec["window"]["cache_bytes"], "met": abs(w[-1] / w[0] - 1) <= 0.2
        and len(set(dec["window"]["cache_bytes"][-2:])) == 1,
    }  # fmt: skip
    mha, gqa = dec["mha"], dec["gqa"]
    byte_ratio = [g / m for g, m in zip(gqa["cache_bytes"], mha["cache_bytes"], strict=True)]
    tok_ratio = [round(g / m, 3) for g, m in zip(gqa["tok_s"], mha["tok_s"], strict=True)]
    out["gqa_vs_mha"] = {
        "cache_bytes_ratio": byte_ratio, "tok_s_ratio": tok_ratio,
        "goal": "bytes 1/4, tok/s >= MHA's",
        "met": all(r == 0.25 for r in byte_ratio) and all(r >= 1 for r in tok_ratio),
    }  # fmt: skip
    return out


def save(fig: object, path: Path) -> None:
    import matplotlib.pyplot as plt

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90)  # type: ignore[attr-defined]
    plt.close(fig)  # type: ignore[arg-type]
    atomic_write_bytes(path, buf.getvalue())


def plot(result: dict, plots: Path) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plots.mkdir(parents=True, exist_ok=True)
    cpu, cases, exps = result["cpu"], result["part_a"]["cases"], result["part_a"]["exponents"]
    written = []
    for name, key, what, unit, scale in (
        ("time", "module_cpu_s", "module_time", "CPU seconds", 1.0),
        ("memory", "peak_rss_bytes", "memory", "peak RSS growth, MiB", 2**-20),
    ):
        fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
        for ax, mode in zip(axes, MODES, strict=True):
            for method in METHODS:
                xs, ys = series(cases[method][mode], key)
                slope = exps[f"{method}_{mode}"][what]
                ax.loglog(xs, [y * scale for y in ys], "o-", base=2,
                          label=f"{method} (slope {slope})")  # fmt: skip
            ax.set(xlabel="sequence length L", ylabel=unit,
                   title=f"{'forward' if mode == 'forward' else 'training step'}")  # fmt: skip
            ax.grid(True, which="both", alpha=0.3)
            ax.legend()
        fig.suptitle(f"one self-attention layer, d_model {result['config']['d_model']}, "
                     f"{result['config']['heads']} heads, fp32, 1 thread, {cpu}")  # fmt: skip
        fig.tight_layout()
        path = plots / f"attention_scaling_{name}.png"
        save(fig, path)
        written.append(str(path))
    dec = result["part_b"]["variants"]
    for name, key, unit in (
        ("decode", "tok_s", "tokens per CPU second"),
        ("cache", "cache_bytes", "MiB"),
    ):
        fig, ax = plt.subplots(figsize=(6, 4.2))
        for variant, row in dec.items():
            ys = [y * (2**-20 if key == "cache_bytes" else 1) for y in row[key]]
            label = f"{variant} (J={row['kv_heads']}" + (
                f", W={row['attn_window']})" if row["attn_window"] else ")"
            )
            ax.loglog(row["contexts"], ys, "o-", base=2, label=label)
        ax.set(
            xlabel="context (cached positions)",
            ylabel=unit,
            title=f"{'decoding speed, batch 1' if name == 'decode' else 'KV cache size'}",
        )
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
        fig.suptitle(f"DecoderLM {result['part_b']['model']}; {cpu}", fontsize=8)
        fig.tight_layout()
        path = plots / f"attention_scaling_{name}.png"
        save(fig, path)
        written.append(str(path))
    return written


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--lengths", type=int, nargs="+", default=[128 * 2**i for i in range(8)])
    p.add_argument("--d-model", type=int, default=256)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--window", type=int, default=256, help="local attention's W (Part A)")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--case-seconds", type=float, default=60.0,
                   help="time for one case's timed calls; fewer reps beyond it")  # fmt: skip
    p.add_argument("--margin-gib", type=float, default=3.0,
                   help="memory left to other processes")  # fmt: skip
    p.add_argument("--contexts", type=int, nargs="+", default=[512 * 2**i for i in range(5)])
    p.add_argument("--decode-window", type=int, default=512)
    p.add_argument("--decode-layers", type=int, default=4)
    p.add_argument("--steps", type=int, default=32, help="decoding steps per timed run")
    p.add_argument("--decode-reps", type=int, default=5)
    p.add_argument("--core", type=int, help="the core to pin to (default: the last allowed)")
    p.add_argument("--out", type=Path, help="also write DIR/results.json")
    p.add_argument("--plots", type=Path, help="write the PNG plots into DIR")
    p.add_argument("--replot", type=Path, help="measure nothing: draw --plots from this "
                   "results.json")  # fmt: skip
    p.add_argument("--methods", nargs="+", choices=METHODS, default=list(METHODS),
                   help="Part A's methods to measure (the others: from --merge)")  # fmt: skip
    p.add_argument("--merge", type=Path, help="an earlier results.json: the methods not "
                   "measured now, and its decoding figures (Part B is then not rerun), are "
                   "taken from it")  # fmt: skip
    a = p.parse_args(argv)
    earlier = json.loads(a.merge.read_text()) if a.merge else None
    if a.replot:
        if not a.plots:
            p.error("--replot needs --plots DIR")
        plot(json.loads(a.replot.read_text()), a.plots)
        return
    if a.heads % 4 or a.d_model % a.heads:
        p.error("--heads must be a multiple of 4 (GQA at heads / 4) and divide --d-model")
    core = a.core if a.core is not None else max(os.sched_getaffinity(0))
    affinity, threads = os.sched_getaffinity(0), torch.get_num_threads()
    os.sched_setaffinity(0, {core})
    torch.set_num_threads(1)
    try:
        load = [os.getloadavg()]
        started = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
        code = code_state()  # as it was when the measurements started
        machine = device_info.machine(torch.device("cpu"))  # one thread, malloc as it comes
        warm_up(a)
        cases = part_a(a)
        load.append(os.getloadavg())
        if earlier is None:
            keep_freed_memory()  # decoding as `aiayn generate` runs it (after Part A's children)
            dec = part_b(a)
        else:  # a rerun of some methods: the rest as measured before
            for method in set(METHODS) - set(a.methods):
                cases[method] = earlier["part_a"]["cases"][method]
            dec = earlier["part_b"]["variants"]
        load.append(os.getloadavg())
    finally:  # as it was (the smoke test calls main in its own process)
        os.sched_setaffinity(0, affinity)
        torch.set_num_threads(threads)
    exps = exponents(cases)
    result: dict = {
        "date": started,
        "cpu": lscpu_model(),
        "machine": machine,
        "allocator_part_b": device_info.allocator(),
        "torch": torch.__version__,
        "code": code,
        "threads": 1,
        "pinned_core": core,
        "load_average_1_5_15": {"start": load[0], "after_part_a": load[1], "end": load[2]},
        "merged": None
        if earlier is None
        else {
            "measured_now": a.methods,
            "from": str(a.merge),
            "earlier_date": earlier["date"],
            "earlier_code": earlier.get("code"),
            "earlier_load_average_1_5_15": earlier.get("load_average_1_5_15"),
        },
        "config": {
            k: getattr(a, k)
            for k in (
                "d_model",
                "heads",
                "window",
                "lengths",
                "reps",
                "case_seconds",
                "margin_gib",
                "contexts",
                "decode_window",
                "decode_layers",
                "steps",
                "decode_reps",
            )
        },
        "part_a": {
            "batch": 1,
            "precision": "fp32",
            "timed": "module_(cpu_)s: the whole MultiHeadAttention layer (projections "
            "included); attention_(cpu_)s: the attention function alone on projected "
            "heads; _cpu_s: CPU seconds of the process (one thread), _s: wall seconds; "
            "exponents and plots from CPU seconds",
            "memory": "peak RSS growth of the module's first call in a forked child: VmHWM "
            "after minus VmRSS before, high-water mark reset via /proc/self/clear_refs",
            "cases": cases,
            "exponents": exps,
        },
        "part_b": {
            "model": f"d_model {a.d_model}, {a.heads} heads, {a.decode_layers} layers, d_ff "
            f"{4 * a.d_model}, rope, vocab 512",
            "cache_fill": "random K/V written into the cache from init_cache (no prefill)",
            "tok_s": "steps / median CPU seconds of a run (tok_s_wall: / wall seconds)",
            "variants": dec,
        },
    }
    result["goals"] = goals(cases, exps, dec, a)
    if a.plots:
        result["plots"] = plot(result, a.plots)
    text = json.dumps(result)
    if a.out:
        a.out.mkdir(parents=True, exist_ok=True)
        atomic_write_text(a.out / "results.json", text + "\n")
    print(text)


if __name__ == "__main__":
    main()
