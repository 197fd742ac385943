"""Export speed and quality: one model, one set of sentences, every engine (issue #14).

Engines: aiayn fp32 (its own search, KV cache, oneDNN-prepacked linears), the same model
exported to CTranslate2 float32 and int8 (`aiayn export ctranslate2`; the int8 model also
loaded with float32 arithmetic, `ct2_int8w_fp32`: int8 weights only), to ONNX and run by
ONNX Runtime through decode.py's search (`aiayn export onnx`), and Hugging Face
`generate()` on a MarianMTModel holding the same weights (bench/decode_speed.py's peer, with
aiayn's weights and positional table copied in; its greedy logits are checked against aiayn's).

Speed: greedy and beam 4, at each `--threads` count, on the first `--lines` source lines,
text in and text out (tokenization included; HF gets token ids). Runs are interleaved
across engines so other processes' load hits them alike; each figure is the median of
`--reps` runs in output tokens (each engine's own outputs, EOS not counted) per wall-clock
second, with its ratio to aiayn fp32 at the same setting.
Quality: every line of `--src`, once per engine and search: BLEU against `--ref`, and the share
of lines identical to aiayn fp32's (the int8 trade-off; docs/export.md).

    python bench/export_speed.py --model DIR --src test.en --ref test.de [--work DIR]

Prints a table, then one JSON object (the last line). Needs the `export` extra and, for the
HF peer, the `bench` extra (transformers); without transformers the HF rows are left out.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from aiayn.config import DecodeConfig
from aiayn.interop.engines import load_translator
from aiayn.interop.export_ct2 import export_ctranslate2
from aiayn.interop.export_onnx import export_onnx
from aiayn.nn.model import Transformer
from aiayn.runtime.memory import keep_freed_memory
from aiayn.store.model_dir import load_model_dir
from aiayn.text.batches import pad_rows
from aiayn.text.tokenizer import Tokenizer
from aiayn.translate.files import read_file_lines
from aiayn.translate.metrics import bleu
from aiayn.translate.translator import Translator

sys.path.insert(0, str(Path(__file__).parent))


def exports(model_dir: Path, work: Path) -> dict[str, Path]:
    """The three exports of `model_dir` under `work` (made once, reused on later runs)."""
    made = {"ct2_fp32": work / "ct2_fp32", "ct2_int8": work / "ct2_int8", "onnx": work / "onnx"}
    for name, out in made.items():
        if not out.exists():
            t0 = time.perf_counter()
            if name == "onnx":
                export_onnx(model_dir, out)
            else:
                export_ctranslate2(model_dir, out, name.split("_")[1].replace("fp", "float"))
            print(f"exported {name} in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    return made


# --- the Hugging Face peer -------------------------------------------------------------------


def hf_peer(model: Transformer) -> Any | None:
    """A MarianMTModel computing aiayn's function (post-LN, ReLU, tied, x sqrt(d)), or None."""
    cfg = model.cfg
    if cfg.norm_first or cfg.positional != "sinusoidal" or not cfg.tie_output or cfg.max_len != 256:
        return None  # Marian: post-LN, a fixed sinusoidal table (256 rows here), tied embeddings
    try:
        import decode_speed
    except ImportError:  # transformers missing
        return None
    size = decode_speed.Size(cfg.d_model, cfg.n_heads, cfg.n_layers, cfg.d_ff, cfg.vocab_size,
                             0, 0, 0)  # fmt: skip
    hf = decode_speed.hf_model(size)
    hf.config.activation_function = cfg.activation.replace("swish", "silu")
    sd = {k: v.detach() for k, v in model.state_dict().items()}
    D = cfg.d_model
    with torch.no_grad():
        hf.model.shared.weight.copy_(sd["src_embed.tokens.weight"])
        for side in ("encoder", "decoder"):
            stack = getattr(hf.model, side)
            stack.embed_positions.weight.copy_(model.src_embed.pe[: cfg.max_len])
            for i, layer in enumerate(stack.layers):
                p = f"{side}.layers.{i}."
                attns = [("self_attn", "self_attn", "norm1")]
                if side == "decoder":
                    attns.append(("encoder_attn", "cross_attn", "norm2"))
                for hf_name, ours, norm in attns:
                    attn = getattr(layer, hf_name)
                    w, b = sd[p + ours + ".in_proj.weight"], sd[p + ours + ".in_proj.bias"]
                    for j, proj in enumerate((attn.q_proj, attn.k_proj, attn.v_proj)):
                        proj.weight.copy_(w[j * D : (j + 1) * D])
                        proj.bias.copy_(b[j * D : (j + 1) * D])
                    attn.out_proj.weight.copy_(sd[p + ours + ".out_proj.weight"])
                    attn.out_proj.bias.copy_(sd[p + ours + ".out_proj.bias"])
                    getattr(layer, f"{hf_name}_layer_norm").weight.copy_(sd[p + norm + ".weight"])
                    getattr(layer, f"{hf_name}_layer_norm").bias.copy_(sd[p + norm + ".bias"])
                last = "norm3" if side == "decoder" else "norm2"
                for k in ("weight", "bias"):
                    getattr(layer.fc1, k).copy_(sd[p + f"ffn.w_1.{k}"])
                    getattr(layer.fc2, k).copy_(sd[p + f"ffn.w_2.{k}"])
                    getattr(layer.final_layer_norm, k).copy_(sd[p + f"{last}.{k}"])
        hf.lm_head.weight = hf.model.shared.weight
    hf.config.pad_token_id, hf.config.eos_token_id = cfg.pad_id, cfg.eos_id
    hf.config.decoder_start_token_id = cfg.bos_id
    hf.generation_config.pad_token_id = cfg.pad_id
    hf.generation_config.eos_token_id = cfg.eos_id
    hf.generation_config.decoder_start_token_id = cfg.bos_id
    hf.generation_config.bad_words_ids = [[cfg.pad_id], [cfg.bos_id]]
    return hf.eval()


def check_peer(hf: Any, model: Transformer, src_BS: torch.Tensor) -> float:
    """Max |logit difference| of the peer against aiayn on a teacher-forced prefix."""
    tgt = torch.full((src_BS.size(0), 5), model.cfg.bos_id)
    tgt[:, 1:] = src_BS[:, :4].clamp(min=4)
    with torch.inference_mode():
        ours = model(src_BS, tgt)
        theirs = hf(input_ids=src_BS, attention_mask=src_BS != model.cfg.pad_id,
                    decoder_input_ids=tgt).logits  # fmt: skip
    return float((ours - theirs).abs().max())


class HfTranslator:
    """`generate()` over sorted batches of `batch` sentences; text in, text out."""

    def __init__(self, hf: Any, tok: Tokenizer, cfg: DecodeConfig, batch: int = 64) -> None:
        self.hf, self.tok, self.cfg, self.batch = hf, tok, cfg, batch

    def translate(self, lines: list[str], beam: int) -> tuple[list[str], int]:
        ids = self.tok.encode_batch(lines)
        order = sorted(range(len(ids)), key=lambda i: -len(ids[i]))
        out: list[str] = [""] * len(lines)
        n_tokens = 0
        for start in range(0, len(order), self.batch):
            rows = order[start : start + self.batch]
            src_BS = pad_rows([ids[i] for i in rows], self.tok.pad_id)
            limit = int(max(len(ids[i]) for i in rows) * self.cfg.max_len_a + self.cfg.max_len_b)
            with torch.inference_mode():
                gen = self.hf.generate(
                    input_ids=src_BS, attention_mask=src_BS != self.tok.pad_id, num_beams=beam,
                    max_new_tokens=limit, do_sample=False, length_penalty=self.cfg.alpha,
                    early_stopping=True,
                )  # fmt: skip
            for i, row in zip(rows, gen[:, 1:].tolist(), strict=True):
                toks = row[: row.index(self.tok.eos_id)] if self.tok.eos_id in row else row
                toks = [t for t in toks if t != self.tok.pad_id]
                n_tokens += len(toks)
                out[i] = self.tok.decode(toks)
        return out, n_tokens


# --- running ---------------------------------------------------------------------------------


def run_translator(tr: Translator, lines: list[str], beam: int) -> tuple[list[str], int]:
    found = tr.translate_hyps(lines, tr.settings(beam))
    return [r[0].text for r in found], sum(len(r[0].hyp.tokens) for r in found)


def set_threads(n: int) -> None:
    torch.set_num_threads(n)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", type=Path, required=True, help="an aiayn model directory")
    parser.add_argument("--src", type=Path, required=True)
    parser.add_argument("--ref", type=Path, required=True)
    parser.add_argument("--work", type=Path, help="where the exports go (default: a temp dir)")
    parser.add_argument("--lines", type=int, default=300, help="lines timed (default 300)")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--threads", default="1,2", help="comma list (default 1,2)")
    parser.add_argument("--no-hf", action="store_true", help="leave out HF generate()")
    args = parser.parse_args()
    keep_freed_memory()  # malloc as aiayn's commands set it, for every side measured here
    work = args.work or Path(tempfile.mkdtemp(prefix="aiayn_export_speed_"))
    work.mkdir(parents=True, exist_ok=True)
    set_threads(1)
    paths = exports(args.model, work)
    src, refs = read_file_lines(args.src), read_file_lines(args.ref)
    timed_lines = src[: args.lines]
    model = load_model_dir(args.model, expect=Transformer)
    tok = Tokenizer.load(args.model)
    cfg = dataclasses.replace(Translator.load(args.model, device="cpu", dtype="fp32").cfg)
    hf = None if args.no_hf else hf_peer(model)
    peer_diff = None
    if hf is not None:
        peer_diff = check_peer(hf, model, pad_rows(tok.encode_batch(src[:8]), tok.pad_id))
    thread_counts = [int(t) for t in args.threads.split(",")]

    def engines(threads: int) -> dict[str, Callable[[list[str], int], tuple[list[str], int]]]:
        aiayn = Translator.load(args.model, cfg, device="cpu", dtype="fp32")
        made: dict[str, Callable[[list[str], int], tuple[list[str], int]]] = {
            "aiayn_fp32": lambda lines, beam: run_translator(aiayn, lines, beam)
        }
        for name, path in paths.items():
            tr = load_translator(path, cfg, threads=threads)
            made[name] = lambda lines, beam, tr=tr: run_translator(tr, lines, beam)
        # int8 weights (4x smaller), float32 arithmetic: the weights' rounding alone
        w8 = load_translator(paths["ct2_int8"], cfg, threads=threads, dtype="fp32")
        made["ct2_int8w_fp32"] = lambda lines, beam: run_translator(w8, lines, beam)
        if hf is not None:
            peer = HfTranslator(hf, tok, cfg)
            made["hf_generate"] = peer.translate
        return made

    # Quality: all lines, one thread.
    quality: dict[str, dict[str, Any]] = {}
    for beam in (1, 4):
        outs = {name: fn(src, beam)[0] for name, fn in engines(1).items()}
        for name, hyps in outs.items():
            same = sum(a == b for a, b in zip(hyps, outs["aiayn_fp32"], strict=True))
            quality[f"{name}_{'greedy' if beam == 1 else 'beam4'}"] = {
                "bleu": round(bleu(hyps, refs).score, 2),
                "identical_to_aiayn": round(same / len(src), 4),
            }
    # Speed: interleaved repetitions per thread count.
    speed: dict[str, dict[str, Any]] = {}
    for threads in thread_counts:
        set_threads(threads)
        fns = engines(threads)
        for beam in (1, 4):
            for fn in fns.values():  # warm-up
                fn(timed_lines[:16], beam)
            times: dict[str, list[float]] = {name: [] for name in fns}
            tokens: dict[str, int] = {}
            for _ in range(args.reps):
                for name, fn in fns.items():
                    t0 = time.perf_counter()
                    _, tokens[name] = fn(timed_lines, beam)
                    times[name].append(time.perf_counter() - t0)
            base = tokens["aiayn_fp32"] / statistics.median(times["aiayn_fp32"])
            for name in fns:
                tok_s = tokens[name] / statistics.median(times[name])
                key = f"{name}_{'greedy' if beam == 1 else 'beam4'}_t{threads}"
                speed[key] = {"tok_s": round(tok_s), "vs_aiayn_fp32": round(tok_s / base, 2)}
                print(f"{key:28s} {tok_s:9.0f} tok/s  x{tok_s / base:5.2f}", file=sys.stderr)
    for key, q in quality.items():
        print(f"{key:28s} BLEU {q['bleu']:6.2f}  identical {100 * q['identical_to_aiayn']:5.1f}%",
              file=sys.stderr)  # fmt: skip
    print(json.dumps({
        "model": str(args.model), "config": dataclasses.asdict(model.cfg),
        "decode": dataclasses.asdict(cfg), "src": str(args.src), "timed_lines": len(timed_lines),
        "reps": args.reps, "cpu": platform.processor() or platform.machine(),
        "torch": torch.__version__, "hf_peer_max_logit_diff": peer_diff,
        "speed": speed, "quality": quality,
    }))  # fmt: skip


if __name__ == "__main__":
    main()
