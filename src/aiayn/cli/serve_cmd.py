"""`aiayn serve`: its flags, and the server's options built from them."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from aiayn.cli.flags import MAX_FLAG, add_device_flag, add_dtype_flag
from aiayn.errors import AiaynError

MAX_WINDOW_MS = 10_000  # a longer wait to gather requests only delays every one of them


def add_serve(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "serve",
        help="an HTTP translation (LibreTranslate-compatible), language model or classifier "
        "server, and the live glass box page",
        description="Serve a model directory over HTTP: GET / is the glass box page, POST "
        "/translate speaks LibreTranslate's API, /v1/translate and /v1/explain are aiayn's own, "
        "/metrics is Prometheus. A language model's directory (a DecoderLM) is served instead "
        "at POST /v1/generate and /v1/explain/lm, its page showing the next-token distribution; "
        "a classifier's (an EncoderClassifier, or its ONNX export) at POST /v1/classify and "
        "/v1/explain/classify. "
        "Needs the serve extra: pip install -e '.[serve]'.",
    )
    p.add_argument(
        "--model",
        type=Path,
        required=True,
        help="a model directory, or one "
        "written by aiayn export (served by its engine; nothing to trace)",
    )
    p.add_argument(
        "--host",
        default="127.0.0.1",
        help="address to bind (default 127.0.0.1; any other needs an API key)",
    )
    p.add_argument("--port", type=int, default=8000, help="port (default 8000; 0 = any free)")
    p.add_argument(
        "--api-key",
        default=os.environ.get("AIAYN_API_KEY"),
        help="needed on every request but /health (default $AIAYN_API_KEY)",
    )
    p.add_argument("--max-chars-per-request", type=int, default=20_000, help="(default 20000)")
    p.add_argument("--max-chars-per-sentence", type=int, default=1_000, help="(default 1000)")
    p.add_argument("--max-sentences", type=int, default=128, help="per request (default 128)")
    p.add_argument("--max-beam", type=int, default=8, help="largest beam/nbest (default 8)")
    p.add_argument(
        "--max-output-tokens",
        type=int,
        default=256,
        help="output tokens per sentence, and decoding steps an explanation traces "
        "(default 256; the model's max_len caps it too)",
    )
    p.add_argument(
        "--max-rows",
        type=int,
        default=512,
        help="search rows (sentences x beam) of one request (default 512)",
    )
    p.add_argument(
        "--max-trace-numbers",
        type=int,
        default=2_000_000,
        help="numbers one /v1/explain trace may hold (default 2000000)",
    )
    p.add_argument(
        "--turn-tokens",
        type=int,
        default=8192,
        help="search rows x their output-length limit in one turn of the model "
        "worker (default 8192)",
    )
    p.add_argument(
        "--chunk-rows",
        type=int,
        default=128,
        help="search rows in one turn of the model worker, and greedy rows in flight "
        "in a running search (default 128)",
    )
    p.add_argument(
        "--batching",
        choices=("continuous", "turns"),
        default="continuous",
        help="greedy and beam requests join a running search at every step "
        "(continuous) or take turns as sampling does (default continuous)",
    )
    p.add_argument(
        "--allowed-host",
        action="append",
        default=[],
        metavar="NAME",
        help="a Host name clients may use besides loopback and --host (repeat; '*' "
        "= any; a wildcard --host accepts any without it)",
    )
    p.add_argument(
        "--cors-origin",
        action="append",
        default=[],
        metavar="ORIGIN",
        help="a web origin that may call the API (repeat; default none)",
    )
    p.add_argument(
        "--timeout",
        type=float,
        default=30.0,
        help="seconds a request may take, queueing included (default 30)",
    )
    p.add_argument(
        "--window-ms",
        type=float,
        default=10.0,
        help="how long the model waits to batch requests, in ms (default 10, at most 10000)",
    )
    p.add_argument("--batch-tokens", type=int, default=2048, help="source tokens per batch")
    p.add_argument(
        "--max-connections",
        type=int,
        default=1024,
        help="connections and requests at once, then 503 (default 1024)",
    )
    p.add_argument(
        "--max-queue",
        type=int,
        default=1000,
        help="requests waiting before 503 busy (default 1000)",
    )
    p.add_argument(
        "--source-lang",
        help="the model's source language code (default: from "
        "the training files' suffixes, e.g. train.en; none = accept any)",
    )
    p.add_argument("--target-lang", help="the model's target language code")
    p.add_argument("--examples", type=Path, help="a file of example sentences for the page")
    p.add_argument(
        "--threads",
        type=int,
        default=0,
        help="torch (or the export's engine) threads; 0 = its default",
    )
    p.add_argument("--no-access-log", action="store_true", help="no line per request")
    add_device_flag(p)
    add_dtype_flag(p)


def run_serve(args: argparse.Namespace) -> int:
    try:
        from aiayn.serve.handlers import ServeOptions
        from aiayn.serve.launch import serve
        from aiayn.serve.requests import Limits
    except ImportError as e:  # the serve extra is optional
        raise AiaynError(f"serve needs the serve extra (pip install -e '.[serve]'): {e}") from None
    positive = (
        "max_chars_per_request",
        "max_chars_per_sentence",
        "max_sentences",
        "max_beam",
        "timeout",
        "batch_tokens",
        "max_queue",
        "max_output_tokens",
        "max_rows",
        "max_trace_numbers",
        "chunk_rows",
        "turn_tokens",
        "max_connections",
    )
    # NaN, inf and past int32 are refused too: a NaN timeout answered every request with 503,
    # an inf window never ran the model, and 10^20 output tokens overflowed a tensor.
    for name in positive:
        value = getattr(args, name)
        if not 0 < value <= MAX_FLAG:
            raise AiaynError(f"--{name.replace('_', '-')} must be positive (at most {MAX_FLAG:,})")
    if not 0 <= args.window_ms <= MAX_WINDOW_MS:  # nan too
        raise AiaynError(f"--window-ms must be in 0..{MAX_WINDOW_MS:,}, got {args.window_ms}")
    if not 0 <= args.port < 65536:
        raise AiaynError(f"--port must be in 0..65535, got {args.port}")
    if bool(args.source_lang) != bool(args.target_lang):
        raise AiaynError("give both --source-lang and --target-lang, or neither")
    if args.examples is not None:
        _check_examples(args.examples)
    from aiayn.runtime.device import set_threads

    set_threads(args.threads)
    limits = Limits(
        args.max_chars_per_request,
        args.max_chars_per_sentence,
        args.max_sentences,
        args.max_beam,
        args.timeout,
        args.max_output_tokens,
        args.max_rows,
        args.max_trace_numbers,
    )
    opts = ServeOptions(
        args.host,
        args.port,
        args.api_key or None,
        limits,
        args.window_ms,
        args.batch_tokens,
        args.max_queue,
        args.source_lang,
        args.target_lang,
        args.examples,
        access_log=not args.no_access_log,
        allowed_hosts=tuple(args.allowed_host),
        cors_origins=tuple(args.cors_origin),
        chunk_rows=args.chunk_rows,
        turn_tokens=args.turn_tokens,
        continuous=args.batching == "continuous",
        max_connections=args.max_connections,
    )
    counts = serve(
        args.model,
        opts,
        device=args.device,
        dtype=args.dtype,
        threads=args.threads,
        announce=lambda line: print(line, flush=True),
    )
    print(
        f"aiayn serve: stopped; answered {counts['answered']} of {counts['accepted']} "
        "accepted requests",
        flush=True,
    )
    return 0


def _check_examples(path: Path) -> None:
    """A given --examples file must hold sentences: the page would otherwise fall back to the
    model's validation sentences without a word."""
    from aiayn.text.corpus import read_lines

    name = f"--examples {path}"
    try:
        with path.open("rb") as f:
            if not any(line.strip() for line in read_lines(f, name)):
                raise AiaynError(f"{name} holds no sentence")
    except OSError as e:
        raise AiaynError(f"{name}: {e.strerror or e}") from None
