"""Export a classifier (`EncoderClassifier`) to one ONNX graph, and classify texts with it
(docs/export.md, "A classifier").

    model.onnx   input_ids (B, S) int64  ->  logits (B, C) float32

One run is the whole model: embeddings, the encoder stack, the pooled sentence vector and the
classifier layer. Batch and length are dynamic (length up to the model's positions); a row is
BOS + the text's ids + EOS, right-padded with PAD, which the graph masks as the model does
(`EncoderClassifier.forward`, traced from aiayn's own modules, so there is no second copy of
the model's math). `aiayn_export.json` keeps the labels (its `extra`, as config.json's).

`OnnxClassifier` is aiayn's `Classifier` over the session: the same ids, batches and outputs
(`probabilities`, `classify`, `labels`), on the CPU in fp32.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from aiayn.atomic import check_new_dir
from aiayn.classify.classifier import BATCH_TOKENS, Classifier
from aiayn.errors import AiaynError, CheckpointError, ConfigError
from aiayn.interop.export_dir import write_export
from aiayn.interop.export_onnx import OPSET, _export, example_length, import_onnxruntime
from aiayn.nn.encoder_only import EncoderClassifier
from aiayn.runtime.device import choose_precision
from aiayn.store.directory import ModelDir, open_model_dir
from aiayn.text.batches import pad_rows
from aiayn.text.labelled import classifier_ids

CLS_FILE = "model.onnx"
ARCHITECTURE = "EncoderClassifier"


def export_cls_graph(model: EncoderClassifier, path: Path) -> None:
    """Write the graph of `model` to `path` (module docstring)."""
    cfg = model.cfg
    Dim = torch.export.Dim
    batch, length = Dim("batch"), Dim("sequence_length", max=cfg.max_len)
    B, S = 2, example_length(cfg)  # above 1, and the band-mask path with a window
    ids_BS = torch.full((B, S), cfg.eos_id, dtype=torch.long)
    ids_BS[:, 0] = cfg.bos_id
    ids_BS[1, -1] = cfg.pad_id
    _export(
        model.eval(),
        (ids_BS,),
        path,
        input_names=["input_ids"],
        output_names=["logits"],
        dynamic_shapes=({0: batch, 1: length},),
    )


def export_cls_onnx(model_dir: Path, out: Path) -> Path:
    """`aiayn export onnx` of an EncoderClassifier: model.onnx, the tokenizer and
    aiayn_export.json (with the labels). Returns `out`."""
    ort = import_onnxruntime()
    check_new_dir(out)
    source = ModelDir.open(model_dir)
    model = source.load_model(EncoderClassifier)
    return write_export(
        out,
        lambda d: export_cls_graph(model, d / CLS_FILE),
        source.tokenizer,
        engine="onnxruntime",
        quantization="float32",
        model_cfg=model.cfg,
        decode=source.decode,
        source=model_dir,
        files={"model": CLS_FILE},
        versions={
            "torch": torch.__version__,
            "onnxruntime": ort.__version__,
            "opset": str(OPSET),
        },
        architecture=ARCHITECTURE,
        extra=model.extra_config(),
    )


def check_cls_export(opened: ModelDir) -> list[str]:
    """The labels of a classifier's ONNX export; anything else is refused in one line."""
    if not opened.is_export:
        raise ConfigError(f"{opened.path} is not an export: Classifier.open runs it")
    if opened.architecture != ARCHITECTURE or opened.meta.get("engine") != "onnxruntime":
        raise ConfigError(
            f"{opened.path} is an export of a {opened.architecture or 'Transformer'} "
            f"({opened.engine}), not an ONNX export of a classifier"
        )
    labels = (opened.meta.get("extra") or {}).get("labels")
    if (
        not isinstance(labels, list)
        or len(labels) < 2
        or not all(isinstance(n, str) for n in labels)
    ):
        raise CheckpointError(f"{opened.path}: aiayn_export.json names no labels: export it again")
    return labels


class OnnxClassifier(Classifier):
    """A classifier's ONNX export behind `Classifier`'s interface: `ids`, `logits`,
    `probabilities`, `classify`, `labels`, `tok`, `precision` (CPU, fp32). There is no torch
    model (`model` is None): the glass box and training take the aiayn model directory."""

    def __init__(
        self, directory: str | Path | ModelDir, threads: int = 0, batch_tokens: int = BATCH_TOKENS
    ) -> None:
        # Not Classifier.__init__: it puts a torch model in eval mode; this holds a session.
        opened = open_model_dir(directory)
        self.labels = check_cls_export(opened)
        self.cfg, self.tok = opened.model_cfg, opened.tokenizer
        self.model = None  # type: ignore[assignment]  # no torch model behind an export
        self.precision = choose_precision("fp32", torch.device("cpu"), decoding=True)
        self.batch_tokens = batch_tokens
        ort = import_onnxruntime()
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads  # 0 = ONNX Runtime's default
        options.inter_op_num_threads = 1
        options.log_severity_level = 3  # errors only
        path = opened.path / CLS_FILE
        if not path.is_file():
            raise AiaynError(f"{opened.path} has no {CLS_FILE}: export it again")
        self.session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])

    @classmethod
    def open(
        cls,
        directory: str | Path | ModelDir,
        device: str = "auto",
        dtype: str = "auto",
        threads: int = 0,
    ) -> OnnxClassifier:
        """The export in `directory`; it runs in fp32 on the CPU, and a --device/--dtype asking
        for anything else is refused in one line. `threads`: ONNX Runtime's (0 = its default)."""
        if device.strip().lower() not in ("auto", "cpu") or dtype not in ("auto", "fp32"):
            raise ConfigError(
                "an exported model runs on the CPU in fp32: leave out --device/--dtype"
            )
        return cls(directory, threads)

    def ids(self, texts: Sequence[str]) -> list[list[int]]:
        return classifier_ids(self.tok, texts, self.cfg.max_len)

    def run(self, ids_BS: Tensor) -> Tensor:
        """Logits (B, C) of a padded batch of ids."""
        (logits,) = self.session.run(None, {"input_ids": ids_BS.numpy().astype(np.int64)})
        return torch.from_numpy(logits)

    def logits(self, texts: Sequence[str]) -> Tensor:
        """(N, C) fp32 class logits, in the texts' order (batched as `Classifier` batches)."""
        ids = self.ids(texts)
        out = torch.empty(len(ids), len(self.labels))
        for idx in self.batches(ids):
            out[idx] = self.run(pad_rows([ids[i] for i in idx], self.cfg.pad_id))
        return out
