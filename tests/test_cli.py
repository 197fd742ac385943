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
