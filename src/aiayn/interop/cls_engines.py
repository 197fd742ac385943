"""A classifier by what its directory holds: `load_classifier(dir)` is aiayn's `Classifier`
over an aiayn model directory, or over a classifier's ONNX export (`OnnxClassifier`,
aiayn.interop.export_cls): what `aiayn classify --model DIR` runs."""

from __future__ import annotations

from pathlib import Path

from aiayn.classify.classifier import Classifier
from aiayn.interop.export_cls import OnnxClassifier
from aiayn.store.directory import ModelDir, open_model_dir


def load_classifier(
    directory: str | Path | ModelDir, device: str = "auto", dtype: str = "auto", threads: int = 0
) -> Classifier:
    """The classifier in `directory`: an export (`aiayn export onnx`) runs with ONNX Runtime on
    the CPU in fp32 (`threads`: its intra-op threads, 0 = its default), anything else through
    `Classifier.open` (whose one-line errors say what another kind of model is for)."""
    opened = open_model_dir(directory)
    if opened.is_export:
        return OnnxClassifier.open(opened, device, dtype, threads)
    return Classifier.open(opened, device, dtype)
