"""`aiayn generate` (a language model continues a prompt) and `aiayn evaluate --text` (its
loss on a text: nats per token, perplexity, bits per character and per byte)."""

from __future__ import annotations

import argparse
import itertools
import json
import math
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from aiayn.cli.flags import add_device_flag, add_dtype_flag
from aiayn.errors import AiaynError

if TYPE_CHECKING:  # imported when the command runs: `aiayn --help` stays fast
    from aiayn.generate.generator import Generator

# The most new tokens one output may ask for from the command line (a server has its own).
MAX_NEW_TOKENS = 1_000_000
PROMPTS_A_BUFFER = 64  # --input's prompts read, generated and written at a time (at most)
# Output tokens held at once (a buffer's prompts x samples x --max-tokens): each is a Python
# int in its row's list until the row ends, ~40 bytes, so this bound is ~400 MB.
MAX_HELD_TOKENS = 10_000_000


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
    per_prompt = args.num_samples * (args.max_tokens or 0)
    if per_prompt > MAX_HELD_TOKENS:
        raise AiaynError(
            f"--num-samples x --max-tokens = {per_prompt:,} tokens held at once; at most "
            f"{MAX_HELD_TOKENS:,}"
        )
    if args.greedy or args.beam is not None:
        if args.num_samples > 1:
            raise AiaynError("--num-samples draws samples: leave out --greedy and --beam")
        given.update(sample=False, beam_size=args.beam or 1)
    else:
        given.update(sample=True, nbest=args.num_samples)
    set_threads(args.threads)
    logging.basicConfig(level=logging.WARNING, format="aiayn: %(message)s")
    gen = _load(args)
    cfg = gen.settings(**given)
    n = cfg.nbest if cfg.sample else 1
    out = sys.stdout
    if args.input is None:
        prompts = [args.prompt or ""]
        if n == 1 and (cfg.sample or cfg.beam_size == 1):  # streamed as it is produced
            out.write(prompts[0])
            out.flush()
            gen.generate_all(prompts, cfg, on_token=lambda _row, text: _write(out, text))
            out.write("\n")
            return 0
        found = gen.generate_all(prompts, cfg)
        out.write("\n---\n".join(prompts[0] + g.text for g in found[0]) + "\n")
        return 0
    from aiayn.text.corpus import read_lines

    with args.input.open("rb") as f:  # streamed: a buffer of prompts at a time
        lines, line_no = read_lines(f, str(args.input)), 1
        held = (cfg.nbest if cfg.sample else cfg.beam_size) * cfg.max_len_b
        buffer = max(1, min(PROMPTS_A_BUFFER, MAX_HELD_TOKENS // max(held, 1)))
        while chunk := list(itertools.islice(lines, buffer)):
            for gens in gen.generate_all(chunk, cfg, first_line_no=line_no):
                for g in gens:  # each sample one line, a prompt's samples together, in order
                    out.write(" ".join(g.text.splitlines()) + "\n")
            out.flush()
            line_no += len(chunk)
    return 0


def _load(args: argparse.Namespace) -> Generator:
    """The model's generator: aiayn's, or an export's engine (ONNX Runtime, CTranslate2)."""
    from aiayn.generate.generator import Generator
    from aiayn.store.directory import is_export_dir

    if not is_export_dir(args.model):
        return Generator.load(args.model, device=args.device, dtype=args.dtype)
    if args.device not in ("auto", "cpu") or args.dtype not in ("auto", "fp32"):
        raise AiaynError("an exported model runs on the CPU in fp32: leave out --device/--dtype")
    from aiayn.interop.lm_engines import load_generator

    return load_generator(args.model, threads=args.threads)


def _write(out: Any, text: str) -> None:
    out.write(text)
    out.flush()


def run_evaluate_text(args: argparse.Namespace) -> int:
    """`aiayn evaluate --model LM --text FILE`: the model's loss on the text."""
    from aiayn.generate.scoring import score_text

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
