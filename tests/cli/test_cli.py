"""The `aiayn` command's own parsing, before any command runs (aiayn.cli.main)."""

from __future__ import annotations

import pytest

from aiayn.cli.main import main


@pytest.mark.parametrize(
    ("argv", "command", "flag"),
    [
        (["translate", "--model", "m", "in.txt"], "aiayn translate", "--input INPUT"),
        (["data", "check", "--src", "a", "--tgt", "b", "--bogus"], "aiayn data check", "--write"),
        (["export", "ctranslate2", "--model", "m", "--out", "o", "-x"], "aiayn export ctranslate2",
         "--quantization"),
    ],
)  # fmt: skip
def test_an_unknown_argument_is_refused_by_its_own_command(argv, command, flag, capsys):
    # argparse left a subcommand's unknown arguments to the top parser, whose usage is
    # `aiayn [-h] [--version] COMMAND ...`: a user who typed a file where --input was wanted
    # was not shown the flag
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert f"{command}: error: unrecognized arguments: {argv[-1]}" in err
    assert f"usage: {command} " in err and flag in err
    assert "COMMAND ..." not in err


def test_a_known_command_line_still_parses(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["translate", "--help"])
    assert exit_.value.code == 0 and "--input" in capsys.readouterr().out


def test_train_needs_only_the_corpus(tmp_path, monkeypatch, capsys):
    """Two files are enough: without --config, `aiayn train` runs the built-in own-data recipe,
    and without a corpus it says how to give one."""
    from pathlib import Path

    from aiayn.cli.main import build_parser
    from aiayn.config_files import load_config

    monkeypatch.chdir(tmp_path)  # no configs/ here: the recipe comes from the package
    args = build_parser().parse_args(["train", "--set", "train.src=a.txt"])
    assert args.config == Path("own_data")
    assert load_config(args.config, args.overrides).model.activation == "swish"
    assert main(["train"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--set train.src=FILE --set train.tgt=FILE" in err
    assert not (tmp_path / "runs").exists()  # refused before anything was written
