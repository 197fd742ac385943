"""A training run's data: its corpora read, checked and encoded, the drops reported.

The path a sentence pair takes:

    aiayn.text.corpus      read_parallel(src, tgt): streamed, checked; unusable pairs dropped
    aiayn.text.batches     encode_pairs -> batch_plan (token budget) -> collate (a padded `Batch`)
    here                   load_data: the training and validation sets of a run, reported
    aiayn.training.loader  StepLoader: the batches of each optimizer step, sharded over ranks
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path

from aiayn.config import TrainConfig
from aiayn.errors import ConfigError
from aiayn.runtime.distributed import Dist
from aiayn.runtime.progress import counted, progress
from aiayn.text.batches import Example, encode_pairs
from aiayn.text.corpus import DataStats, Heldout, count_lines, read_parallel
from aiayn.text.tokenizer import Tokenizer

log = logging.getLogger(__name__)


@dataclass
class RunData:
    train: list[Example]
    valid: list[Example]
    valid_refs: list[str]  # target text of the validation pairs, for BLEU
    valid_srcs: list[str] = field(default_factory=list)  # their source text (choosing alpha)
    held_out: int = 0  # training pairs left out for (or because of) a held-out validation set
    # the text of each training example, kept only under subword regularization (each epoch
    # segments it afresh: aiayn.training.loader's `StepLoader`)
    train_text: list[tuple[str, str]] = field(default_factory=list)


def require_corpus(tc: TrainConfig) -> None:
    """A run needs its training text: say how to give it where the config names none."""
    if not tc.src:
        raise ConfigError(
            "train.src is empty: give the training corpus, two line-aligned files "
            "(--set train.src=FILE --set train.tgt=FILE) or one TSV "
            "(--set train.src=FILE)"
        )


def load_data(
    tc: TrainConfig,
    tok: Tokenizer,
    d: Dist,
    heldout: Heldout | None = None,
    bar: bool = False,
) -> RunData:
    """Read, check and encode the training and validation corpora; report what was dropped.

    With `heldout` (no validation files: see `hold_out`), its pairs are the validation set and
    training leaves them, and every pair sharing a source with them, out. `bar`: a progress
    bar over the training pairs as they are encoded (a million short pairs take ~15 s).
    """
    require_corpus(tc)
    stats = DataStats()
    pb = progress(
        total=count_lines(tc.src) if bar else None,
        unit="pair",
        disable=not bar,
        desc=f"encode {Path(tc.src).name}",
    )
    pairs_in = counted(read_parallel(tc.src, tc.tgt or None, stats, heldout), pb)
    train_text: list[tuple[str, str]] = []
    if tc.subword_alpha:  # the text is segmented again each epoch: hold it
        if not tok.samples:
            raise ConfigError(
                f"train.subword_alpha samples segmentations, and this "
                f"{type(tok).__name__} has one (an imported model's, or a "
                "'word' vocabulary of segmented text)"
            )
        text = list(pairs_in)
        kept: list[int] = []
        train = encode_pairs(text, tok, tc.max_len, stats, kept=kept)
        train_text = [text[i] for i in kept]
    else:
        train = encode_pairs(pairs_in, tok, tc.max_len, stats)
    pb.total = pb.n  # the file's lines less the dropped and held-out ones: 100% at the end
    pb.refresh()
    pb.close()
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
        kept_valid: list[int] = []
        valid = encode_pairs(pairs, tok, tc.max_len, vstats, kept=kept_valid)
        refs = [pairs[i][1] for i in kept_valid]
        srcs = [pairs[i][0] for i in kept_valid]
        _report(vstats, "valid" if tc.valid_src else "valid (held out of train)", d)
    if not train:
        raise ConfigError(f"no training pairs left after filtering {tc.src}")
    return RunData(train, valid, refs, srcs, stats.held_out, train_text)


def _report(stats: DataStats, name: str, d: Dist) -> None:
    if d.main:
        (log.warning if stats.dropped else log.info)(stats.report(name))
