"""`aiayn generate` (a language model continues a prompt) and `aiayn evaluate --text` (its
loss on a text: nats per token, perplexity, bits per character and per byte)."""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

from aiayn.cli.flags import MAX_FLAG, add_device_flag, add_dtype_flag
from aiayn.errors import AiaynError

# The most new tokens one output may ask for from the command line (a server has its own).
MAX_NEW_TOKENS = 1_000_000


def add_generate(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "generate",
        help="continue a prompt with a language model (aiayn train --config lm)",
        description="Sample (or greedy / beam search) a continuation of each prompt. Tokens are "
        "printed as they are produced; with --input, one completion a line, in order.",
    )
    p.add_argument("--model", type=Path, required=True, help="a language model's directory")
    src = p.add_mutually_exclusive_group()
    src.add_argument("--prompt", help="the text to continue (default: empty, from BOS)")
    src.add_argument("--input", type=Path, help="UTF-8 prompts, one a line")
    p.add_argument(
        "--max-tokens", type=int, help="new tokens per output (default: the model's, 200)"
    )
    p.add_argument("--temperature", type=float, help="sampling temperature (default 1.0)")
    p.add_argument("--top-k", type=int, help="sample among the k likeliest; 0 = off (default)")
    p.add_argument("--top-p", type=float, help="nucleus sampling; 1.0 = off (default)")
    p.add_argument("--seed", type=int, help="the same seed gives the same text (default 0)")
    p.add_argument("--num-samples", type=int, default=1, help="samples per prompt (default 1)")
    how = p.add_mutually_exclusive_group()
    how.add_argument("--greedy", action="store_true", help="the likeliest token each step")
    how.add_argument("--beam", type=int, help="beam search of this width (stops at the context)")
    p.add_argument("--threads", type=int, default=0, help="torch threads; 0 = its default")
    add_device_flag(p)
    add_dtype_flag(p)


def run_generate(args: argparse.Namespace) -> int:
    import logging

    from aiayn.generate.generator import Generator
    from aiayn.runtime.device import set_threads

    given: dict[str, Any] = {}
    if args.max_tokens is not None:
        if not 1 <= args.max_tokens <= MAX_NEW_TOKENS:
            raise AiaynError(
                f"--max-tokens must be in [1, {MAX_NEW_TOKENS:,}], got {args.max_tokens}"
            )
        given.update(max_len_a=0.0, max_len_b=args.max_tokens)
    for name in ("temperature", "top_k", "top_p", "seed"):
        if getattr(args, name) is not None:
            given[name] = getattr(args, name)
    if args.top_k is not None and args.top_k < 1:
        raise AiaynError(
            f"--top-k must be at least 1 (leave it out for no limit), got {args.top_k}"
        )
    if not 1 <= args.num_samples <= 1024:
        raise AiaynError(f"--num-samples must be in [1, 1024], got {args.num_samples}")
    if args.greedy or args.beam is not None:
        if args.num_samples > 1:
            raise AiaynError("--num-samples draws samples: leave out --greedy and --beam")
        given.update(sample=False, beam_size=args.beam or 1)
    else:
        given.update(sample=True, nbest=args.num_samples)
    prompts = _prompts(args)
    set_threads(args.threads)
    logging.basicConfig(level=logging.WARNING, format="aiayn: %(message)s")
    gen = Generator.load(args.model, device=args.device, dtype=args.dtype)
    cfg = gen.settings(**given)
    n = cfg.nbest if cfg.sample else 1
    out = sys.stdout
    if args.input is None:
        if n == 1 and (cfg.sample or cfg.beam_size == 1):  # streamed as it is produced
            out.write(prompts[0])
            out.flush()
            gen.generate_all(prompts, cfg, on_token=lambda _row, text: _write(out, text))
            out.write("\n")
            return 0
        found = gen.generate_all(prompts, cfg)
        out.write("\n---\n".join(prompts[0] + g.text for g in found[0]) + "\n")
        return 0
    for a in range(0, len(prompts), 64):
        found = gen.generate_all(prompts[a : a + 64], cfg, first_line_no=a + 1)
        for gens in found:
            for g in gens:
                out.write(" ".join(g.text.splitlines()) + "\n")  # one line each, in order
        out.flush()
    return 0


def _write(out: Any, text: str) -> None:
    out.write(text)
    out.flush()


def _prompts(args: argparse.Namespace) -> list[str]:
    if args.input is None:
        return [args.prompt or ""]
    from aiayn.text.lm_data import read_text

    data = args.input.read_bytes()
    if not data:
        return []
    return read_text(args.input).split("\n")[: None if not data.endswith(b"\n") else -1]


def run_evaluate_text(args: argparse.Namespace) -> int:
    """`aiayn evaluate --model LM --text FILE`: the model's loss on the text."""
    from aiayn.generate.scoring import score_text

    if args.threads and not 0 < args.threads <= MAX_FLAG:
        raise AiaynError(f"--threads must be >= 0, got {args.threads}")
    result = score_text(
        args.model, args.text, device=args.device, dtype=args.dtype, threads=args.threads
    )
    if args.json:
        print(json.dumps(result))
        return 0
    print(
        f"{result['tokens']:,} tokens scored: {result['nats_per_token']:.4f} nats/token, "
        f"perplexity {result['perplexity']:.2f}, {result['bits_per_char']:.4f} bits/char, "
        f"{result['bits_per_byte']:.4f} bits/byte"
    )
    if not math.isfinite(result["perplexity"]):
        return 1
    return 0
