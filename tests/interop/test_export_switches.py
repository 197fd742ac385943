"""The exports of models built with the switches after the paper (docs/export.md, "Which
switches each engine takes"): RoPE, ALiBi, no positions, RMSNorm, gated FFNs, no biases,
GQA/MQA, local attention, qk_norm.

Oracles, on tiny random models whose every weight is moved off its start (so a wrong op
shows): CTranslate2's language model gives aiayn's logits within 1e-4 (`forward_batch`) and
its greedy tokens; CTranslate2's translator gives aiayn's log-probabilities of reference targets
within 1e-4 and its greedy lines; the ONNX graphs give aiayn's logits within 1e-4 and its
greedy and sampled tokens. What an engine cannot express is refused in one line, exit 2,
nothing written.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch

from aiayn.classify.classifier import Classifier
from aiayn.cli.main import main
from aiayn.config import DecodeConfig, ModelConfig
from aiayn.errors import ConfigError
from aiayn.generate.generator import Generator
from aiayn.nn.encoder_only import EncoderClassifier
from aiayn.nn.model import Transformer
from aiayn.nn.variants import DecoderLM
from aiayn.store.directory import ModelDir
from aiayn.store.model_dir import save_model_dir
from aiayn.text.batches import pad_rows
from aiayn.text.charset import CharTokenizer
from aiayn.text.tokenizer import Tokenizer
from aiayn.translate.translator import Translator

ct2 = pytest.importorskip("ctranslate2", reason="ctranslate2 is not installed (aiayn[export])")
ort = pytest.importorskip("onnxruntime", reason="onnxruntime is not installed (aiayn[export])")
pytest.importorskip("onnxscript", reason="onnxscript is not installed (aiayn[export])")

from aiayn.interop.engines import load_translator  # noqa: E402
from aiayn.interop.export_cls import OnnxClassifier, export_cls_onnx  # noqa: E402
from aiayn.interop.export_ct2 import export_ctranslate2  # noqa: E402
from aiayn.interop.export_lm import OnnxLM, export_lm_onnx, past_names  # noqa: E402
from aiayn.interop.export_lm_ct2 import export_lm_ctranslate2  # noqa: E402
from aiayn.interop.export_onnx import OnnxModel, export_onnx  # noqa: E402
from aiayn.interop.lm_engines import generate_onnx, load_generator  # noqa: E402

TEXT = "ROMEO: But soft, what light through yonder window breaks? the quick brown fox " * 8
PROMPTS = ["", "R", "ROMEO:", "the quick brown fox"]
WORDS = ["haus", "katze", "hund", "baum", "auto", "weg", "stadt", "fluss", "berg", "see",
         "wald", "rot", "blau", "klein", "gross"]  # fmt: skip
LINES = [" ".join(random.Random(i).choices(WORDS, k=1 + i % 9)) for i in range(40)]

# LLaMA's block: RoPE, RMSNorm before each sub-layer, SwiGLU, no biases, 2 K/V heads for 4
LLAMA: dict[str, object] = {
    "positional": "rope", "norm": "rmsnorm", "norm_first": True, "activation": "swiglu",
    "bias": False, "kv_heads": 2, "scale_embeddings": False,
}  # fmt: skip
LM_VARIANTS: dict[str, dict[str, object]] = {
    "llama, qk_norm, rope_base 500": LLAMA | {"qk_norm": True, "rope_base": 500.0},
    "mistral: llama + window 8, MQA": LLAMA | {"attn_window": 8, "kv_heads": 1},
    "alibi, pre-LN, 6 heads": {"positional": "alibi", "norm_first": True, "n_heads": 6,
                               "d_model": 48},
    "no positions, geglu, post-LN": {"positional": "none", "activation": "geglu"},
}  # fmt: skip
TR_VARIANTS: dict[str, dict[str, object]] = {
    "llama, untied": LLAMA | {"tie_output": False, "share_embeddings": False},
    "rope, geglu, post-LN, MQA": {"positional": "rope", "activation": "geglu", "kv_heads": 1},
}  # fmt: skip


@pytest.fixture(scope="module", autouse=True)
def one_thread() -> Iterator[None]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def chars() -> CharTokenizer:
    return CharTokenizer.fit([TEXT])


@pytest.fixture(scope="module")
def pieces() -> Tokenizer:
    return Tokenizer.train(LINES * 5, vocab_size=300, mask=True)


def model_dir(root: Path, kind: type, tok: Tokenizer | CharTokenizer, **kw: object) -> Path:
    """A random model of `kind` with `kw`'s switches, every weight moved off its start."""
    base: dict[str, object] = {
        "vocab_size": tok.vocab_size, "d_model": 32, "n_heads": 4, "n_layers": 2, "d_ff": 64,
        "dropout": 0.0, "max_len": 48, **tok.special_ids,
    }  # fmt: skip
    cfg = ModelConfig(**(base | kw))  # type: ignore[arg-type]
    torch.manual_seed(0)
    model = EncoderClassifier(cfg, 3, ["a", "b", "c"]) if kind is EncoderClassifier else kind(cfg)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.3 * torch.randn_like(p))
    save_model_dir(model.eval(), root)
    tok.save(root)
    return root


def greedy(
    directory: Path, n: int, prompts: list[str] = PROMPTS, **overrides: object
) -> list[list[int]]:
    gen = Generator.load(directory, device="cpu")
    cfg = gen.settings(n, **({"sample": False} | overrides))
    return [g[0].tokens for g in gen.generate_all(prompts, cfg)]


# --- CTranslate2: the language model ------------------------------------------------------------


@pytest.mark.parametrize("variant", list(LM_VARIANTS))
def test_ct2_lm_gives_aiayns_logits_and_greedy_tokens(
    variant: str, chars: CharTokenizer, tmp_path: Path
) -> None:
    src = model_dir(tmp_path / "lm", DecoderLM, chars, **LM_VARIANTS[variant])
    out = export_lm_ctranslate2(src, tmp_path / "ct2")
    model = ModelDir.open(src).load_model(DecoderLM)
    W = model.cfg.attn_window or model.cfg.max_len  # CTranslate2's prefill is exact up to W
    ids = [chars.bos_id, *chars.encode("ROMEO: But soft, what light", eos=False)][:W]
    with torch.no_grad():
        ours = model(torch.tensor([ids]))[0].numpy()
    engine = ct2.Generator(str(out), intra_threads=1)
    theirs = np.array(engine.forward_batch([chars.pieces(ids)]))[0]
    assert np.abs(theirs - ours).max() < 1e-4
    assert np.abs(ours).max() > 1.0  # logits that mean something
    gen = load_generator(out)
    prompts = [p[: W - 1] for p in PROMPTS]  # BOS + prompt within the window
    found = [g[0].tokens for g in gen.generate_all(prompts, gen.settings(30, sample=False))]
    expected = greedy(src, 30, prompts)
    assert len({tuple(t) for t in expected}) > 1
    assert found == expected  # 30 tokens: past the window of 8, where the cache slides


def test_ct2_lm_refuses_a_prompt_longer_than_its_window(chars: CharTokenizer, tmp_path: Path):
    """CTranslate2 runs such a prompt in chunks of the window, not aiayn's band."""
    src = model_dir(tmp_path / "lm", DecoderLM, chars, **LLAMA, attn_window=4)
    gen = load_generator(export_lm_ctranslate2(src, tmp_path / "ct2"))
    assert gen.generate(["ROM"], 5, sample=False)  # BOS + 3 = the window: runs
    with pytest.raises(ConfigError, match="longer than the model's window"):
        gen.generate(["ROMEO"], 5, sample=False)


# --- CTranslate2: the translator ----------------------------------------------------------------


@pytest.mark.parametrize("variant", list(TR_VARIANTS))
def test_ct2_translator_gives_aiayns_log_probabilities(
    variant: str, pieces: Tokenizer, tmp_path: Path
) -> None:
    src = model_dir(tmp_path / "tr", Transformer, pieces, **TR_VARIANTS[variant])
    out = export_ctranslate2(src, tmp_path / "ct2")
    ref = Translator.load(src, DecodeConfig(), device="cpu", dtype="fp32")
    model, cfg = ref.model, ref.model.cfg
    engine = ct2.Translator(str(out), intra_threads=1)
    source, target = pieces.encode_batch(LINES[:12]), pieces.encode_batch(LINES[12:24])
    scored = engine.score_batch(
        [pieces.pieces(s) for s in source], [pieces.pieces(t[:-1]) for t in target],
        max_input_length=0,
    )  # fmt: skip  # CTranslate2 adds the EOS it scores
    for s, t, r in zip(source, target, scored, strict=True):
        with torch.no_grad():
            logits = model(torch.tensor([s]), torch.tensor([[cfg.bos_id, *t[:-1]]]))
        ours = logits.log_softmax(-1)[0, torch.arange(len(t)), torch.tensor(t)]
        torch.testing.assert_close(torch.tensor(r.log_probs), ours, rtol=0, atol=1e-4)
    theirs = load_translator(out, DecodeConfig(), threads=1)
    assert theirs.translate(LINES, beam=1) == ref.translate(LINES, beam=1)


# --- what an engine cannot express: one line, exit 2, nothing written ---------------------------

REFUSED = [
    ("ctranslate2", Transformer, {"positional": "alibi"}, "positional='alibi'"),
    ("ctranslate2", Transformer, {"attn_window": 4}, "attn_window=4"),
    ("ctranslate2", Transformer, {"activation": "relu2"}, "activation='relu2'"),
    ("ctranslate2", Transformer, {"qk_norm": True, "norm": "rmsnorm"}, "qk_norm=True"),
    ("ctranslate2", DecoderLM, {"activation": "relu2"}, "activation='relu2'"),
    ("ctranslate2", DecoderLM, {"qk_norm": True}, "qk_norm=True with norm='layernorm'"),
]


@pytest.mark.parametrize(("engine", "kind", "switch", "named"), REFUSED)
def test_what_an_engine_cannot_express_is_refused_in_one_line(
    engine: str,
    kind: type,
    switch: dict[str, object],
    named: str,
    chars: CharTokenizer,
    pieces: Tokenizer,
    tmp_path: Path,
    capsys: pytest.CaptureFixture,
) -> None:
    tok = chars if kind is DecoderLM else pieces
    src = model_dir(tmp_path / "model", kind, tok, **switch)
    out = tmp_path / "out"
    assert main(["export", engine, "--model", str(src), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert named in err and "cannot be expressed" in err, err
    assert len(err.strip().splitlines()) == 1 and not out.exists()


# --- ONNX ---------------------------------------------------------------------------------------


def check_onnx_lm(src: Path, out: Path, chars: CharTokenizer) -> None:
    """The prompt's logits in one run, then the first steps after left-padded prompts; greedy
    and sampled tokens (40 of them: past the window, and past max_len's context)."""
    model = ModelDir.open(src).load_model(DecoderLM)
    onnx = OnnxLM(out, model.cfg, threads=1)
    prompts = [[chars.bos_id, *chars.encode(p, eos=False)] for p in PROMPTS]
    worst = 0.0
    with torch.inference_mode():
        whole_BT = torch.tensor([prompts[-1]])
        ours = model(whole_BT)
        theirs = onnx.run(whole_BT, onnx.init_cache(model.encode(whole_BT[:, :1]), 40))
        worst = float((ours - theirs).abs().max())
        src_BS = pad_rows(prompts, chars.pad_id)
        mem, mem_o = model.encode(src_BS), onnx.encode(src_BS)
        cache, cache_o = model.init_cache(mem, 8), onnx.init_cache(mem_o, 8)
        first = model.first_tokens(mem)
        for _ in range(3):
            logits, cache = model.decode_step(first, mem, cache)
            logits_o, cache_o = onnx.decode_step(first, mem_o, cache_o)
            worst = max(worst, float((logits - logits_o).abs().max()))
            first = logits.argmax(-1, keepdim=True)
    assert worst < 1e-4
    assert generate_onnx(out, PROMPTS, 40) == greedy(src, 40)
    sampled = greedy(src, 30, sample=True, seed=7, top_k=10)
    assert generate_onnx(out, PROMPTS, 30, sample=True, seed=7, top_k=10) == sampled


def test_onnx_lm_of_the_llama_block_with_a_window(chars: CharTokenizer, tmp_path: Path) -> None:
    """RoPE, RMSNorm, SwiGLU, no biases, 2 K/V heads, qk_norm and a window of 5: the past holds
    J = 2 heads; the 20-position prompt is longer than 2W (aiayn attends block by block there, the
    graph with its band mask: the same numbers)."""
    src = model_dir(tmp_path / "lm", DecoderLM, chars, **LLAMA, qk_norm=True, attn_window=5)
    out = export_lm_onnx(src, tmp_path / "onnx")
    sess = ort.InferenceSession(str(out / "model.onnx"), providers=["CPUExecutionProvider"])
    inputs = {i.name: i.shape for i in sess.get_inputs()}
    assert list(inputs) == ["input_ids", "attention_mask", "position_ids", *past_names(2)]
    assert inputs["past_key_values.0.key"] == ["batch", 2, "past_sequence_length", 8]
    check_onnx_lm(src, out, chars)


@pytest.mark.slow
@pytest.mark.parametrize(
    "switches",
    [{"positional": "alibi", "kv_heads": 1}, {"positional": "none", "activation": "relu2"},
     {"positional": "learned", "activation": "geglu", "embed_norm": True}],
    ids=["alibi, MQA", "no positions, relu2", "learned, geglu, embedding norm"],
)  # fmt: skip
def test_onnx_lm_with_other_switches(
    switches: dict[str, object], chars: CharTokenizer, tmp_path: Path
) -> None:
    src = model_dir(tmp_path / "lm", DecoderLM, chars, **switches)
    check_onnx_lm(src, export_lm_onnx(src, tmp_path / "onnx"), chars)


def test_a_failed_onnx_trace_is_one_line_and_leaves_nothing(
    chars: CharTokenizer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The torch exporter's report of a model it cannot trace runs to pages: one line here."""

    def fail(*args: object, **kwargs: object) -> None:
        raise RuntimeError("Failed to export the model with torch.export.\n" + "detail\n" * 50)

    monkeypatch.setattr(torch.onnx, "export", fail)
    src = model_dir(tmp_path / "lm", DecoderLM, chars, **LLAMA)
    with pytest.raises(ConfigError, match=r"could not trace this model \(Failed to export") as e:
        export_lm_onnx(src, tmp_path / "onnx")
    assert "\n" not in str(e.value) and not (tmp_path / "onnx").exists()


@pytest.mark.slow
@pytest.mark.parametrize(
    "switches",
    [LLAMA | {"qk_norm": True, "attn_window": 4}, {"positional": "alibi", "kv_heads": 1}],
    ids=["llama + qk_norm + window 4", "alibi, MQA"],
)
def test_onnx_translator_gives_aiayns_logits_and_lines(
    switches: dict[str, object], pieces: Tokenizer, tmp_path: Path
) -> None:
    src = model_dir(tmp_path / "tr", Transformer, pieces, **switches)
    out = export_onnx(src, tmp_path / "onnx")
    settings = DecodeConfig(beam_size=4, alpha=0.6, max_len_a=1.0, max_len_b=5)
    ref = Translator.load(src, settings, device="cpu", dtype="fp32")
    model = ref.model
    graphs = OnnxModel(out, model.cfg, threads=1)
    src_BS = pad_rows(pieces.encode_batch(LINES[:7]), model.cfg.pad_id)
    assert src_BS.size(1) > 8  # longer than 2W: aiayn's encoder goes block by block
    with torch.inference_mode():
        ours, theirs = model.encode(src_BS), graphs.encode(src_BS)
        keep = ours.keep_BS
        torch.testing.assert_close(theirs.out_BSD[keep], ours.out_BSD[keep], rtol=0, atol=1e-4)
        cache_a, cache_b = model.init_cache(ours, 12), graphs.init_cache(theirs, 12)
        tokens_B1 = src_BS.new_full((7, 1), model.cfg.bos_id)
        for _ in range(12):  # past the window: aiayn's cache is a ring, the graph's past is not
            logits_a, cache_a = model.decode_step(tokens_B1, ours, cache_a)
            logits_b, cache_b = graphs.decode_step(tokens_B1, theirs, cache_b)
            torch.testing.assert_close(logits_b, logits_a, rtol=0, atol=1e-4)
            tokens_B1 = logits_a.argmax(-1, keepdim=True)
    theirs_tr = load_translator(out, settings, threads=1)
    for beam in (1, 4):
        assert theirs_tr.translate(LINES, beam=beam) == ref.translate(LINES, beam=beam)


@pytest.mark.slow
@pytest.mark.parametrize(
    "switches",
    [LLAMA | {"qk_norm": True}, {"positional": "alibi", "kv_heads": 1, "attn_window": 2}],
    ids=["llama + qk_norm", "alibi, MQA, window 2"],
)
def test_onnx_classifier_gives_aiayns_logits(
    switches: dict[str, object], pieces: Tokenizer, tmp_path: Path
) -> None:
    src = model_dir(tmp_path / "cls", EncoderClassifier, pieces, **switches, max_len=24)
    out = export_cls_onnx(src, tmp_path / "onnx")
    ours, theirs = Classifier.open(src, device="cpu", dtype="fp32"), OnnxClassifier.open(out)
    ids = ours.ids(["", LINES[3], " ".join(LINES), LINES[8]])
    assert max(map(len, ids)) == 24 > 2 * 2
    for rows in (ids, ids[:2], ids[2:3], ids[3:]):
        ids_BS = pad_rows(rows, pieces.pad_id)
        with torch.inference_mode():
            torch.testing.assert_close(theirs.run(ids_BS), ours.model(ids_BS), rtol=0, atol=1e-5)
