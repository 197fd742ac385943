"""Decoding speed: aiayn (KV cache, no cache, beam 4) against Hugging Face MarianMT generate().

Same process, same dims on both sides, random weights. `--size small` (the default on CPU):
d_model 256, 4 heads, 3+3 layers, d_ff 1024, vocab 8000, 32 source sentences of about 24
tokens, exactly 32 output tokens each. `--size paper_base` (the default with `--device cuda`):
the paper's base model (d_model 512, 8 heads, 6+6 layers, d_ff 2048) with a 37,000 vocabulary,
sources of about 64 tokens and exactly 64 output tokens. EOS is forbidden until the output
length, which is also the limit (aiayn `min_len = max_len`, HF `min_new_tokens =
max_new_tokens`). The timed runs are interleaved (aiayn, HF, aiayn, HF, ...) so load from
other processes hits both alike; each figure is the median over the repetitions, in output
tokens per wall-clock second, and on CPU also per CPU-second of this process
(`per_cpu_second`). The last line printed is one JSON object.

    python bench/decode_speed.py [--reps 5] [--threads 1]
    python bench/decode_speed.py --device cuda [--size paper_base] [--reps 10]

CPU: fp32, threads default to 1 (on the shared 2-core machine the figures in
docs/lab/decoding.md come from, two OpenMP threads per process lose badly to the other
processes' load, both sides). CUDA: both sides run under bf16 autocast, with
`torch.cuda.synchronize()` around every timed run and `--warmup` untimed runs first; MFU is
reported against the device's dense bf16 peak (bench/device_info.py). It counts 2 FLOPs per
weight that one decoding step multiplies (per layer W^Q, W^K, W^V, W^O of self-attention,
W^Q and W^O of cross-attention, the FFN; plus the output projection) per row and step, i.e.
per output token for greedy and per beam and token for beam search. Not counted: the encoder
and cross-attention K/V (once per sentence) and the attention scores, so it is a lower bound.
No CUDA graphs or torch.compile here: a step's cache length grows by one every step and the
search loop is Python, so neither is a simple drop-in (HF's static cache would be the model).

Needs the `bench` extra (`pip install -e .[bench]`) for transformers; aiayn never imports it.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

import device_info
import torch

from aiayn.config import BOS_ID, EOS_ID, PAD_ID, DecodeConfig, ModelConfig
from aiayn.nn.model import Transformer
from aiayn.runtime.memory import keep_freed_memory
from aiayn.search.decode import beam_search, greedy_search


@dataclass(frozen=True)
class Size:
    d_model: int
    heads: int
    layers: int
    d_ff: int
    vocab: int
    src_len: int  # mean source length; sources are src_len - 4 .. src_len + 4 tokens
    out_len: int  # output tokens per sentence, exactly
    sentences: int  # one batch

    def step_weights(self) -> int:
        """Weights one decoding step multiplies per row (what MFU counts, x 2 FLOPs)."""
        D, F = self.d_model, self.d_ff
        return self.layers * (6 * D * D + 2 * D * F) + D * self.vocab


SIZES = {
    "small": Size(256, 4, 3, 1024, 8000, 24, 32, 32),
    "paper_base": Size(512, 8, 6, 2048, 37000, 64, 64, 32),
}


def sources(size: Size, seed: int = 0) -> torch.Tensor:
    """Right-padded sources of src_len - 4 .. src_len + 4 tokens, each ending in EOS."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(size.src_len - 4, size.src_len + 5, (size.sentences,), generator=g)
    src = torch.full((size.sentences, int(lengths.max())), PAD_ID)
    for i, n in enumerate(lengths.tolist()):
        src[i, : n - 1] = torch.randint(4, size.vocab, (n - 1,), generator=g)
        src[i, n - 1] = EOS_ID
    return src


def hf_model(size: Size) -> torch.nn.Module:
    from transformers import MarianConfig, MarianMTModel

    cfg = MarianConfig(
        vocab_size=size.vocab, d_model=size.d_model, encoder_layers=size.layers,
        decoder_layers=size.layers, encoder_attention_heads=size.heads,
        decoder_attention_heads=size.heads, encoder_ffn_dim=size.d_ff, decoder_ffn_dim=size.d_ff,
        max_position_embeddings=256, activation_function="relu", dropout=0.0,
        attention_dropout=0.0, activation_dropout=0.0, scale_embedding=True,
        pad_token_id=PAD_ID, eos_token_id=EOS_ID, decoder_start_token_id=BOS_ID,
        forced_eos_token_id=None,
    )  # fmt: skip
    torch.manual_seed(0)
    return MarianMTModel(cfg).eval()


def timed(
    fn: Callable[[], object], check: Callable[[object], None], device: torch.device
) -> tuple[float, float]:
    """(wall seconds, CPU seconds of this process) for one call; then check its output."""
    device_info.sync(device)  # nothing queued from before counts
    wall, cpu = time.perf_counter(), time.process_time()
    out = fn()
    device_info.sync(device)  # the GPU's work counts, not only its launch
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    check(out)
    return wall, cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--size", choices=sorted(SIZES), help="default: small on CPU, "
                        "paper_base on CUDA")  # fmt: skip
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=1, help="untimed runs of each first")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (0 = default)")
    args = parser.parse_args()
    keep_freed_memory()  # malloc as aiayn's commands set it, for every side measured here
    device = device_info.require_device(args.device)
    size_name = args.size or ("paper_base" if device.type == "cuda" else "small")
    size = SIZES[size_name]
    if args.threads:
        torch.set_num_threads(args.threads)

    import transformers

    torch.manual_seed(0)
    ours = Transformer(
        ModelConfig(vocab_size=size.vocab, d_model=size.d_model, n_heads=size.heads,
                    n_layers=size.layers, d_ff=size.d_ff, dropout=0.0, max_len=256)
    ).eval().to(device)  # fmt: skip
    hf = hf_model(size).to(device)
    src = sources(size).to(device)
    mask = src != PAD_ID
    n_out = size.out_len
    forced = dict(min_len=n_out, max_len_a=0.0, max_len_b=n_out)
    greedy_cfg = DecodeConfig(beam_size=1, **forced)  # type: ignore[arg-type]
    beam_cfg = DecodeConfig(beam_size=4, **forced)  # type: ignore[arg-type]
    hf_kw = dict(min_new_tokens=n_out, max_new_tokens=n_out, do_sample=False)

    def precision() -> contextlib.AbstractContextManager[object]:
        # CUDA: bf16 autocast on both sides (tensor cores); CPU: fp32, as before.
        if device.type == "cuda":
            return torch.autocast("cuda", dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def ours_run(cfg: DecodeConfig, **kw: bool) -> object:
        with precision():
            search = greedy_search if cfg.beam_size == 1 else beam_search
            return search(ours, src, cfg, **kw)

    def hf_generate(beams: int) -> torch.Tensor:
        with torch.inference_mode(), precision():
            return hf.generate(input_ids=src, attention_mask=mask, num_beams=beams, **hf_kw)

    def check_ours(out: object) -> None:
        hyps = [h if not isinstance(h, list) else h[0] for h in out]  # type: ignore[attr-defined]
        assert all(len(h.tokens) == n_out and not h.eos for h in hyps)

    def check_hf(out: object) -> None:
        assert out.shape == (size.sentences, n_out + 1)  # type: ignore[attr-defined]  # start + n
        assert not (out[:, 1:] == EOS_ID).any()  # type: ignore[index]

    runs: dict[str, tuple[Callable[[], object], Callable[[object], None]]] = {
        "aiayn_greedy": (lambda: ours_run(greedy_cfg), check_ours),
        "aiayn_greedy_nocache": (lambda: ours_run(greedy_cfg, use_cache=False), check_ours),
        "hf_greedy": (lambda: hf_generate(1), check_hf),
        "aiayn_beam4": (lambda: ours_run(beam_cfg), check_ours),
        "hf_beam4": (lambda: hf_generate(4), check_hf),
    }
    for _ in range(args.warmup):  # warm-up (and a check that both sides make n_out tokens)
        for fn, check in runs.values():
            timed(fn, check, device)
    seconds: dict[str, list[float]] = {name: [] for name in runs}
    cpu_seconds: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(args.reps):
        for name, (fn, check) in runs.items():
            wall, cpu = timed(fn, check, device)
            seconds[name].append(wall)
            cpu_seconds[name].append(cpu)
    tokens = size.sentences * n_out
    tok_s = {name: tokens / statistics.median(s) for name, s in seconds.items()}
    # Tokens per CPU-second: less sensitive to other processes' load than wall time (with one
    # thread it is the speed on an idle core; with more it also counts threads' spin-waiting).
    tok_cpu_s = {name: tokens / statistics.median(s) for name, s in cpu_seconds.items()}
    peak, peak_note = device_info.gpu_peak_flops(device)

    def mfu(name: str, rows_per_sentence: int) -> float | None:
        if peak is None:
            return None
        flops_per_token = 2 * size.step_weights() * rows_per_sentence
        return round(tok_s[name] * flops_per_token / peak, 4)

    for name in runs:
        print(f"{name:22s} {tok_s[name]:8.0f} tok/s wall   {tok_cpu_s[name]:8.0f} tok/CPU-s")
    result = {
        "greedy": {
            "aiayn_tok_s": round(tok_s["aiayn_greedy"]),
            "hf_tok_s": round(tok_s["hf_greedy"]),
            "ratio": round(tok_s["aiayn_greedy"] / tok_s["hf_greedy"], 2),
            "aiayn_nocache_tok_s": round(tok_s["aiayn_greedy_nocache"]),
            "aiayn_mfu": mfu("aiayn_greedy", 1),
            "hf_mfu": mfu("hf_greedy", 1),
        },
        "beam4": {
            "aiayn_tok_s": round(tok_s["aiayn_beam4"]),
            "hf_tok_s": round(tok_s["hf_beam4"]),
            "ratio": round(tok_s["aiayn_beam4"] / tok_s["hf_beam4"], 2),
            "aiayn_mfu": mfu("aiayn_beam4", 4),
            "hf_mfu": mfu("hf_beam4", 4),
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
        "mfu_peak": peak_note,
        "size": {"name": size_name, **asdict(size)},
        "precision": "bf16 autocast" if device.type == "cuda" else "fp32",
        "load_average": os.getloadavg()[0],
        "sentences": size.sentences,
        "output_tokens": n_out,
        "reps": args.reps,
        "warmup": args.warmup,
        "threads": torch.get_num_threads(),
        "allocator": device_info.allocator(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "cpu": device_info.cpu_model(),
        "machine": device_info.machine(device),
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
