"""The joint SentencePiece vocabulary: exact round trips, fixed special ids, clear errors."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aiayn.config import BOS_ID, EOS_ID, PAD_ID, UNK_ID
from aiayn.errors import CheckpointError, DataError
from aiayn.text.tokenizer import ONE_BY_ONE, TOKENIZER_FILE, Tokenizer

CORPUS = [
    "Ein Mann fährt Fahrrad auf der Straße.",
    "A man rides a bicycle on the street.",
    "Zwei Hunde spielen im Schnee.",
    "Two dogs are playing in the snow.",
] * 50


@pytest.fixture(scope="module")
def tok():
    return Tokenizer.train(CORPUS, vocab_size=400)


def test_special_ids_are_the_projects(tok):
    sp = tok.sp
    assert (sp.pad_id(), sp.unk_id(), sp.bos_id(), sp.eos_id()) == (PAD_ID, UNK_ID, BOS_ID, EOS_ID)
    ids = tok.encode("Zwei Hunde", bos=True)
    assert ids[0] == BOS_ID and ids[-1] == EOS_ID and PAD_ID not in ids


# Single spaces between words: SentencePiece folds runs of spaces, by design.
words = st.text(st.characters(blacklist_categories=("Cs", "Cc", "Zs", "Zl", "Zp")), min_size=1)


@settings(max_examples=30)
@given(st.lists(words, min_size=1, max_size=6))
def test_round_trip_is_exact_even_for_unseen_characters(tok, parts):
    text = " ".join(parts)
    ids = tok.encode(text)
    assert UNK_ID not in ids  # byte fallback: no character is lost
    assert tok.decode(ids) == text


def test_decode_stops_at_eos_and_skips_pad_and_bos(tok):
    ids = tok.encode("Zwei Hunde", bos=True)
    assert tok.decode([*ids, PAD_ID, *tok.encode("Schnee")]) == "Zwei Hunde"


def test_batch_encoding_equals_one_by_one(tok):
    lines = ["Ein Mann", "Zwei Hunde spielen", "snow"]
    assert tok.encode_batch(lines, bos=True) == [tok.encode(x, bos=True) for x in lines]
    many = CORPUS[: 2 * ONE_BY_ONE]  # SentencePiece's list call, not one call a line
    assert tok.encode_batch(many) == [tok.encode(x) for x in many]


def test_save_and_load(tmp_path, tok):
    tok.save(tmp_path)
    again = Tokenizer.load(tmp_path)
    assert again.encode("Ein Mann fährt") == tok.encode("Ein Mann fährt")
    assert again.vocab_size == tok.vocab_size


SEGMENTED = ["ein mann mit einem orange@@ farb@@ enen hut .", "a man in an orange hat ."] * 20


@pytest.fixture(scope="module")
def word_tok():
    return Tokenizer.train(SEGMENTED, vocab_size=8000, model_type="word")


def test_a_word_vocabulary_keeps_the_texts_own_segmentation(word_tok, tmp_path):
    """Text segmented beforehand (subword-nmt's "@@ " BPE, as fairseq's published recipes):
    each piece between spaces is one id, and decoding gives the segmented text back."""
    types = {w for line in SEGMENTED for w in line.split()}
    assert word_tok.vocab_size == 4 + 256 + len(types)  # specials, bytes, every piece
    ids = word_tok.encode(SEGMENTED[0])
    assert [p.lstrip("\u2581") for p in word_tok.pieces(ids[:-1])] == SEGMENTED[0].split()
    assert word_tok.decode(ids) == SEGMENTED[0]
    assert not word_tok.samples  # one segmentation: subword regularization has none to draw
    word_tok.save(tmp_path)
    again = Tokenizer.load(tmp_path)
    assert not again.samples and again.decode(ids) == SEGMENTED[0]


@settings(max_examples=30)
@given(st.lists(words, min_size=1, max_size=6))
def test_a_word_vocabulary_round_trips_unseen_pieces_in_bytes(word_tok, parts):
    # an unseen piece is spelled in bytes, its space marker with it, which SentencePiece
    # decodes as the character U+2581: JointTokenizer.decode reads it as the space it stands for
    text = " ".join(["mann", *parts, "hut"])
    ids = word_tok.encode(text)
    assert UNK_ID not in ids
    assert word_tok.decode(ids) == " ".join(text.replace("\u2581", " ").split())


def test_small_corpus_gets_the_largest_vocabulary_it_supports():
    assert 260 < Tokenizer.train(["hello world", "foo bar"], vocab_size=8000).vocab_size < 8000


def test_clear_errors(tmp_path):
    with pytest.raises(DataError, match="too small: this text needs at least"):
        Tokenizer.train(CORPUS, vocab_size=262)  # fewer than the bytes, specials and characters
    for tiny in (3, 100):  # 3 was SentencePiece's "INTERNAL: ... insert_id(eos_id)"
        with pytest.raises(DataError, match="too small: a vocabulary needs at least 260 pieces"):
            Tokenizer.train(CORPUS, vocab_size=tiny)
    with pytest.raises(DataError, match="empty text"):
        Tokenizer.train(["", "  "])
    with pytest.raises(CheckpointError, match="no tokenizer"):
        Tokenizer.load(tmp_path)
    (tmp_path / TOKENIZER_FILE).write_bytes(b"not a model")
    with pytest.raises(CheckpointError, match="not a SentencePiece model"):
        Tokenizer.load(tmp_path)
