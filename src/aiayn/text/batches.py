"""Pairs -> ids -> token-budget, length-bucketed `Batch`es (§5.1).

encode_pairs(pairs, tok)     SentencePiece ids; pairs longer than max_len dropped, counted
resegment(texts, ...)        an epoch's ids, each pair segmented by sampling (regularization)
batch_plan(examples, ...)    index lists whose padded size B * max_len fits `max_tokens`
cut_batches(order, sizes, n) the token-budget rule itself (translation and serving use it)
padding_parts(sizes, slack)  a batch cut into parts of similar length (a server's admissions)
collate(examples, indices)   a padded `Batch` (src = ids + EOS, tgt_in = BOS + ids,
                             tgt_out = ids + EOS); `pad_rows` is the one padding function
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from aiayn.errors import DataError
from aiayn.text.corpus import DataStats
from aiayn.text.tokenizer import Tokenizer


@dataclass(frozen=True)
class Example:
    """One encoded pair, framed by the tokenizer (the only code that adds BOS and EOS)."""

    src: tuple[int, ...]  # source ids + EOS
    tgt: tuple[int, ...]  # BOS + target ids + EOS: the decoder reads tgt[:-1], predicts tgt[1:]

    @property
    def tgt_positions(self) -> int:
        """Decoder positions (= target tokens predicted, EOS included)."""
        return len(self.tgt) - 1


def encode_pairs(
    pairs: Iterable[tuple[str, str]],
    tok: Tokenizer,
    max_len: int,
    stats: DataStats | None = None,
    chunk: int = 4096,
    kept: list[int] | None = None,
) -> list[Example]:
    """Tokenize pairs; drop (and count) those whose source+EOS or target+EOS exceeds `max_len`.

    `pairs` is consumed in chunks, so a `read_parallel` stream is never held as text.
    `kept`, when given, receives the index in `pairs` of every example returned.
    """
    stats = stats if stats is not None else DataStats()
    out: list[Example] = []
    it = iter(pairs)
    for start in itertools.count(0, chunk):
        part = list(itertools.islice(it, chunk))
        if not part:
            break
        srcs = tok.encode_batch([s for s, _ in part], eos=True)
        tgts = tok.encode_batch([t for _, t in part], bos=True, eos=True, side="target")
        for i, (s, t) in enumerate(zip(srcs, tgts, strict=True)):
            if len(s) > max_len or len(t) - 1 > max_len:
                stats.drop("too_long_tokens", stats.where(start + i))
            else:
                out.append(Example(tuple(s), tuple(t)))
                if kept is not None:
                    kept.append(start + i)
    return out


def resegment(
    texts: Sequence[tuple[str, str]],
    best: Sequence[Example],
    tok: Tokenizer,
    alpha: float,
    seed: int,
    max_len: int,
) -> list[Example]:
    """The training pairs `texts` segmented afresh by sampling (`Tokenizer.sample_batch`):
    an epoch's examples under subword regularization, a pure function of `seed`. Sampled
    segmentations are longer; a pair whose sample no longer fits `max_len` keeps its best
    segmentation (`best[i]`, the one `encode_pairs` gave `texts[i]`), so no pair is lost."""
    srcs = tok.sample_batch([s for s, _ in texts], alpha, seed, eos=True)
    tgts = tok.sample_batch([t for _, t in texts], alpha, seed + 1, bos=True, eos=True)
    return [
        Example(tuple(s), tuple(t)) if len(s) <= max_len and len(t) - 1 <= max_len else b
        for s, t, b in zip(srcs, tgts, best, strict=True)
    ]


@dataclass(frozen=True)
class Batch:
    """Right-padded ids; masks are built by the model from its pad id, never stored here."""

    src_BS: Tensor
    tgt_in_BT: Tensor  # BOS + target ids (teacher forcing input, shifted right)
    tgt_out_BT: Tensor  # target ids + EOS (what the model must predict)
    n_tgt_tokens: int  # real (non-PAD) positions of tgt_out: counted on the host, no sync

    @property
    def inputs(self) -> tuple[Tensor, Tensor]:
        """What the model is called on (a language model's batch: its blocks alone)."""
        return self.src_BS, self.tgt_in_BT

    def to(self, device: torch.device | str) -> Batch:
        """The batch on `device`. To a GPU the copy goes through pinned (page-locked) memory
        and does not block: the host queues the step's kernels while the copy runs."""
        device = torch.device(device)
        if device.type == "cpu":
            return self
        gpu = device.type == "cuda"
        src_BS, tgt_in_BT, tgt_out_BT = (
            (t.pin_memory() if gpu else t).to(device, non_blocking=gpu)
            for t in (self.src_BS, self.tgt_in_BT, self.tgt_out_BT)
        )
        return Batch(src_BS, tgt_in_BT, tgt_out_BT, self.n_tgt_tokens)


def example_size(ex: Example) -> int:
    """Positions the pair occupies in a padded batch: its longer side (target counts EOS)."""
    return max(len(ex.src), ex.tgt_positions)


def batch_plan(
    examples: Sequence[Example],
    max_tokens: int,
    *,
    seed: int = 0,
    epoch: int = 0,
    shuffle: bool = True,
) -> list[list[int]]:
    """Group example indices into batches whose padded size B * max_len is <= `max_tokens`.

    Like fairseq's `--max-tokens`: examples are sorted by length (ties broken randomly) so
    each batch holds similar lengths (little padding); the batch order is then shuffled.
    The plan is a pure function of (examples, max_tokens, seed, epoch), which is what makes
    resuming from a data position exact.
    """
    rng = random.Random(seed * 1_000_003 + epoch)
    order = list(range(len(examples)))
    if shuffle:
        rng.shuffle(order)  # random tie-break among equal lengths; the sort below is stable
    order.sort(key=lambda i: (len(examples[i].tgt), len(examples[i].src)))
    sizes = [example_size(ex) for ex in examples]
    if sizes and max(sizes) > max_tokens:
        raise DataError(
            f"an example of {max(sizes)} tokens does not fit max_tokens={max_tokens}; "
            "raise train.max_tokens or lower train.max_len"
        )
    batches = cut_batches(order, sizes, max_tokens)
    if shuffle:
        rng.shuffle(batches)
    return batches


def cut_batches(
    order: Sequence[int], sizes: Sequence[int], max_tokens: int, max_count: int | None = None
) -> list[list[int]]:
    """`order` cut into consecutive batches whose padded size, count x the largest size, is at
    most `max_tokens` (one item larger than that gets a batch of its own), and of at most
    `max_count` items when given. The one token-budget rule of training (`batch_plan`) and
    translation (`translate.token_budget_batches`)."""
    batches: list[list[int]] = []
    cur: list[int] = []
    cur_len = 0
    for i in order:
        full = max_count is not None and len(cur) >= max_count
        if cur and (full or (len(cur) + 1) * max(cur_len, sizes[i]) > max_tokens):
            batches.append(cur)
            cur, cur_len = [], 0
        cur.append(i)
        cur_len = max(cur_len, sizes[i])
    if cur:
        batches.append(cur)
    return batches


def padding_parts(sizes: Sequence[int], slack: int) -> list[list[int]]:
    """Indices of one batch, longest first, cut into parts of similar size: a part takes the
    next (shorter) item while its padding (count x its largest size - their sum) stays at most
    `slack`. Every index is in exactly one part; `slack` 0 gives parts of equal sizes, a large
    one a single part.

    A server admits sentences as they arrive, not sorted like a file: one padded encoder batch
    of them wastes a third to a half of its positions (docs/lab/serving.md). `slack` is the
    padding a part may waste before another part (one more pass of the encoder's ops over
    fewer rows) costs less."""
    order = sorted(range(len(sizes)), key=lambda i: -sizes[i])
    parts: list[list[int]] = []
    real = 0  # the last part's summed sizes; its first (largest) size is its padded width
    for i in order:
        if parts and (len(parts[-1]) + 1) * sizes[parts[-1][0]] - real - sizes[i] <= slack:
            parts[-1].append(i)
            real += sizes[i]
        else:
            parts.append([i])
            real = sizes[i]
    return parts


def pad_rows(rows: Sequence[Sequence[int]], pad_id: int) -> Tensor:
    """(len(rows), longest) long tensor of the rows, right-padded with `pad_id`: the one padding
    function (training batches, translation batches, attention pictures).

    One tensor of all the ids, written through a mask of the real positions: a tensor per row
    cost ~13 ms for a 600-sentence training batch (three per step), the host time of a small
    model's whole GPU step; this takes ~1.4 ms (one CPU thread)."""
    lens_B = torch.tensor([len(r) for r in rows], dtype=torch.long)
    width = int(lens_B.max())
    out = torch.full((len(rows), width), pad_id, dtype=torch.long)
    real_BW = torch.arange(width)[None, :] < lens_B[:, None]  # row-major: the rows' own order
    out[real_BW] = torch.tensor(list(itertools.chain.from_iterable(rows)), dtype=torch.long)
    return out


def collate(examples: Sequence[Example], indices: Sequence[int], pad_id: int) -> Batch:
    """The padded `Batch` of `examples[indices]`."""
    exs = [examples[i] for i in indices]
    return Batch(
        pad_rows([e.src for e in exs], pad_id),
        pad_rows([e.tgt[:-1] for e in exs], pad_id),
        pad_rows([e.tgt[1:] for e in exs], pad_id),
        sum(e.tgt_positions for e in exs),
    )


def padding_efficiency(examples: Sequence[Example], plan: Sequence[Sequence[int]]) -> float:
    """Real tokens / padded positions over source and target of every batch (1.0 = no padding)."""
    real = padded = 0
    for idx in plan:
        s = [len(examples[i].src) for i in idx]
        t = [examples[i].tgt_positions for i in idx]
        real += sum(s) + sum(t)
        padded += len(idx) * (max(s) + max(t))
    return real / padded if padded else 1.0
