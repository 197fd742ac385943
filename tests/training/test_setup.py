"""setup.py: a run before its first step: the tokenizer, the data check, a held-out validation
set, and what a resume checks (foreign directories, changed recipes, moved or edited data)."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
from copy_task import tiny

from aiayn.errors import CheckpointError
from aiayn.store.checkpoints import list_checkpoints
from aiayn.training.loop import train


def test_the_data_check_and_encoding_of_a_run_have_bars_only_where_training_has_one(
    corpus, tok, tmp_path, monkeypatch, capsys
):
    """Training's own data check and the encoding are passes over the corpus (minutes for a
    large one): on a terminal each shows a bar; with --no-progress, or in a log, none."""
    import aiayn.runtime.progress as progress
    import aiayn.training.setup as training

    monkeypatch.setattr(progress, "interactive", lambda: True)  # a terminal, as far as the bar
    monkeypatch.setattr(training, "interactive", lambda: True)  # and training can tell
    dropped = {"train.src": tmp_path / "train.src", "train.tgt": tmp_path / "train.tgt"}
    for key, extra in (("train.src", "a b\n" * 5), ("train.tgt", "\n" * 5)):  # 5 empty sides
        dropped[key].write_text(Path(corpus[key]).read_text() + extra)
    bar = tiny({**corpus, **{k: str(v) for k, v in dropped.items()}}, tmp_path / "bar",
               **{"train.max_steps": 1})  # fmt: skip
    train(bar, tokenizer=tok)
    err = capsys.readouterr().err
    assert "check train.src: 100%" in err and "405/405" in err
    # the encoding's bar ends at 100% of the pairs passed on, not at 400 of the file's 405
    assert "encode train.src: 100%" in err and "400/400" in err
    train(tiny(corpus, tmp_path / "quiet", **{"train.max_steps": 1}), tokenizer=tok,
          progress=False)  # fmt: skip
    err = capsys.readouterr().err
    assert "check train.src" not in err and "encode train.src" not in err


def test_two_files_are_enough_a_validation_set_is_held_out(corpus, tok, tmp_path):
    """Without valid_src/valid_tgt the run holds 5% of the corpus out, writes it into the run
    directory, records it in run_config.json, validates on it (best checkpoint, BLEU), never
    trains on its sources, and resumes with the same held-out set."""
    two_files = {k: v for k, v in corpus.items() if not k.startswith("train.valid")}
    out = tmp_path / "run"
    over = {"train.max_steps": 20, "train.valid_every": 10, "train.bleu_samples": 5}
    train(tiny(two_files, out, **over), tokenizer=tok, progress=False)
    run_cfg = json.loads((out / "run_config.json").read_text())
    held = run_cfg["heldout_valid"]
    src_lines = (out / held["src"]).read_text().splitlines()
    tgt_lines = (out / held["tgt"]).read_text().splitlines()
    assert held["corpus_lines"] == 400 and held["drawn"] == 20  # 5% of the copy corpus
    assert len(src_lines) == len(tgt_lines) == held["pairs"] > 0 and src_lines == tgt_lines
    corpus_src = Path(corpus["train.src"]).read_text().splitlines()
    repeats = sum(1 for line in corpus_src if line in set(src_lines))
    assert held["left_out_of_training"] == repeats >= held["pairs"]
    assert run_cfg["train"]["valid_src"] == ""  # the recipe is unchanged: a resume matches
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    valid = [r for r in records if "valid_loss" in r]
    assert [r["step"] for r in valid] == [10, 20] and all("valid_bleu" in r for r in valid)
    assert valid[-1]["best_step"] in (10, 20)
    more = train(tiny(two_files, out, **{**over, "train.max_steps": 30}), progress=False)
    assert more.step == 30 and (out / held["src"]).read_text().splitlines() == src_lines


def test_train_runs_the_data_check_and_says_what_it_found(corpus, tok, tmp_path, caplog):
    """The copy corpus is all copies, repeats some pairs, and its validation set is its first
    40 training pairs: the log says so, once per run (not again on resume)."""

    from aiayn.text.check import check_corpus

    expected = check_corpus(
        corpus["train.src"],
        corpus["train.tgt"],
        {"valid": (corpus["train.valid_src"], corpus["train.valid_tgt"])},
    )
    assert expected.counts["copies"] == 400 and expected.counts["overlap"] == 40
    with caplog.at_level(logging.INFO, logger="aiayn.training.setup"):
        train(tiny(corpus, tmp_path / "run", **{"train.max_steps": 2}), tokenizer=tok,
              progress=False)  # fmt: skip
    found = [r.getMessage() for r in caplog.records if "data check" in r.getMessage()]
    assert len(found) == 1 and found[0].startswith(f"data check: {expected.summary()} (")
    assert "aiayn data check --src" in found[0]
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="aiayn.training.setup"):
        train(tiny(corpus, tmp_path / "run", **{"train.max_steps": 3}), progress=False)
    assert not [r for r in caplog.records if "data check" in r.getMessage()]


def test_refuses_foreign_dirs_incompatible_configs_and_corrupt_checkpoints(corpus, tok, tmp_path):
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    with pytest.raises(CheckpointError, match="refusing to overwrite"):
        train(tiny(corpus, foreign, **{"train.max_steps": 2}), tokenizer=tok, progress=False)
    assert (foreign / "notes.txt").read_text() == "mine" and len(list(foreign.iterdir())) == 1

    out = tmp_path / "run"
    train(tiny(corpus, out, **{"train.max_steps": 4}), tokenizer=tok, progress=False)
    before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    with pytest.raises(CheckpointError, match=r"model.d_model was 32, now 48"):
        train(tiny(corpus, out, **{"train.max_steps": 8, "model.d_model": 48}), progress=False)
    with pytest.raises(CheckpointError, match=r"train.max_tokens was 256"):
        train(tiny(corpus, out, **{"train.max_steps": 8, "train.max_tokens": 512}), progress=False)
    last = list_checkpoints(out)[-1]
    (last / "optimizer.safetensors").write_bytes(b"garbage")
    before[last / "optimizer.safetensors"] = b"garbage"
    with pytest.raises(CheckpointError, match="not a readable safetensors file"):
        train(tiny(corpus, out, **{"train.max_steps": 8}), progress=False)
    after = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    assert after == before  # nothing overwritten by any refused attempt


def test_a_run_from_before_a_field_existed_resumes_under_its_default(corpus, tok, tmp_path):
    """A field added after the run started is missing from its run_config.json: the default
    (new options start off) is what the run ran, so it resumes under it, and only under it."""
    out = tmp_path / "run"
    train(tiny(corpus, out, **{"train.max_steps": 4}), tokenizer=tok, progress=False)
    path = out / "run_config.json"
    saved = json.loads(path.read_text())
    del saved["train"]["subword_alpha"], saved["model"]["activation"]
    path.write_text(json.dumps(saved))
    with pytest.raises(CheckpointError, match=r"train.subword_alpha was 0.0, now 0.1"):
        train(tiny(corpus, out, **{"train.max_steps": 8, "train.subword_alpha": 0.1}),
              progress=False)  # fmt: skip
    assert train(tiny(corpus, out, **{"train.max_steps": 8}), progress=False).step == 8


def test_resume_follows_moved_data_and_refuses_edited_data(corpus, tok, tmp_path):
    """The data is checked by content (sha256 in run_config.json): moved files resume, edited
    files are refused, whatever their path."""
    moved = tmp_path / "moved"
    moved.mkdir()
    new_paths = {}
    for key, path in corpus.items():
        new_paths[key] = str(moved / Path(path).name)
        Path(new_paths[key]).write_bytes(Path(path).read_bytes())
    out = tmp_path / "run"
    train(tiny(corpus, out, **{"train.max_steps": 4}), tokenizer=tok, progress=False)
    result = train(tiny(new_paths, out, **{"train.max_steps": 8}), progress=False)
    assert result.step == 8
    saved = json.loads((out / "run_config.json").read_text())
    assert saved["train"]["src"] == new_paths["train.src"]
    tgt = Path(new_paths["train.tgt"])
    tgt.write_text(tgt.read_text().replace("a", "b", 1))  # same lines, one letter changed
    with pytest.raises(CheckpointError, match=r"train.tgt .* differs from the file the run"):
        train(tiny(new_paths, out, **{"train.max_steps": 12}), progress=False)
