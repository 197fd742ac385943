"""Flags and settings shared by several commands: device, dtype, the search's flags, and loading
a translator with the search settings a command was given.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING, Any

from aiayn.errors import AiaynError

MAX_FLAG = 2**31 - 1  # the most any count or number of seconds may be (a signed 32-bit int)

if TYPE_CHECKING:  # imported lazily at run time: `aiayn --help` stays fast
    from aiayn.config import DecodeConfig
    from aiayn.translate.translator import Translator


def add_device_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--device",
        default="auto",
        help="auto | cpu | cuda | cuda:N | mps (default auto: a GPU if there is one, else CPU)",
    )


def add_dtype_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--dtype",
        choices=("auto", "fp32", "bf16"),
        default="auto",
        help="arithmetic: auto = bf16 on a GPU with native bf16, else fp32 (docs/decoding.md)",
    )


def add_search_flags(p: argparse.ArgumentParser) -> None:
    # Search flags default to None: "the model's own settings", i.e. the [decode] table of the
    # run that made it (docs/decoding.md), falling back to the paper's beam 4, alpha 0.6.
    p.add_argument(
        "--model",
        type=Path,
        required=True,
        help="a model directory (aiayn train), or one written by aiayn export (runs in its engine)",
    )
    p.add_argument("--beam", type=int, help="beam size; 1 = greedy (default: the model's, or 4)")
    add_length_penalty_flags(p)
    p.add_argument("--min-len", type=int, help="no EOS before this many tokens (default 0)")
    p.add_argument("--max-len-a", type=float, help="max length = a * src_len + b (default 1.0)")
    p.add_argument("--max-len-b", type=int, help="(default 50)")
    p.add_argument(
        "--max-tokens",
        type=int,
        help="at most this many output tokens per sentence (default 0: the model's max_len)",
    )
    add_sampling_flags(p, "--top-k", "sample instead of searching")
    p.add_argument("--batch-tokens", type=int, default=2048, help="source tokens per batch")
    p.add_argument(
        "--threads",
        type=int,
        default=0,
        help="torch (or the export's engine) threads; 0 = its default",
    )
    add_device_flag(p)
    add_dtype_flag(p)


def add_length_penalty_flags(p: argparse.ArgumentParser) -> None:
    """--alpha and --length-penalty, which translate, evaluate and explain share."""
    p.add_argument("--alpha", type=float, help="length penalty α (default: the model's, or 0.6)")
    p.add_argument(
        "--length-penalty",
        choices=("gnmt", "power"),
        help="a finished hypothesis's log-probability is divided by ((5 + |Y|) / 6) "
        "** α (gnmt, the paper's) or |Y| ** α (power: fairseq's --lenpen, "
        "Hugging Face, CTranslate2); default: the model's, or gnmt",
    )


def add_sampling_flags(p: argparse.ArgumentParser, top_k_flag: str, sample_help: str) -> None:
    """The sampling flags translate, evaluate and explain share (explain's --top-k counts the
    candidates it shows, so its sampling top-k is --sample-top-k)."""
    p.add_argument("--sample", action="store_true", help=sample_help)
    p.add_argument("--temperature", type=float, help="with --sample (default 1.0)")
    p.add_argument(top_k_flag, type=int, help="with --sample; 0 = off (default)")
    p.add_argument("--top-p", type=float, help="with --sample; 1.0 = off (default)")
    p.add_argument(
        "--seed", type=int, help="with --sample (default 0); line n samples from (seed, n)"
    )


def given_search_settings(args: argparse.Namespace, flags: dict[str, str]) -> dict[str, Any]:
    """The DecodeConfig fields the command line set (`flags`: field -> argparse dest)."""
    given: dict[str, Any] = {
        f: getattr(args, a) for f, a in flags.items() if getattr(args, a, None) is not None
    }
    if args.sample:
        given["sample"] = True
    return given


SEARCH_FLAGS = {  # DecodeConfig field -> argparse dest
    "beam_size": "beam",
    "alpha": "alpha",
    "length_penalty": "length_penalty",
    "min_len": "min_len",
    "max_len_a": "max_len_a",
    "max_len_b": "max_len_b",
    "max_tokens": "max_tokens",
    "nbest": "nbest",
    "temperature": "temperature",
    "top_k": "top_k",
    "top_p": "top_p",
    "seed": "seed",
}


def decode_setup(args: argparse.Namespace) -> tuple[Translator, DecodeConfig]:
    """The flags given, over the model's saved search settings; checked before the model loads."""
    import dataclasses
    import logging

    from aiayn.config import check_decode_config
    from aiayn.interop.engines import load_translator
    from aiayn.nn.model import Transformer
    from aiayn.runtime.device import resolve_device, set_threads
    from aiayn.store.directory import ModelDir, is_export_dir
    from aiayn.translate.translator import Translator

    given = given_search_settings(args, SEARCH_FLAGS)
    if not is_export_dir(args.model):  # a missing device is said before any file is read
        resolve_device(args.device)
    opened = ModelDir.open(args.model)  # the one reading of the directory's description
    if not opened.is_export:
        opened.require(Transformer)  # a language model: say which commands take it
    cfg = dataclasses.replace(opened.decode, **given)
    check_decode_config(cfg)
    if args.batch_tokens < 1:
        raise AiaynError(f"--batch-tokens must be at least 1, got {args.batch_tokens}")
    set_threads(args.threads)
    logging.basicConfig(level=logging.INFO, format="aiayn: %(message)s")  # show warnings
    if opened.is_export:  # CTranslate2 or ONNX Runtime runs it (docs/export.md)
        translator = load_translator(
            opened, cfg, device=args.device, dtype=args.dtype, threads=args.threads
        )
        return translator, cfg
    return Translator.load(opened, cfg, device=args.device, dtype=args.dtype), cfg


def refuse_export_dir(directory: Path | None, command: str) -> None:
    """The glass box needs aiayn's own model: say so for an exported directory."""
    from aiayn.store.directory import is_export_dir

    if directory is not None and is_export_dir(directory):
        raise AiaynError(
            f"{command} needs an aiayn model directory; {directory} was written by aiayn "
            "export (translate and evaluate run it)"
        )
