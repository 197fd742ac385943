"""Decoding speed: aiayn (KV cache, no cache, beam 4) against Hugging Face MarianMT generate().

Same process, same dims (d_model 256, 4 heads, 3+3 layers, d_ff 1024, vocab 8000, random
weights), 32 source sentences of about 24 tokens, batch 32, and exactly 32 output tokens per
sentence on both sides (EOS is forbidden until 32 tokens, which is also the limit:
aiayn `min_len = max_len = 32`, HF `min_new_tokens = max_new_tokens = 32`). The timed runs are
interleaved (aiayn, HF, aiayn, HF, ...) so load from other processes hits both alike; each
figure is the median over the repetitions, in output tokens per wall-clock second, and also per
CPU-second of this process (`per_cpu_second`). The last line printed is one JSON object.

    python bench/decode_speed.py [--reps 5] [--threads 1]

Threads default to 1: on the shared 2-core machine the figures in docs/benchmarks.md come
from, two OpenMP threads per process lose badly to the other processes' load (both sides).

Needs the `bench` extra (`pip install -e .[bench]`) for transformers; aiayn never imports it.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from collections.abc import Callable

import torch

from aiayn.config import BOS_ID, EOS_ID, PAD_ID, DecodeConfig, ModelConfig
from aiayn.decode import beam_search, greedy_search
from aiayn.model import Transformer

D_MODEL, HEADS, LAYERS, D_FF, VOCAB = 256, 4, 3, 1024, 8000
N_SENT, SRC_LEN, OUT_LEN = 32, 24, 32


def sources(seed: int = 0) -> torch.Tensor:
    """32 right-padded sources of 20..28 tokens (mean ~24), each ending in EOS."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(SRC_LEN - 4, SRC_LEN + 5, (N_SENT,), generator=g)
    src = torch.full((N_SENT, int(lengths.max())), PAD_ID)
    for i, n in enumerate(lengths.tolist()):
        src[i, : n - 1] = torch.randint(4, VOCAB, (n - 1,), generator=g)
        src[i, n - 1] = EOS_ID
    return src


def hf_model() -> torch.nn.Module:
    from transformers import MarianConfig, MarianMTModel

    cfg = MarianConfig(
        vocab_size=VOCAB, d_model=D_MODEL, encoder_layers=LAYERS, decoder_layers=LAYERS,
        encoder_attention_heads=HEADS, decoder_attention_heads=HEADS, encoder_ffn_dim=D_FF,
        decoder_ffn_dim=D_FF, max_position_embeddings=256, activation_function="relu",
        dropout=0.0, attention_dropout=0.0, activation_dropout=0.0, scale_embedding=True,
        pad_token_id=PAD_ID, eos_token_id=EOS_ID, decoder_start_token_id=BOS_ID,
        forced_eos_token_id=None,
    )  # fmt: skip
    torch.manual_seed(0)
    return MarianMTModel(cfg).eval()


def timed(fn: Callable[[], object], check: Callable[[object], None]) -> tuple[float, float]:
    """(wall seconds, CPU seconds of this process) for one call; then check its output."""
    wall, cpu = time.perf_counter(), time.process_time()
    out = fn()
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    check(out)
    return wall, cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (0 = default)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    import transformers

    torch.manual_seed(0)
    ours = Transformer(
        ModelConfig(vocab_size=VOCAB, d_model=D_MODEL, n_heads=HEADS, n_layers=LAYERS, d_ff=D_FF,
                    dropout=0.0, max_len=256)
    ).eval()  # fmt: skip
    hf = hf_model()
    src = sources()
    mask = src != PAD_ID
    forced = dict(min_len=OUT_LEN, max_len_a=0.0, max_len_b=OUT_LEN)
    greedy_cfg = DecodeConfig(beam_size=1, **forced)  # type: ignore[arg-type]
    beam_cfg = DecodeConfig(beam_size=4, **forced)  # type: ignore[arg-type]
    hf_kw = dict(min_new_tokens=OUT_LEN, max_new_tokens=OUT_LEN, do_sample=False)

    def hf_generate(beams: int) -> torch.Tensor:
        with torch.inference_mode():
            return hf.generate(input_ids=src, attention_mask=mask, num_beams=beams, **hf_kw)

    def check_ours(out: object) -> None:
        hyps = [h if not isinstance(h, list) else h[0] for h in out]  # type: ignore[attr-defined]
        assert all(len(h.tokens) == OUT_LEN and not h.eos for h in hyps)

    def check_hf(out: object) -> None:
        assert out.shape == (N_SENT, OUT_LEN + 1)  # type: ignore[attr-defined]  # start + 32
        assert not (out[:, 1:] == EOS_ID).any()  # type: ignore[index]

    runs: dict[str, tuple[Callable[[], object], Callable[[object], None]]] = {
        "aiayn_greedy": (lambda: greedy_search(ours, src, greedy_cfg), check_ours),
        "aiayn_greedy_nocache": (
            lambda: greedy_search(ours, src, greedy_cfg, use_cache=False),
            check_ours,
        ),
        "hf_greedy": (lambda: hf_generate(1), check_hf),
        "aiayn_beam4": (lambda: beam_search(ours, src, beam_cfg), check_ours),
        "hf_beam4": (lambda: hf_generate(4), check_hf),
    }
    for fn, check in runs.values():  # warm-up (and a check that both sides make 32 tokens)
        timed(fn, check)
    seconds: dict[str, list[float]] = {name: [] for name in runs}
    cpu_seconds: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(args.reps):
        for name, (fn, check) in runs.items():
            wall, cpu = timed(fn, check)
            seconds[name].append(wall)
            cpu_seconds[name].append(cpu)
    tokens = N_SENT * OUT_LEN
    tok_s = {name: tokens / statistics.median(s) for name, s in seconds.items()}
    # Tokens per CPU-second: less sensitive to other processes' load than wall time (with one
    # thread it is the speed on an idle core; with more it also counts threads' spin-waiting).
    tok_cpu_s = {name: tokens / statistics.median(s) for name, s in cpu_seconds.items()}
    for name in runs:
        print(f"{name:22s} {tok_s[name]:8.0f} tok/s wall   {tok_cpu_s[name]:8.0f} tok/CPU-s")
    result = {
        "greedy": {
            "aiayn_tok_s": round(tok_s["aiayn_greedy"]),
            "hf_tok_s": round(tok_s["hf_greedy"]),
            "ratio": round(tok_s["aiayn_greedy"] / tok_s["hf_greedy"], 2),
            "aiayn_nocache_tok_s": round(tok_s["aiayn_greedy_nocache"]),
        },
        "beam4": {
            "aiayn_tok_s": round(tok_s["aiayn_beam4"]),
            "hf_tok_s": round(tok_s["hf_beam4"]),
            "ratio": round(tok_s["aiayn_beam4"] / tok_s["hf_beam4"], 2),
        },
        "cache_speedup": round(tok_s["aiayn_greedy"] / tok_s["aiayn_greedy_nocache"], 2),
        "per_cpu_second": {
            "greedy_ratio": round(tok_cpu_s["aiayn_greedy"] / tok_cpu_s["hf_greedy"], 2),
            "beam4_ratio": round(tok_cpu_s["aiayn_beam4"] / tok_cpu_s["hf_beam4"], 2),
            "cache_speedup": round(
                tok_cpu_s["aiayn_greedy"] / tok_cpu_s["aiayn_greedy_nocache"], 2
            ),
            **{f"{name}_tok_s": round(v) for name, v in tok_cpu_s.items()},
        },
        "load_average": os.getloadavg()[0],
        "sentences": N_SENT,
        "output_tokens": OUT_LEN,
        "reps": args.reps,
        "threads": torch.get_num_threads(),
        "allocator": os.environ.get("LD_PRELOAD", ""),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "cpu": platform.processor() or platform.machine(),
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
