"""`aiayn export onnx|ctranslate2` of a decoder-only language model (docs/export.md).

Parity, on tiny character LMs trained here for a second (the paper's post-LN block and a
GPT-2-style one, as `aiayn import gpt2` writes): the ONNX graph's logits are aiayn's within
1e-4 (the prompt's, at every position, and the first step's), and ONNX Runtime and
CTranslate2 give aiayn's `Generator` greedy tokens on prompts of different lengths, batched
together; the ONNX export also samples aiayn's tokens with the same seeds.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from aiayn.cli.main import main
from aiayn.config import ModelConfig
from aiayn.generate.generator import Generator
from aiayn.nn.variants import DecoderLM, EncoderClassifier
from aiayn.store.directory import ModelDir
from aiayn.store.model_dir import save_model_dir
from aiayn.text.batches import pad_rows
from aiayn.text.charset import CharTokenizer

ct2 = pytest.importorskip("ctranslate2", reason="ctranslate2 is not installed (aiayn[export])")
ort = pytest.importorskip("onnxruntime", reason="onnxruntime is not installed (aiayn[export])")
pytest.importorskip("onnxscript", reason="onnxscript is not installed (aiayn[export])")

from aiayn.interop.export_lm import (  # noqa: E402
    OnnxLM,
    export_lm_onnx,
    past_names,
    present_names,
)
from aiayn.interop.export_lm_ct2 import export_lm_ctranslate2  # noqa: E402
from aiayn.interop.lm_engines import generate_onnx, load_generator  # noqa: E402

TEXT = (
    "ROMEO: But soft, what light through yonder window breaks?\n"
    "JULIET: O Romeo, Romeo, wherefore art thou Romeo?\n"
    "the quick brown fox jumps over the lazy dog.\n"
) * 20
PROMPTS = ["", "R", "JULIET:", "the quick brown fox", "ROMEO: But soft, what light"]
PAPER, GPT2 = "post-LN, sinusoidal", "GPT-2 style: pre-LN, learned, gelu_tanh, unscaled"
VARIANTS: dict[str, dict[str, object]] = {
    PAPER: {},
    GPT2: {"norm_first": True, "positional": "learned", "activation": "gelu_tanh",
           "scale_embeddings": False},
}  # fmt: skip


@pytest.fixture(scope="module", autouse=True)
def one_thread() -> Iterator[None]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def trained_lm(tok: CharTokenizer, steps: int = 120, **overrides: object) -> DecoderLM:
    """About a second of Adam on TEXT: enough for varied, prompt-dependent continuations."""
    torch.manual_seed(0)
    cfg = ModelConfig(
        vocab_size=tok.vocab_size, d_model=32, n_heads=4, n_layers=2, d_ff=64, dropout=0.0,
        max_len=64, **overrides,  # type: ignore[arg-type]
    )  # fmt: skip
    model = DecoderLM(cfg)
    ids = torch.tensor(tok.encode(TEXT, eos=False))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    rng = random.Random(0)
    for _ in range(steps):
        starts = [rng.randrange(len(ids) - 33) for _ in range(16)]
        x_BT = torch.stack([ids[s : s + 33] for s in starts])
        logits = model(x_BT[:, :-1])
        loss = F.cross_entropy(logits.transpose(1, 2), x_BT[:, 1:])
        opt.zero_grad()
        loss.backward()
        opt.step()
    return model.eval()


@pytest.fixture(scope="module")
def lm_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    tok = CharTokenizer.fit([TEXT])
    dirs = {}
    for name, kw in VARIANTS.items():
        root = tmp_path_factory.mktemp("lm")
        save_model_dir(trained_lm(tok, **kw), root)
        tok.save(root)
        dirs[name] = root
    return dirs


@pytest.fixture(scope="module")
def onnx_exports(lm_dirs: dict[str, Path], tmp_path_factory: pytest.TempPathFactory):
    return {n: export_lm_onnx(d, tmp_path_factory.mktemp("x") / "onnx") for n, d in lm_dirs.items()}


@pytest.fixture(scope="module")
def ct2_exports(lm_dirs: dict[str, Path], tmp_path_factory: pytest.TempPathFactory):
    return {
        n: export_lm_ctranslate2(d, tmp_path_factory.mktemp("x") / "ct2")
        for n, d in lm_dirs.items()
    }


def aiayn_tokens(lm_dir: Path, n: int, **overrides: object) -> list[list[int]]:
    gen = Generator.load(lm_dir, device="cpu")
    cfg = gen.settings(n, **({"sample": False} | overrides))
    return [g[0].tokens for g in gen.generate_all(PROMPTS, cfg)]


# --- ONNX ---------------------------------------------------------------------------------------


def test_the_graph_has_optimums_names_and_dynamic_axes(onnx_exports: dict[str, Path]) -> None:
    out = onnx_exports[PAPER]
    opened = ModelDir.open(out)
    assert (opened.is_export, opened.architecture, opened.engine) == (
        True, "DecoderLM", "onnxruntime (float32)",
    )  # fmt: skip
    sess = ort.InferenceSession(str(out / "model.onnx"), providers=["CPUExecutionProvider"])
    L = opened.model_cfg.n_layers
    inputs = {i.name: i.shape for i in sess.get_inputs()}
    outputs = {o.name: o.shape for o in sess.get_outputs()}
    assert list(inputs) == ["input_ids", "attention_mask", "position_ids", *past_names(L)]
    assert list(outputs) == ["logits", *present_names(L)]
    assert inputs["past_key_values.0.key"] == ["batch", 4, "past_sequence_length", 8]
    assert outputs["logits"] == ["batch", "sequence_length", opened.model_cfg.vocab_size]


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_onnx_logits_within_1e_4_of_aiayns(
    variant: str, lm_dirs: dict[str, Path], onnx_exports: dict[str, Path]
) -> None:
    """The prompt at every position (one run, no past) and the first step after a batch of
    left-padded prompts (the prefill, then one token over the past), as aiayn's search runs."""
    model = ModelDir.open(lm_dirs[variant]).load_model(DecoderLM)
    tok = CharTokenizer.load(lm_dirs[variant])
    onnx = OnnxLM(onnx_exports[variant], model.cfg)
    prompts = [[tok.bos_id, *tok.encode(p, eos=False)] for p in PROMPTS]
    worst = 0.0
    with torch.inference_mode():
        whole_BT = torch.tensor([prompts[-1]])
        ours = model(whole_BT)
        theirs = onnx.run(whole_BT, onnx.init_cache(model.encode(whole_BT[:, :1]), 40))
        worst = max(worst, float((ours - theirs).abs().max()))
        src_BS = pad_rows(prompts, tok.pad_id)
        mem, mem_o = model.encode(src_BS), onnx.encode(src_BS)
        assert torch.equal(mem.ids_BS, mem_o.ids_BS)  # type: ignore[attr-defined]
        cache, cache_o = model.init_cache(mem, 8), onnx.init_cache(mem_o, 8)
        first = model.first_tokens(mem)
        for _ in range(3):  # the first three steps
            ours, cache = model.decode_step(first, mem, cache)
            theirs, cache_o = onnx.decode_step(first, mem_o, cache_o)
            worst = max(worst, float((ours - theirs).abs().max()))
            first = ours.argmax(-1, keepdim=True)
    assert worst < 1e-4


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_onnx_greedy_and_sampled_tokens_are_aiayns(
    variant: str, lm_dirs: dict[str, Path], onnx_exports: dict[str, Path]
) -> None:
    greedy = aiayn_tokens(lm_dirs[variant], 40)
    assert len({tuple(t) for t in greedy}) > 1  # the prompts lead somewhere different
    assert generate_onnx(onnx_exports[variant], PROMPTS, 40) == greedy
    sampled = aiayn_tokens(lm_dirs[variant], 30, sample=True, seed=7, top_k=10)
    assert generate_onnx(onnx_exports[variant], PROMPTS, 30, sample=True, seed=7, top_k=10) == (
        sampled
    )


def test_onnx_goes_on_past_the_context_as_aiayn_does(
    lm_dirs: dict[str, Path], onnx_exports: dict[str, Path]
) -> None:
    """Sampling 100 tokens with a 64-position context recomputes its last half (generator.py)."""
    ours = aiayn_tokens(lm_dirs[GPT2], 100, sample=True, seed=3)
    assert generate_onnx(onnx_exports[GPT2], PROMPTS, 100, sample=True, seed=3) == ours
    assert max(len(t) for t in ours) == 100


# --- CTranslate2 --------------------------------------------------------------------------------


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_ct2_greedy_tokens_are_aiayns(
    variant: str, lm_dirs: dict[str, Path], ct2_exports: dict[str, Path]
) -> None:
    out = ct2_exports[variant]
    assert ModelDir.open(out).engine == "ctranslate2 (float32)"
    gen = load_generator(out)
    found = gen.generate_all(PROMPTS, gen.settings(40, sample=False))
    assert [g[0].tokens for g in found] == aiayn_tokens(lm_dirs[variant], 40)
    assert ct2.Generator(str(out)).generate_batch([["<s>", "R"]], max_length=3)  # loads as is


def test_ct2_refuses_what_it_cannot_reproduce(ct2_exports: dict[str, Path]) -> None:
    gen = load_generator(ct2_exports[PAPER])
    with pytest.raises(ValueError, match="searches greedily only"):
        gen.generate(["R"], 5, sample=True)


# --- the command line and bad input -------------------------------------------------------------


def test_cli_exports_a_language_model_and_refuses_other_architectures(
    lm_dirs: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    out = tmp_path / "out"
    assert main(["export", "onnx", "--model", str(lm_dirs[PAPER]), "--out", str(out)]) == 0
    assert "language model" in capsys.readouterr().out
    assert json.loads((out / "aiayn_export.json").read_text())["architecture"] == "DecoderLM"
    assert main(["translate", "--model", str(out)]) == 2
    err = capsys.readouterr().err
    assert "holds a language model" in err and len(err.splitlines()) == 1, err

    cls = tmp_path / "classifier"
    cfg = ModelConfig(vocab_size=40, d_model=16, n_heads=2, n_layers=1, d_ff=32, max_len=16)
    save_model_dir(EncoderClassifier(cfg, n_classes=3), cls)
    # a classifier: ONNX exports it (tests/interop/test_export_cls.py), here refused for want
    # of a tokenizer; CTranslate2 has no model of its kind
    for engine, why in (("onnx", "no tokenizer"), ("ctranslate2", "CTranslate2 cannot run")):
        new = tmp_path / f"new_{engine}"
        assert main(["export", engine, "--model", str(cls), "--out", str(new)]) == 2
        err = capsys.readouterr().err
        assert why in err, err
        assert len(err.splitlines()) == 1 and not new.exists()
