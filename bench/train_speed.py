"""Training throughput: aiayn's Transformer vs one built on `torch.nn.Transformer`, same run.

Both models: d_model 256, 4 heads, 3+3 layers, d_ff 1024, vocabulary 8000, one shared
embedding matrix (scaled by sqrt(d_model), plus sinusoids) tied to the output layer, dropout
0.1, label-smoothed loss, Adam. One training step = forward, backward, Adam update, on
batches of ~1,500 target tokens built by aiayn's own token-budget batcher. The two models'
timed steps are interleaved (A, B, A, B, ...) on the same batches so machine noise hits both.

Known differences (see docs/benchmarks.md): nn.Transformer applies its dropout also to the
attention weights and inside the FFN (after the ReLU) and adds a final LayerNorm to each
stack; the paper and aiayn's defaults (attn_dropout = 0) use dropout on the sub-layer outputs
and the embedding sums only.

    python bench/train_speed.py            # prints one JSON object on its last line
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import time

import torch
from torch import Tensor, nn

from aiayn.config import PAD_ID, ModelConfig
from aiayn.data import Example, batch_plan, collate
from aiayn.model import Transformer, sinusoidal_positions
from aiayn.train import label_smoothed_loss

D, H, L, F, V = 256, 4, 3, 1024, 8000


class TorchReference(nn.Module):
    """`nn.Transformer` with aiayn's embeddings and output layer (shared, tied, sinusoids)."""

    def __init__(self, dropout: float = 0.1) -> None:
        super().__init__()
        self.embed = nn.Embedding(V, D, padding_idx=PAD_ID)
        nn.init.normal_(self.embed.weight, std=D**-0.5)
        self.register_buffer("pe", sinusoidal_positions(512, D), persistent=False)
        self.drop = nn.Dropout(dropout)
        self.core = nn.Transformer(D, H, L, L, F, dropout, batch_first=True)

    def forward(self, src_BS: Tensor, tgt_in_BT: Tensor) -> Tensor:
        src_pad, tgt_pad = src_BS == PAD_ID, tgt_in_BT == PAD_ID
        x = self.drop(self.embed(src_BS) * math.sqrt(D) + self.pe[: src_BS.size(1)])
        y = self.drop(self.embed(tgt_in_BT) * math.sqrt(D) + self.pe[: tgt_in_BT.size(1)])
        T = tgt_in_BT.size(1)  # bool masks throughout (True = hidden), like the padding masks
        causal = torch.ones(T, T, dtype=torch.bool).triu(1)
        out = self.core(
            x, y, tgt_mask=causal, tgt_is_causal=True, src_key_padding_mask=src_pad,
            tgt_key_padding_mask=tgt_pad, memory_key_padding_mask=src_pad,
        )
        return out @ self.embed.weight.t()


def make_batches(n_batches: int, seed: int) -> list:
    """Caption-like pairs (source 6-30 tokens, target within ±3), ~1,500 target tokens a batch."""
    rng = random.Random(seed)
    exs = []
    for _ in range(n_batches * 110):
        s = rng.randint(6, 30)
        t = max(2, s + rng.randint(-3, 3))
        src = (*(rng.randint(4, V - 1) for _ in range(s)), 3)
        exs.append(Example(src, tuple(rng.randint(4, V - 1) for _ in range(t))))
    plan = batch_plan(exs, 1700, seed=seed)
    return [collate(exs, idx) for idx in plan[:n_batches]]


def train_flops(src_BS: Tensor, tgt_BT: Tensor) -> float:
    """Matmul FLOPs of one training step on the padded batch (backward = 2 x forward)."""
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


def step(model: nn.Module, opt: torch.optim.Optimizer, batch, bf16: bool) -> float:
    t0 = time.perf_counter()
    opt.zero_grad(set_to_none=True)
    ctx = torch.autocast("cpu", torch.bfloat16) if bf16 else torch.autocast("cpu", enabled=False)
    with ctx:
        logits = model(batch.src_BS, batch.tgt_in_BT)
    loss, _ = label_smoothed_loss(logits.flatten(0, 1), batch.tgt_out_BT.flatten(), 0.1, PAD_ID)
    (loss / batch.n_tgt_tokens).backward()
    opt.step()
    return time.perf_counter() - t0


def run(dtype: str, batches: list, warmup: int, seed: int) -> dict[str, float]:
    torch.manual_seed(seed)
    ours = Transformer(ModelConfig(vocab_size=V, d_model=D, n_heads=H, n_layers=L, d_ff=F,
                                   dropout=0.1, max_len=512)).train()
    ref = TorchReference(0.1).train()
    models = {"aiayn": ours, "reference": ref}
    opts = {k: torch.optim.Adam(m.parameters(), lr=1e-4, betas=(0.9, 0.98), eps=1e-9)
            for k, m in models.items()}
    bf16 = dtype == "bf16"
    for b in batches[:warmup]:
        for k in models:
            step(models[k], opts[k], b, bf16)
    secs = {k: 0.0 for k in models}
    tokens = flops = 0.0
    pair_ratios = []  # reference time / aiayn time on the same batch, back to back
    for i, b in enumerate(batches[warmup:]):
        order = list(models) if i % 2 == 0 else list(reversed(models))  # alternate who goes first
        t = {k: step(models[k], opts[k], b, bf16) for k in order}
        for k in models:
            secs[k] += t[k]
        pair_ratios.append(t["reference"] / t["aiayn"])
        tokens += b.n_tgt_tokens
        flops += train_flops(b.src_BS, b.tgt_in_BT)
    out = {
        "aiayn_tok_s": tokens / secs["aiayn"],
        "reference_tok_s": tokens / secs["reference"],
        "aiayn_gflop_s": flops / secs["aiayn"] / 1e9,
        "reference_gflop_s": flops / secs["reference"] / 1e9,
    }
    out["ratio"] = out["aiayn_tok_s"] / out["reference_tok_s"]
    out["ratio_median_step"] = sorted(pair_ratios)[len(pair_ratios) // 2]  # robust to bursts
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=10, help="timed steps per model and dtype")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    t0 = time.perf_counter()
    batches = make_batches(args.warmup + args.steps, args.seed)
    result: dict[str, object] = {
        "config": {"d_model": D, "n_heads": H, "layers": L, "d_ff": F, "vocab": V,
                   "dropout": 0.1, "steps": args.steps, "warmup": args.warmup,
                   "tgt_tokens_per_batch": sum(b.n_tgt_tokens for b in batches) / len(batches)},
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "allocator": os.environ.get("LD_PRELOAD", ""),
    }
    for dtype in ("fp32", "bf16"):
        peak = matmul_peak(torch.float32 if dtype == "fp32" else torch.bfloat16)
        r = run(dtype, batches, args.warmup, args.seed)
        r["matmul_peak_gflop_s"] = peak
        r["aiayn_frac_of_peak"] = r["aiayn_gflop_s"] / peak
        r["reference_frac_of_peak"] = r["reference_gflop_s"] / peak
        result[dtype] = {k: round(v, 4) for k, v in r.items()}
        print(f"{dtype}: " + ", ".join(f"{k}={v:.3g}" for k, v in r.items()), flush=True)
    result["seconds"] = round(time.perf_counter() - t0, 1)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
