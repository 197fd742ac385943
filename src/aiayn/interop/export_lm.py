"""Export a decoder-only language model (`DecoderLM`) to one ONNX graph with past key/values,
and generate with it through aiayn's own search (docs/export.md, "A language model").

    model.onnx   input_ids (B, T), attention_mask (B, P+T), position_ids (B, T),
                 past_key_values.{i}.key, past_key_values.{i}.value (B, J, P, K)
                 ->  logits (B, T, V), present.{i}.key, present.{i}.value (B, J, P+T, K)

The names and layout are Hugging Face Optimum's and ONNX Runtime GenAI's for a decoder with
past (`decoder_model_merged`): one graph for the prompt (P = 0) and for every step after it,
`present` = past + the new positions, `attention_mask` 1 for real columns, 0 for left padding.
J is the K/V heads (`kv_heads`; the paper's J = H). A table of positions reads `position_ids`;
RoPE and ALiBi read the columns (column - the row's first real column, from the mask), as
aiayn's decoding steps do; a window's band is over the whole past (exact, not a ring).
Batch, new length and past length are dynamic. The graph is traced from aiayn's own modules
(`Encoder.step` over a cache that concatenates instead of writing in place), as the
translator's graphs are (`aiayn.interop.export_onnx`).

`OnnxLM` puts the session behind `DecoderLM`'s search interface (`encode`, `first_tokens`,
`output_room`, `init_cache`, `decode_step`), so `OnnxGenerator` is aiayn's `Generator`: greedy,
beam and seeded sampling are aiayn.search's own code and give aiayn's tokens.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from torch import Tensor, nn

from aiayn.atomic import check_new_dir
from aiayn.config import DecodeConfig, ModelConfig
from aiayn.errors import AiaynError, ConfigError
from aiayn.generate.generator import Generator
from aiayn.interop.export_dir import write_export
from aiayn.interop.export_onnx import OPSET, _export, embed_at, import_onnxruntime
from aiayn.nn.kv_cache import KVCache, Memory
from aiayn.nn.variants import DecoderLM, PromptMemory
from aiayn.store.directory import ModelDir
from aiayn.text.tokenizer import Tokenizer

LM_FILE = "model.onnx"
ARCHITECTURE = "DecoderLM"


def past_names(n_layers: int) -> list[str]:
    """`past_key_values.{i}.key` then `.value`, layer by layer (Optimum's order)."""
    return [f"past_key_values.{i}.{kv}" for i in range(n_layers) for kv in ("key", "value")]


def present_names(n_layers: int) -> list[str]:
    return [f"present.{i}.{kv}" for i in range(n_layers) for kv in ("key", "value")]


# --- the graph ----------------------------------------------------------------------------------


@dataclass
class _PresentCache(KVCache):
    """A KVCache that returns past + new K/V by concatenation (a graph has no in-place writes)
    and keeps them: the graph's `present` outputs."""

    present: list[Tensor] = field(default_factory=list)

    def append_self(
        self, layer: int, k_BJTK: Tensor, v_BJTK: Tensor
    ) -> tuple[Tensor, Tensor, None]:
        k_BJCK = torch.cat([self.self_k[layer], k_BJTK], 2)
        v_BJCK = torch.cat([self.self_v[layer], v_BJTK], 2)
        self.present += [k_BJCK, v_BJCK]
        return k_BJCK, v_BJCK, None


class DecoderLMGraph(nn.Module):
    """`DecoderLM.decode_step` for T new positions with the past passed in and out."""

    def __init__(self, model: DecoderLM) -> None:
        super().__init__()
        self.model = model

    def forward(
        self, ids_BT: Tensor, mask_BC: Tensor, pos_BT: Tensor, past: list[Tensor]
    ) -> tuple[Tensor, list[Tensor]]:
        x_BTD = embed_at(self.model.embed, ids_BT, pos_BT)
        T, C = ids_BT.size(1), mask_BC.size(1)
        # A real column is seen by the queries after it (the layer adds causality); each query
        # sees its own column too, so a padding row attends to itself (finite, never NaN, and
        # seen by no real row), as `DecoderLM.init_cache` does.
        own_TC = torch.arange(C)[None, :] == (C - T + torch.arange(T))[:, None]
        keep_B1TC = (mask_BC[:, None, None, :] != 0) | own_TC
        # The cache says where the new columns sit (after the past) and where each row starts
        # (its left padding): RoPE's positions and ALiBi's distances are read from them, as
        # in aiayn's own decoding steps.
        P = past[0].size(2)
        start_B = (mask_BC == 0).sum(1)
        cache = _PresentCache(list(past[0::2]), list(past[1::2]), [], [], P, start_B=start_B)
        y_BTD = self.model.decoder.step(x_BTD, cache, keep_B1TC)
        return self.model.generator(y_BTD), cache.present


def export_lm_graph(model: DecoderLM, path: Path) -> None:
    """Write the graph of `model` to `path` (module docstring)."""
    cfg = model.cfg
    L, J, K = cfg.n_layers, cfg.n_kv_heads, cfg.d_k
    Dim = torch.export.Dim
    batch, new, total = Dim("batch"), Dim("sequence_length"), Dim("total_sequence_length")
    past_len = Dim("past_sequence_length")
    # Example sizes above 1: the exporter specialises dimensions it sees as 0 or 1.
    B, T, P = 2, 3, 4
    ids_BT = torch.full((B, T), cfg.eos_id, dtype=torch.long)
    mask_BC = torch.ones(B, P + T, dtype=torch.long)
    pos_BT = torch.arange(P, P + T)[None].repeat(B, 1)
    past = [torch.zeros(B, J, P, K) for _ in range(2 * L)]  # distinct tensors: distinct inputs
    _export(
        DecoderLMGraph(model.eval()),
        (ids_BT, mask_BC, pos_BT, past),
        path,
        input_names=["input_ids", "attention_mask", "position_ids", *past_names(L)],
        output_names=["logits", *present_names(L)],
        dynamic_shapes=(
            {0: batch, 1: new},
            {0: batch, 1: total},
            {0: batch, 1: new},
            [{0: batch, 2: past_len}] * (2 * L),
        ),
    )


def export_lm_onnx(model_dir: Path, out: Path) -> Path:
    """`aiayn export onnx` of a DecoderLM: model.onnx, the tokenizer and aiayn_export.json."""
    ort = import_onnxruntime()
    model, tok, decode = load_lm_source(model_dir, out)
    return write_export(
        out,
        lambda d: export_lm_graph(model, d / LM_FILE),
        tok,
        engine="onnxruntime",
        quantization="float32",
        model_cfg=model.cfg,
        decode=decode,
        source=model_dir,
        files={"model": LM_FILE},
        versions={
            "torch": torch.__version__,
            "onnxruntime": ort.__version__,
            "opset": str(OPSET),
        },
        architecture=ARCHITECTURE,
    )


def load_lm_source(model_dir: Path, out: Path) -> tuple[DecoderLM, Tokenizer, DecodeConfig]:
    """The language model, its tokenizer and its search defaults (the LM's, where its
    directory saves none); `out` is refused first if it is taken."""
    check_new_dir(out)
    source = ModelDir.open(model_dir)
    model = source.load_model(DecoderLM)
    return model, source.tokenizer, source.decode


# --- running it ---------------------------------------------------------------------------------


class OnnxLM:
    """The graph behind `DecoderLM`'s search interface, on the CPU: torch tensors in and out,
    NumPy arrays at the ONNX Runtime boundary. The KV cache is aiayn's `KVCache` (so the
    search reorders and joins it as ever); each run reads its filled part as the past and
    writes the new positions of `present` into it."""

    training = False  # decode's inference guard asks; there is no dropout to switch off

    def __init__(self, directory: str | Path, cfg: ModelConfig, threads: int = 0) -> None:
        ort = import_onnxruntime()
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads  # 0 = ONNX Runtime's default
        options.inter_op_num_threads = 1
        options.log_severity_level = 3  # errors only
        path = Path(directory) / LM_FILE
        if not path.is_file():
            raise AiaynError(f"{directory} has no {LM_FILE}: export it again")
        self.session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        self.cfg = cfg
        self._past = past_names(cfg.n_layers)

    def eval(self) -> OnnxLM:
        return self

    def encode(self, prompt_BS: Tensor) -> Memory:
        """Left-align the prompts, as `DecoderLM.encode` does (it reads no weights)."""
        S = prompt_BS.size(1)
        cols_S = torch.arange(1, S + 1)
        n_B = ((prompt_BS != self.cfg.pad_id) * cols_S).amax(1).clamp(min=1)
        keep_BS = cols_S[None, :] <= n_B[:, None]
        shift_BS = (torch.arange(S) - (S - n_B)[:, None]) % S
        no_out_BS0 = keep_BS.new_zeros(*keep_BS.shape, 0, dtype=torch.float)
        return PromptMemory(no_out_BS0, keep_BS, prompt_BS.gather(1, shift_BS), S - n_B)

    def first_tokens(self, memory: Memory) -> Tensor:
        assert isinstance(memory, PromptMemory)
        return memory.ids_BS[:, -1:]

    def output_room(self, memory: Memory) -> Tensor:
        return self.cfg.max_len - memory.keep_BS.sum(1)

    def init_cache(self, memory: Memory, capacity: int) -> KVCache:
        """A cache of the prompt's K/V (all but its last token), room for `capacity` more."""
        assert isinstance(memory, PromptMemory)
        B, S = memory.ids_BS.shape
        shape = (B, self.cfg.n_kv_heads, S - 1 + capacity, self.cfg.d_k)
        k = [torch.zeros(shape) for _ in range(self.cfg.n_layers)]
        v = [torch.zeros(shape) for _ in range(self.cfg.n_layers)]
        cache = KVCache(k, v, [], [], 0, start_B=memory.start_B)
        if S > 1:
            self.run(memory.ids_BS[:, :-1], cache)
        return cache

    def decode_step(
        self, tokens_BT: Tensor, memory: Memory, cache: KVCache
    ) -> tuple[Tensor, KVCache]:
        return self.run(tokens_BT, cache)[:, -1], cache

    def run(self, ids_BT: Tensor, cache: KVCache) -> Tensor:
        """Logits (B, T, V) after feeding `ids_BT` at column cache.length; the cache grows by T."""
        P, (B, T) = cache.length, ids_BT.shape
        start_B = cache.start_B if cache.start_B is not None else torch.zeros(B, dtype=torch.long)
        mask_BC = torch.arange(P + T)[None, :] >= start_B[:, None]
        pos_BT = P + torch.arange(T)[None, :] - start_B[:, None]  # column - start
        feeds: dict[str, np.ndarray] = {
            "input_ids": ids_BT.cpu().numpy(),
            "attention_mask": mask_BC.long().numpy(),
            "position_ids": pos_BT.numpy(),
        }
        past = [b[:, :, :P] for kv in zip(cache.self_k, cache.self_v, strict=True) for b in kv]
        feeds.update(
            (n, np.ascontiguousarray(t.numpy())) for n, t in zip(self._past, past, strict=True)
        )
        logits, *present = self.session.run(None, feeds)
        for i in range(self.cfg.n_layers):
            k, v = present[2 * i][:, :, P:], present[2 * i + 1][:, :, P:]
            cache.append_self(i, torch.from_numpy(k), torch.from_numpy(v))
        cache.length = P + T
        return torch.from_numpy(logits)


class OnnxGenerator(Generator):
    """aiayn's `Generator` over an `OnnxLM` (CPU, fp32): the same prompts, settings, seeds and
    search, so the same tokens."""


def check_lm_export(opened: ModelDir) -> None:
    """Refuse an export that is not a language model's, in one line."""
    if not opened.is_export:
        raise ConfigError(f"{opened.path} is not an export: Generator.load runs it")
    if opened.architecture != ARCHITECTURE:
        raise ConfigError(
            f"{opened.path} is an export of a {opened.architecture or 'Transformer'}, not of a "
            "language model (a DecoderLM)"
        )
