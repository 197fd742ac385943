"""How well a language model predicts a text: `score_text` (what `aiayn evaluate --text` prints).

The text is the stream the model was trained on (BOS + its tokens + EOS), scored in windows of
the model's context (`max_len`) that overlap by one token, so every token after BOS is
predicted once, from up to max_len - 1 tokens before it (nanoGPT's validation cuts blocks the
same way). Bits per character and per byte divide the same total by the text's characters and
UTF-8 bytes, so models with different vocabularies (characters, bytes, BPE) compare.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from aiayn.nn.variants import DecoderLM
from aiayn.runtime.device import Precision, set_threads
from aiayn.runtime.distributed import Dist, all_sum
from aiayn.store.directory import load_for_decoding
from aiayn.text.lm_data import NOT_SCORED, eval_windows, read_text, token_stream, window_batch


def score_text(
    model_dir: str | Path,
    text_path: str | Path,
    *,
    device: str = "auto",
    dtype: str = "auto",
    threads: int = 0,
) -> dict[str, Any]:
    """{nats_per_token, perplexity, bits_per_char, bits_per_byte, tokens, chars, bytes}."""
    text = read_text(Path(text_path))  # checked before the model loads
    set_threads(threads)
    opened, model, precision = load_for_decoding(model_dir, DecoderLM, device, dtype)
    stream = token_stream(opened.tokenizer, [text])
    nll, n = score_windows(model, stream, model.cfg.max_len, precision)
    bits = nll / math.log(2)
    nbytes = len(text.encode("utf-8"))
    return {
        "nats_per_token": nll / n,
        "perplexity": math.exp(min(nll / n, 700.0)),
        "bits_per_char": bits / len(text),
        "bits_per_byte": bits / nbytes,
        "tokens": n,
        "chars": len(text),
        "bytes": nbytes,
        "model": str(model_dir),
    }


# Windows scored at once (rows of max_len tokens).
VALID_ROWS = 64


@torch.no_grad()
def score_windows(
    model: DecoderLM, stream: torch.Tensor, block: int, precision: Precision, d: Dist | None = None
) -> tuple[float, int]:
    """(summed NLL in nats, tokens scored) of `stream` in windows of `block` tokens, each token
    after the first scored once, given up to `block` - 1 tokens before it in its window."""
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    totals = torch.zeros(2, dtype=torch.float64, device=device)
    starts = eval_windows(len(stream), block)
    rank, world = (d.rank, d.world) if d is not None else (0, 1)
    for a in range(rank * VALID_ROWS, len(starts), VALID_ROWS * world):
        b = window_batch(stream, starts[a : a + VALID_ROWS], block, model.cfg.pad_id).to(device)
        with precision.autocast():
            logits_BTV = model(b.ids_BT)
        totals[0] += F.cross_entropy(
            logits_BTV.flatten(0, 1).float(),
            b.next_BT.flatten(),
            ignore_index=NOT_SCORED,
            reduction="sum",
        ).double()
        totals[1] += int((b.next_BT != NOT_SCORED).sum())
    model.train(was_training)
    if d is not None:
        nll_sum, n = all_sum(totals, d)
    else:
        nll_sum, n = totals.tolist()
    return float(nll_sum), int(n)
