"""Validation loss and perplexity of a model directory, as `aiayn train` computes them.

For comparing a model that training did not validate (an `averaged/` model) with
bench/marian_baseline.py's figures: label-smoothed loss per target token (ε 0.1) and exp of
the mean NLL, pairs over `--max-len` tokens dropped, batches of `--max-tokens`, bf16 autocast
where native (dtype auto), as in training.

    python bench/valid_loss.py --model runs/x/averaged --src val.en --tgt val.de

Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from aiayn.config import TrainConfig
from aiayn.nn.model import Transformer
from aiayn.runtime.device import choose_precision
from aiayn.runtime.distributed import init_distributed
from aiayn.store.model_dir import load_model_dir
from aiayn.text.batches import encode_pairs
from aiayn.text.corpus import read_parallel
from aiayn.text.tokenizer import Tokenizer
from aiayn.training.validate import validate


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", type=Path, required=True)
    p.add_argument("--src", type=Path, required=True)
    p.add_argument("--tgt", type=Path, required=True)
    p.add_argument("--max-len", type=int, default=128)
    p.add_argument("--max-tokens", type=int, default=4096)
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    d = init_distributed("cpu")
    tok = Tokenizer.load(args.model)
    model = load_model_dir(args.model, expect=Transformer)
    data = encode_pairs(read_parallel(args.src, args.tgt), tok, args.max_len)
    tc = TrainConfig(max_tokens=args.max_tokens, label_smoothing=0.1)
    precision = choose_precision("auto", d.device)
    rec = validate(model, data, tc, d, precision)
    print(json.dumps({"model": str(args.model), "pairs": len(data), **rec,
                      "precision": precision.why}))  # fmt: skip


if __name__ == "__main__":
    main()
