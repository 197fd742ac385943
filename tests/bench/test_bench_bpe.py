"""bench/multi30k_bpe.py and multi30k_eval.py's --bpe-codes: the published Multi30k recipe's
subword-nmt segmentation, written and undone (the plumbing; docs/lab/translation_quality.md has
the check against the published files themselves)."""

from __future__ import annotations

import importlib.util
import json
import random
import sys

import pytest
from paths import BENCH


def load(name: str):
    spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_segmentation_is_written_for_every_file_and_undone_exactly(tmp_path, monkeypatch,
                                                                        capsys):  # fmt: skip
    pytest.importorskip("subword_nmt", reason="the segmentation needs subword-nmt (.[test])")
    bpe = load("multi30k_bpe")
    rng = random.Random(0)
    words = ["".join(rng.choices("abcdefghij", k=rng.randint(3, 9))) for _ in range(200)]
    tok = tmp_path / "data" / "tok"
    tok.mkdir(parents=True)
    text: dict[str, list[str]] = {}
    for split in bpe.SPLITS:
        for lang in ("en", "de"):
            lines = [" ".join(rng.choices(words, k=rng.randint(1, 12))) for _ in range(60)]
            bpe.tok_file(tok.parent, split, lang).write_text("\n".join(lines) + "\n")
            text[f"{split}.lc.norm.tok.{lang}"] = lines
    out = tmp_path / "bpe"
    argv = ["multi30k_bpe", "--data", str(tok.parent), "--out", str(out), "--merges", "100",
            "--compare", str(tok)]  # against the text before segmentation  # fmt: skip
    monkeypatch.setattr(sys, "argv", argv)
    bpe.main()
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert report["merges"] == 100 and report["training_piece_types"] > 0
    assert len((out / "codes").read_text().splitlines()) == 1 + 100  # a version line, merges
    seg, join = load("multi30k_eval").subword_nmt(out / "codes")
    segmented_any = False
    for name, lines in text.items():
        written = (out / name).read_text().splitlines()
        assert seg(lines) == written  # the evaluation segments sources as the files are
        assert [join(x) for x in written] == lines  # and "@@ " undone gives the text back
        assert report["lines_differing"][name] == sum("@@ " in x for x in written)
        segmented_any |= any("@@ " in x for x in written)
    assert segmented_any
    assert load("multi30k_eval").subword_nmt(None)[1]("a@@ b") == "a@@ b"  # no codes: as is
