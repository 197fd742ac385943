"""Sampling speed of a decoder-only LM: aiayn's search (what `aiayn generate` runs) against
Hugging Face `GPT2LMHeadModel.generate()`, on the same function.

One randomly initialised GPT-2 is built, of nanoGPT's CPU-example size (`--size cpu`: 4 layers,
4 heads, d_model 128) or of its shakespeare_char size (`--size char`: 6 layers, 6 heads, d_model
384), context 256 and a 512-token vocabulary either way; it is built with transformers and
opened in aiayn through `aiayn import gpt2` (`aiayn.interop.gpt2`: logits equal within 1e-4), so
both sides compute the same model. Both sample with the same settings (temperature 0.8, top-k
200: nanoGPT's sample.py), the KV cache on both, exactly `--new` tokens each (EOS forbidden
until then: aiayn `min_len`, HF `min_new_tokens`), from prompts of 16 tokens, at batch 1 and
batch 8. The timed runs are interleaved (aiayn, HF, aiayn, HF, ...) in one process on one
thread, so load from other processes hits both alike; each figure is the median over `--reps`,
in new tokens per second. The last line printed is one JSON object.

    python bench/lm_generate_speed.py [--size cpu|char] [--reps 7] [--new 200] [--threads 1]

Needs transformers (the `bench` or `test` extra); aiayn never imports it.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import tempfile
import time
from pathlib import Path

import torch

from aiayn.config import DecodeConfig
from aiayn.interop.gpt2 import import_gpt2
from aiayn.runtime.device import set_threads
from aiayn.search.decode import search
from aiayn.store.model_dir import load_model_dir

VOCAB, CONTEXT, PROMPT = 512, 256, 16
SIZES = {"cpu": (4, 4, 128), "char": (6, 6, 384)}  # layers, heads, width (nanoGPT's configs)


def build(tmp: Path, size: str = "cpu") -> tuple[torch.nn.Module, torch.nn.Module]:
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    cfg = GPT2Config(
        vocab_size=VOCAB,
        n_positions=CONTEXT,
        n_embd=SIZES[size][2],
        n_layer=SIZES[size][0],
        n_head=SIZES[size][1],
        bos_token_id=VOCAB - 1,
        eos_token_id=VOCAB - 1,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
    )
    hf = GPT2LMHeadModel(cfg).eval()
    hf.save_pretrained(tmp / "hf", safe_serialization=True)
    import_gpt2(tmp / "hf", tmp / "aiayn")
    return hf, load_model_dir(tmp / "aiayn").eval()


def time_both(
    lm: torch.nn.Module, hf: torch.nn.Module, src_BS: torch.Tensor, new: int, reps: int
) -> tuple[float, float]:
    """Median new tokens per second of aiayn's sampling and HF's, interleaved runs."""
    batch = src_BS.size(0)
    cfg = DecodeConfig(
        beam_size=1,
        sample=True,
        temperature=0.8,
        top_k=200,
        max_len_a=0.0,
        max_len_b=new,
        min_len=new,
        seed=3,
    )

    def aiayn_run() -> int:
        hyps = search(lm, src_BS, cfg, row_seeds=list(range(batch)))
        return sum(len(h[0].tokens) for h in hyps)

    def hf_run() -> int:
        with torch.inference_mode():
            ids = hf.generate(
                src_BS,
                attention_mask=torch.ones_like(src_BS),
                do_sample=True,
                temperature=0.8,
                top_k=200,
                max_new_tokens=new,
                min_new_tokens=new,
                pad_token_id=VOCAB - 1,
                use_cache=True,
            )
        return (ids.size(1) - src_BS.size(1)) * batch

    rates: dict[str, list[float]] = {"aiayn": [], "hf": []}
    aiayn_run(), hf_run()  # warm up both
    for _ in range(reps):
        for name, fn in (("aiayn", aiayn_run), ("hf", hf_run)):
            t0 = time.perf_counter()
            n = fn()
            rates[name].append(n / (time.perf_counter() - t0))
    return statistics.median(rates["aiayn"]), statistics.median(rates["hf"])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--size", choices=sorted(SIZES), default="cpu")
    p.add_argument("--reps", type=int, default=7)
    p.add_argument("--new", type=int, default=200, help="new tokens per prompt")
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args()
    set_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        hf, lm = build(Path(tmp), args.size)
    g = torch.Generator().manual_seed(1)
    out: dict[str, object] = {
        "model": "GPT-2 layout, {} layers, {} heads, d_model {}, vocab 512, context 256".format(
            *SIZES[args.size]
        ),
        "sampling": "temperature 0.8, top-k 200",
        "new_tokens": args.new,
        "prompt_tokens": PROMPT,
        "threads": args.threads,
        "torch": torch.__version__,
        "cpu": platform.processor() or platform.machine(),
    }
    for batch in (1, 8):
        prompts_BS = torch.randint(0, VOCAB - 1, (batch, PROMPT), generator=g)
        src_BS = torch.cat([torch.full((batch, 1), VOCAB - 1), prompts_BS], 1)  # BOS first
        a, h = time_both(lm, hf, src_BS, args.new, args.reps)
        out[f"batch_{batch}"] = {
            "aiayn_tokens_per_s": round(a, 1),
            "hf_tokens_per_s": round(h, 1),
            "ratio": round(a / h, 2),
        }
        print(f"batch {batch}: aiayn {a:,.0f} tok/s, HF {h:,.0f} tok/s, ratio {a / h:.2f}")
    print(json.dumps(out))


if __name__ == "__main__":
    main()
