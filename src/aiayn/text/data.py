"""Parallel text -> validated pairs -> token-budget, length-bucketed `Batch`es (§5.1).

The path a sentence pair takes:

    read_parallel(src, tgt)      two line-aligned files (or one TSV), streamed line by line,
                                 checked; unusable pairs are dropped *as pairs* and counted
    encode_pairs(pairs, tok)     SentencePiece ids; pairs longer than max_len dropped, counted
    batch_plan(examples, ...)    index lists whose padded size B * max_len fits `max_tokens`
    cut_batches(order, sizes, n) the token-budget rule itself (translation uses it too)
    collate(examples, indices)   a padded `Batch` (src = ids + EOS, tgt_in = BOS + ids,
                                 tgt_out = ids + EOS); `pad_rows` is the one padding function
    load_data / StepLoader       a training run's corpora, and each optimizer step's share
                                 of batches for this rank

Errors a user can cause (different line counts, invalid UTF-8, an empty file) are `DataError`s
with one-line messages. Filtering never shifts alignment: line i of the source is only ever
paired with line i of the target, and every dropped pair is counted and logged.
"""

from __future__ import annotations

import itertools
import logging
import random
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

import torch
from torch import Tensor

from aiayn.config import TrainConfig
from aiayn.errors import ConfigError, DataError
from aiayn.runtime.distributed import Dist
from aiayn.text.tokenizer import Tokenizer

log = logging.getLogger(__name__)

MAX_LINE_CHARS = 10_000  # a "sentence" longer than this is almost surely a broken line


@dataclass
class DataStats:
    """What reading and encoding kept and dropped, so that filtering is never silent."""

    read: int = 0
    held_out: int = 0  # left out of training: held out for validation, or a held-out source
    empty: int = 0  # a side is empty (or whitespace only)
    too_long_chars: int = 0  # a side has more than MAX_LINE_CHARS characters
    too_long_tokens: int = 0  # a side has more than max_len tokens (with EOS)
    examples: list[str] = field(default_factory=list)  # where the first drops happened

    def drop(self, reason: str, where: str) -> None:
        setattr(self, reason, getattr(self, reason) + 1)
        if len(self.examples) < 5:
            self.examples.append(where)

    @property
    def dropped(self) -> int:
        return self.empty + self.too_long_chars + self.too_long_tokens

    @property
    def kept(self) -> int:
        return self.read - self.held_out - self.dropped

    def report(self, name: str) -> str:
        msg = f"{name}: read {self.read} pairs, kept {self.kept}"
        if self.held_out:
            msg += f"; {self.held_out} held out for validation (or sharing a held-out source)"
        if self.dropped:
            msg += (
                f"; dropped {self.dropped} (empty side {self.empty}, over {MAX_LINE_CHARS} chars "
                f"{self.too_long_chars}, over max_len tokens {self.too_long_tokens}; "
                f"first: {', '.join(self.examples)})"
            )
        return msg


# --- reading --------------------------------------------------------------------------------


def read_lines(stream: BinaryIO, name: str) -> Iterator[str]:
    """Decoded lines of a binary stream without their newline; invalid UTF-8 is a DataError
    that names the file (`name`) and the line."""
    for line_no, raw in enumerate(stream, 1):
        try:
            yield raw.decode("utf-8").rstrip("\r\n")
        except UnicodeDecodeError as e:
            raise DataError(
                f"{name}: line {line_no} is not valid UTF-8 (byte {e.start}: {e.reason})"
            ) from None


def _lines(path: Path) -> Iterator[str]:
    """Decoded lines of the corpus file `path` (see `read_lines`)."""
    try:
        f = path.open("rb")
    except FileNotFoundError:
        raise DataError(f"corpus file not found: {path}") from None
    with f:
        yield from read_lines(f, str(path))


def _count_lines(path: Path) -> int:
    with path.open("rb") as f:
        return sum(1 for _ in f)


def _aligned(src: Path, tgt: Path) -> Iterator[tuple[str, str]]:
    """Line i of `src` with line i of `tgt`; a length mismatch is a DataError naming both counts."""
    src_it, tgt_it = _lines(src), _lines(tgt)
    n = 0
    while True:
        s, t = next(src_it, None), next(tgt_it, None)
        if s is None or t is None:
            if s is None and t is None:
                return
            n_src = n + (0 if s is None else 1 + sum(1 for _ in src_it))
            n_tgt = n + (0 if t is None else 1 + sum(1 for _ in tgt_it))
            raise DataError(
                f"{src} has {n_src} lines but {tgt} has {n_tgt}: the files must be line-aligned"
            )
        n += 1
        yield s, t


def _tsv(path: Path) -> Iterator[tuple[str, str]]:
    for line_no, line in enumerate(_lines(path), 1):
        cols = line.split("\t")
        if len(cols) != 2:
            raise DataError(f"{path}: line {line_no} has {len(cols)} tab-separated fields, not 2")
        yield cols[0], cols[1]


def read_parallel(
    src: str | Path,
    tgt: str | Path | None = None,
    stats: DataStats | None = None,
    heldout: Heldout | None = None,
) -> Iterator[tuple[str, str]]:
    """Stream (source, target) sentence pairs from two line-aligned files or one TSV.

    A pair with an empty side or a side over MAX_LINE_CHARS characters is dropped whole (the
    other side with it, so alignment holds) and counted in `stats`. Surrounding whitespace is
    stripped. Raises DataError for an empty file, different line counts or invalid UTF-8.
    With `heldout` (see `hold_out`), its lines, and every pair with one of its sources, are
    left out (counted as `held_out`).
    """
    stats = stats if stats is not None else DataStats()
    return _filtered(raw_pairs(src, tgt), stats, heldout)


def raw_pairs(src: str | Path, tgt: str | Path | None) -> Iterator[tuple[str, str]]:
    """Every line pair as read (nothing stripped or dropped); files checked at the call."""
    src = Path(src)
    paths = [src] if not tgt else [src, Path(tgt)]
    for p in paths:
        if not p.is_file():
            raise DataError(f"corpus file not found: {p}")
        if p.stat().st_size == 0:
            raise DataError(f"corpus file is empty: {p}")
    return _tsv(src) if not tgt else _aligned(src, Path(tgt))


def _filtered(
    pairs: Iterator[tuple[str, str]], stats: DataStats, heldout: Heldout | None = None
) -> Iterator[tuple[str, str]]:
    for line_no, (s, t) in enumerate(pairs, 1):
        stats.read += 1
        s, t = s.strip(), t.strip()
        if heldout is not None and (line_no - 1 in heldout.lines or s in heldout.sources):
            stats.held_out += 1
        elif not s or not t:
            stats.drop("empty", f"line {line_no}")
        elif len(s) > MAX_LINE_CHARS or len(t) > MAX_LINE_CHARS:
            stats.drop("too_long_chars", f"line {line_no}")
        else:
            yield s, t


# --- a validation set held out of the training corpus -------------------------------------

HELDOUT_FILES = ("heldout_valid.src", "heldout_valid.tgt")  # written into the run directory
HELDOUT_MAX = 2000  # pairs: enough for a stable loss and BLEU, cheap to validate on a CPU
HELDOUT_SHARE = 0.05  # at most this share of the corpus, so small corpora keep 95% to learn


@dataclass(frozen=True)
class Heldout:
    """Validation pairs drawn from the training corpus, and what training must then leave out."""

    pairs: list[tuple[str, str]]  # stripped, usable (no empty or over-long side), one per source
    lines: frozenset[int]  # 0-based corpus lines drawn (a drawn line that was unusable too)
    sources: frozenset[str]  # training pairs with one of these sources are left out as well
    corpus_lines: int


def hold_out(src: str | Path, tgt: str | Path | None, seed: int) -> Heldout:
    """Draw min(HELDOUT_MAX, HELDOUT_SHARE of the lines) corpus lines as a validation set.

    The draw is a pure function of (line count, seed), so every rank and every resumed session
    holds out the same pairs. Two streaming passes: one counts lines, one keeps the drawn ones.
    The pairs are deduplicated by source, and training leaves out every pair whose source is a
    held-out one (`read_parallel(..., heldout=...)`), so no validation source is trained on.
    """
    n = _count_lines(Path(src)) if Path(src).is_file() else 0  # a missing file: raised below
    k = min(HELDOUT_MAX, int(HELDOUT_SHARE * n))
    drawn = frozenset(random.Random(seed).sample(range(n), k))
    pairs: list[tuple[str, str]] = []
    sources: set[str] = set()
    for i, (s, t) in enumerate(raw_pairs(src, tgt)):
        s, t = s.strip(), t.strip()
        usable = s and t and len(s) <= MAX_LINE_CHARS and len(t) <= MAX_LINE_CHARS
        if i in drawn and usable and s not in sources:
            pairs.append((s, t))
            sources.add(s)
    return Heldout(pairs, drawn, frozenset(sources), n)


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
                stats.drop("too_long_tokens", f"kept pair {start + i + 1}")
            else:
                out.append(Example(tuple(s), tuple(t)))
                if kept is not None:
                    kept.append(start + i)
    return out


# --- batching -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Batch:
    """Right-padded ids; masks are built by the model from its pad id, never stored here."""

    src_BS: Tensor
    tgt_in_BT: Tensor  # BOS + target ids (teacher forcing input, shifted right)
    tgt_out_BT: Tensor  # target ids + EOS (what the model must predict)
    n_tgt_tokens: int  # real (non-PAD) positions of tgt_out: counted on the host, no sync

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


def cut_batches(order: Sequence[int], sizes: Sequence[int], max_tokens: int) -> list[list[int]]:
    """`order` cut into consecutive batches whose padded size, count x the largest size, is at
    most `max_tokens` (one item larger than that gets a batch of its own). The one token-budget
    rule of training (`batch_plan`) and translation (`translate.token_budget_batches`)."""
    batches: list[list[int]] = []
    cur: list[int] = []
    cur_len = 0
    for i in order:
        if cur and (len(cur) + 1) * max(cur_len, sizes[i]) > max_tokens:
            batches.append(cur)
            cur, cur_len = [], 0
        cur.append(i)
        cur_len = max(cur_len, sizes[i])
    if cur:
        batches.append(cur)
    return batches


def pad_rows(rows: Sequence[Sequence[int]], pad_id: int) -> Tensor:
    """(len(rows), longest) long tensor of the rows, right-padded with `pad_id`: the one padding
    function (training batches, translation batches, attention pictures)."""
    width = max(len(r) for r in rows)
    out = torch.full((len(rows), width), pad_id, dtype=torch.long)
    for b, r in enumerate(rows):
        out[b, : len(r)] = torch.tensor(r, dtype=torch.long)
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


# --- the data a training run sees ---------------------------------------------------------------


@dataclass
class RunData:
    train: list[Example]
    valid: list[Example]
    valid_refs: list[str]  # target text of the validation pairs, for BLEU
    valid_srcs: list[str] = field(default_factory=list)  # their source text (choosing alpha)
    held_out: int = 0  # training pairs left out for (or because of) a held-out validation set


def load_data(tc: TrainConfig, tok: Tokenizer, d: Dist, heldout: Heldout | None = None) -> RunData:
    """Read, check and encode the training and validation corpora; report what was dropped.

    With `heldout` (no validation files: see `hold_out`), its pairs are the validation set and
    training leaves them, and every pair sharing a source with them, out.
    """
    if not tc.src:
        raise ConfigError("train.src is empty: give a training corpus (two files or a TSV)")
    stats = DataStats()
    pairs_in = read_parallel(tc.src, tc.tgt or None, stats, heldout)
    train = encode_pairs(pairs_in, tok, tc.max_len, stats)
    _report(stats, "train", d)
    valid: list[Example] = []
    refs: list[str] = []
    srcs: list[str] = []
    if tc.valid_src or heldout is not None:
        vstats = DataStats()
        if tc.valid_src:
            pairs = list(read_parallel(tc.valid_src, tc.valid_tgt or None, vstats))
        else:
            pairs = heldout.pairs if heldout else []
            vstats.read = len(pairs)
        kept: list[int] = []
        valid = encode_pairs(pairs, tok, tc.max_len, vstats, kept=kept)
        refs = [pairs[i][1] for i in kept]
        srcs = [pairs[i][0] for i in kept]
        _report(vstats, "valid" if tc.valid_src else "valid (held out of train)", d)
    if not train:
        raise ConfigError(f"no training pairs left after filtering {tc.src}")
    return RunData(train, valid, refs, srcs, stats.held_out)


def _report(stats: DataStats, name: str, d: Dist) -> None:
    if d.main:
        (log.warning if stats.dropped else log.info)(stats.report(name))


class StepLoader:
    """Hands out, per optimizer step, this rank's micro-batches and the step's target tokens.

    One step consumes accum_steps × world batches of the epoch's plan; rank r takes every
    world-th of them. The plan depends only on (seed, epoch), so (epoch, batch_in_epoch), as
    a run's `TrainState` keeps them, is a complete data position. A remainder shorter than one
    step is skipped and the epoch ends at once, so the epoch always counts finished epochs.
    """

    def __init__(self, data: list[Example], tc: TrainConfig, d: Dist) -> None:
        self.data, self.tc, self.d = data, tc, d
        self.per_step = tc.accum_steps * d.world
        self._plan: tuple[int, list[list[int]]] = (-1, [])

    def plan(self, epoch: int) -> list[list[int]]:
        if self._plan[0] != epoch:
            plan = batch_plan(self.data, self.tc.max_tokens, seed=self.tc.seed, epoch=epoch)
            if len(plan) < self.per_step:
                raise ConfigError(
                    f"one step needs {self.per_step} batches but an epoch has {len(plan)}; "
                    "lower train.max_tokens or train.accum_steps"
                )
            if self.d.main:
                log.info(
                    "epoch %d: %d batches, padding efficiency %.1f%%",
                    epoch + 1,
                    len(plan),
                    100 * padding_efficiency(self.data, plan),
                )
            self._plan = (epoch, plan)
        return self._plan[1]

    def next_step(
        self, epoch: int, batch_in_epoch: int
    ) -> tuple[list[list[int]], int, tuple[int, int]]:
        """This rank's batches of the step at (epoch, batch_in_epoch), the step's target tokens
        over all ranks, and the data position after the step."""
        plan = self.plan(epoch)
        chunk = plan[batch_in_epoch : batch_in_epoch + self.per_step]
        tokens = sum(self.data[i].tgt_positions for idx in chunk for i in idx)
        after = batch_in_epoch + self.per_step
        position = (epoch + 1, 0) if after + self.per_step > len(plan) else (epoch, after)
        return chunk[self.d.rank :: self.d.world], tokens, position
