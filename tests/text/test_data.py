"""data.py: reading and validating parallel text, token-budget batching, collation."""

from __future__ import annotations

import dataclasses
import itertools
import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from aiayn.config import BOS_ID, EOS_ID, PAD_ID, TrainConfig
from aiayn.errors import DataError
from aiayn.runtime.distributed import Dist
from aiayn.text.batches import (
    Example,
    batch_plan,
    collate,
    encode_pairs,
    pad_rows,
    padding_efficiency,
    padding_parts,
    resegment,
)
from aiayn.text.corpus import MAX_LINE_CHARS, DataStats, hold_out, read_parallel
from aiayn.text.tokenizer import Tokenizer
from aiayn.training.loader import StepLoader


def write(path, text: str | bytes):
    path.write_bytes(text if isinstance(text, bytes) else text.encode("utf-8"))
    return path


def test_two_files_and_tsv_agree(tmp_path):
    src = write(tmp_path / "a.de", "eins zwei\ndrei\n")
    tgt = write(tmp_path / "a.en", "one two\nthree\n")
    tsv = write(tmp_path / "a.tsv", "eins zwei\tone two\ndrei\tthree\n")
    expected = [("eins zwei", "one two"), ("drei", "three")]
    assert list(read_parallel(src, tgt)) == expected
    assert list(read_parallel(tsv)) == expected


def test_line_count_mismatch_names_both_counts(tmp_path):
    src = write(tmp_path / "a.de", "a\nb\nc\n")
    tgt = write(tmp_path / "a.en", "a\nb\n")
    with pytest.raises(DataError, match=r"has 3 lines but .* has 2"):
        list(read_parallel(src, tgt))


def test_invalid_utf8_names_file_and_line(tmp_path):
    src = write(tmp_path / "a.de", b"gut\nschl\xff\n")
    tgt = write(tmp_path / "a.en", "good\nbad\n")
    with pytest.raises(DataError, match=r"a\.de: line 2 is not valid UTF-8"):
        list(read_parallel(src, tgt))


def test_empty_and_missing_files(tmp_path):
    src = write(tmp_path / "a.de", "")
    tgt = write(tmp_path / "a.en", "x\n")
    with pytest.raises(DataError, match="empty"):
        read_parallel(src, tgt)  # raised at the call, before iteration
    with pytest.raises(DataError, match="not found"):
        read_parallel(tmp_path / "nope.de", tgt)


def test_filtering_is_counted_and_keeps_alignment(tmp_path):
    long = "x" * (MAX_LINE_CHARS + 1)
    src = write(tmp_path / "a.de", f"eins\n\nzwei\n{long}\ndrei\n")
    tgt = write(tmp_path / "a.en", "one\ntwo?\n \nfour\nthree\n")
    stats = DataStats()
    pairs = list(read_parallel(src, tgt, stats))
    assert pairs == [("eins", "one"), ("drei", "three")]
    assert (stats.read, stats.kept, stats.empty, stats.too_long_chars) == (5, 2, 2, 1)
    assert "dropped 3" in stats.report("train") and "line 2" in stats.report("train")


def test_a_line_longer_than_the_cap_is_cut_and_the_next_line_stays_aligned(monkeypatch, caplog):
    """One line is never held whole past MAX_LINE_BYTES (a line of gigabytes was read into
    memory): its head is kept, cut at a character's start, and the rest skipped in pieces."""
    import io

    from aiayn.text import corpus

    monkeypatch.setattr(corpus, "MAX_LINE_BYTES", 8)
    text = "ab\n" + "é" * 10 + "\n" + "x" * 30 + "\n\nlast"
    with caplog.at_level("WARNING", logger="aiayn.text.corpus"):
        lines = list(corpus.read_lines(io.BytesIO(text.encode("utf-8")), "in.txt"))
    assert lines == ["ab", "éééé", "xxxxxxxx", "", "last"]  # 4 x 2 bytes: no é cut in half
    assert "in.txt: line 3 is longer than 8 bytes" in caplog.text


def test_count_lines_counts_as_read_lines_reads(tmp_path):
    """A last line without a newline counts; a line longer than a read block is one line."""
    import io

    from aiayn.text.corpus import count_lines, read_lines

    for text in ["", "a", "a\n", "a\nb", "\n\n", "x" * (3 << 20) + "\ny", "é\r\nü\r\n"]:
        path = write(tmp_path / "c.txt", text)
        assert count_lines(path) == len(list(read_lines(io.BytesIO(text.encode()), "c.txt")))


def test_tsv_with_wrong_field_count(tmp_path):
    tsv = write(tmp_path / "a.tsv", "a\tb\nc\n")
    with pytest.raises(DataError, match="line 2 has 1 tab-separated fields") as e:
        list(read_parallel(tsv))
    # train.valid_src given without valid_tgt is read this way: the message says why
    assert "without its target side is read as source<TAB>target" in str(e.value)


@pytest.fixture(scope="module")
def tok():
    rng = random.Random(0)
    words = ["haus", "baum", "katze", "hund", "house", "tree", "cat", "dog", "the", "a"]
    lines = [" ".join(rng.choices(words, k=rng.randint(1, 8))) for _ in range(300)]
    return Tokenizer.train(lines, vocab_size=300)


def test_encode_pairs_drops_overlong_by_tokens(tok):
    pairs = [("haus", "house"), ("haus " * 40, "house"), ("baum", "tree " * 40)]
    stats = DataStats(read=3)
    exs = encode_pairs(pairs, tok, max_len=20, stats=stats)
    assert len(exs) == 1 and stats.too_long_tokens == 2 and stats.kept == 1
    assert exs[0].src[-1] == EOS_ID and exs[0].tgt[0] == BOS_ID and exs[0].tgt[-1] == EOS_ID
    assert exs[0].tgt[1:-1] == tuple(tok.encode("house", eos=False))  # framed by the tokenizer


def _pairs(n: int, seed: int = 1) -> list[tuple[str, str]]:
    rng = random.Random(seed)
    de, en = ["haus", "baum", "katze", "hund"], ["house", "tree", "cat", "dog"]
    out = []
    for _ in range(n):
        k = [rng.randrange(4) for _ in range(rng.randint(1, 8))]
        out.append((" ".join(de[i] for i in k), " ".join(en[i] for i in k)))
    return out


def test_resegment_samples_other_segmentations_of_the_same_text_seeded(tok):
    """Subword regularization: the text comes back from every sample, a seed gives one sample,
    other seeds others, and a sample longer than max_len falls back to the best segmentation."""
    texts = _pairs(200)
    best = encode_pairs(texts, tok, max_len=64)
    a = resegment(texts, best, tok, 0.3, seed=5, max_len=64)
    assert a == resegment(texts, best, tok, 0.3, seed=5, max_len=64)
    b = resegment(texts, best, tok, 0.3, seed=6, max_len=64)
    assert sum(x != y for x, y in zip(a, b, strict=True)) > 100
    assert sum(x != y for x, y in zip(a, best, strict=True)) > 100
    for (src, tgt), ex in zip(texts, a, strict=True):
        assert ex.src[-1] == EOS_ID and ex.tgt[0] == BOS_ID and ex.tgt[-1] == EOS_ID
        assert tok.decode(ex.src) == src and tok.decode(ex.tgt) == tgt
    assert sum(map(len, (e.src for e in a))) > sum(map(len, (e.src for e in best)))
    tight = max(max(len(e.src), len(e.tgt) - 1) for e in best)  # the best fit; samples not all
    c = resegment(texts, best, tok, 0.3, seed=5, max_len=tight)
    assert all(len(e.src) <= tight and len(e.tgt) - 1 <= tight for e in c)
    assert 0 < sum(x == y for x, y in zip(c, best, strict=True)) < len(best)
    assert resegment(texts, best, tok, 0.0, seed=5, max_len=64) == best  # alpha 0: the best


def test_step_loader_segments_each_epoch_afresh_and_a_resume_finds_the_same_batches(tok):
    texts = _pairs(300)
    best = encode_pairs(texts, tok, max_len=64)
    tc = TrainConfig(subword_alpha=0.1, max_tokens=128, max_len=64, seed=3)

    def batches(loader: StepLoader, epoch: int) -> list[list[Example]]:
        return [[loader.data[i] for i in idx] for idx in loader.plan(epoch)]

    run = StepLoader(best, tc, Dist(), texts, tok)
    first, data0 = batches(run, 0), run.data
    second, data1 = batches(run, 1), run.data
    assert sum(x != y for x, y in zip(data0, data1, strict=True)) > len(best) // 4  # resampled
    resumed = StepLoader(best, tc, Dist(), texts, tok)  # a resume starts at epoch 1
    assert batches(resumed, 1) == second and batches(resumed, 0) == first
    seen = sorted(tok.decode(e.src) for b in second for e in b)
    assert seen == sorted(s for s, _ in texts)  # every pair once an epoch, its text intact
    plain = StepLoader(best, dataclasses.replace(tc, subword_alpha=0.0), Dist(), texts, tok)
    assert plain.plan(0) and plain.data is best


def test_overlong_pair_is_named_by_its_file_line(tmp_path, tok):
    # Line 2 is dropped as empty before encoding, so the over-long pair is the 2nd passed on
    # but line 3 of the files: the report must name what the user can find.
    src = write(tmp_path / "a.de", "haus\n\n" + "haus " * 40 + "\nbaum\n")
    tgt = write(tmp_path / "a.en", "house\ntree\nhouse\ntree\n")
    stats = DataStats()
    exs = encode_pairs(read_parallel(src, tgt, stats), tok, max_len=20, stats=stats)
    assert len(exs) == 2 and stats.examples == ["line 2", "line 3"]
    held = DataStats(read=2)  # pairs not read from files (a held-out set) are named by place
    encode_pairs([("haus", "house"), ("haus " * 40, "house")], tok, max_len=20, stats=held)
    assert held.examples == ["pair 2"]


def test_collate_shifts_targets_and_pads():
    exs = [Example((5, 6, EOS_ID), (BOS_ID, 7, 8, 9, EOS_ID)),
           Example((5, EOS_ID), (BOS_ID, 7, EOS_ID))]  # fmt: skip
    b = collate(exs, [0, 1], PAD_ID)
    assert b.src_BS.tolist() == [[5, 6, EOS_ID], [5, EOS_ID, PAD_ID]]
    assert b.tgt_in_BT.tolist() == [[BOS_ID, 7, 8, 9], [BOS_ID, 7, PAD_ID, PAD_ID]]
    assert b.tgt_out_BT.tolist() == [[7, 8, 9, EOS_ID], [7, EOS_ID, PAD_ID, PAD_ID]]
    assert b.n_tgt_tokens == 6
    assert b.to("cpu").src_BS.dtype == torch.long


@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(st.integers(0, 2**40), max_size=12), min_size=1, max_size=20),
       st.integers(0, 3))  # fmt: skip
def test_pad_rows_is_each_row_then_padding(rows, pad_id):
    """Written all at once through a mask, the batch is still each row in its place, then
    `pad_id` to the longest row (empty rows, and a batch of only empty rows, included)."""
    out = pad_rows(rows, pad_id)
    width = max(len(r) for r in rows)
    assert out.dtype == torch.long and out.shape == (len(rows), width)
    assert out.tolist() == [[*r, *[pad_id] * (width - len(r))] for r in rows]


def random_examples(seed: int, n: int, max_len: int) -> list[Example]:
    """Pairs whose source and target lengths correlate, as translations' do."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        t = rng.randint(1, max_len - 3)
        s = max(0, t + rng.randint(-2, 2))
        src = (*(rng.randint(4, 50) for _ in range(s)), EOS_ID)
        out.append(Example(src, (BOS_ID, *(rng.randint(4, 50) for _ in range(t)), EOS_ID)))
    return out


@settings(max_examples=25, deadline=None, derandomize=True)
@given(
    seed=st.integers(0, 2**16),
    n=st.integers(1, 200),
    max_tokens=st.integers(32, 400),
    epoch=st.integers(0, 3),
)
def test_batch_plan_partitions_and_respects_budget(seed, n, max_tokens, epoch):
    exs = random_examples(seed, n, max_len=32)
    plan = batch_plan(exs, max_tokens, seed=seed, epoch=epoch)
    flat = sorted(i for idx in plan for i in idx)
    assert flat == list(range(n))  # every example in exactly one batch
    for idx in plan:
        b = collate(exs, idx, PAD_ID)
        padded = len(idx) * max(b.src_BS.size(1), b.tgt_out_BT.size(1))
        assert padded <= max_tokens
    assert plan == batch_plan(exs, max_tokens, seed=seed, epoch=epoch)  # a pure function


@settings(max_examples=50, deadline=None, derandomize=True)
@given(sizes=st.lists(st.integers(1, 40), min_size=1, max_size=64), slack=st.integers(0, 80))
def test_padding_parts_cut_a_batch_by_length_within_the_slack(sizes, slack):
    """A server's admission cut for the encoder: every index once, parts longest first, each
    part's padding within `slack`, and a part ends only where the next item would break it."""
    parts = padding_parts(sizes, slack)
    assert sorted(i for p in parts for i in p) == list(range(len(sizes)))
    flat = [sizes[i] for p in parts for i in p]
    assert flat == sorted(sizes, reverse=True)
    for p, nxt in itertools.zip_longest(parts, parts[1:]):
        width = sizes[p[0]]
        assert len(p) * width - sum(sizes[i] for i in p) <= slack
        if nxt is not None:  # the next item did not fit
            assert (len(p) + 1) * width - sum(sizes[i] for i in p) - sizes[nxt[0]] > slack
    assert len(padding_parts(sizes, 40 * 64)) == 1
    assert all(len({sizes[i] for i in p}) == 1 for p in padding_parts(sizes, 0))


def test_bucketing_beats_random_batching_on_padding():
    exs = random_examples(1, 2000, max_len=60)
    plan = batch_plan(exs, 1000, seed=0)
    rng = random.Random(0)
    order = list(range(len(exs)))
    rng.shuffle(order)
    same_sizes = []
    start = 0
    for idx in plan:  # random batches with the same batch sizes
        same_sizes.append(order[start : start + len(idx)])
        start += len(idx)
    assert padding_efficiency(exs, plan) > 0.85 > padding_efficiency(exs, same_sizes)
    assert batch_plan(exs, 1000, seed=0, epoch=1) != plan  # reshuffled each epoch


def test_example_larger_than_budget_is_a_clear_error():
    exs = [Example((5,) * 30 + (EOS_ID,), (BOS_ID, 6, EOS_ID))]
    with pytest.raises(DataError, match="does not fit max_tokens=16"):
        batch_plan(exs, 16)


def test_hold_out_draws_a_bounded_deterministic_validation_set_that_training_never_sees(tmp_path):
    """5% of the lines (at most 2000), drawn by seed; deduplicated by source; training leaves out
    the drawn lines and every other pair with a held-out source (a repeated sentence)."""
    rng = random.Random(0)
    lines = [f"s{rng.randrange(300)} x" for _ in range(1000)]  # many sources repeat
    src = write(tmp_path / "t.src", "".join(f"{s}\n" for s in lines))
    tgt = write(tmp_path / "t.tgt", "".join(f"{s} T\n" for s in lines))
    held = hold_out(src, tgt, seed=3)
    assert held.corpus_lines == 1000 and len(held.lines) == 50  # 5% of 1000
    sources = [s for s, _ in held.pairs]
    assert len(sources) == len(set(sources)) and 0 < len(sources) <= 50
    assert held.sources == frozenset(sources)
    assert all(t == f"{s} T" for s, t in held.pairs)  # aligned pairs
    assert hold_out(src, tgt, seed=3) == held and hold_out(src, tgt, seed=4).lines != held.lines
    stats = DataStats()
    train = list(read_parallel(src, tgt, stats, held))
    assert not {s for s, _ in train} & held.sources
    left_out = sum(1 for s in lines if s in held.sources)  # the drawn lines and their repeats
    assert stats.held_out == left_out > len(held.pairs) and len(train) == 1000 - left_out
    assert "held out for validation" in stats.report("train")
    big = write(tmp_path / "big.tsv", "".join(f"{i}\t{i}\n" for i in range(50_000)))
    assert len(hold_out(big, None, seed=1).pairs) == 2000  # the cap, not 5% (2500)
    small = write(tmp_path / "small.tsv", "a\tb\n" * 19)
    assert hold_out(small, None, seed=1).pairs == []  # 5% of 19 lines is no pair at all
