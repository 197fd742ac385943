"""Export a Transformer to two ONNX graphs, and run them with ONNX Runtime (docs/export.md).

    encoder.onnx   src_ids (B, S)  ->  memory (B, S, D), keep (B, S),
                                       cross_k_i, cross_v_i (B, J, S, K) for each layer i
    decoder.onnx   tokens (B, 1), position (1,), keep (B, S), cross_k_i, cross_v_i,
                   past_k_i, past_v_i (B, J, P, K)
                   ->  logits (B, V), new_k_i, new_v_i (B, J, 1, K)

(J: the K/V heads, `cfg.n_kv_heads`; the paper's J = H.)

One decoder run is one decoding step with the past positions' self-attention keys and values
("decoder with past"); batch B, source length S and past length P are dynamic. The encoder
graph also computes each layer's cross-attention keys and values once, as
`Transformer.init_cache` does, so a step only projects its one new position.

Both graphs are traced from aiayn's own modules (`Transformer.encode`, `Decoder.step` over a
cache that concatenates instead of writing in place), so there is no second copy of the model
math. `OnnxModel` gives the two sessions the narrow interface `aiayn.search.decode` searches over
(`encode`, `init_cache`, `decode_step`, `cfg`), so greedy,
beam and sampling are aiayn.search's own.
"""

from __future__ import annotations

import logging
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from aiayn.config import ModelConfig
from aiayn.errors import AiaynError, ConfigError
from aiayn.interop.export_dir import load_source, source_architecture, write_export
from aiayn.nn.embeddings import Embeddings
from aiayn.nn.kv_cache import KVCache, Memory
from aiayn.nn.model import DecoderLayer, Transformer

ENCODER_FILE = "encoder.onnx"
DECODER_FILE = "decoder.onnx"
OPSET = 18


def import_onnxruntime() -> Any:
    """The `onnxruntime` module, or a one-line error saying how to install it."""
    try:
        import onnxruntime
    except ImportError:
        raise AiaynError(
            "the ONNX engine needs the onnxruntime package: pip install 'aiayn[export]'"
        ) from None
    return onnxruntime


def example_length(cfg: ModelConfig) -> int:
    """The sequence length a graph is traced at: above 1 (the exporter specialises dimensions
    it sees as 0 or 1), at most max_len, and with a window (`attn_window` W) at most 2W, so
    that the trace takes attention's band-mask path, exact at every length, not the
    block-by-block path aiayn's eager forward takes for sequences longer than 2W."""
    S = min(5, cfg.max_len)
    return max(2, min(S, 2 * cfg.attn_window)) if cfg.attn_window else S


def embed_at(embed: Embeddings, ids_BT: Tensor, pos_BT: Tensor) -> Tensor:
    """`Embeddings.forward` with the positions as a tensor (it takes a Python int): one per
    token, broadcast over rows (left padding: < 0, clamped as `Embeddings.at` does; no real
    position sees it). Positions that act in attention (RoPE, ALiBi) or none add nothing."""
    x_BTD = embed.tokens(ids_BT) * embed.scale
    if embed.adds_positions:
        table_PD = embed.learned.weight if embed.learned is not None else embed.pe
        x_BTD = x_BTD + table_PD[pos_BT.clamp(min=0)]
    return x_BTD if embed.norm is None else embed.norm(x_BTD)


def _names(prefix: str, n_layers: int) -> list[str]:
    return [f"{prefix}_{i}" for i in range(n_layers)]


# --- the graphs ---------------------------------------------------------------------------------


class EncoderGraph(nn.Module):
    """src_ids -> memory, keep mask and every layer's cross-attention K/V (module docstring)."""

    def __init__(self, model: Transformer) -> None:
        super().__init__()
        self.model = model

    def forward(self, src_BS: Tensor) -> tuple[Tensor, Tensor, list[Tensor], list[Tensor]]:
        memory = self.model.encode(src_BS)
        cross_k, cross_v = [], []
        layer: DecoderLayer
        for layer in self.model.decoder.layers:  # type: ignore[assignment]  # ModuleList items
            k_BHSK, v_BHSK = layer.cross_attn.project_kv(memory.out_BSD)
            cross_k.append(k_BHSK)
            cross_v.append(v_BHSK)
        return memory.out_BSD, memory.keep_BS, cross_k, cross_v


@dataclass
class _ConcatCache(KVCache):
    """A KVCache that returns past + new self-attention K/V by concatenation (a graph has no
    in-place writes) and records the new position's K/V: the decoder graph's outputs."""

    new_k: list[Tensor] = field(default_factory=list)
    new_v: list[Tensor] = field(default_factory=list)

    def append_self(
        self, layer: int, k_BHTK: Tensor, v_BHTK: Tensor
    ) -> tuple[Tensor, Tensor, None]:
        self.new_k.append(k_BHTK)
        self.new_v.append(v_BHTK)
        k_BHCK = torch.cat([self.self_k[layer], k_BHTK], 2)
        return k_BHCK, torch.cat([self.self_v[layer], v_BHTK], 2), None


class DecoderStepGraph(nn.Module):
    """One decoding step: `Transformer.decode_step` with the cache passed in and out."""

    def __init__(self, model: Transformer) -> None:
        super().__init__()
        self.model = model

    def forward(
        self,
        tokens_B1: Tensor,
        position_1: Tensor,
        keep_BS: Tensor,
        cross_k: list[Tensor],
        cross_v: list[Tensor],
        past_k: list[Tensor],
        past_v: list[Tensor],
    ) -> tuple[Tensor, list[Tensor], list[Tensor]]:
        y_B1D = embed_at(self.model.tgt_embed, tokens_B1, position_1[None, :])
        P = past_k[0].size(2)  # the new position's column
        cache = _ConcatCache(list(past_k), list(past_v), list(cross_k), list(cross_v), P)
        y_B1D = self.model.decoder.step(y_B1D, cache, keep_BS[:, None, None, :])
        return self.model.generator(y_B1D[:, -1]), cache.new_k, cache.new_v


def _export(module: nn.Module, args: tuple[Any, ...], path: Path, **kw: Any) -> None:
    # Grad mode on: aiayn's Linear takes its oneDNN-prepacked path only without autograd, and
    # that kernel has no ONNX form; the plain F.linear path exports.
    with warnings.catch_warnings(), torch.enable_grad():
        warnings.simplefilter("ignore")
        logging.getLogger("torch.onnx").setLevel(logging.ERROR)
        try:
            torch.onnx.export(
                module,
                args,
                str(path),
                dynamo=True,
                opset_version=OPSET,
                verbose=False,
                external_data=False,
                optimize=True,
                **kw,
            )
        except Exception as e:  # the exporter's own report runs to pages: its first line
            first = next((line for line in str(e).splitlines() if line.strip()), type(e).__name__)
            raise ConfigError(
                f"the torch ONNX exporter could not trace this model ({first.strip()[:200]})"
            ) from None


def export_graphs(model: Transformer, directory: Path) -> None:
    """Write encoder.onnx and decoder.onnx for `model` into `directory`."""
    cfg = model.cfg
    L, J, K = cfg.n_layers, cfg.n_kv_heads, cfg.d_k
    Dim = torch.export.Dim
    batch, src_len = Dim("batch"), Dim("src_len", max=cfg.max_len)
    past_len = Dim("past_len", max=cfg.max_len - 1)
    # Example sizes above 1: the exporter specialises dimensions it sees as 0 or 1.
    B, S, P = 2, example_length(cfg), min(3, cfg.max_len - 1)
    src_BS = torch.full((B, S), cfg.eos_id, dtype=torch.long)
    src_BS[1, -1] = cfg.pad_id
    model = model.eval()
    _export(
        EncoderGraph(model),
        (src_BS,),
        directory / ENCODER_FILE,
        input_names=["src_ids"],
        output_names=["memory", "keep", *_names("cross_k", L), *_names("cross_v", L)],
        dynamic_shapes=({0: batch, 1: src_len},),
    )
    # Distinct tensors for every input: the exporter treats one tensor passed twice as one input.
    cross_k, cross_v = ([torch.zeros(B, J, S, K) for _ in range(L)] for _ in range(2))
    past_k, past_v = ([torch.zeros(B, J, P, K) for _ in range(L)] for _ in range(2))
    args = (
        torch.full((B, 1), cfg.bos_id),
        torch.tensor([P]),
        src_BS != cfg.pad_id,
        cross_k,
        cross_v,
        past_k,
        past_v,
    )
    _export(
        DecoderStepGraph(model),
        args,
        directory / DECODER_FILE,
        input_names=[
            "tokens",
            "position",
            "keep",
            *_names("cross_k", L),
            *_names("cross_v", L),
            *_names("past_k", L),
            *_names("past_v", L),
        ],
        output_names=["logits", *_names("new_k", L), *_names("new_v", L)],
        dynamic_shapes=(
            {0: batch},
            None,
            {0: batch, 1: src_len},
            [{0: batch, 2: src_len}] * L,
            [{0: batch, 2: src_len}] * L,
            [{0: batch, 2: past_len}] * L,
            [{0: batch, 2: past_len}] * L,
        ),
    )


def export_onnx(model_dir: Path, out: Path) -> Path:
    """`aiayn export onnx`: write encoder.onnx, decoder.onnx, the tokenizer and
    aiayn_export.json for the translator in `model_dir` to `out` (a language model's one
    graph: `aiayn.interop.export_lm`). Returns `out`."""
    ort = import_onnxruntime()
    if source_architecture(model_dir, out) == "DecoderLM":  # export_lm builds on this one
        raise ConfigError(
            f"{model_dir} holds a language model: aiayn.interop.export_lm.export_lm_onnx "
            "exports it (`aiayn export onnx` calls it)"
        )

    model, tok, decode = load_source(model_dir, out)
    return write_export(
        out,
        lambda d: export_graphs(model, d),
        tok,
        engine="onnxruntime",
        quantization="float32",
        model_cfg=model.cfg,
        decode=decode,
        source=model_dir,
        files={"encoder": ENCODER_FILE, "decoder": DECODER_FILE},
        versions={
            "torch": torch.__version__,
            "onnxruntime": ort.__version__,
            "opset": str(OPSET),
        },
    )


# --- running them -------------------------------------------------------------------------------


@dataclass
class OnnxMemory(Memory):
    """The encoder graph's outputs: memory, keep mask, and each layer's cross-attention K/V
    (B, J, S, K), which `OnnxModel.init_cache` puts in the cache."""

    cross_k: list[Tensor] = field(default_factory=list)
    cross_v: list[Tensor] = field(default_factory=list)

    def index_select(self, idx_B: Tensor) -> OnnxMemory:
        return OnnxMemory(
            self.out_BSD.index_select(0, idx_B),
            self.keep_BS.index_select(0, idx_B),
            [k.index_select(0, idx_B) for k in self.cross_k],
            [v.index_select(0, idx_B) for v in self.cross_v],
        )


class OnnxModel:
    """The two graphs behind `aiayn.search.decode`'s narrow interface, on the CPU: torch tensors in
    and out, NumPy arrays at the ONNX Runtime boundary (shared memory where contiguous)."""

    training = False  # decode's inference guard asks; there is no dropout to switch off

    def __init__(self, directory: str | Path, cfg: ModelConfig, threads: int = 0) -> None:
        ort = import_onnxruntime()
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads  # 0 = ONNX Runtime's default
        options.inter_op_num_threads = 1
        options.log_severity_level = 3  # errors only
        directory = Path(directory)

        def session(name: str) -> Any:
            path = directory / name
            if not path.is_file():
                raise AiaynError(f"{directory} has no {name}: export it again")
            return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])

        self.cfg = cfg
        self.encoder, self.decoder = session(ENCODER_FILE), session(DECODER_FILE)
        L = cfg.n_layers
        self._cross = [*_names("cross_k", L), *_names("cross_v", L)]
        self._past = [*_names("past_k", L), *_names("past_v", L)]

    def encode(self, src_BS: Tensor) -> OnnxMemory:
        L = self.cfg.n_layers
        out = self.encoder.run(None, {"src_ids": src_BS.cpu().numpy()})
        memory_BSD, keep_BS, *cross = (torch.from_numpy(x) for x in out)
        return OnnxMemory(memory_BSD, keep_BS, cross[:L], cross[L:])

    def init_cache(self, memory: Memory, capacity: int) -> KVCache:
        if not isinstance(memory, OnnxMemory):
            raise TypeError("OnnxModel.init_cache needs the OnnxMemory its encode returned")
        B, J, K = memory.out_BSD.size(0), self.cfg.n_kv_heads, self.cfg.d_k
        self_k = [torch.empty(B, J, capacity, K) for _ in range(self.cfg.n_layers)]
        self_v = [torch.empty(B, J, capacity, K) for _ in range(self.cfg.n_layers)]
        return KVCache(self_k, self_v, list(memory.cross_k), list(memory.cross_v), 0)

    def decode_step(
        self, tokens_BT: Tensor, memory: Memory, cache: KVCache
    ) -> tuple[Tensor, KVCache]:
        """Feed `tokens_BT` one position at a time (T > 1 only in the recompute reference)."""
        logits_BV = torch.empty(0)
        for t in range(tokens_BT.size(1)):
            logits_BV = self._step(tokens_BT[:, t : t + 1], memory, cache)
        return logits_BV, cache

    def _step(self, tokens_B1: Tensor, memory: Memory, cache: KVCache) -> Tensor:
        P = cache.length
        feeds: dict[str, np.ndarray] = {
            "tokens": tokens_B1.cpu().numpy(),
            "position": np.array([P], dtype=np.int64),
            "keep": memory.keep_BS.numpy(),
        }
        layers = [*cache.cross_k, *cache.cross_v]
        feeds.update((n, t.numpy()) for n, t in zip(self._cross, layers, strict=True))
        past = [b[:, :, :P] for b in (*cache.self_k, *cache.self_v)]
        feeds.update(
            (n, np.ascontiguousarray(t.numpy())) for n, t in zip(self._past, past, strict=True)
        )
        logits, *new = self.decoder.run(None, feeds)
        L = self.cfg.n_layers
        for i in range(L):
            cache.append_self(i, torch.from_numpy(new[i]), torch.from_numpy(new[L + i]))
        cache.length = P + 1
        return torch.from_numpy(logits)
