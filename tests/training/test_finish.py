"""finish.py: the end of a run: the last weights validated and saved, the last checkpoints
averaged (a stop inside the span stands in for those not reached), alpha chosen on validation."""

from __future__ import annotations

import json
import logging

import torch
from copy_task import assert_mean_of_checkpoints, tiny

from aiayn.store.checkpoints import list_checkpoints
from aiayn.store.model_dir import load_model_dir, load_tensors
from aiayn.training.loop import train


def test_the_last_weights_are_validated_and_a_model_is_always_saved(corpus, tok, tmp_path):
    """Stopping between validations still validates the final weights (they may be the best),
    and a run stopped before its first validation still leaves a loadable model directory."""
    out = tmp_path / "run"
    train(tiny(corpus, out, **{"train.max_steps": 13, "train.valid_every": 5}), tokenizer=tok,
          progress=False)  # fmt: skip
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if "valid_loss" in r] == [5, 10, 13]
    early = tmp_path / "early"
    over = {"train.max_steps": 3, "train.valid_every": 1000, "train.save_every": 1000}
    train(tiny(corpus, early, **over), tokenizer=tok, progress=False)
    assert load_model_dir(early).cfg.vocab_size == tok.vocab_size


def test_a_stop_inside_the_averaged_span_stands_in_for_the_checkpoints_not_reached():
    from aiayn.training.finish import averaged_steps

    planned = [840, 879, 918, 957, 996]
    assert averaged_steps(planned, 996) == planned  # on schedule
    assert averaged_steps(planned, 991) == [840, 879, 918, 957, 991]  # max_minutes, 5 short
    assert averaged_steps(planned, 957) == [840, 879, 918, 957]  # on a planned step: itself
    assert averaged_steps(planned, 800) == []  # before the span: nothing to stand in for
    assert averaged_steps([], 50) == []


def test_a_run_stopped_inside_the_averaged_span_still_averages(corpus, tok, tmp_path, caplog,
                                                               monkeypatch):  # fmt: skip
    """max_minutes stops the run at step 58 of a schedule ending at 60 (a machine slower than
    its last re-fit knew): averaged/ is the mean of the planned checkpoints 52 and 56 and the
    stop's own at 58, and the log says which stood in."""

    from aiayn.training.run import Run

    should_stop = Run.should_stop

    def late_at_58(self: Run, flag: dict[str, int]) -> str | None:
        return "max_minutes" if self.state.step == 58 else should_stop(self, flag)

    monkeypatch.setattr(Run, "should_stop", late_at_58)
    out = tmp_path / "run"
    over = {"train.lr_schedule": "cosine_budget", "train.lr": 1e-3, "train.warmup_steps": 10,
            "train.average_last": 3, "train.valid_every": 1000, "train.save_every": 20,
            "train.max_steps": 60}  # fmt: skip
    with caplog.at_level(logging.INFO, logger="aiayn.training.finish"):
        result = train(tiny(corpus, out, **over), tokenizer=tok, progress=False)
    assert result.stopped == "max_minutes" and result.step == 58
    said = [r.getMessage() for r in caplog.records if "averaged the checkpoints" in r.getMessage()]
    assert len(said) == 1 and "[52, 56, 58]" in said[0] and "stands in" in said[0]
    assert_mean_of_checkpoints(out, (52, 56, 58))


def test_a_stale_trash_averaged_does_not_stop_the_average(corpus, tok, tmp_path):
    """An interrupted earlier swap can leave `.trash_averaged`: the next average clears it."""
    out = tmp_path / "run"
    over = {"train.lr_schedule": "cosine_budget", "train.max_steps": 20,
            "train.average_last": 2, "train.save_every": 10, "train.valid_every": 1000}  # fmt: skip
    train(tiny(corpus, out, **over), tokenizer=tok, progress=False)
    first = (out / "averaged" / "model.safetensors").read_bytes()
    (out / ".trash_averaged").mkdir()
    (out / ".trash_averaged" / "model.safetensors").write_bytes(b"stale")
    train(tiny(corpus, out, **over), tokenizer=tok, progress=False)  # a rerun: averages again
    assert (out / "averaged" / "model.safetensors").read_bytes() == first
    assert not (out / ".trash_averaged").exists()


def test_a_budget_run_chooses_alpha_on_validation_for_its_averaged_model(
    corpus, tok, tmp_path, capsys
):
    """At the end of a cosine_budget run the averaged model's [decode] alpha is the best of
    ALPHA_GRID on validation (unless within chance of the recipe's own), found by the same sweep
    as `evaluate --alphas` (same BLEUs), and
    saved where translate reads its defaults; the run directory's own model keeps its alpha."""
    from aiayn.cli.main import main
    from aiayn.store.directory import saved_decode_config
    from aiayn.training.finish import ALPHA_GRID
    from aiayn.translate.evaluate import best_alpha_row

    out = tmp_path / "run"
    over = {"train.lr_schedule": "cosine_budget", "train.lr": 3e-3, "train.warmup_steps": 10,
            "train.max_steps": 60, "train.valid_every": 1000, "train.average_last": 2,
            "decode.beam_size": 2}  # fmt: skip
    train(tiny(corpus, out, **over), tokenizer=tok, progress=False)
    saved = json.loads((out / "averaged" / "run_config.json").read_text())
    choice = saved["alpha_choice"]
    assert choice["sentences"] == 40 and choice["beam_size"] == 2  # the whole validation set
    rows = choice["rows"]
    assert [r["alpha"] for r in rows] == list(ALPHA_GRID)
    # sweep_alpha's choice: the highest, unless within chance of the recipe's own 0.6
    best = rows[best_alpha_row(rows, keep=[r["current"] for r in rows].index(True))]
    assert [r["best"] for r in rows].count(True) == 1 and best["best"]
    assert saved["decode"]["alpha"] == best["alpha"] == saved_decode_config(out / "averaged").alpha
    assert saved_decode_config(out).alpha == 0.6  # the run's own [decode] is untouched
    capsys.readouterr()
    args = ["evaluate", "--model", str(out / "averaged"), "--src", corpus["train.valid_src"],
            "--ref", corpus["train.valid_tgt"], "--beam", "2", "--json",
            "--alphas", ",".join(str(a) for a in ALPHA_GRID)]  # fmt: skip
    assert main(args) == 0
    swept = json.loads(capsys.readouterr().out)
    assert [(r["alpha"], r["bleu"]) for r in swept] == [(r["alpha"], r["bleu"]) for r in rows]


def test_the_alpha_sweep_takes_as_many_sentences_as_its_cost_bound_allows():
    """At the speed the probe measured (per source character), as many sentences as keep
    every α's pass within the bound; never fewer than 300 (or all), never more than all."""
    from aiayn.training.finish import ALPHA_SENTENCES, alpha_sentences, alpha_sweep_bound

    assert ALPHA_SENTENCES == 300
    assert alpha_sweep_bound(0) == 120 and alpha_sweep_bound(20) == 120  # 2 minutes at least
    assert alpha_sweep_bound(60) == 360  # 10% of the budget
    lengths = [50] * 2000  # 100 sentences in 1 s: 0.2 ms a character, 4 passes 40 ms a sentence
    assert alpha_sentences(lengths, 100, 1.0, 4, 120.0) == (2000, 80.0)  # all of them fit
    n, estimate = alpha_sentences(lengths, 100, 1.0, 4, 60.0)
    assert (n, estimate) == (1500, 60.0)  # as many as fit
    assert alpha_sentences(lengths, 100, 10.0, 4, 60.0) == (300, 120.0)  # over, but 300
    assert alpha_sentences(lengths[:200], 100, 10.0, 4, 1.0)[0] == 200  # all, when fewer
    # the cost follows the sources' lengths, not their number
    n, _ = alpha_sentences([50] * 100 + [500] * 1900, 100, 1.0, 4, 120.0)
    assert n == 100 + 290  # 4 s for the first 100, then 0.4 s each


def test_a_run_sweeps_alpha_on_more_than_300_validation_sentences_when_they_fit(
    corpus, tok, tmp_path, caplog, monkeypatch
):
    """A validation set of 400 pairs, within the sweep's bound (made generous here, so a
    slow machine decides nothing): the α sweep runs on all 400, not the first 300, and the log
    says so and why."""
    from aiayn.training import finish

    monkeypatch.setattr(finish, "alpha_sweep_bound", lambda max_minutes: 1e6)
    out = tmp_path / "run"
    over = {"train.lr_schedule": "cosine_budget", "train.lr": 3e-3, "train.warmup_steps": 10,
            "train.max_steps": 30, "train.valid_every": 1000, "train.average_last": 2,
            "decode.beam_size": 2, "train.valid_src": corpus["train.src"],
            "train.valid_tgt": corpus["train.tgt"]}  # fmt: skip
    with caplog.at_level(logging.INFO, logger="aiayn.training.finish"):
        train(tiny(corpus, out, **over), tokenizer=tok, progress=False)
    choice = json.loads((out / "averaged" / "run_config.json").read_text())["alpha_choice"]
    assert (choice["sentences"], choice["of"]) == (400, 400)
    assert choice["estimated_s"] <= choice["bound_s"] == 1e6
    said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("alpha sweep")]
    assert len(said) == 1 and said[0].startswith("alpha sweep on 400 of 400 validation sentences")
    assert "within its" in said[0]
    assert "on 400 validation sentences" in caplog.text  # the choice's own line


def test_a_run_of_any_schedule_averages_its_last_checkpoints(corpus, tok, tmp_path, capsys):
    """average_last with the paper's schedule (not cosine_budget): at the end the last n
    checkpoints kept (save_every apart, and the final step's) are averaged into
    OUT_DIR/averaged, the same weights as `aiayn average --last n`, and its alpha is chosen on
    validation as a budget run's is."""
    from aiayn.cli.main import main
    from aiayn.store.directory import saved_decode_config

    out = tmp_path / "run"
    over = {"train.lr_schedule": "noam", "train.max_steps": 50, "train.save_every": 20,
            "train.keep_last": 3, "train.average_last": 3, "train.valid_every": 1000,
            "decode.beam_size": 2}  # fmt: skip
    train(tiny(corpus, out, **over), tokenizer=tok, progress=False)
    assert [int(c.name[5:]) for c in list_checkpoints(out)] == [20, 40, 50]
    assert main(["average", "--run", str(out), "--last", "3", "--out", str(tmp_path / "cli")]) == 0
    ours = load_tensors(out / "averaged" / "model.safetensors")
    theirs = load_tensors(tmp_path / "cli" / "model.safetensors")
    assert ours.keys() == theirs.keys()
    for k in ours:
        torch.testing.assert_close(ours[k], theirs[k], rtol=0, atol=0)
    saved = json.loads((out / "averaged" / "run_config.json").read_text())
    assert saved["alpha_choice"]["beam_size"] == 2
    assert saved_decode_config(out / "averaged").alpha == saved["decode"]["alpha"]
    capsys.readouterr()


def test_choose_alpha_false_keeps_the_recipes_length_penalty(corpus, tok, tmp_path, caplog):
    """A published recipe's own search (fairseq's lenpen 1: "power", alpha 1.0) stays the
    averaged model's with train.choose_alpha = false; turning it back on is no new experiment
    (the run resumes), and its sweep keeps the recipe's form."""
    from aiayn.store.directory import saved_decode_config

    out = tmp_path / "run"
    over = {"train.lr_schedule": "noam", "train.max_steps": 30, "train.save_every": 10,
            "train.keep_last": 2, "train.average_last": 2, "train.valid_every": 1000,
            "train.choose_alpha": False, "decode.beam_size": 2, "decode.alpha": 1.0,
            "decode.length_penalty": "power"}  # fmt: skip
    with caplog.at_level(logging.INFO, logger="aiayn"):
        train(tiny(corpus, out, **over), tokenizer=tok, progress=False)
    assert "alpha not chosen (train.choose_alpha = false)" in caplog.text
    saved = json.loads((out / "averaged" / "run_config.json").read_text())
    assert "alpha_choice" not in saved
    kept = saved_decode_config(out / "averaged")
    assert (kept.alpha, kept.length_penalty) == (1.0, "power")
    over |= {"train.max_steps": 40, "train.choose_alpha": True}
    result = train(tiny(corpus, out, **over), tokenizer=tok, progress=False)
    assert result.step == 40  # resumed, not refused
    chosen = saved_decode_config(out / "averaged")
    assert chosen.length_penalty == "power" and "alpha_choice" in json.loads(
        (out / "averaged" / "run_config.json").read_text()
    )
