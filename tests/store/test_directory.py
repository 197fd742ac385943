"""directory.py: a model directory opened once, an aiayn model's or an export's."""

from __future__ import annotations

import json

import pytest

from aiayn.config import DecodeConfig
from aiayn.config_files import RUN_CONFIG_FILE, to_dict
from aiayn.errors import CheckpointError
from aiayn.nn.model import Transformer
from aiayn.store.directory import EXPORT_FORMAT, EXPORT_FORMAT_VERSION, ModelDir, open_model_dir
from aiayn.store.model_dir import EXPORT_FILE, save_model_dir


def test_an_aiayn_directory_is_read_once_with_its_search_defaults(tmp_path, tiny_cfg):
    save_model_dir(Transformer(tiny_cfg), tmp_path)
    (tmp_path / RUN_CONFIG_FILE).write_text(json.dumps({"decode": {"beam_size": 3}}))
    opened = ModelDir.open(tmp_path)
    assert opened.kind == "aiayn" and not opened.is_export and opened.engine is None
    assert opened.model_cfg == tiny_cfg and opened.decode == DecodeConfig(beam_size=3)
    assert opened.source == tmp_path and opened.architecture == "Transformer"
    assert open_model_dir(opened) is opened  # what every loader takes, not read again
    model = opened.load_model(Transformer)
    assert isinstance(model, Transformer) and model.cfg == tiny_cfg


def test_an_export_is_described_by_its_own_file_and_refuses_to_load_as_aiayn(tmp_path, tiny_cfg):
    """An export without its source (moved, or never recorded) is its own source; a bad
    model config names the export's file, not config.json."""
    meta = {"format": EXPORT_FORMAT, "format_version": EXPORT_FORMAT_VERSION,
            "engine": "onnxruntime", "architecture": "Transformer",
            "model": to_dict(tiny_cfg), "decode": {"alpha": 1.0}, "source_model": ""}  # fmt: skip
    (tmp_path / EXPORT_FILE).write_text(json.dumps(meta))
    opened = ModelDir.open(tmp_path)
    assert opened.is_export and opened.engine == "onnxruntime (float32)"
    assert opened.decode.alpha == 1.0 and opened.source == tmp_path
    with pytest.raises(CheckpointError, match="written by aiayn export"):
        opened.load_model(Transformer)
    (tmp_path / EXPORT_FILE).write_text(json.dumps({**meta, "model": {"d_model": "x"}}))
    with pytest.raises(CheckpointError, match=f"{EXPORT_FILE}: bad model config"):
        ModelDir.open(tmp_path)
