"""Translator API, `aiayn translate` / `aiayn evaluate`, metrics, and their bad-input errors."""

from __future__ import annotations

import io
import json
import logging
import math
import os
import random
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from paths import CONFIGS

from aiayn.cli.main import main
from aiayn.config import DecodeConfig, ModelConfig, search_rows
from aiayn.errors import DataError
from aiayn.nn.model import Transformer
from aiayn.store.model_dir import save_model_dir
from aiayn.text.corpus import read_lines
from aiayn.text.tokenizer import Tokenizer
from aiayn.translate.metrics import bleu, bleu_by_source_length, chrf, exact_match
from aiayn.translate.significance import significance
from aiayn.translate.translator import Translator, token_budget_batches

WORDS = ["haus", "katze", "hund", "baum", "auto", "weg", "stadt", "fluss", "berg", "see", "wald"]


def corpus(n: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choices(WORDS, k=rng.randint(1, 8))) for _ in range(n)]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real model directory: a SentencePiece tokenizer and a (random) cpu_tiny Transformer."""
    directory = tmp_path_factory.mktemp("model")
    tok = Tokenizer.train(corpus(400), vocab_size=320)
    torch.manual_seed(0)
    cfg = ModelConfig.preset("cpu_tiny", vocab_size=tok.vocab_size, d_model=32, d_ff=64, max_len=40)
    save_model_dir(Transformer(cfg), directory)
    tok.save(directory)
    return directory


@pytest.fixture(scope="module")
def translator(model_dir: Path) -> Translator:
    return Translator.load(model_dir, DecodeConfig(max_len_a=0.0, max_len_b=6))


def test_one_output_per_input_in_order(translator: Translator) -> None:
    lines = ["haus katze", "", "   ", *corpus(10, seed=1), ""]
    out = translator.translate(lines, beam=2, batch_tokens=16)
    assert len(out) == len(lines)
    assert out[1] == out[2] == out[-1] == ""
    # Sorting and batching do not change any translation: one by one gives the same.
    assert out == [translator.translate([line], beam=2)[0] for line in lines]
    assert all("\n" not in t for t in out)


def test_translate_api_defaults_and_overrides(translator: Translator) -> None:
    [greedy] = translator.translate(["hund baum"], beam=1)
    assert translator.translate(["hund baum"], sample=True, top_k=1) == [greedy]
    hyps = translator.translate_hyps(["hund baum"], translator.settings(beam=3, nbest=3))[0]
    assert len(hyps) == 3 and hyps[0].hyp.score >= hyps[-1].hyp.score
    for wrong in ("hund baum", ["hund", None]):  # the str's characters were translated one each
        with pytest.raises(TypeError, match=r"a list of sentences \(str\)"):
            translator.translate(wrong)  # type: ignore[arg-type]


def test_token_budget_batches() -> None:
    lengths = [3, 10, 2, 7, 7, 1, 30]
    batches = token_budget_batches(lengths, 20)
    assert sorted(i for b in batches for i in b) == list(range(len(lengths)))
    assert batches[0] == [6]  # longer than the budget: a batch of its own
    for b in batches:
        assert len(b) == 1 or max(lengths[i] for i in b) * len(b) <= 20


def test_a_wide_beam_is_batched_by_its_rows(
    translator: Translator, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The token budget counts source tokens: beam 400 over 2,048 of them made batches of
    ~40,000 search rows (16 GB on a 500-word model). A batch holds at most MAX_BATCH_ROWS rows
    (sentences x beam, or x samples), with the same translations as one batch of all."""
    assert token_budget_batches([2] * 10, 1000, max_count=3) == [[0, 1, 2], [3, 4, 5],
                                                                 [6, 7, 8], [9]]  # fmt: skip
    import aiayn.translate.translator as tr

    rows: list[int] = []
    real = tr.search

    def spy(model, src_BS, cfg, **kw):  # the real search, its batches' rows noted
        rows.append(src_BS.size(0) * search_rows(cfg))
        return real(model, src_BS, cfg, **kw)

    def texts(cfg: DecodeConfig, max_rows: int) -> list[list[str]]:
        monkeypatch.setattr(tr, "MAX_BATCH_ROWS", max_rows)
        rows.clear()
        return [[h.text for h in r] for r in translator.translate_hyps(lines, cfg)]

    monkeypatch.setattr(tr, "search", spy)
    lines = corpus(30, seed=4)
    for settings in (dict(beam=8, nbest=2), dict(sample=True, nbest=5), dict(beam=1)):
        cfg = translator.settings(**settings)  # type: ignore[arg-type]
        whole = texts(cfg, 10_000)  # one batch of all 30 sentences
        assert rows == [len(lines) * search_rows(cfg)]
        assert texts(cfg, 40) == whole, settings  # the rule, at this model's small scale
        assert max(rows) <= 40 and sum(rows) == len(lines) * search_rows(cfg), settings


def test_long_line_is_truncated_with_warning(
    translator: Translator, caplog: pytest.LogCaptureFixture
) -> None:
    long_line = " ".join(["katze"] * 200)
    with caplog.at_level(logging.WARNING, logger="aiayn.translate.translator"):
        out = translator.translate(["haus", long_line], beam=1)
    assert len(out) == 2
    assert "line 2 has" in caplog.text and "max_len=40" in caplog.text


def test_read_lines_names_bad_utf8() -> None:
    stream = io.BytesIO(b"gut\nauch gut\r\nschlecht \xff\n")
    with pytest.raises(DataError, match=r"x\.txt: line 3 is not valid UTF-8"):
        list(read_lines(stream, "x.txt"))


def test_read_lines_drops_crlf_and_a_leading_byte_order_mark() -> None:
    """A file saved by a Windows editor: its BOM was part of the first sentence ("one" came
    out as "fünfzehntausendein" from the quick start model, "ein" without it)."""
    stream = io.BytesIO(b"\xef\xbb\xbfone\r\ntwo\r\n\xef\xbb\xbfthree\n")
    assert list(read_lines(stream, "x.txt")) == ["one", "two", "\ufeffthree"]  # only at the start


def test_a_byte_order_mark_inside_the_text_is_no_part_of_the_sentence(translator) -> None:
    """Not only at a file's start: pasted into a served text, or at a line of concatenated
    files, a U+FEFF was translated as a character (byte-fallback pieces); and `aiayn explain`
    encoded its sentence unstripped where translate stripped it: each reads `source_text`."""
    from aiayn.glassbox.explain import source_ids

    sentence = corpus(1, seed=3)[0]
    variants = [sentence, f"\ufeff{sentence}", f"  \ufeff {sentence}\t", "\ufeff", " \ufeff "]
    assert translator.encode_lines(variants)[1] == [translator.tokenizer.encode(sentence)] * 3
    assert translator.translate(variants, beam=1)[3:] == ["", ""]
    for text in variants[:3]:
        assert source_ids(translator.model, translator.tokenizer, text) == translator.encode_lines(
            [text])[1][0]  # fmt: skip


def test_metrics() -> None:
    refs = ["the cat sat on the mat", "a dog"]
    assert bleu(refs, refs).score == pytest.approx(100.0)
    assert bleu(refs, refs).signature.startswith("nrefs:1|case:mixed|eff:no|tok:13a")
    assert "chrF2" in chrf(refs, refs).text
    assert exact_match(["a dog ", "x"], ["a dog", "y"]) == 50.0
    with pytest.raises(DataError):
        bleu(["a"], ["a", "b"])
    same = bleu(refs, refs)
    assert same.length_ratio == 1.0 and same.brevity_penalty == 1.0
    short = bleu(["the cat sat", "a dog"], refs)  # 5 of 8 reference words
    assert short.length_ratio == pytest.approx(5 / 8)
    assert short.brevity_penalty == pytest.approx(math.exp(1 - 8 / 5))
    assert chrf(refs, refs).length_ratio is None
    srcs = ["one two three", " ".join(["w"] * 12)]
    buckets = bleu_by_source_length(srcs, ["the cat sat", "a dog"], refs)
    assert [(b["source_words"], b["sentences"]) for b in buckets] == [("1-10", 1), ("11-20", 1)]
    assert buckets[0]["length_ratio"] == pytest.approx(3 / 6)


def drop_words(lines: list[str], p: float, seed: int) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(w for w in line.split() if rng.random() > p) for line in lines]


def test_significance_intervals_and_paired_test() -> None:
    refs = [f"{line} number {i}" for i, line in enumerate(corpus(300, seed=7))]
    good, bad = drop_words(refs, 0.1, seed=1), drop_words(refs, 0.5, seed=2)
    alone = significance(good, refs, name="good")
    assert alone["test"] is None and alone["bootstrap_resamples"] == 1000
    [row] = alone["systems"]
    assert row["name"] == "good" and "p_value" not in row["bleu"]
    for key, metric in (("bleu", bleu), ("chrf", chrf)):
        assert row[key]["score"] == pytest.approx(metric(good, refs).score)  # sacreBLEU's
        assert 0 < row[key]["ci95"] < 15  # a real spread, not a point
        assert abs(row[key]["mean"] - row[key]["score"]) < row[key]["ci95"]
    assert alone["signatures"]["bleu"].startswith("nrefs:1|case:mixed|eff:no|tok:13a")
    assert significance(good, refs, name="good") == alone  # seeded: a rerun prints the same
    # Four times the sentences: the interval shrinks about as 1 / sqrt(n) (to ~half).
    wide = significance(good * 4, refs * 4)["systems"][0]["bleu"]["ci95"]
    assert 0.35 < wide / row["bleu"]["ci95"] < 0.7
    one_word = list(good)
    one_word[5] += " extra"
    paired = significance(good, refs, [("same", list(good)), ("one word", one_word),
                                       ("bad", bad)], tokenize="none")  # fmt: skip
    assert paired["test"] == "paired approximate randomization" and paired["trials"] == 10_000
    assert "tok:none" in paired["signatures"]["bleu"]
    first, same, one, worse = paired["systems"]
    assert [s["name"] for s in paired["systems"]] == ["hypotheses", "same", "one word", "bad"]
    for key in ("bleu", "chrf"):
        assert "p_value" not in first[key]
        # sacreBLEU's PairedTest says p = 0.0001 for these two (see aiayn.translate.significance)
        assert same[key]["p_value"] == 1.0  # identical outputs: nothing to explain
        assert one[key]["p_value"] > 0.5  # one word in 300 sentences (1.0 here)
        assert worse[key]["p_value"] < 0.05 and worse[key]["score"] < first[key]["score"] - 10
    with pytest.raises(DataError, match="bad has 299 lines but the test set has 300"):
        significance(good, refs, [("bad", bad[:-1])])


def test_significance_agrees_with_sacrebleu_where_its_test_is_right() -> None:
    """Away from ties, sacreBLEU's PairedTest (other random draws, the same sizes) is an
    oracle: p-values within Monte Carlo error (~0.005 at 10,000 trials), intervals within the
    spread of 1,000 resamples."""
    from sacrebleu.metrics import BLEU, CHRF
    from sacrebleu.significance import PairedTest

    refs = [f"{line} number {i}" for i, line in enumerate(corpus(300, seed=8))]
    a, b = drop_words(refs, 0.15, seed=3), drop_words(refs, 0.16, seed=4)
    ours = significance(a, refs, [("b", b)])["systems"]
    _, theirs = PairedTest([("a", a), ("b", b)], {"BLEU": BLEU(), "chrF": CHRF()}, [refs],
                           test_type="ar", n_samples=10_000, n_ar_confidence=1000)()  # fmt: skip
    for key, name in (("bleu", "BLEU"), ("chrf", "chrF2")):
        them = theirs[name]
        assert not isinstance(them[1], str)
        assert 0.01 < ours[1][key]["p_value"] < 0.9  # a case that is neither tie nor sure
        assert ours[1][key]["p_value"] == pytest.approx(them[1].p_value, abs=0.03)
        for mine, their in zip(ours, them, strict=True):
            assert not isinstance(their, str)
            assert mine[key]["score"] == pytest.approx(their.score)
            assert mine[key]["ci95"] == pytest.approx(their.ci, rel=0.2)


def test_tokenized_text_warning_once(caplog: pytest.LogCaptureFixture) -> None:
    """sacreBLEU's three-line warning about tokenized hypotheses (a model of tokenized text
    writes them at every validation) reaches the log once per process, not once per score."""
    lines = [f"a man number {i} sits on a bench ." for i in range(120)]
    with caplog.at_level(logging.WARNING, logger="sacrebleu"):
        for _ in range(3):
            assert bleu(lines, lines).score == pytest.approx(100.0)
    said = [r for r in caplog.records if "forgot to detokenize" in r.getMessage()]
    assert len(said) <= 1  # (0 if an earlier test in this process has already been told)


# --- the command line ---------------------------------------------------------------------------


def test_cli_translate_file(model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    src = tmp_path / "in.txt"
    lines = ["haus katze", "", *corpus(12, seed=2)]
    src.write_text("\n".join(lines) + "\n", encoding="utf-8")
    out = tmp_path / "out" / "hyp.txt"
    args = ["translate", "--model", str(model_dir), "--input", str(src), "--output", str(out)]
    assert main([*args, "--beam", "2", "--max-len-b", "6", "--max-len-a", "0"]) == 0
    got = out.read_text(encoding="utf-8").split("\n")
    assert len(got) == len(lines) + 1 and got[-1] == "" and got[1] == ""
    expected = Translator.load(model_dir).translate(lines, beam=2, max_len_a=0.0, max_len_b=6)
    assert got[:-1] == expected
    # stderr is no terminal here: no bar and its carriage returns in a log (runtime.progress)
    assert "\r" not in capsys.readouterr().err
    assert main([*args, "--nbest", "3", "--beam", "3", "--max-len-b", "4"]) == 0
    nbest = out.read_text(encoding="utf-8").splitlines()
    assert nbest[0].startswith("1 ||| ") and nbest[3].startswith("2 ||| ")  # empty line 2: one
    assert len(nbest) == 3 * len(lines) - 2


def test_cli_translate_streams_stdin(model_dir: Path) -> None:
    lines = ["haus", "", "katze hund"]
    proc = subprocess.run(
        [sys.executable, "-m", "aiayn", "translate", "--model", str(model_dir), "--beam", "1",
         "--max-len-b", "5", "--max-len-a", "0", "--buffer-size", "2"],
        input="\n".join(lines) + "\n", capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split("\n")[:-1] == Translator.load(model_dir).translate(
        lines, beam=1, max_len_a=0.0, max_len_b=5
    )


def test_cli_evaluate_json(model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    src, ref = tmp_path / "src.txt", tmp_path / "ref.txt"
    lines = corpus(6, seed=3)
    src.write_text("\n".join(lines) + "\n", encoding="utf-8")
    ref.write_text("\n".join(lines) + "\n", encoding="utf-8")
    base = ["evaluate", "--model", str(model_dir), "--src", str(src), "--ref", str(ref)]
    assert main([*base, "--beam", "2", "--json", "--max-len-b", "5"]) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert set(result) >= {"bleu", "chrf", "exact_match", "sentences", "length_ratio",
                           "brevity_penalty"}  # fmt: skip
    assert isinstance(result["length_ratio"], float) and 0 < result["brevity_penalty"] <= 1
    assert sum(b["sentences"] for b in result["by_source_length"]) == 6
    assert result["bleu"]["signature"].startswith("nrefs:1|")
    assert result["sentences"] == 6
    assert main([*base, "--beam", "1", "--max-len-b", "5"]) == 0
    text = capsys.readouterr().out
    assert "BLEU = " in text and "chrF2 = " in text and "signature: nrefs:1|" in text


def test_cli_evaluate_confidence_and_compare(
    model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    src, ref, mine = tmp_path / "src.txt", tmp_path / "ref.txt", tmp_path / "mine.txt"
    lines = corpus(8, seed=5)
    src.write_text("\n".join(lines) + "\n", encoding="utf-8")
    ref.write_text("\n".join(lines) + "\n", encoding="utf-8")
    base = ["evaluate", "--model", str(model_dir), "--src", str(src), "--ref", str(ref),
            "--beam", "2", "--max-len-b", "5"]  # fmt: skip
    assert main([*base, "--json", "--confidence", "--hyps", str(mine)]) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    [row] = result["significance"]["systems"]
    assert row["name"] == str(model_dir) and row["bleu"]["score"] == result["bleu"]["score"]
    assert row["chrf"]["score"] == pytest.approx(result["chrf"]["score"])
    # The references themselves, and this model's own output, as systems to compare with.
    assert main([*base, "--json", "--compare", str(ref), "--compare", str(mine)]) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    this, perfect, itself = result["significance"]["systems"]
    assert "p_value" not in this["bleu"] and this["name"] == str(model_dir)
    assert perfect["name"] == str(ref) and perfect["bleu"]["score"] == pytest.approx(100.0)
    assert itself["bleu"]["p_value"] == itself["chrf"]["p_value"] == 1.0  # the same lines
    assert main([*base, "--compare", str(mine)]) == 0
    text = capsys.readouterr().out
    assert "±95%" in text and "paired approximate randomization" in text
    assert any(line.startswith(str(mine)) and line.endswith("1.0000") for line in text.splitlines())
    short = tmp_path / "short.txt"
    short.write_text("haus\n", encoding="utf-8")
    for argv, message in [
        ([*base, "--compare", str(short)], "has 1 lines but"),
        ([*base, "--compare", str(tmp_path)], "is a directory"),
        ([*base, "--compare", str(tmp_path / "nope.txt")], "nope.txt"),
        ([*base, "--compare", str(mine), "--hyps", str(mine)], "is a --compare file"),
        ([*base, "--alphas", "0.6,1", "--confidence"], "leave out --confidence"),
        ([*base, *["--compare", str(mine)] * 11], "at most 10"),
    ]:
        assert main(argv) == 2, argv
        err = capsys.readouterr().err.strip()
        assert message in err and len(err.splitlines()) == 1, (argv, err)


def bad_runs(model_dir: Path, tmp_path: Path) -> list[tuple[list[str], str]]:
    latin1 = tmp_path / "latin1.txt"
    latin1.write_bytes("gut\nsch\xf6n\n".encode("latin-1"))
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "config.json").write_text('{"model_type": "marian"}')
    fine = tmp_path / "fine.txt"
    fine.write_text("haus\n")
    short = tmp_path / "short.txt"
    short.write_text("")
    return [
        (["translate", "--model", str(tmp_path / "nope")], "model directory not found"),
        (["translate", "--model", str(foreign)], "not an aiayn model config"),
        (["translate", "--model", str(fine)], "is a file; give the model directory"),
        (["translate", "--model", str(model_dir), "--input", str(latin1)], "line 2 is not valid"),
        (["translate", "--model", str(model_dir), "--beam", "0"], "beam size must be at least 1"),
        (["translate", "--model", str(model_dir), "--nbest", "9"], "cannot exceed the beam"),
        (["translate", "--model", str(model_dir), "--input", str(fine), "--beam", "321"],
         "beam size 321 exceeds the model's vocabulary of 320 tokens"),
        # 100,000 samples of one word held 8.9 GB: a sentence's rows are bounded (MAX_ROWS)
        (["translate", "--model", str(model_dir), "--input", str(fine), "--sample", "--nbest",
          "100000"], "nbest (samples) 100,000 is more than 1,024: each is a row"),
        (["translate", "--model", str(model_dir), "--threads", "-1"], "--threads=-1: give 0"),
        (["translate", "--model", str(model_dir), "--threads", str(2**64)], "up to 4096"),
        (["translate", "--model", str(model_dir), "--buffer-size", "-1"], "must be >= 0"),
        (["translate", "--model", str(model_dir), "--input", str(tmp_path / "x")], "No such file"),
        (["evaluate", "--model", str(model_dir), "--src", str(fine), "--ref", str(short)],
         "has 1 lines but"),
    ]  # fmt: skip


def test_cli_bad_input_one_line_exit_2(
    model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    for argv, message in bad_runs(model_dir, tmp_path):
        assert main(argv) == 2, argv
        err = capsys.readouterr().err.strip()
        assert message in err and len(err.splitlines()) == 1, (argv, err)
        assert "Traceback" not in err


def test_model_dir_keeps_its_search_settings(
    model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """The [decode] table of run_config.json (written by `aiayn train`, copied by `aiayn
    average`) is the model's default search; a flag given on the command line wins."""
    import shutil

    from aiayn.store.checkpoints import write_average

    own = tmp_path / "own"
    shutil.copytree(model_dir, own)
    saved = {"beam_size": 3, "alpha": 1.0, "length_penalty": "power", "max_len_a": 0.0,
             "max_len_b": 5}  # fmt: skip
    (own / "run_config.json").write_text(json.dumps({"model": {}, "decode": saved}))
    assert Translator.load(own).cfg == DecodeConfig(**saved)
    averaged = write_average([own, own], tmp_path / "avg")
    assert Translator.load(averaged).cfg == DecodeConfig(**saved)

    src = tmp_path / "in.txt"
    lines = corpus(5, seed=4)
    src.write_text("\n".join(lines) + "\n", encoding="utf-8")
    plain = Translator.load(model_dir)
    assert main(["translate", "--model", str(own), "--input", str(src)]) == 0
    assert capsys.readouterr().out.splitlines() == plain.translate(lines, **saved)
    assert main(["translate", "--model", str(own), "--input", str(src), "--beam", "1"]) == 0
    assert capsys.readouterr().out.splitlines() == plain.translate(
        lines, **{**saved, "beam_size": 1}
    )
    gnmt = ["--length-penalty", "gnmt", "--nbest", "3"]
    assert main(["translate", "--model", str(own), "--input", str(src), *gnmt]) == 0
    by_flag = [line.split(" ||| ") for line in capsys.readouterr().out.splitlines()]
    cfg = Translator.load(own).settings(length_penalty="gnmt", nbest=3)
    found = plain.translate_hyps(lines, cfg)
    expected = [(str(i), t.text, t.hyp.score) for i, hyps in enumerate(found, 1) for t in hyps]
    assert [(i, text) for i, text, _ in by_flag] == [(i, text) for i, text, _ in expected]
    assert [float(s) for *_, s in by_flag] == pytest.approx([s for *_, s in expected], abs=2e-4)

    bad_files = [
        ("{", "is unreadable"),
        ('{"decode": {"beam": 2}}', "unknown key"),
        ('{"decode": {"beam_size": 0}}', "beam size must be at least 1"),
    ]
    for bad, message in bad_files:
        (own / "run_config.json").write_text(bad)
        assert main(["translate", "--model", str(own), "--input", str(src)]) == 2
        err = capsys.readouterr().err.strip()
        assert message in err and len(err.splitlines()) == 1, err


# --- end to end: a model trained by `aiayn train` translates a file ------------------------------


def test_trained_copy_model_translates_a_file(tmp_path: Path, capsys: pytest.CaptureFixture):
    """Train the tiny config to copy letter sequences (800 steps, ~10 s), then translate and
    evaluate held-out lines from the command line: most must come back exactly."""
    rng = random.Random(0)
    lines = [" ".join(rng.choices("abcdefghijkl", k=rng.randint(2, 8))) for _ in range(600)]
    for name, part in (("train", lines[:500]), ("test", lines[500:])):
        for side in ("src", "tgt"):
            (tmp_path / f"{name}.{side}").write_text("\n".join(part) + "\n", encoding="utf-8")
    config = CONFIGS / "tiny_copy.toml"
    run = tmp_path / "run"
    sets = [f"train.src={tmp_path / 'train.src'}", f"train.tgt={tmp_path / 'train.tgt'}",
            f"train.out_dir={run}", "train.max_steps=800", "train.valid_every=0"]  # fmt: skip
    assert main(["train", "--config", str(config), "--no-progress",
                 *[a for s in sets for a in ("--set", s)]]) == 0  # fmt: skip
    hyp = tmp_path / "test.hyp"
    test_src, test_ref = str(tmp_path / "test.src"), str(tmp_path / "test.tgt")
    assert main(["translate", "--model", str(run), "--input", test_src, "--output", str(hyp)]) == 0
    got = hyp.read_text(encoding="utf-8").splitlines()
    assert len(got) == 100
    assert sum(g == r for g, r in zip(got, lines[500:], strict=True)) >= 70
    capsys.readouterr()
    argv = ["evaluate", "--model", str(run), "--src", test_src, "--ref", test_ref, "--json"]
    assert main([*argv, "--beam", "1"]) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["bleu"]["score"] > 80 and result["exact_match"] >= 70


def test_a_reader_that_leaves_early_is_no_traceback(model_dir: Path, tmp_path: Path) -> None:
    """`aiayn translate ... | head`, `aiayn info ... | head`: once the reader has gone, the
    command stops quietly with 141 (128 + SIGPIPE, as `yes | head` reports for `yes`). `info`
    wrote a BrokenPipeError traceback; `translate` had its own handler (it said 0)."""
    from serving import child_env

    src = tmp_path / "in.txt"
    src.write_text("haus\n" * 50, encoding="utf-8")
    for argv in (["info", "--preset", "cpu_tiny", "--vocab-size", "100"],
                 ["translate", "--model", str(model_dir), "--input", str(src)]):  # fmt: skip
        read_end, write_end = os.pipe()
        os.close(read_end)  # the reader is gone before the first line
        try:
            proc = subprocess.run([sys.executable, "-m", "aiayn", *argv], stdout=write_end,
                                  stderr=subprocess.PIPE, text=True, env=child_env(),
                                  timeout=300)  # fmt: skip
        finally:
            os.close(write_end)
        assert proc.returncode == 141, (argv, proc.stderr[-500:])
        assert "Traceback" not in proc.stderr and "Error" not in proc.stderr, proc.stderr[-500:]


def test_cli_refuses_to_write_over_its_input(
    model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """`--output` that is `--input` (by name, symlink or hard link) would lose the input."""
    src, ref = tmp_path / "src.txt", tmp_path / "ref.txt"
    src.write_text("haus\nkatze\n", encoding="utf-8")
    ref.write_text("haus\nkatze\n", encoding="utf-8")
    (tmp_path / "link.txt").symlink_to(src)
    os.link(src, tmp_path / "hard.txt")
    base = ["translate", "--model", str(model_dir), "--input", str(src), "--output"]
    for output in (src, tmp_path / "link.txt", tmp_path / "hard.txt", tmp_path / "." / "src.txt"):
        assert main([*base, str(output)]) == 2, output
        err = capsys.readouterr().err.strip()
        assert err.startswith("aiayn translate: error: --output") and "\n" not in err
        assert "is the input file" in err
    evaluate = ["evaluate", "--model", str(model_dir), "--src", str(src), "--ref", str(ref)]
    for hyps, flag in ((src, "--src"), (tmp_path / "link.txt", "--src"), (ref, "--ref")):
        assert main([*evaluate, "--hyps", str(hyps)]) == 2
        err = capsys.readouterr().err.strip()
        assert f"is the {flag} file" in err and "\n" not in err
    assert src.read_text(encoding="utf-8") == ref.read_text(encoding="utf-8") == "haus\nkatze\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "hard.txt", "link.txt", "ref.txt", "src.txt"
    ]  # fmt: skip
    with src.open("rb") as stdin:  # `aiayn translate --output a.txt < a.txt`
        proc = subprocess.run(
            [sys.executable, "-m", "aiayn", "translate", "--model", str(model_dir),
             "--output", str(src)],
            stdin=stdin, capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
    assert proc.returncode == 2 and "is the input file" in proc.stderr, proc.stderr
    assert src.read_text(encoding="utf-8") == "haus\nkatze\n"


def test_cli_output_files_get_the_umask_or_keep_their_mode(model_dir: Path, tmp_path: Path) -> None:
    src = tmp_path / "in.txt"
    src.write_text("haus\n", encoding="utf-8")
    old_umask = os.umask(0o022)
    try:
        fresh, kept, hyps = tmp_path / "fresh.txt", tmp_path / "kept.txt", tmp_path / "hyps.txt"
        kept.write_text("old\n")
        kept.chmod(0o640)
        for output in (fresh, kept):
            assert main(["translate", "--model", str(model_dir), "--input", str(src),
                         "--output", str(output), "--max-len-b", "3"]) == 0  # fmt: skip
        assert main(["evaluate", "--model", str(model_dir), "--src", str(src), "--ref", str(src),
                     "--hyps", str(hyps), "--max-len-b", "3"]) == 0  # fmt: skip
    finally:
        os.umask(old_umask)
    assert stat.S_IMODE(fresh.stat().st_mode) == 0o644  # not mkstemp's 0600
    assert stat.S_IMODE(hyps.stat().st_mode) == 0o644
    assert stat.S_IMODE(kept.stat().st_mode) == 0o640
    assert kept.read_text(encoding="utf-8") == fresh.read_text(encoding="utf-8") != "old\n"


def test_the_best_alpha_is_the_highest_bleu_then_chrf_then_the_first() -> None:
    from aiayn.translate.evaluate import best_alpha_row

    assert best_alpha_row([{"bleu": 30.0, "chrf": 50.0}, {"bleu": 31.0, "chrf": 40.0}]) == 1
    # one-word targets: BLEU is 0 at every alpha, chrF still tells them apart
    zero = [{"bleu": 0.0, "chrf": c} for c in (97.1, 98.4, 98.4, 90.0)]
    assert best_alpha_row(zero) == 1
    # With the model's own alpha (keep), the best must differ from it by more than chance
    # in the metric that ranked them.
    rows = [{"bleu": 30.0, "chrf": 50.0, "bleu_p_value": None, "chrf_p_value": None},
            {"bleu": 30.6, "chrf": 50.2, "bleu_p_value": 0.3, "chrf_p_value": 0.01},
            {"bleu": 29.0, "chrf": 49.0, "bleu_p_value": 0.01, "chrf_p_value": 0.01}]  # fmt: skip
    assert best_alpha_row(rows) == 1 and best_alpha_row(rows, keep=0) == 0
    rows[1]["bleu_p_value"] = 0.03  # below 0.05, but the best of two others: 0.05 / 2
    assert best_alpha_row(rows, keep=0) == 0
    rows[1]["bleu_p_value"] = 0.024
    assert best_alpha_row(rows, keep=0) == 1
    assert best_alpha_row(rows, keep=1) == 1  # the model's own is the highest
    tied = [{**r, "bleu": 0.0} for r in rows]  # BLEU ties: chrF's p decides
    tied[1]["bleu_p_value"] = 0.9
    assert best_alpha_row(tied, keep=0) == 1
    tied[1]["chrf_p_value"] = 0.2
    assert best_alpha_row(tied, keep=0) == 0
    same = [dict(rows[0]), {**rows[0], "bleu_p_value": 0.0, "chrf_p_value": 0.0}]
    assert best_alpha_row(same, keep=1) == 1  # an equal score is no reason to move


def test_the_sweep_says_what_to_do_with_its_choice() -> None:
    from aiayn.cli.translate_cmd import sweep_advice

    def rows(best: int, p: float) -> list[dict]:
        return [{"alpha": a, "bleu": b, "chrf": 50.0, "current": a == 0.6, "best": i == best,
                 "bleu_p_value": None if a == 0.6 else p}
                for i, (a, b) in enumerate([(0.6, 30.0), (1.4, 31.0)])]  # fmt: skip

    moved = sweep_advice(rows(1, 0.01), "power")
    assert "best alpha = 1.4: pass --alpha 1.4 --length-penalty power to translate" in moved
    assert "--set decode.alpha=1.4" in moved
    assert "--length-penalty" not in sweep_advice(rows(1, 0.01), "gnmt")
    kept = sweep_advice(rows(0, 0.3), "gnmt")
    assert "alpha 1.4 scored highest, but within chance of the model's 0.6 (p = 0.300)" in kept
    top = [{**r, "bleu": 32.0 if r["current"] else 31.0} for r in rows(0, 0.3)]
    assert sweep_advice(top, "gnmt") == "the model's alpha 0.6 is the best: nothing to change"


def _brevity_case() -> tuple[list[str], list[str]]:
    """40 references of 10 words, and outputs one word short of each (BP 0.895)."""
    rng = random.Random(7)
    words = [f"w{i}" for i in range(50)]
    refs = [" ".join(rng.choices(words, k=10)) for _ in range(40)]
    return refs, [r.rsplit(" ", 1)[0] for r in refs]


def _alpha_rows(*rows: tuple[float, float, float]) -> list[dict]:
    """Made-up sweep rows (alpha, BLEU, BP), the first the model's own."""
    return [{"alpha": a, "bleu": b, "chrf": 50.0, "brevity_penalty": bp,
             "length_ratio": 1 / (1 - math.log(bp)), "current": i == 0}
            for i, (a, b, bp) in enumerate(rows)]  # fmt: skip


def test_a_short_alpha_gives_way_to_the_smallest_larger_one_that_is_not_worse() -> None:
    """An α whose outputs are more than 5% short (BP < 0.95) is not kept when a larger α
    reaches BP 0.95 and is not worse beyond chance: the smallest such one is taken."""
    from aiayn.translate.evaluate import brevity_alpha_row

    refs, short = _brevity_case()
    outputs = [short, short, refs, refs]
    # 1.0 is still short; 1.4 and 2.0 reach 0.95 with the same BLEU: 1.4, no test needed
    rows = _alpha_rows((0.6, 30.0, 0.895), (1.0, 30.0, 0.93), (1.4, 30.0, 0.97), (2.0, 30.0, 1.0))
    assert brevity_alpha_row(rows, 0, outputs, refs) == (2, {})
    # by α, not by place in the list
    assert brevity_alpha_row(rows[::-1], 3, outputs[::-1], refs) == (1, {})
    # a chosen α that is not short stays, whatever follows
    assert brevity_alpha_row(rows, 2, outputs, refs) == (2, {})
    # lower, but within chance: outputs that differ from the short ones in one word
    close = [*short[:-1], short[-1] + " w0"]
    rows[2]["bleu"] = 29.9
    index, tested = brevity_alpha_row(rows, 0, [short, short, close, refs], refs)
    assert index == 2 and set(tested) == {2} and tested[2] >= 0.05


def test_a_short_alpha_stays_when_the_larger_ones_are_worse_or_short_too() -> None:
    from aiayn.translate.evaluate import brevity_alpha_row

    refs, short = _brevity_case()
    garbage = ["zz " * 10 for _ in refs]  # the right length, nothing right
    rows = _alpha_rows((0.6, 30.0, 0.895), (1.4, 10.0, 1.0))
    index, tested = brevity_alpha_row(rows, 0, [short, garbage], refs)
    assert index == 0 and tested[1] < 0.05  # significantly worse: the short α stays
    rows = _alpha_rows((0.6, 30.0, 0.895), (1.4, 31.0, 0.93), (2.0, 32.0, 0.949))
    assert brevity_alpha_row(rows, 0, [short] * 3, refs) == (0, {})  # none reaches 0.95


class _LengthFake:
    """A translator whose outputs depend on α alone: `by_alpha[α]` (sweep_alpha's input)."""

    def __init__(self, by_alpha: dict[float, list[str]]) -> None:
        self.by_alpha = by_alpha

    def translate_stream(self, src, cfg, *, batch_tokens=2048, progress=None):
        from types import SimpleNamespace

        for line in self.by_alpha[cfg.alpha]:
            yield [SimpleNamespace(text=line)]


def test_the_sweep_takes_a_larger_alpha_when_the_gate_keeps_a_short_one(caplog) -> None:
    """On 4 sentences no gain is beyond chance, so the gate keeps the model's 0.6, whose
    outputs are 10% short; 1.4 is as long as the references and scores higher: it is chosen,
    its row says why ("brevity"), and the note says it in one line."""
    from aiayn.translate.evaluate import alpha_choice_note, sweep_alpha

    refs, short = _brevity_case()
    refs, short = refs[:4], short[:4]
    fake = _LengthFake({0.6: short, 1.0: short, 1.4: refs})
    cfg = DecodeConfig(beam_size=4, alpha=0.6)
    rows = sweep_alpha(fake, cfg, refs, refs, [0.6, 1.0, 1.4], progress=False)  # type: ignore[arg-type]
    assert [r["best"] for r in rows] == [False, False, True]
    assert [r["reason"] for r in rows] == [None, None, "brevity"]
    assert rows[2]["bleu_p_value"] >= 0.05 / 2  # the gate alone would have kept 0.6
    note = alpha_choice_note(rows)
    assert note is not None and note.startswith("alpha 1.4 chosen over 0.6: 0.6's beam outputs")
    assert "10% short" in note and "BP 0.895" in note
    stays = sweep_alpha(fake, cfg, refs, refs, [0.6, 1.0], progress=False)  # type: ignore[arg-type]
    assert stays[0]["best"] and stays[0]["reason"] == "kept"
    assert "no larger alpha offered reaches BP 0.95" in (alpha_choice_note(stays) or "")


def test_cli_evaluate_alphas_scores_each_and_names_the_best(
    model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    src, ref = tmp_path / "src.txt", tmp_path / "ref.txt"
    lines = corpus(6, seed=4)
    src.write_text("\n".join(lines) + "\n", encoding="utf-8")
    ref.write_text("\n".join(lines) + "\n", encoding="utf-8")
    base = ["evaluate", "--model", str(model_dir), "--src", str(src), "--ref", str(ref),
            "--beam", "3", "--max-len-b", "5"]  # fmt: skip
    assert main([*base, "--alphas", "0.6,1.0,1.4", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert [r["alpha"] for r in rows] == [0.6, 1.0, 1.4]
    assert [r["best"] for r in rows].count(True) == 1
    assert [r["current"] for r in rows] == [True, False, False]  # the model's own 0.6
    assert rows[0]["bleu_p_value"] is None and rows[0]["chrf_p_value"] is None
    assert all(0 < r["bleu_p_value"] <= 1 and 0 < r["chrf_p_value"] <= 1 for r in rows[1:])
    best = next(r for r in rows if r["best"])
    top = max(rows, key=lambda r: (r["bleu"], r["chrf"]))
    # the highest, or the model's own where the highest is within chance of it
    assert best is top or (best is rows[0] and (top["bleu_p_value"] >= 0.05 / 2
                                                or top["bleu"] == rows[0]["bleu"]))  # fmt: skip
    for r in rows:  # each row is the plain evaluate of that alpha
        assert main([*base, "--alpha", str(r["alpha"]), "--json"]) == 0
        one = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
        assert r["bleu"] == one["bleu"]["score"] and r["length_ratio"] == one["length_ratio"]
        assert r["chrf"] == one["chrf"]["score"]
        assert r["brevity_penalty"] == one["brevity_penalty"]
    assert main([*base, "--alphas", "0.6,1.0,0.6,1.0", "--json"]) == 0  # each value once
    again = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert [r["alpha"] for r in again] == [0.6, 1.0]
    assert main([*base, "--alphas", "1.0,1.4", "--json"]) == 0  # the model's 0.6 is added
    rows = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert [(r["alpha"], r["current"]) for r in rows] == [(0.6, True), (1.0, False), (1.4, False)]
    assert main([*base, "--alphas", "0.6,1.0"]) == 0
    text = capsys.readouterr().out
    assert "length ratio" in text and "<- best" in text and "the model's" in text
    assert ("--set decode.alpha=" in text or "nothing to change" in text
            or "within chance of the model's 0.6" in text)  # fmt: skip
    assert "gnmt length penalty" in text and "paired approximate randomization" in text
    assert main([*base, "--alphas", "0.6,1.0", "--length-penalty", "power"]) == 0
    text = capsys.readouterr().out  # the sweep is of the form asked for, and says so
    assert "power length penalty" in text
    for argv, message in [
        ([*base, "--alphas", "0.6,x"], "expected numbers"),
        ([*base, "--alphas", "-1"], "in [0, 10]"),
        ([*base, "--alphas", "0.6,inf"], "in [0, 10]"),  # said before 0.6 was translated
        ([*base, "--alphas", ",".join(f"{a / 100}" for a in range(101))], "at most 100"),
        ([*base, "--alpha", "1e308"], "alpha must be in [0, 10]"),  # an OverflowError
        ([*base, "--alphas", "0.6", "--alpha", "1"], "leave out --alpha"),
        ([*base, "--alphas", "0.6", "--beam", "1"], "needs beam search"),
    ]:
        assert main(argv) == 2, argv
        err = capsys.readouterr().err.strip()
        assert message in err and len(err.splitlines()) == 1, (argv, err)
