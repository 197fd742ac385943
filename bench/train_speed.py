"""Training throughput: aiayn's Transformer vs one built on `torch.nn.Transformer`, same run.

Both models: d_model 256, 4 heads, 3+3 layers, d_ff 1024, vocabulary 8000, one shared
embedding matrix (scaled by sqrt(d_model), plus sinusoids) tied to the output layer, dropout
0.1, label-smoothed loss, Adam. One training step = forward, backward, Adam update, on
batches of ~1,500 target tokens built by aiayn's own token-budget batcher. The two models'
timed steps are interleaved (A, B, A, B, ...) on the same batches so machine noise hits both.

`--device cuda` (default cpu) runs the same comparison on the GPU at the paper's base size
(`--size paper_base`: d_model 512, 8 heads, 6+6 layers, d_ff 2048, vocabulary 37,000,
sequences of 64 tokens, ~25,000 target tokens a batch) under bf16 autocast, with
`torch.cuda.synchronize()` around every timed step and `--warmup` untimed steps first. There
it also reports model FLOP utilisation, MFU = 6 x parameters x target tokens/s / peak: the
parameters are each model's trainable ones (the shared embedding once), 6 = forward (2) +
backward (4) FLOPs per parameter per target token; attention scores, the source side's own
tokens and padding are not counted. The peak is the device's dense bf16 figure from a table
keyed by `torch.cuda.get_device_name()` (bench/device_info.py); unknown devices get null.
`--compile` wraps both models in `torch.compile` (compiled during the warm-up steps).

Known differences (see docs/lab/training.md): nn.Transformer applies its dropout also to the
attention weights and inside the FFN (after the ReLU) and adds a final LayerNorm to each
stack; the paper and aiayn's defaults (attn_dropout = 0) use dropout on the sub-layer outputs
and the embedding sums only.

    python bench/train_speed.py            # prints one JSON object on its last line
    python bench/train_speed.py --device cuda [--size paper_base] [--compile]
"""

from __future__ import annotations

import argparse
import json
import math
import random
import time
from dataclasses import asdict, dataclass

import device_info
import torch
from torch import Tensor, nn

from aiayn.config import PAD_ID, ModelConfig
from aiayn.nn.embeddings import sinusoidal_positions
from aiayn.nn.model import Transformer, count_parameters
from aiayn.runtime.memory import keep_freed_memory
from aiayn.text.batches import Batch, Example, batch_plan, collate
from aiayn.training.loss import label_smoothed_loss


@dataclass(frozen=True)
class Size:
    d_model: int
    heads: int
    layers: int
    d_ff: int
    vocab: int
    lengths: tuple[int, int]  # source lengths drawn from this range (targets within +-3)
    max_tokens: int  # padded tokens per batch (aiayn's token-budget batcher)


SIZES = {
    "small": Size(256, 4, 3, 1024, 8000, (6, 30), 1700),  # caption-like (Multi30k)
    "paper_base": Size(512, 8, 6, 2048, 37000, (63, 63), 25000),  # 64 with EOS; §5.1 batches
}


class TorchReference(nn.Module):
    """`nn.Transformer` with aiayn's embeddings and output layer (shared, tied, sinusoids)."""

    def __init__(self, size: Size, dropout: float = 0.1) -> None:
        super().__init__()
        D = self.d_model = size.d_model
        self.embed = nn.Embedding(size.vocab, D, padding_idx=PAD_ID)
        nn.init.normal_(self.embed.weight, std=D**-0.5)
        self.register_buffer("pe", sinusoidal_positions(512, D), persistent=False)
        self.drop = nn.Dropout(dropout)
        L = size.layers
        self.core = nn.Transformer(D, size.heads, L, L, size.d_ff, dropout, batch_first=True)

    def forward(self, src_BS: Tensor, tgt_in_BT: Tensor) -> Tensor:
        src_pad, tgt_pad = src_BS == PAD_ID, tgt_in_BT == PAD_ID
        scale = math.sqrt(self.d_model)
        x = self.drop(self.embed(src_BS) * scale + self.pe[: src_BS.size(1)])
        y = self.drop(self.embed(tgt_in_BT) * scale + self.pe[: tgt_in_BT.size(1)])
        T = tgt_in_BT.size(1)  # bool masks throughout (True = hidden), like the padding masks
        causal = torch.ones(T, T, dtype=torch.bool, device=src_BS.device).triu(1)
        out = self.core(
            x,
            y,
            tgt_mask=causal,
            tgt_is_causal=True,
            src_key_padding_mask=src_pad,
            tgt_key_padding_mask=tgt_pad,
            memory_key_padding_mask=src_pad,
        )
        return out @ self.embed.weight.t()


def make_batches(size: Size, n_batches: int, seed: int) -> list[Batch]:
    """Pairs with source lengths in `size.lengths` (target within ±3; exactly the source length
    when the range is one value), batched by `size.max_tokens` padded tokens.

    small: caption-like, ~1,500 target tokens a batch. paper_base: 64-token sequences.
    """
    rng = random.Random(seed)
    lo, hi = size.lengths
    per_batch = size.max_tokens // (lo + 1) + 10
    exs = []
    for _ in range(n_batches * per_batch):
        s = rng.randint(lo, hi)
        t = max(2, s + rng.randint(-3, 3)) if lo != hi else s
        src = (*(rng.randint(4, size.vocab - 1) for _ in range(s)), 3)
        tgt = (2, *(rng.randint(4, size.vocab - 1) for _ in range(t)), 3)  # BOS ... EOS
        exs.append(Example(src, tgt))
    plan = batch_plan(exs, size.max_tokens, seed=seed)
    return [collate(exs, idx, 0) for idx in plan[:n_batches]]


def train_flops(size: Size, src_BS: Tensor, tgt_BT: Tensor) -> float:
    """Matmul FLOPs of one training step on the padded batch (backward = 2 x forward)."""
    D, F, L, V = size.d_model, size.d_ff, size.layers, size.vocab
    B, S = src_BS.shape
    T = tgt_BT.size(1)
    enc = B * S * (4 * D * D + 2 * D * F + 2 * S * D)
    dec = B * T * (4 * D * D + 2 * T * D + 2 * D * D + 2 * S * D + 2 * D * F) + B * S * 2 * D * D
    out = B * T * D * V
    return 3 * 2 * (L * (enc + dec) + out)


def matmul_peak(dtype: torch.dtype, windows: int = 6, seconds: float = 0.25) -> float:
    """GFLOP/s of a 1024^3 matmul: the best of several short windows (a peak is a maximum;
    the best window is the one least disturbed by other jobs on the machine)."""
    a = torch.randn(1024, 1024).to(dtype)
    b = torch.randn(1024, 1024).to(dtype)
    for _ in range(3):
        a @ b
    best = 0.0
    for _ in range(windows):
        n, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            a @ b
            n += 1
        best = max(best, 2 * 1024**3 * n / (time.perf_counter() - t0) / 1e9)
    return best


def step(
    model: nn.Module, opt: torch.optim.Optimizer, batch: Batch, n_tgt: int, bf16: bool
) -> float:
    """One timed training step. `n_tgt` is counted beforehand: reading it from a GPU tensor
    here would be a host sync inside the timing."""
    device = batch.src_BS.device
    device_info.sync(device)  # nothing queued from before counts
    t0 = time.perf_counter()
    opt.zero_grad(set_to_none=True)
    ctx = (
        torch.autocast(device.type, torch.bfloat16)
        if bf16
        else torch.autocast(device.type, enabled=False)
    )
    with ctx:
        logits = model(batch.src_BS, batch.tgt_in_BT)
    loss, _ = label_smoothed_loss(logits.flatten(0, 1), batch.tgt_out_BT.flatten(), 0.1, PAD_ID)
    (loss / n_tgt).backward()
    opt.step()
    device_info.sync(device)  # the GPU's work counts, not only its launch
    return time.perf_counter() - t0


def run(
    size: Size, dtype: str, batches: list[Batch], args: argparse.Namespace, peak: float | None
) -> dict[str, float | None]:
    torch.manual_seed(args.seed)
    device = batches[0].src_BS.device
    ours = Transformer(ModelConfig(vocab_size=size.vocab, d_model=size.d_model,
                                   n_heads=size.heads, n_layers=size.layers, d_ff=size.d_ff,
                                   dropout=0.1, max_len=512)).train().to(device)  # fmt: skip
    ref = TorchReference(size, 0.1).train().to(device)
    models: dict[str, nn.Module] = {"aiayn": ours, "reference": ref}
    n_params = {k: count_parameters(m) for k, m in models.items()}
    opts = {k: torch.optim.Adam(m.parameters(), lr=1e-4, betas=(0.9, 0.98), eps=1e-9)
            for k, m in models.items()}  # fmt: skip
    if args.compile:  # the optimizers keep the original parameters; compiled modules share them
        models = {k: torch.compile(m) for k, m in models.items()}  # type: ignore[misc]
    bf16 = dtype == "bf16"
    n_tgt = [b.n_tgt_tokens for b in batches]
    for b, n in zip(batches[: args.warmup], n_tgt, strict=False):
        for k in models:
            step(models[k], opts[k], b, n, bf16)
    secs = {k: 0.0 for k in models}
    tokens = flops = 0.0
    pair_ratios = []  # reference time / aiayn time on the same batch, back to back
    for i, (b, n) in enumerate(zip(batches[args.warmup :], n_tgt[args.warmup :], strict=True)):
        order = list(models) if i % 2 == 0 else list(reversed(models))  # alternate who goes first
        t = {k: step(models[k], opts[k], b, n, bf16) for k in order}
        for k in models:
            secs[k] += t[k]
        pair_ratios.append(t["reference"] / t["aiayn"])
        tokens += n
        flops += train_flops(size, b.src_BS, b.tgt_in_BT)
    out: dict[str, float | None] = {
        "aiayn_tok_s": tokens / secs["aiayn"],
        "reference_tok_s": tokens / secs["reference"],
        "aiayn_gflop_s": flops / secs["aiayn"] / 1e9,
        "reference_gflop_s": flops / secs["reference"] / 1e9,
        "ratio": secs["reference"] / secs["aiayn"],
        "ratio_median_step": sorted(pair_ratios)[len(pair_ratios) // 2],  # robust to bursts
        "aiayn_params": n_params["aiayn"],
        "reference_params": n_params["reference"],
    }
    for k in models:  # MFU = 6 x parameters x target tokens/s / peak (see the docstring)
        mfu = 6 * n_params[k] * tokens / secs[k] / peak if peak else None
        out[f"{k}_mfu"] = mfu
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--size", choices=sorted(SIZES), help="default: small on CPU, paper_base on "
                   "CUDA")  # fmt: skip
    p.add_argument("--dtypes", help="comma-separated, of fp32 and bf16 (autocast); default: "
                   "fp32,bf16 on CPU, bf16 on CUDA")  # fmt: skip
    p.add_argument("--steps", type=int, default=10, help="timed steps per model and dtype")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--compile", action="store_true", help="torch.compile both models")
    args = p.parse_args()
    keep_freed_memory()  # malloc as aiayn's commands set it, for every side measured here
    device = device_info.require_device(args.device)
    on_gpu = device.type == "cuda"
    size_name = args.size or ("paper_base" if on_gpu else "small")
    size = SIZES[size_name]
    dtypes = (args.dtypes or ("bf16" if on_gpu else "fp32,bf16")).split(",")
    t0 = time.perf_counter()
    batches = [b.to(device) for b in make_batches(size, args.warmup + args.steps, args.seed)]
    peak, peak_note = device_info.gpu_peak_flops(device)
    result: dict[str, object] = {
        "config": {"size": size_name, **asdict(size), "dropout": 0.1, "steps": args.steps,
                   "warmup": args.warmup, "compile": args.compile,
                   "tgt_tokens_per_batch": sum(b.n_tgt_tokens for b in batches) / len(batches)},
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "allocator": device_info.allocator(),
        "machine": device_info.machine(device),
        "mfu_peak": peak_note,
    }  # fmt: skip
    for dtype in dtypes:
        # CPU: a matmul peak measured in the same run, as before (none on GPU: MFU instead).
        mm_peak = (
            0.0 if on_gpu else matmul_peak(torch.float32 if dtype == "fp32" else torch.bfloat16)
        )
        r = run(size, dtype, batches, args, peak)
        if mm_peak:
            r["matmul_peak_gflop_s"] = mm_peak
            r["aiayn_frac_of_peak"] = r["aiayn_gflop_s"] / mm_peak  # type: ignore[operator]
            r["reference_frac_of_peak"] = r["reference_gflop_s"] / mm_peak  # type: ignore[operator]
        result[dtype] = {k: v if v is None else round(v, 4) for k, v in r.items()}
        shown = ", ".join(f"{k}={v:.3g}" for k, v in r.items() if v is not None)
        print(f"{dtype}: {shown}", flush=True)
    result["seconds"] = round(time.perf_counter() - t0, 1)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
