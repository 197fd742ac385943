"""`aiayn import` and `aiayn export`: other toolkits' models in, other engines' formats out."""

from __future__ import annotations

import argparse
from pathlib import Path


def add_import(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("import", help="open another toolkit's model as an aiayn model directory")
    import_sub = p.add_subparsers(dest="import_command", required=True, metavar="FORMAT")
    m = import_sub.add_parser(
        "marian",
        help="a local Hugging Face MarianMT (OPUS-MT) directory (docs/import.md)",
        description="Convert HF_DIR (config.json, model.safetensors, source.spm, target.spm, "
        "vocab.json) into a new aiayn model directory that translate, evaluate, explain, "
        "attend, average and train (train.init_from) accept. Nothing is downloaded.",
    )
    g = import_sub.add_parser(
        "gpt2",
        help="a local Hugging Face GPT-2 directory, as a decoder-only LM (docs/import.md)",
        description="Convert HF_DIR (config.json, model.safetensors, and tokenizer.json or "
        "vocab.json + merges.txt) into a new aiayn model directory holding a DecoderLM. "
        "Nothing is downloaded.",
    )
    b = import_sub.add_parser(
        "bert",
        help="a local Hugging Face BertForSequenceClassification directory, as a classifier "
        "(docs/import.md)",
        description="Convert HF_DIR (config.json, model.safetensors, and tokenizer.json or "
        "vocab.txt) into a new aiayn model directory holding an EncoderClassifier that "
        "classify, evaluate --data and train (train.init_from) accept. Nothing is downloaded.",
    )
    ll = import_sub.add_parser(
        "llama",
        help="a local Hugging Face LLaMA or Mistral directory, as a decoder-only LM "
        "(docs/import.md)",
        description="Convert HF_DIR (config.json with model_type llama or mistral, "
        "model.safetensors or the shards model.safetensors.index.json names, and optionally "
        "tokenizer.json) into a new aiayn model directory holding a DecoderLM (RoPE, RMSNorm, "
        "SwiGLU, grouped-query attention). What aiayn cannot compute exactly (scaled RoPE, "
        "another activation or head size) is refused. Nothing is downloaded.",
    )
    ll.add_argument(
        "--max-len",
        type=int,
        default=None,
        metavar="N",
        help="positions the model accepts (default: config.json's max_position_embeddings; "
        "at most that)",
    )
    for q in (m, g, b, ll):
        q.add_argument("hf_dir", type=Path, metavar="HF_DIR", help="the Hugging Face directory")
        q.add_argument(
            "--out",
            type=Path,
            required=True,
            help="new model directory (must not exist or be empty)",
        )


def run_import(args: argparse.Namespace) -> int:
    if args.import_command == "gpt2":
        return _run_import_gpt2(args)
    if args.import_command == "bert":
        return _run_import_bert(args)
    if args.import_command == "llama":
        return _run_import_llama(args)
    from aiayn.interop.marian import import_marian

    done = import_marian(args.hf_dir, args.out)
    cfg, dec = done.model, done.decode
    langs = f"{done.source_lang or '?'} -> {done.target_lang or '?'}"
    print(
        f"imported {args.hf_dir} ({langs}) into {done.out}: d_model {cfg.d_model}, "
        f"{cfg.n_layers}+{cfg.n_layers} layers, {cfg.n_heads} heads, d_ff {cfg.d_ff}, "
        f"vocabulary {cfg.vocab_size}, {cfg.activation} FFN; search: beam {dec.beam_size}, "
        f"alpha {dec.alpha:g} ({dec.length_penalty} length penalty)"
    )
    return 0


def _run_import_gpt2(args: argparse.Namespace) -> int:
    from aiayn.interop.gpt2 import import_gpt2

    done = import_gpt2(args.hf_dir, args.out)
    cfg = done.model
    tokens = "byte-level BPE tokenizer" if done.tokenizer else "no tokenizer: token ids only"
    print(
        f"imported {args.hf_dir} (GPT-2) into {done.out}: DecoderLM, d_model {cfg.d_model}, "
        f"{cfg.n_layers} layers, {cfg.n_heads} heads, d_ff {cfg.d_ff}, vocabulary "
        f"{cfg.vocab_size}, {cfg.max_len} positions, {cfg.activation} FFN; {tokens}"
    )
    return 0


def _run_import_llama(args: argparse.Namespace) -> int:
    from aiayn.interop.llama import import_llama

    done = import_llama(args.hf_dir, args.out, args.max_len)
    cfg = done.model
    tokens = "tokenizer.json" if done.tokenizer else "no tokenizer: token ids only"
    window = f", window {cfg.attn_window}" if cfg.attn_window else ""
    print(
        f"imported {args.hf_dir} (LLaMA) into {done.out}: DecoderLM, d_model {cfg.d_model}, "
        f"{cfg.n_layers} layers, {cfg.n_heads} heads ({cfg.n_kv_heads} K/V), d_ff {cfg.d_ff}, "
        f"vocabulary {cfg.vocab_size}, {cfg.max_len} positions{window}, RoPE base "
        f"{cfg.rope_base:g}, {cfg.activation} FFN; {tokens}"
    )
    return 0


def _run_import_bert(args: argparse.Namespace) -> int:
    from aiayn.interop.bert import import_bert

    done = import_bert(args.hf_dir, args.out)
    cfg = done.model
    tokens = "WordPiece tokenizer" if done.tokenizer else "no tokenizer: token ids only"
    print(
        f"imported {args.hf_dir} (BERT) into {done.out}: EncoderClassifier, d_model "
        f"{cfg.d_model}, {cfg.n_layers} layers, {cfg.n_heads} heads, d_ff {cfg.d_ff}, "
        f"vocabulary {cfg.vocab_size}, {cfg.max_len} positions; {len(done.labels)} labels: "
        f"{', '.join(done.labels)}; {tokens}"
    )
    return 0


def add_export(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "export",
        help="write a model for another engine: CTranslate2 (float32, or int8 for a CPU's "
        "speed) or ONNX Runtime",
    )
    engines = p.add_subparsers(dest="engine", required=True, metavar="ENGINE")
    c = engines.add_parser(
        "ctranslate2",
        help="a CTranslate2 model (+ tokenizer); translate/evaluate --model OUT run it",
    )
    c.add_argument(
        "--quantization",
        choices=("float32", "int8", "int16", "bfloat16"),
        default="float32",
        help="weight type (default float32; int8 is the fast one on a CPU)",
    )
    o = engines.add_parser(
        "onnx",
        help="encoder + decoder-with-past ONNX graphs (translate/evaluate run them), a "
        "language model's one graph (generate), or a classifier's (classify)",
    )
    for q in (c, o):
        q.add_argument("--model", type=Path, required=True, help="an aiayn model directory")
        q.add_argument("--out", type=Path, required=True, help="a new (or empty) directory")


def run_export(args: argparse.Namespace) -> int:
    from aiayn.interop.export_dir import source_architecture

    arch = source_architecture(args.model, args.out, args.engine)  # CTranslate2: no classifier
    lm = arch == "DecoderLM"
    if arch == "EncoderClassifier":
        from aiayn.interop.export_cls import export_cls_onnx

        out = export_cls_onnx(args.model, args.out)
        print(
            f"exported {args.model} (a classifier) as onnx (model.onnx) to {out}; run it: "
            f"aiayn classify --model {out}"
        )
        return 0
    if args.engine == "ctranslate2" and lm:
        from aiayn.interop.export_lm_ct2 import export_lm_ctranslate2

        out = export_lm_ctranslate2(args.model, args.out, args.quantization)
        what = f"CTranslate2 ({args.quantization})"
    elif args.engine == "ctranslate2":
        from aiayn.interop.export_ct2 import export_ctranslate2

        out = export_ctranslate2(args.model, args.out, args.quantization)
        what = f"CTranslate2 ({args.quantization})"
    elif lm:
        from aiayn.interop.export_lm import export_lm_onnx

        out = export_lm_onnx(args.model, args.out)
        what = "ONNX (model.onnx)"
    else:
        from aiayn.interop.export_onnx import export_onnx

        out = export_onnx(args.model, args.out)
        what = "ONNX (encoder.onnx, decoder.onnx)"
    from aiayn.store.directory import ModelDir

    if ModelDir.open(out).architecture == "DecoderLM":
        files = "model.onnx" if args.engine == "onnx" else args.quantization
        print(
            f"exported {args.model} (a language model) as {args.engine} ({files}) to {out}; "
            f"run it: aiayn generate --model {out} --prompt TEXT"
        )
        return 0
    print(f"exported {args.model} as {what} to {out}; run it: aiayn translate --model {out}")
    return 0
