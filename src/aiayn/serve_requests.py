"""What a request to `aiayn serve` may say: bodies read and checked, fields typed, sizes
against the limits, search settings; and what a model directory tells the server (its
languages, example sentences). Every refusal is an `ApiError`: an HTTP status and one line.
"""

from __future__ import annotations

import contextlib
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

from aiayn.config import RUN_CONFIG_FILE, DecodeConfig
from aiayn.errors import AiaynError
from aiayn.translate import Translator


@dataclass(frozen=True)
class Limits:
    """What one request may ask for (`aiayn serve --help` names the flags)."""

    max_chars_per_request: int = 20_000
    max_chars_per_sentence: int = 1_000
    max_sentences: int = 128
    max_beam: int = 8
    timeout_s: float = 30.0  # from arrival to answer, queueing included


class ApiError(Exception):
    """A request the server refuses: HTTP `status` with `{"error": message}`."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


# --- what the model directory records -------------------------------------------------------------

_LANG = re.compile(r"^[a-z]{2,3}(?:[-_][A-Za-z]{2,4})?$")


def _run_config(directory: Path) -> dict[str, Any]:
    try:
        table = json.loads((directory / RUN_CONFIG_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return table if isinstance(table, dict) else {}


def model_languages(directory: Path) -> tuple[str, str] | None:
    """(source, target) language codes a model directory records: an imported model's
    (`aiayn import marian` writes them under `imported`), else the training files' suffixes in
    `run_config.json` (`train.en` / `train.de` -> ("en", "de"), as the quick start and Multi30k
    name them); None when neither names two different language codes."""
    config = _run_config(directory)
    imported, train = config.get("imported", {}), config.get("train", {})
    if isinstance(imported, dict) and imported.get("source_lang"):
        codes = (str(imported.get("source_lang")), str(imported.get("target_lang") or ""))
    elif isinstance(train, dict):
        src, tgt = str(train.get("src", "")), str(train.get("tgt", ""))
        codes = (Path(src).suffix.lstrip("."), Path(tgt).suffix.lstrip("."))
    else:
        return None
    if all(_LANG.match(c) for c in codes) and codes[0] != codes[1]:
        return codes[0], codes[1]
    return None


def example_sentences(directory: Path, given: Path | None, n: int = 12) -> list[str]:
    """Sentences for the page's picker: `given`, else the run's validation sources (found as
    recorded or as `../data/valid.*` beside the model, the quick start's layout)."""
    candidates = [given] if given else []
    valid = str(_run_config(directory).get("train", {}).get("valid_src", "") or "")
    if valid:
        candidates += [Path(valid), directory.parent / "data" / Path(valid).name]
    for path in candidates:
        with contextlib.suppress(OSError, UnicodeDecodeError):
            lines = path.read_text(encoding="utf-8").splitlines()
            return [s for s in lines if s.strip() and len(s) <= 200][:n]
    return []


def language_name(code: str) -> str:
    from babel import Locale, UnknownLocaleError

    try:
        return str(Locale.parse(code.replace("-", "_")).get_display_name("en"))
    except (ValueError, UnknownLocaleError):
        return code


# --- reading requests -----------------------------------------------------------------------------


def parse_body(raw: bytes, content_type: str, max_bytes: int) -> dict[str, Any]:
    """The request body as a dict: JSON, or a form (LibreTranslate's clients send both)."""
    if len(raw) > max_bytes:
        raise ApiError(413, f"the body has {len(raw)} bytes; the limit is {max_bytes}")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ApiError(400, f"the body is not valid UTF-8 (byte {e.start})") from None
    form_type = content_type.startswith("application/x-www-form-urlencoded")
    if form_type and not text.lstrip().startswith("{"):  # curl -d '{...}' sends this type too
        form = parse_qs(text, keep_blank_values=True)
        return {k: (v if k == "q" and len(v) > 1 else v[0]) for k, v in form.items()}
    if not text.strip():
        raise ApiError(400, "the body is empty: send a JSON object")
    try:
        body = json.loads(text)
    except json.JSONDecodeError as e:
        raise ApiError(400, f"invalid JSON: {e.msg} (line {e.lineno}, column {e.colno})") from None
    if not isinstance(body, dict):
        raise ApiError(400, f"the body must be a JSON object, not {type(body).__name__}")
    return body


_TYPES: dict[type, str] = {int: "an integer", float: "a number", bool: "true or false",
                           str: "a string"}  # fmt: skip


def field(body: dict[str, Any], name: str, kind: type, default: Any = None) -> Any:
    """`body[name]` checked to be of `kind` (a form's strings are converted), else `default`."""
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, str) and kind is not str:  # form fields are strings
        with contextlib.suppress(ValueError):
            value = {"true": True, "false": False}[value] if kind is bool else kind(value)
    ok = isinstance(value, kind) and not (kind is not bool and isinstance(value, bool))
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        value, ok = float(value), True
    if not ok:
        raise ApiError(422, f"'{name}' must be {_TYPES[kind]}, got {json.dumps(value)[:40]}")
    return value


def texts(body: dict[str, Any]) -> tuple[list[str], bool]:
    """(the texts of `q`, whether q was a single string)."""
    q = body.get("q")
    if q is None:
        raise ApiError(422, "'q' is missing: give the text to translate")
    single = isinstance(q, str)
    items = [q] if single else q
    if not isinstance(items, list) or not all(isinstance(s, str) for s in items):
        raise ApiError(422, "'q' must be a string or a list of strings")
    if not items or not any(s.strip() for s in items):
        raise ApiError(422, "'q' is empty: give the text to translate")
    return items, single


def check_sizes(lines: list[str], limits: Limits) -> None:
    """413 for a request over one of the size limits, naming the limit."""
    if len(lines) > limits.max_sentences:
        raise ApiError(413, f"{len(lines)} sentences; the limit is {limits.max_sentences} "
                            "(--max-sentences)")  # fmt: skip
    total = sum(len(s) for s in lines)
    if total > limits.max_chars_per_request:
        raise ApiError(413, f"{total} characters; the limit is {limits.max_chars_per_request} "
                            "(--max-chars-per-request)")  # fmt: skip
    for i, s in enumerate(lines):
        if len(s) > limits.max_chars_per_sentence:
            limit = limits.max_chars_per_sentence
            raise ApiError(413, f"sentence {i} has {len(s)} characters; the limit is {limit} "
                                "(--max-chars-per-sentence)")  # fmt: skip


# /v1 request field -> (DecodeConfig field, type)
SEARCH_FIELDS: dict[str, tuple[str, type]] = {
    "beam": ("beam_size", int), "alpha": ("alpha", float), "nbest": ("nbest", int),
    "sample": ("sample", bool), "temperature": ("temperature", float),
    "top_k": ("top_k", int), "top_p": ("top_p", float), "seed": ("seed", int),
    "min_len": ("min_len", int), "max_len_a": ("max_len_a", float),
    "max_len_b": ("max_len_b", int),
}  # fmt: skip
EXPLAIN_SEARCH: dict[str, type] = {"alpha": float, "min_len": int, "sample": bool,
                                   "temperature": float, "top_k": int, "top_p": float,
                                   "seed": int}  # fmt: skip
EXPLAIN_FIELDS = {"q", "api_key", "beam", "top_k", "max_len", "alpha", "min_len", "sample",
                  "temperature", "sample_top_k", "top_p", "seed", "layers", "heads", "steps",
                  "dims", "precision", "tensors"}  # fmt: skip


def unknown_fields(body: dict[str, Any], known: set[str]) -> None:
    extra = sorted(set(body) - known)
    if extra:
        raise ApiError(422, f"unknown field '{extra[0]}'; known: {', '.join(sorted(known))}")


def search_settings(body: dict[str, Any], translator: Translator, limits: Limits) -> DecodeConfig:
    """The DecodeConfig a /v1/translate body asks for (the model's defaults for the rest)."""
    given = {f: field(body, name, kind) for name, (f, kind) in SEARCH_FIELDS.items()}
    given = {k: v for k, v in given.items() if v is not None}
    for name in ("beam_size", "nbest"):
        if given.get(name, 1) > limits.max_beam:
            raise ApiError(422, f"{name} {given[name]} is over the limit of {limits.max_beam} "
                                "(--max-beam)")  # fmt: skip
    try:
        return translator.settings(**given)
    except AiaynError as e:
        raise ApiError(422, str(e)) from None


def indices(body: dict[str, Any], name: str) -> str | None:
    """A view field as `parse_indices` text: "0,2" / "1-3" / [0, 2] / null (all)."""
    value = body.get(name)
    if isinstance(value, list) and all(isinstance(v, int) for v in value):
        return ",".join(map(str, value))
    if value is None or isinstance(value, str):
        return value
    raise ApiError(422, f"'{name}' must be a list of integers or text like '0,2' or '1-3'")
