"""Atomic file writes: readers see the old file or the new one, never a torn one.

Every file aiayn writes (weights, configs, corpora, translations, reports) goes through here:
write a temporary file in the same directory, flush and fsync it, rename it over the target,
then fsync the directory so that the rename itself survives a crash. If anything fails on the
way, the temporary file is removed and the old file is left as it was.

Permissions follow what a plain `open(path, "w")` would give: a new file gets
`0o666 & ~umask`, and a replaced file keeps its mode. (`tempfile.mkstemp` would give 0600.)

A directory is written the same way (`atomic_dir`): filled under a temporary sibling name and
renamed into place, so an exported or imported model directory is complete or absent.

Reading aiayn's own JSON files back has one owner too (`read_json_object`): a missing, unreadable
or foreign file is a one-line CheckpointError naming it.

A leaf module: it imports only `aiayn.errors`, so anything may use it without pulling in torch.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any, TextIO, cast

from aiayn.errors import CheckpointError, ConfigError


def _create_temp(path: Path) -> tuple[int, Path]:
    """Open a new, empty temporary file beside `path`; return its descriptor and name.

    `os.open(..., 0o666)` with O_EXCL lets the kernel apply the umask, as it does for any new
    file, without reading the umask (`os.umask` can only be read by setting it, which is racy
    when threads are running).
    """
    stem = path.name[:200]  # leave room for the suffix under the usual 255-byte name limit
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)
    for _ in range(100):
        tmp = path.with_name(f".{stem}.{secrets.token_hex(6)}.tmp")
        try:
            return os.open(tmp, flags, 0o666), tmp
        except FileExistsError:  # a random name taken: vanishingly rare, try another
            continue
    raise FileExistsError(f"could not create a temporary file beside {path}")


def _keep_mode(fd: int, path: Path) -> None:
    """Give the temporary file the mode of the file it is about to replace, if there is one."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return
    if stat.S_ISREG(st.st_mode):
        # Permission bits only: set-id bits would be a surprise on freshly written content.
        os.fchmod(fd, stat.S_IMODE(st.st_mode) & 0o777)


def fsync_dir(directory: Path) -> None:
    """Make a rename inside `directory` durable (POSIX: the directory entry is data too)."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def check_new_dir(out: Path, flag: str = "--out") -> None:
    """Refuse a `--out` (or the `flag` that named it) that exists and is not an empty
    directory (before any work starts)."""
    if out.is_symlink() or (out.exists() and not out.is_dir()):
        raise ConfigError(f"{flag} {out} exists and is not a directory; choose a new directory")
    if out.is_dir() and any(out.iterdir()):
        raise ConfigError(f"{flag} {out} exists and is not empty; choose a new directory")


@contextmanager
def atomic_dir(out: str | Path, *, replace: bool = False) -> Iterator[Path]:
    """Yield a temporary sibling of `out` to fill; rename it to `out` when the block succeeds.

    Any exception (a failed conversion, Ctrl-C) removes the temporary directory and leaves
    `out` as it was. An empty `out` is replaced (a directory rename may replace an empty one);
    one with files is refused before any work starts, unless `replace` (a checkpoint saved
    twice, a rerun's averaged model), when it is swapped out by `remove_dir` at the end.
    The new directory gets the mode any new directory would (0o777 less the umask).
    """
    out = Path(out)
    if not replace:
        check_new_dir(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.parent / f".{out.name[:200]}.{secrets.token_hex(6)}.tmp"
    tmp.mkdir()
    try:
        yield tmp
        if replace and out.exists():
            remove_dir(out)
        os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    fsync_dir(out.parent)


def remove_dir(path: Path) -> None:
    """Delete a directory so that a kill half way never leaves it partial under its own name:
    rename it to `.trash_<name>` first (atomic), then delete the files. A trash left by an
    earlier kill is cleared first."""
    trash = path.with_name(f".trash_{path.name}")
    shutil.rmtree(trash, ignore_errors=True)
    os.replace(path, trash)
    fsync_dir(path.parent)
    shutil.rmtree(trash, ignore_errors=True)


def clear_stale(directory: Path, name_glob: str) -> None:
    """Remove what a killed `atomic_dir` or `remove_dir` left beside directories matching
    `name_glob`: their temporary and trash siblings. Only for a directory with one writer."""
    for stale in [
        *directory.glob(f".{name_glob}.tmp"),
        *directory.glob(f".trash_{name_glob}"),
        *directory.glob(f".tmp_{name_glob}"),  # older aiayn's checkpoint temporaries
    ]:
        shutil.rmtree(stale, ignore_errors=True)


@contextmanager
def _atomic_file(path: str | Path, mode: str, **open_kw: Any) -> Iterator[IO[Any]]:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = _create_temp(path)
    try:
        _keep_mode(fd, path)
        with os.fdopen(fd, mode, **open_kw) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:  # including KeyboardInterrupt: never leave a stray temporary file
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


@contextmanager
def atomic_open_text(path: str | Path, encoding: str = "utf-8") -> Iterator[TextIO]:
    """Stream text into `path`; it appears (or is replaced) only when the block ends cleanly.

        with atomic_open_text(out_path) as out:
            for line in lines:
                out.write(line + "\\n")

    An exception inside the block removes the partial file and leaves any old `path` untouched.
    """
    with _atomic_file(path, "w", encoding=encoding) as f:
        yield cast(TextIO, f)


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    """Write `data` to `path` so that readers see the old file or the new one, never a torn one."""
    with _atomic_file(path, "wb") as f:
        f.write(data)


def atomic_write_text(path: str | Path, text: str, encoding: str = "utf-8") -> None:
    atomic_write_bytes(path, text.encode(encoding))


def atomic_write_json(path: str | Path, obj: Any) -> None:
    """Pretty, key-sorted JSON with a final newline (diff-friendly)."""
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=True) + "\n")


def same_file(a: str | Path, b: str | Path) -> bool:
    """Whether two paths name one file: through symlinks and hard links when both exist
    (same device and inode), else by their resolved paths."""
    try:
        return os.path.samestat(os.stat(a), os.stat(b))
    except OSError:
        return Path(a).resolve() == Path(b).resolve()


def read_json_object(
    path: Path,
    missing: str | None = None,
    *,
    fmt: tuple[str, str, int | None] | None = None,
) -> dict[str, Any]:
    """The JSON object in `path` (one of aiayn's own files). A missing file is `{}` when
    `missing` is None, else a CheckpointError that says `missing`; unreadable bytes, bad UTF-8
    or JSON, or anything but an object is a CheckpointError naming the file. `fmt` is
    (what the file is, its "format" field, its "format_version" or None), checked too."""
    if not path.is_file():
        if missing is None:
            return {}
        raise CheckpointError(missing)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as e:
        raise CheckpointError(f"{path} is unreadable: {e.strerror}") from None
    except ValueError as e:  # bad JSON or bad UTF-8
        raise CheckpointError(f"{path} is unreadable: corrupt JSON ({e})") from None
    if not isinstance(data, dict):
        raise CheckpointError(f"{path} is unreadable: not a JSON object")
    if fmt is not None:
        what, name, version = fmt
        if data.get("format") != name:
            raise CheckpointError(f"{path} is not {what} (format != {name!r})")
        if version is not None and data.get("format_version") != version:
            found = data.get("format_version")
            raise CheckpointError(f"{path} has format_version {found}; this aiayn reads {version}")
    return data
