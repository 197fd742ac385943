"""A language model's data: text files read and checked, one token stream, blocks of it.

The path the text takes:

    read_texts         the files of `train.text` (files, a folder of *.txt, comma-separated),
                       UTF-8 checked: one clear line for empty, binary or undecodable input
    token_stream       each file as BOS + its tokens + EOS, the files one after another
    load_lm_data       the training and validation streams of a run: `train.valid_text`, or the
                       last `train.valid_share` of the training stream held out (nanoGPT's
                       90/10 split of tiny Shakespeare is the default's)
    block_batch        the `LMBatch` of a step: contiguous blocks of `max_len` tokens at random
                       offsets of the stream, the same for the same (seed, step) (nanoGPT's way)
    eval_windows       the stream cut into windows that score every token once
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import Tensor

from aiayn.errors import ConfigError, DataError
from aiayn.text.text_check import text_files
from aiayn.text.tokenizer import Tokenizer

log = logging.getLogger(__name__)

# SentencePiece and the character vocabularies encode this many characters a call: a novel
# at once would hold every piece's Python object (tens of bytes each) at the same time.
CHUNK_CHARS = 1 << 20


def text_paths(spec: str) -> list[Path]:
    """The files `spec` names: comma-separated paths, a folder standing for its *.txt files."""
    if not spec.replace(",", "").strip():
        raise ConfigError("train.text is empty: give a text file (--set train.text=FILE)")
    return text_files(spec)


def read_text(path: Path) -> str:
    """One file's text, checked: UTF-8 (a BOM dropped), not binary, not empty."""
    data = path.read_bytes()
    if not data.strip():
        raise DataError(f"{path}: the file is empty")
    if b"\x00" in data[: 1 << 16]:
        raise DataError(f"{path}: a binary file (NUL bytes), not text")
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        line = data[: e.start].count(b"\n") + 1
        raise DataError(f"{path}: not UTF-8 (line {line}, byte {e.start})") from None
    return text.replace("\r\n", "\n")


def read_texts(spec: str) -> list[tuple[Path, str]]:
    return [(path, read_text(path)) for path in text_paths(spec)]


def encode_text(tok: Tokenizer, text: str) -> list[int]:
    """The ids of `text` (no special ids), in chunks cut after a newline."""
    out: list[int] = []
    start = 0
    while start < len(text):
        end = min(start + CHUNK_CHARS, len(text))
        if end < len(text):
            newline = text.rfind("\n", start, end)
            end = newline + 1 if newline > start else end
        out.extend(tok.encode(text[start:end], eos=False))
        start = end
    return out


def token_stream(tok: Tokenizer, texts: Sequence[str]) -> Tensor:
    """Each text as BOS + its ids + EOS, one after another (int64, 1-D)."""
    ids: list[int] = []
    for text in texts:
        ids.append(tok.bos_id)
        ids.extend(encode_text(tok, text))
        ids.append(tok.eos_id)
    return torch.tensor(ids, dtype=torch.long)


def stream_text(tok: Tokenizer, ids: Sequence[int]) -> str:
    """The text of a stream's ids: each document's (between BOS and EOS) decoded, joined."""
    out: list[str] = []
    doc: list[int] = []
    for i in ids:
        if i in (tok.bos_id, tok.eos_id, tok.pad_id):
            if doc:
                out.append(tok.decode(doc))
            doc = []
        else:
            doc.append(i)
    if doc:
        out.append(tok.decode(doc))
    return "".join(out)


@dataclass
class LMData:
    """A language-model run's token streams. `valid` is truthy when there is validation."""

    train: Tensor  # (N,) the training stream
    valid_stream: Tensor  # (M,) the validation stream (may be empty)
    block: int  # tokens a training example holds: the model's max_len
    heldout: dict[str, object] = field(default_factory=dict)  # run_config.json's record
    chars: int = 0  # characters of the validation text (bits per character)
    bytes: int = 0  # its UTF-8 bytes

    @functools.cached_property
    def valid(self) -> list[int]:
        """Start offsets of the validation windows (`eval_windows`)."""
        return eval_windows(len(self.valid_stream), self.block)


def load_lm_data(tc_text: str, valid_text: str, share: float, tok: Tokenizer, block: int) -> LMData:
    """The run's streams: `valid_text`'s, or the last `share` of the training stream."""
    train_texts = [text for _, text in read_texts(tc_text)]
    stream = token_stream(tok, train_texts)
    heldout: dict[str, object] = {}
    if valid_text:
        valid_texts = [text for _, text in read_texts(valid_text)]
        valid = token_stream(tok, valid_texts)
        chars = sum(len(t) for t in valid_texts)
        nbytes = sum(len(t.encode("utf-8")) for t in valid_texts)
    elif share > 0:
        cut = int(len(stream) * (1.0 - share))
        stream, valid = stream[:cut], stream[cut:]
        text = stream_text(tok, valid.tolist())
        chars, nbytes = len(text), len(text.encode("utf-8"))
        heldout = {"share": share, "tokens": len(valid), "from_token": cut}
    else:
        valid, chars, nbytes = stream[:0], 0, 0
    if len(stream) < block + 1:
        raise DataError(
            f"the training text has {len(stream):,} tokens, fewer than one block of "
            f"model.max_len + 1 = {block + 1}: give more text or a smaller model.max_len"
        )
    if len(valid) and len(valid) < 2:
        valid = valid[:0]
    return LMData(stream, valid, block, heldout, chars, nbytes)


@dataclass
class LMBatch:
    """Blocks of the stream: inputs and the next tokens (every position is a target)."""

    ids_BT: Tensor
    next_BT: Tensor

    @property
    def inputs(self) -> tuple[Tensor, ...]:
        return (self.ids_BT,)

    @property
    def tgt_out_BT(self) -> Tensor:
        return self.next_BT

    @property
    def n_tgt_tokens(self) -> int:
        return self.next_BT.numel()

    def to(self, device: torch.device | str) -> LMBatch:
        device = torch.device(device)
        if device.type == "cpu":
            return self
        gpu = device.type == "cuda"
        ids, nxt = (
            (t.pin_memory() if gpu else t).to(device, non_blocking=gpu)
            for t in (self.ids_BT, self.next_BT)
        )
        return LMBatch(ids, nxt)


def block_offsets(n_tokens: int, block: int, rows: int, seed: int, step: int) -> Tensor:
    """`rows` random block starts in a stream of `n_tokens`, a pure function of (seed, step):
    a resumed run draws the same blocks."""
    g = torch.Generator().manual_seed(1_000_003 * seed + step)
    return torch.randint(0, n_tokens - block, (rows,), generator=g)


def block_batch(stream: Tensor, offsets: Sequence[int] | Tensor, block: int) -> LMBatch:
    """The blocks at `offsets`: ids x[o : o + block], targets x[o + 1 : o + block + 1]."""
    idx_BT = torch.as_tensor(offsets, dtype=torch.long)[:, None] + torch.arange(block + 1)
    win_BT = stream[idx_BT]
    return LMBatch(win_BT[:, :-1], win_BT[:, 1:])


def eval_windows(n_tokens: int, block: int) -> list[int]:
    """Window starts that score tokens 1 .. n-1 of a stream once each: windows of block + 1
    tokens (block inputs, block targets) overlapping by one, the last one shorter."""
    return list(range(0, max(n_tokens - 1, 0), block))


NOT_SCORED = -100  # a padded window's target (cross_entropy's ignore_index)


def window_batch(stream: Tensor, starts: Sequence[int], block: int, pad_id: int) -> LMBatch:
    """The windows at `starts`, the last one right-padded: PAD inputs, NOT_SCORED targets."""
    rows = [stream[s : s + block + 1] for s in starts]
    width = max(len(r) for r in rows)
    win_BT = torch.full((len(rows), width), pad_id, dtype=torch.long)
    next_BT = torch.full((len(rows), width - 1), NOT_SCORED, dtype=torch.long)
    for i, r in enumerate(rows):
        win_BT[i, : len(r)] = r
        next_BT[i, : len(r) - 1] = r[1:]
    return LMBatch(win_BT[:, :-1], next_BT)
