"""The copy task's corpus and tokenizer, once per test module (copy_task.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from copy_task import write_copy_corpus

from aiayn.text.tokenizer import Tokenizer


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return write_copy_corpus(tmp_path_factory.mktemp("copy"))


@pytest.fixture(scope="module")
def tok(corpus):
    lines = Path(corpus["train.src"]).read_text().splitlines()
    return Tokenizer.train(lines, vocab_size=300)
