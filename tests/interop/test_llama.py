"""`aiayn import llama`: LLaMA and Mistral directories made here with `transformers` and a
SentencePiece-style BPE trained here with `tokenizers` (no download), their logits, hidden
states and greedy continuations against Hugging Face's own, and bad input as one-line errors."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")

from aiayn.cli.main import main  # noqa: E402
from aiayn.config import DecodeConfig  # noqa: E402
from aiayn.errors import CheckpointError  # noqa: E402
from aiayn.generate.generator import Generator  # noqa: E402
from aiayn.interop.llama import LlamaTokenizer, import_llama  # noqa: E402
from aiayn.nn.variants import DecoderLM  # noqa: E402
from aiayn.store.model_dir import load_model_dir  # noqa: E402
from aiayn.text.tokenizer import Tokenizer  # noqa: E402

TOL = 1e-4  # fp32 on both sides: what differs is the order of additions
CORPUS = [
    "the cat sat on the mat.",
    "a dog runs in the park, fast and happy!",
    "llamas eat grass; the grass grows back.",
    "rotary positions turn queries and keys.",
] * 20
TEXTS = ["the cat runs in the park.", "llamas turn", "  two  spaces ", "Größe ½ 😀", ""]
SPECIALS = ["<unk>", "<s>", "</s>"]  # LLaMA 1/2's ids 0, 1, 2 (LlamaConfig's defaults)
BYTE_SPECIALS = ["<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>"]  # LLaMA 3's


def train_tokenizer(path: Path, style: str = "spm") -> int:
    """A BPE trained on CORPUS, saved as tokenizer.json; its size. "spm": LLaMA 2's layout
    ("▁" for a space, <unk> <s> </s> ids 0 1 2, unknown characters as <unk>); "bytes": LLaMA
    3's (byte-level, never unknown, the special tokens added after the pieces)."""
    if style == "spm":
        bpe = tokenizers.Tokenizer(tokenizers.models.BPE(unk_token="<unk>"))
        bpe.pre_tokenizer = tokenizers.pre_tokenizers.Metaspace(prepend_scheme="first")
        bpe.decoder = tokenizers.decoders.Metaspace(prepend_scheme="first")
        specials, alphabet = SPECIALS, []
    else:
        bpe = tokenizers.Tokenizer(tokenizers.models.BPE())
        bpe.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
        bpe.decoder = tokenizers.decoders.ByteLevel()
        specials, alphabet = [], tokenizers.pre_tokenizers.ByteLevel.alphabet()
    trainer = tokenizers.trainers.BpeTrainer(
        vocab_size=100 if style == "spm" else 300,
        special_tokens=specials,
        initial_alphabet=alphabet,
        show_progress=False,
    )
    bpe.train_from_iterator(CORPUS, trainer)
    if style == "bytes":
        bpe.add_special_tokens(BYTE_SPECIALS)
    bos = "<s>" if style == "spm" else BYTE_SPECIALS[0]
    bpe.post_processor = tokenizers.processors.TemplateProcessing(
        single=f"{bos} $A", special_tokens=[(bos, bpe.token_to_id(bos))]
    )
    bpe.save(str(path / "tokenizer.json"))
    return bpe.get_vocab_size()


def make_llama_dir(
    path: Path, *, seed: int = 0, tokenizer: str = "spm", kind: str = "llama", **config
) -> Path:
    """A randomly initialised LlamaForCausalLM (or MistralForCausalLM), every weight moved off
    its start (norm gains too, so a wrong mapping shows), saved with safetensors."""
    path.mkdir(parents=True, exist_ok=True)
    vocab = train_tokenizer(path, tokenizer) if tokenizer != "none" else 100
    settings = dict(
        vocab_size=vocab, hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
        num_hidden_layers=2, intermediate_size=96, max_position_embeddings=64,
        initializer_range=0.2, tie_word_embeddings=False,
    )  # fmt: skip
    classes = {
        "llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM),
        "mistral": (transformers.MistralConfig, transformers.MistralForCausalLM),
    }
    config_class, model_class = classes[kind]
    shard = config.pop("shard", None)
    torch.manual_seed(seed)
    model = model_class(config_class(**{**settings, **config}))
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    model.save_pretrained(path, **({"max_shard_size": shard} if shard else {}))
    return path


def hf_model(hf_dir: Path):
    return transformers.AutoModelForCausalLM.from_pretrained(hf_dir).eval()


def imported(hf_dir: Path, out: Path, *flags: str) -> DecoderLM:
    assert main(["import", "llama", str(hf_dir), "--out", str(out), *flags]) == 0
    return load_model_dir(out, expect=DecoderLM)


def max_diff(model: DecoderLM, hf, ids: torch.Tensor) -> float:
    with torch.no_grad():
        want = hf(ids).logits
        assert want.abs().max() > 1.0  # weights large enough that a wrong mapping shows
        return (model(ids) - want).abs().max().item()


def random_ids(vocab: int, shape: tuple[int, int], seed: int = 1) -> torch.Tensor:
    return torch.randint(vocab, shape, generator=torch.Generator().manual_seed(seed))


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory) -> Path:
    return make_llama_dir(tmp_path_factory.mktemp("hf") / "tiny-llama")


@pytest.fixture(scope="module")
def llama_out(llama_dir: Path, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("aiayn") / "llama"
    imported(llama_dir, out)
    return out


def test_logits_and_hidden_states_match_hugging_face(llama_dir: Path, llama_out: Path) -> None:
    model = load_model_dir(llama_out, expect=DecoderLM)
    cfg = model.cfg
    assert (cfg.positional, cfg.norm, cfg.activation, cfg.n_kv_heads) == (
        "rope", "rmsnorm", "swiglu", 2,
    )  # fmt: skip
    assert not cfg.tie_output and not cfg.bias and cfg.d_hidden == 96
    hf = hf_model(llama_dir)
    ids = random_ids(cfg.vocab_size, (2, 40))
    diff = max_diff(model, hf, ids)  # the prepacked oneDNN path (kernels.Linear, no_grad)
    with torch.no_grad():
        want = hf(ids).logits
    plain = (model(ids).detach() - want).abs().max().item()  # the plain F.linear path
    print(
        f"LLaMA GQA untied: max |logit diff| {diff:.2e} (plain path {plain:.2e}), logits up "
        f"to {want.abs().max().item():.1f}"
    )
    assert diff <= TOL and plain <= TOL
    base = transformers.LlamaModel.from_pretrained(llama_dir).eval()
    with torch.no_grad():
        want = base(ids).last_hidden_state
        got = model.decoder(model.embed(ids), None, causal=True)
    assert (got - want).abs().max().item() <= TOL


@pytest.mark.parametrize(
    "name, config",
    [
        ("tied, theta 500000", dict(tie_word_embeddings=True, rope_theta=500000.0)),
        ("multi-query", dict(num_key_value_heads=1)),
        ("biases", dict(attention_bias=True, mlp_bias=False, shard="40KB")),
    ],
)
def test_variants_match_hugging_face(name: str, config: dict, tmp_path: Path) -> None:
    hf_dir = make_llama_dir(tmp_path / "hf", tokenizer="none", seed=3, **config)
    model = imported(hf_dir, tmp_path / "out")
    if "shard" in config:
        assert (hf_dir / "model.safetensors.index.json").is_file()
    diff = max_diff(model, hf_model(hf_dir), random_ids(100, (2, 33)))
    print(f"LLaMA {name}: max |logit diff| {diff:.2e}")
    assert diff <= TOL


def test_mistral_window(tmp_path: Path) -> None:
    """A window of 5 over 40 positions: aiayn's blocked local attention (T > 2W) against
    Mistral's sliding-window mask, and greedy decoding through the ring cache."""
    hf_dir = make_llama_dir(tmp_path / "hf", tokenizer="none", kind="mistral", sliding_window=5)
    model = imported(hf_dir, tmp_path / "out")
    assert model.cfg.attn_window == 5
    hf = hf_model(hf_dir)
    diff = max_diff(model, hf, random_ids(100, (2, 40)))
    print(f"Mistral window 5: max |logit diff| {diff:.2e}")
    assert diff <= TOL
    prompt = [1, 5, 9, 13, 17, 21, 25]  # longer than the window: the ring has wrapped
    assert greedy_ids(model, prompt, 12) == hf_greedy(hf, prompt, 12)


def greedy_ids(model: DecoderLM, prompt: list[int], n: int) -> list[int]:
    from aiayn.search.decode import search

    cfg = DecodeConfig(beam_size=1, alpha=0.0, max_len_a=0.0, max_len_b=n)
    hyp = search(model, torch.tensor([prompt]), cfg)[0][0]
    return list(hyp.tokens) + ([model.cfg.eos_id] if hyp.eos else [])


def hf_greedy(hf, prompt: list[int], n: int) -> list[int]:
    with torch.no_grad():
        out = hf.generate(
            torch.tensor([prompt]), do_sample=False, max_new_tokens=n, min_new_tokens=0,
            pad_token_id=hf.config.eos_token_id,
        )  # fmt: skip
    return out[0, len(prompt) :].tolist()


def test_tokenizer_and_greedy_generation_match(llama_dir: Path, llama_out: Path) -> None:
    tok = Tokenizer.load(llama_out)
    assert isinstance(tok, LlamaTokenizer)
    assert (tok.pad_id, tok.bos_id, tok.eos_id) == (2, 1, 2)  # pad_token_id null: EOS
    hf_tok = transformers.PreTrainedTokenizerFast(
        tokenizer_file=str(llama_dir / "tokenizer.json"), bos_token="<s>", eos_token="</s>"
    )
    for text in TEXTS:
        ids = tok.encode(text, bos=True, eos=False)
        assert ids == hf_tok(text)["input_ids"], text
        assert tok.decode(ids) == hf_tok.decode(ids[1:]), text  # <unk> stays written
    gen = Generator.load(llama_out, device="cpu", dtype="fp32")
    cfg = DecodeConfig(beam_size=1, alpha=0.0, max_len_a=0.0, max_len_b=10)
    prompts = ["the cat", "llamas eat grass; the"]  # two lengths: the left-padded batch
    hf = hf_model(llama_dir)
    for prompt, made in zip(prompts, gen.generate_all(prompts, cfg), strict=True):
        want = hf_greedy(hf, hf_tok(prompt)["input_ids"], 10)
        got = made[0].tokens + ([tok.eos_id] if made[0].eos else [])
        assert got == want and len(got) >= 3, prompt
        assert made[0].text == tok.decode(want)


def test_byte_level_tokenizer_and_eos_list(tmp_path: Path, caplog) -> None:
    """LLaMA 3's layout: a byte-level BPE, BOS and EOS added after the pieces, and
    config.json's eos_token_id a list (Instruct's): the first is EOS, with a warning."""
    hf_dir = tmp_path / "hf"
    hf_dir.mkdir()
    V = train_tokenizer(hf_dir, "bytes")
    bos, eot, eom = V - 3, V - 2, V - 1
    make_llama_dir(hf_dir, tokenizer="none", vocab_size=V, bos_token_id=bos, eos_token_id=eot)
    _edit_config(hf_dir, eos_token_id=[eot, eom])
    imported(hf_dir, tmp_path / "out")
    assert "eos_token_id=" in caplog.text and "first only" in caplog.text
    tok = Tokenizer.load(tmp_path / "out")
    assert (tok.pad_id, tok.bos_id, tok.eos_id, tok.vocab_size) == (eot, bos, eot, V)
    hf_tok = transformers.PreTrainedTokenizerFast(
        tokenizer_file=str(hf_dir / "tokenizer.json"), bos_token=BYTE_SPECIALS[0]
    )
    for text in [*TEXTS, f"a literal {BYTE_SPECIALS[2]} token"]:
        ids = tok.encode(text, bos=True, eos=False)
        assert ids == hf_tok(text)["input_ids"], text
        assert tok.decode(ids) == text  # byte-level: every text comes back
    assert tok.decode([bos, *tok.encode("the cat", eos=True), 7]) == "the cat"


def test_without_a_tokenizer_the_model_imports_alone(tmp_path: Path, caplog) -> None:
    hf_dir = make_llama_dir(tmp_path / "hf", tokenizer="none", num_key_value_heads=4)
    model = imported(hf_dir, tmp_path / "out")
    assert "no tokenizer.json" in caplog.text
    assert model.cfg.n_kv_heads == 4
    assert max_diff(model, hf_model(hf_dir), random_ids(100, (1, 9))) <= TOL
    with pytest.raises(CheckpointError):
        Tokenizer.load(tmp_path / "out")


def test_embedding_rows_beyond_the_tokenizer(tmp_path: Path) -> None:
    """A vocab_size above the tokenizer's pieces (rows padded for speed, as some models do)."""
    hf_dir = make_llama_dir(tmp_path / "hf", vocab_size=120)
    model = imported(hf_dir, tmp_path / "out")
    tok = Tokenizer.load(tmp_path / "out")
    assert tok.vocab_size == model.cfg.vocab_size == 120
    tok.check_fits(model.cfg)
    with pytest.raises(CheckpointError, match="100 pieces but config.json says vocab_size=50"):
        import_llama(make_llama_dir(tmp_path / "hf2", vocab_size=50), tmp_path / "out2")


def test_max_len_flag(llama_dir: Path, tmp_path: Path) -> None:
    model = imported(llama_dir, tmp_path / "out", "--max-len", "32")
    assert model.cfg.max_len == 32
    with pytest.raises(CheckpointError, match="choose 2 .. 64"):
        import_llama(llama_dir, tmp_path / "out2", max_len=65)


def _edit_config(d: Path, **changes: object) -> None:
    cfg = json.loads((d / "config.json").read_text())
    (d / "config.json").write_text(json.dumps({**cfg, **changes}))


def _edit_tensor(d: Path, name: str, how: str = "drop") -> None:
    from safetensors.torch import load_file, save_file

    tensors = load_file(d / "model.safetensors")
    if how == "cut":
        tensors[name] = tensors[name][:-1]
    elif how == "add":
        tensors[name] = torch.zeros(3)
    else:
        del tensors[name]
    save_file(tensors, d / "model.safetensors", metadata={"format": "pt"})


BAD = {
    "no config.json": (lambda d: (d / "config.json").unlink(), "has no config.json"),
    "unknown model_type": (lambda d: _edit_config(d, model_type="gpt_neox"), "not a LLaMA"),
    "qwen2": (lambda d: _edit_config(d, model_type="qwen2"), "Qwen2"),
    "rope scaling (v4)": (
        lambda d: _edit_config(d, rope_scaling={"rope_type": "linear", "factor": 2.0}),
        "rope_scaling has rope_type='linear'",
    ),
    "rope scaling (v5)": (
        lambda d: _edit_config(d, rope_parameters={"rope_type": "llama3", "rope_theta": 5e5}),
        "rope_parameters has rope_type='llama3'",
    ),
    "activation": (lambda d: _edit_config(d, hidden_act="gelu"), "hidden_act='gelu'"),
    "head_dim": (lambda d: _edit_config(d, head_dim=32), "head_dim=32"),
    "kv heads": (lambda d: _edit_config(d, num_key_value_heads=3), "kv_heads=3 must divide"),
    "missing weight": (
        lambda d: _edit_tensor(d, "model.layers.1.mlp.up_proj.weight"),
        "has no tensor model.layers.1.mlp.up_proj.weight",
    ),
    "wrong shape": (
        lambda d: _edit_tensor(d, "model.layers.0.self_attn.k_proj.weight", "cut"),
        "k_proj.weight has shape (31, 64)",
    ),
    "extra tensor": (
        lambda d: _edit_tensor(d, "model.layers.0.self_attn.q_norm.weight", "add"),
        "a LLaMA does not have: model.layers.0.self_attn.q_norm.weight",
    ),
    "pickle only": (
        lambda d: (d / "model.safetensors").rename(d / "pytorch_model.bin"),
        "never opens a pickle",
    ),
    "no weights": (lambda d: (d / "model.safetensors").unlink(), "has no model.safetensors"),
    "tokenizer size": (lambda d: _edit_config(d, vocab_size=50), "vocab_size=50"),
    "not a directory": (lambda d: d.rename(d.with_name("gone")), "not found"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_input_is_one_line(case: str, llama_dir: Path, tmp_path: Path, capsys) -> None:
    hf_dir = tmp_path / "hf"
    shutil.copytree(llama_dir, hf_dir)
    spoil, expected = BAD[case]
    spoil(hf_dir)
    out = tmp_path / "out"
    assert main(["import", "llama", str(hf_dir), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("aiayn import: error:") and err.count("\n") == 1, err
    assert expected in err and "Traceback" not in err
    assert not out.exists()
