"""The plain baseline of issue 20: a Hugging Face `MarianMTModel` trained by a short script.

What an expert would write by hand, for the same data, tokenizer, batch budget, time budget and
threads as an aiayn run, so that every claim against it is re-run with one command:

- aiayn's joint SentencePiece tokenizer (`--tokenizer RUN_DIR` reuses an aiayn run's, else one
  of `--vocab-size` pieces is trained on the training text as `aiayn train` would);
- aiayn's batches: `aiayn.text.batches.batch_plan`, padded size <= `--max-tokens`, pairs over
  `--max-len` tokens dropped, shuffled per epoch;
- `MarianConfig` at its defaults (GELU FFN, dropout 0.1, HF's init with std 0.02) but for the
  size (d_model 256, 4 heads, 3+3 layers, FFN 1024), the vocabulary's special ids and
  `scale_embedding=True` (embeddings x sqrt(d_model), as in the paper, Marian and every
  Helsinki-NLP opus-mt config; `--no-scale-embedding` keeps HF's default, under which the
  std-0.02 token embeddings are drowned by sinusoidal positions of amplitude 1);
- AdamW(betas 0.9, 0.98), inverse-sqrt schedule with `--warmup` steps to a peak of `--lr`,
  label smoothing 0.1 (PyTorch's cross-entropy), gradient clipping 1.0;
- bf16 autocast where the CPU (or GPU) has native bf16, as aiayn's `dtype = "auto"` chooses;
- training until `--minutes` of wall clock have passed (evaluation after, not counted), then
  validation loss/perplexity and test BLEU (sacreBLEU, cased, detokenized) with greedy search
  and beam `--beam` (`generate()`'s defaults: length penalty 1.0), on `--test-src/--test-tgt`
  and, if given, a second test set `--test2-src/--test2-tgt` (keys `test2_greedy`, ...).

    python bench/marian_baseline.py --src train.en --tgt train.de --valid-src val.en \\
        --valid-tgt val.de --test-src test.en --test-tgt test.de --minutes 10 --threads 1

Prints one JSON object on its last line. Needs transformers (`pip install -e ".[bench]"`).
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from multi30k_epoch import cpu_name  # one CPU-name probe for the bench scripts

from aiayn.runtime.device import Precision, choose_precision
from aiayn.runtime.memory import keep_freed_memory
from aiayn.text.batches import Example, batch_plan, collate, encode_pairs
from aiayn.text.corpus import read_parallel
from aiayn.text.tokenizer import Tokenizer
from aiayn.training.schedule import inverse_sqrt_lr
from aiayn.translate.metrics import bleu, chrf, exact_match

SOURCE_MAX = 256  # tokens with EOS, as aiayn's own_data.toml model (max_len 256) reads them


def build_model(tok: Tokenizer, args: argparse.Namespace) -> torch.nn.Module:
    from transformers import MarianConfig, MarianMTModel

    cfg = MarianConfig(
        vocab_size=tok.vocab_size, d_model=args.d_model, encoder_layers=args.layers,
        decoder_layers=args.layers, encoder_attention_heads=args.heads,
        decoder_attention_heads=args.heads, encoder_ffn_dim=args.ffn, decoder_ffn_dim=args.ffn,
        max_position_embeddings=max(args.max_len, SOURCE_MAX) + 64,
        pad_token_id=tok.pad_id, eos_token_id=tok.eos_id, bos_token_id=tok.bos_id,
        decoder_start_token_id=tok.bos_id, forced_eos_token_id=None,
        scale_embedding=args.scale_embedding,
    )  # fmt: skip
    return MarianMTModel(cfg)


def loss_sums(
    model: torch.nn.Module, batch: Any, pad_id: int, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Summed label-smoothed loss and summed NLL of one batch's target tokens."""
    out = model(
        input_ids=batch.src_BS,
        attention_mask=batch.src_BS != pad_id,
        decoder_input_ids=batch.tgt_in_BT,
        decoder_attention_mask=batch.tgt_in_BT != pad_id,
    )
    logits_PV = out.logits.float().flatten(0, 1)
    target_P = batch.tgt_out_BT.flatten()
    loss = F.cross_entropy(logits_PV, target_P, ignore_index=pad_id, label_smoothing=eps,
                           reduction="sum")  # fmt: skip
    nll = F.cross_entropy(logits_PV, target_P, ignore_index=pad_id, reduction="sum")
    return loss, nll


@torch.no_grad()
def validate(
    model: torch.nn.Module, data: list[Example], args: argparse.Namespace, pad_id: int,
    precision: Precision,
) -> dict[str, float]:  # fmt: skip
    model.eval()
    loss_sum = nll_sum = tokens = 0.0
    for idx in batch_plan(data, args.max_tokens, shuffle=False):
        b = collate(data, idx, pad_id)
        with precision.autocast():
            loss, nll = loss_sums(model, b, pad_id, args.label_smoothing)
        loss_sum, nll_sum = loss_sum + loss.item(), nll_sum + nll.item()
        tokens += b.n_tgt_tokens
    model.train()
    return {"val_loss": loss_sum / tokens, "val_ppl": math.exp(nll_sum / tokens)}


@torch.no_grad()
def translate(
    model: torch.nn.Module, tok: Tokenizer, lines: list[str], beam: int, batch_size: int = 64
) -> list[str]:
    """generate() over batches sorted by length; one output per line, in order. A source
    over SOURCE_MAX tokens is cut to its first SOURCE_MAX - 1 and EOS, as `aiayn evaluate`
    cuts it (the positions end at max(max_len, SOURCE_MAX) + 64)."""
    model.eval()
    specials = {tok.pad_id, tok.bos_id, tok.eos_id}
    ids = [tok.encode(s, eos=True) for s in lines]
    ids = [x if len(x) <= SOURCE_MAX else [*x[: SOURCE_MAX - 1], tok.eos_id] for x in ids]
    order = sorted(range(len(lines)), key=lambda i: len(ids[i]))
    out: list[str] = [""] * len(lines)
    for start in range(0, len(order), batch_size):
        part = order[start : start + batch_size]
        width = max(len(ids[i]) for i in part)
        src_BS = torch.full((len(part), width), tok.pad_id, dtype=torch.long)
        for row, i in enumerate(part):
            src_BS[row, : len(ids[i])] = torch.tensor(ids[i])
        gen = model.generate(
            input_ids=src_BS, attention_mask=src_BS != tok.pad_id, num_beams=beam,
            do_sample=False, max_new_tokens=width + 50,  # aiayn's default: source + 50
        )  # fmt: skip
        for row, i in enumerate(part):
            out[i] = tok.decode([t for t in gen[row].tolist() if t not in specials])
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    for name in ("src", "tgt", "valid-src", "valid-tgt", "test-src", "test-tgt"):
        p.add_argument(f"--{name}", type=Path, required=True)
    p.add_argument("--test2-src", type=Path, help="an optional second test set, scored the "
                   "same way as test2_greedy/test2_beamN")  # fmt: skip
    p.add_argument("--test2-tgt", type=Path)
    p.add_argument("--tokenizer", type=Path, help="an aiayn run/model directory whose "
                   "tokenizer.model to use (default: train one like aiayn train)")  # fmt: skip
    p.add_argument("--vocab-size", type=int, default=8000)
    p.add_argument("--minutes", type=float, required=True, help="training wall-clock budget")
    p.add_argument("--max-steps", type=int, default=0, help="0 = no cap")
    p.add_argument("--max-tokens", type=int, default=4096, help="padded tokens per batch")
    p.add_argument("--max-len", type=int, default=128, help="longer pairs are dropped")
    p.add_argument("--lr", type=float, default=1e-3, help="peak rate")
    p.add_argument("--warmup", type=int, default=1000)
    p.add_argument("--label-smoothing", type=float, default=0.1)
    p.add_argument("--clip", type=float, default=1.0)
    p.add_argument("--d-model", type=int, default=256)
    p.add_argument("--layers", type=int, default=3)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--ffn", type=int, default=1024)
    p.add_argument("--no-scale-embedding", dest="scale_embedding", action="store_false",
                   help="HF's default: embeddings not scaled by sqrt(d_model)")  # fmt: skip
    p.add_argument("--beam", type=int, default=4)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--dtype", choices=("auto", "fp32", "bf16"), default="auto")
    p.add_argument("--seed", type=int, default=1)
    args = p.parse_args(argv)
    keep_freed_memory()  # malloc as aiayn's commands set it, for every side measured here
    if (args.test2_src is None) != (args.test2_tgt is None):
        p.error("--test2-src and --test2-tgt go together")

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    random.seed(args.seed)
    if args.tokenizer:
        tok = Tokenizer.load(args.tokenizer)
    else:
        texts = (side for pair in read_parallel(args.src, args.tgt) for side in pair)
        tok = Tokenizer.train(texts, args.vocab_size, "bpe")
    train = encode_pairs(read_parallel(args.src, args.tgt), tok, args.max_len)
    valid = encode_pairs(read_parallel(args.valid_src, args.valid_tgt), tok, args.max_len)
    precision = choose_precision(args.dtype, torch.device("cpu"))
    model = build_model(tok, args)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.98))
    pad = tok.pad_id

    step = epoch = 0
    t0 = time.monotonic()
    last_loss = float("nan")
    while time.monotonic() - t0 < 60 * args.minutes and not (args.max_steps and
                                                             step >= args.max_steps):  # fmt: skip
        plan = batch_plan(train, args.max_tokens, seed=args.seed, epoch=epoch)
        for idx in plan:
            if time.monotonic() - t0 >= 60 * args.minutes or (args.max_steps and
                                                              step >= args.max_steps):  # fmt: skip
                break
            b = collate(train, idx, pad)
            for group in opt.param_groups:
                group["lr"] = inverse_sqrt_lr(step + 1, args.warmup, args.lr)
            with precision.autocast():
                loss, _ = loss_sums(model, b, pad, args.label_smoothing)
            opt.zero_grad(set_to_none=True)
            (loss / b.n_tgt_tokens).backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)
            opt.step()
            step += 1
            last_loss = loss.item() / b.n_tgt_tokens
        else:
            epoch += 1
    train_s = time.monotonic() - t0

    result: dict[str, Any] = {
        "script": "bench/marian_baseline.py",
        "steps": step,
        "epochs": round(epoch + 0.0, 2),
        "train_minutes": round(train_s / 60, 2),
        "last_train_loss": round(last_loss, 4),
        **{k: round(v, 4) for k, v in validate(model, valid, args, pad, precision).items()},
    }
    decoding = choose_precision(args.dtype, torch.device("cpu"), decoding=True)  # as aiayn's
    tests = [("", args.test_src, args.test_tgt)]
    if args.test2_src is not None:
        tests.append(("test2_", args.test2_src, args.test2_tgt))
    for prefix, test_src, test_tgt in tests:
        pairs = list(read_parallel(test_src, test_tgt))
        src, refs = [s for s, _ in pairs], [t for _, t in pairs]
        for name, beam in (("greedy", 1), (f"beam{args.beam}", args.beam)):
            with decoding.autocast():
                hyps = translate(model, tok, src, beam)
            score = bleu(hyps, refs)
            # chrF and exact match too, as `aiayn evaluate` reports: BLEU is 0 on one-word
            # targets (the quick start's numbers are one German word each)
            result[prefix + name] = {"bleu": round(score.score, 2),
                                     "bp": round(score.brevity_penalty or 0, 3),
                                     "length_ratio": round(score.length_ratio or 0, 3),
                                     "chrf": round(chrf(hyps, refs).score, 2),
                                     "exact_match": round(exact_match(hyps, refs), 2)}  # fmt: skip
    result |= {
        "model": {"d_model": args.d_model, "heads": args.heads, "layers": args.layers,
                  "ffn": args.ffn, "vocab": tok.vocab_size,
                  "parameters": sum(p.numel() for p in model.parameters())},
        "recipe": {"lr": args.lr, "warmup": args.warmup, "max_tokens": args.max_tokens,
                   "label_smoothing": args.label_smoothing, "clip": args.clip,
                   "betas": [0.9, 0.98], "scale_embedding": args.scale_embedding},
        "precision": precision.why, "decoding": decoding.why, "threads": args.threads,
        "cpu": cpu_name(),
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
    }  # fmt: skip
    print(json.dumps(result), flush=True)
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
