"""Configurations read and written: TOML recipes (`configs/*.toml`), typed `--set` overrides
(`--set train.warmup_steps=8000`, always through `dataclasses.replace`) and the JSON a run
or model directory keeps (`run_config.json`).

The recipes live in the package (`aiayn/configs/`; the repository's `configs/` links to it),
so an installed aiayn has them too: `load_config("own_data")` reads the built-in recipe.
"""

from __future__ import annotations

import dataclasses
import json
import os
import tomllib
import typing
from pathlib import Path
from typing import Any

from pydantic import TypeAdapter, ValidationError

from aiayn.atomic import read_json_object
from aiayn.config import MODEL_PRESETS, Config, DecodeConfig, ModelConfig, TrainConfig
from aiayn.errors import ConfigError

# The full Config of a training run, saved in its directory (and copied by `aiayn average`).
RUN_CONFIG_FILE = "run_config.json"


def read_run_config(directory: str | Path) -> dict[str, Any]:
    """A model or run directory's `run_config.json` as a dict; {} when there is none.

    The one reader of the file (resuming, a model's saved search settings, what the server
    learns of a model): an unreadable file or one that is not a JSON object is a
    CheckpointError naming it, never a silent default.
    """
    return read_json_object(Path(directory) / RUN_CONFIG_FILE)


def _config_error(e: ValidationError, where: str) -> ConfigError:
    """pydantic's first complaint as aiayn's one line: `train.max_tokens='lots': expected int`."""
    err = e.errors()[0]
    kind, ctx = err["type"], err.get("ctx", {})
    if kind == "value_error":  # a dataclass's own check (__post_init__) said it: keep its words
        return ConfigError(str(ctx["error"]))
    at = ".".join([where, *map(str, err["loc"])]).strip(".")
    if kind == "missing":
        return ConfigError(f"[{where}]: missing required field {at!r}")
    if kind == "literal_error":
        return ConfigError(f"{at}={err['input']!r}: choose one of {ctx['expected']}")
    typ = {"int": "int", "bool": "bool", "float": "float", "string": "str"}.get(kind.split("_")[0])
    return ConfigError(f"{at}={err['input']!r}: " + (f"expected {typ}" if typ else err["msg"]))


def _validate(tp: Any, value: Any, where: str) -> Any:
    """`value` (TOML, JSON or a `--set` string) as type `tp`, by pydantic's lax conversions
    ("8_000" -> 8000, "on" -> True, [0.9, 0.98] -> a tuple; 3.5 is no int)."""
    try:
        return TypeAdapter(tp).validate_python(value)
    except ValidationError as e:
        raise _config_error(e, where) from None


def from_dict(cls: type, data: dict[str, Any], where: str = "") -> Any:
    """Build dataclass `cls` from a plain dict, converting types and rejecting unknown keys."""
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = set(data) - names if isinstance(data, dict) else set()
    if unknown:
        raise ConfigError(
            f"unknown key(s) {sorted(unknown)} in [{where or cls.__name__}]; known: {sorted(names)}"
        )
    return _validate(cls, data, where or cls.__name__)


def to_dict(obj: Any) -> dict[str, Any]:
    """A JSON-ready dict (tuples become lists)."""
    return json.loads(json.dumps(dataclasses.asdict(obj)))


def apply_overrides(cfg: Config, overrides: list[str]) -> Config:
    """Apply `section.field=value` strings, each typed from the dataclass field."""
    for item in overrides:
        key, sep, raw = item.partition("=")
        section, dot, name = key.strip().partition(".")
        if not sep or not dot or section not in ("model", "train", "decode"):
            raise ConfigError(f"--set {item!r}: expected model|train|decode.FIELD=VALUE")
        sub = getattr(cfg, section)
        hints = typing.get_type_hints(type(sub))
        if name not in hints:
            known = sorted(f.name for f in dataclasses.fields(sub))
            raise ConfigError(f"--set {item!r}: {section} has no field {name!r}; known: {known}")
        value: Any = raw.strip()
        tp = hints[name]
        if typing.get_origin(tp) is tuple:  # "0.9,0.98" or "(0.9, 0.98)"
            value = [v for v in value.strip("()[] ").split(",") if v.strip()]
        value = _validate(tp, value, key)
        cfg = dataclasses.replace(cfg, **{section: dataclasses.replace(sub, **{name: value})})
    return cfg


# The recipes shipped with aiayn, as package data: aiayn/configs/NAME.toml
BUILTIN_CONFIGS_DIR = Path(__file__).resolve().parent / "configs"


def builtin_configs() -> list[str]:
    """The names of the shipped recipes (`own_data`, `multi30k_en_de`, ...)."""
    return sorted(p.stem for p in BUILTIN_CONFIGS_DIR.glob("*.toml"))


def find_config(name_or_path: str | Path) -> Path:
    """A config file: the path given where it exists, else the built-in recipe of that name
    (`own_data` or `own_data.toml`: a bare name, so that a mistyped path is never replaced by
    a recipe). Missing both: a ConfigError naming the recipes."""
    path = Path(name_or_path)
    try:
        if path.is_file():
            return path
        if path.is_dir():
            raise ConfigError(f"config {path} is a directory; give a TOML file")
    except OSError as e:  # is_file raises some errors: a name over the system's length limit
        raise ConfigError(f"config {str(path)[:80]!r}: {e.strerror}") from None
    bare = len(path.parts) == 1 and not str(name_or_path).endswith(("/", os.sep))  # own_data/
    if bare and path.suffix in ("", ".toml"):
        builtin = BUILTIN_CONFIGS_DIR / f"{path.stem}.toml"
        if builtin.is_file():
            return builtin
    raise ConfigError(
        f"config file not found: {path} (the built-in recipes, by name: "
        f"{', '.join(builtin_configs())})"
    )


def load_config(path: str | Path, overrides: list[str] | None = None) -> Config:
    """Read a TOML config (tables [model], [train], [decode]) and apply `--set` overrides.

    `path` is a file, or the name of a built-in recipe (`find_config`).

    `[model]` may name a `preset`; its other keys override the preset. `vocab_size` may be
    left out: it is filled from the tokenizer when training starts.
    """
    path = find_config(path)
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise ConfigError(f"{path}: not valid TOML: {e}") from None
    unknown = set(data) - {"model", "train", "decode"}
    if unknown:
        raise ConfigError(f"{path}: unknown table(s) {sorted(unknown)}; use model/train/decode")
    model = dict(data.get("model", {}))
    preset = model.pop("preset", None)
    if preset is not None:
        if preset not in MODEL_PRESETS:
            raise ConfigError(f"{path}: unknown preset {preset!r}; one of {sorted(MODEL_PRESETS)}")
        model = {**MODEL_PRESETS[preset], **model}
    model.setdefault("vocab_size", 8)  # placeholder until the tokenizer fixes it
    cfg = Config(
        model=from_dict(ModelConfig, model, "model"),
        train=from_dict(TrainConfig, data.get("train", {}), "train"),
        decode=from_dict(DecodeConfig, data.get("decode", {}), "decode"),
    )
    return apply_overrides(cfg, overrides or [])
