"""aiayn.atomic: all-or-nothing writes, no stray temporary files, and the permissions of `open`."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from aiayn.atomic import (
    atomic_dir,
    atomic_open_text,
    atomic_write_bytes,
    atomic_write_json,
    atomic_write_text,
    same_file,
)
from aiayn.errors import ConfigError


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.fixture
def umask_022():
    old = os.umask(0o022)  # the test sets the umask it expects; no threads are running here
    yield 0o022
    os.umask(old)


def test_writes_and_replaces(tmp_path: Path) -> None:
    path = tmp_path / "deep" / "er" / "f.txt"  # missing parents are made
    atomic_write_text(path, "eins\n")
    atomic_write_bytes(path, b"zwei\n")
    assert path.read_text() == "zwei\n"
    atomic_write_json(tmp_path / "f.json", {"b": 1, "a": [1, 2]})
    assert json.loads((tmp_path / "f.json").read_text()) == {"a": [1, 2], "b": 1}
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["deep", "er", "f.json", "f.txt"]


def test_a_failed_stream_leaves_the_old_file_and_no_temporary(tmp_path: Path) -> None:
    path = tmp_path / "out.txt"
    path.write_text("old\n")
    with pytest.raises(RuntimeError, match="half way"), atomic_open_text(path) as out:
        out.write("new, partial\n")
        raise RuntimeError("half way")
    assert path.read_text() == "old\n"
    assert [p.name for p in tmp_path.iterdir()] == ["out.txt"]
    with atomic_open_text(path) as out:
        out.write("new\n")
        assert path.read_text() == "old\n"  # nothing visible until the block ends
    assert path.read_text() == "new\n"


def test_a_new_file_gets_the_umask_not_0600(tmp_path: Path, umask_022: int) -> None:
    atomic_write_text(tmp_path / "a.txt", "x")
    with atomic_open_text(tmp_path / "b.txt") as out:
        out.write("x")
    assert mode(tmp_path / "a.txt") == mode(tmp_path / "b.txt") == 0o644
    os.umask(0o077)
    atomic_write_text(tmp_path / "c.txt", "x")
    assert mode(tmp_path / "c.txt") == 0o600


def test_a_replaced_file_keeps_its_mode(tmp_path: Path, umask_022: int) -> None:
    path = tmp_path / "a.txt"
    path.write_text("old")
    path.chmod(0o640)
    atomic_write_text(path, "new")
    assert mode(path) == 0o640
    path.chmod(0o444)  # read-only files are replaced too (the directory is writable), as by mv
    with atomic_open_text(path) as out:
        out.write("newer")
    assert (path.read_text(), mode(path)) == ("newer", 0o444)


def test_same_file(tmp_path: Path) -> None:
    a = tmp_path / "a.txt"
    a.write_text("x")
    (tmp_path / "link").symlink_to(a)
    os.link(a, tmp_path / "hard")
    (tmp_path / "b.txt").write_text("x")
    assert same_file(a, tmp_path / "link") and same_file(a, tmp_path / "hard")
    assert same_file(a, tmp_path / "sub" / ".." / "a.txt")
    assert not same_file(a, tmp_path / "b.txt")
    assert not same_file(a, tmp_path / "new.txt")
    assert same_file(tmp_path / "new.txt", tmp_path / "." / "new.txt")  # neither exists yet


def test_a_directory_is_written_whole_or_not_at_all(tmp_path):
    out = tmp_path / "deep" / "model"  # missing parents are made
    with atomic_dir(out) as tmp:
        assert not out.exists()  # filled under another name
        (tmp / "weights").write_text("w")
    assert (out / "weights").read_text() == "w"
    assert os.listdir(out.parent) == ["model"]  # no temporary sibling left

    failed = tmp_path / "failed"
    with pytest.raises(RuntimeError), atomic_dir(failed) as tmp:
        (tmp / "half").write_text("x")
        raise RuntimeError("conversion failed midway")
    assert not failed.exists() and os.listdir(tmp_path) == ["deep"]

    (tmp_path / "empty").mkdir()  # an empty target is replaced
    with atomic_dir(tmp_path / "empty") as tmp:
        (tmp / "f").write_text("f")
    assert os.listdir(tmp_path / "empty") == ["f"]
    for taken in (out, tmp_path / "deep" / "model" / "weights"):  # not empty; not a directory
        with pytest.raises(ConfigError, match="choose a new directory"), atomic_dir(taken):
            pass
    assert (out / "weights").read_text() == "w"
