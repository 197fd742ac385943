"""`aiayn import gpt2`: a GPT-2 directory made here with `transformers` and a byte-level BPE
trained here with `tokenizers` (no download), its logits and ids against Hugging Face's own,
and bad input as one-line errors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")

from aiayn.cli.main import main  # noqa: E402
from aiayn.errors import CheckpointError  # noqa: E402
from aiayn.interop.gpt2 import import_gpt2  # noqa: E402
from aiayn.nn.variants import DecoderLM  # noqa: E402
from aiayn.store.model_dir import load_model_dir  # noqa: E402
from aiayn.text.hf_tokenizer import HFTokenizer  # noqa: E402
from aiayn.text.tokenizer import Tokenizer  # noqa: E402

EOT = "<|endoftext|>"
CORPUS = [
    "the cat sat on the mat.",
    "a dog runs in the park, fast and happy!",
    "Größe, Straße und Fahrräder: 12 Ölfässer.",
    "tokenizers split bytes into pieces; pieces merge into words.",
    "    indented code(x) -> y  # with spaces",
] * 20
TEXTS = [
    "the cat runs in the park.",
    "Ölfässer: 3 ½ über ℕ, 😀 and \u00a0 odd spaces  twice",
    f"first document.{EOT}second one",
    "",
    "  leading and trailing  ",
]


def train_bpe(directory: Path) -> int:
    """A byte-level BPE trained on CORPUS, saved as GPT-2 ships one (vocab.json + merges.txt,
    "<|endoftext|>" the last id); returns the vocabulary size."""
    bpe = tokenizers.Tokenizer(tokenizers.models.BPE())
    bpe.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = tokenizers.trainers.BpeTrainer(
        vocab_size=320,
        initial_alphabet=tokenizers.pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    bpe.train_from_iterator(CORPUS, trainer)
    bpe.model.save(str(directory))  # vocab.json, merges.txt
    vocab = json.loads((directory / "vocab.json").read_text())
    vocab[EOT] = len(vocab)
    (directory / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False))
    return len(vocab)


def hf_tokenizer(directory: Path):
    """Hugging Face's GPT-2 tokenizer of `directory` (its vocab.json + merges.txt, local)."""
    return transformers.GPT2TokenizerFast.from_pretrained(str(directory))


def make_gpt2_dir(path: Path, *, seed: int = 0, tokenizer: str = "files", **config) -> Path:
    """A randomly initialised GPT2LMHeadModel (every weight moved off its initial value, so
    that LayerNorms and biases are tested too), saved with safetensors, and a tokenizer:
    "files" (vocab.json + merges.txt), "json" (tokenizer.json only) or "none"."""
    path.mkdir(parents=True, exist_ok=True)
    vocab_size = train_bpe(path)
    eot = vocab_size - 1
    settings = dict(
        vocab_size=vocab_size, n_embd=64, n_layer=2, n_head=4, n_positions=64,
        bos_token_id=eot, eos_token_id=eot, initializer_range=0.2,
    )  # fmt: skip
    torch.manual_seed(seed)
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config(**{**settings, **config}))
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    model.save_pretrained(path, safe_serialization=True)
    if tokenizer == "json":
        hf_tokenizer(path).backend_tokenizer.save(str(path / "tokenizer.json"))
    if tokenizer != "files":
        (path / "vocab.json").unlink()
        (path / "merges.txt").unlink()
    return path


@pytest.fixture(scope="module")
def gpt2_dir(tmp_path_factory) -> Path:
    return make_gpt2_dir(tmp_path_factory.mktemp("hf") / "tiny-gpt2")


@pytest.fixture(scope="module")
def imported(gpt2_dir: Path, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("aiayn") / "gpt2"
    assert main(["import", "gpt2", str(gpt2_dir), "--out", str(out)]) == 0
    return out


def hf_logits(gpt2_dir: Path, ids: torch.Tensor) -> torch.Tensor:
    model = transformers.GPT2LMHeadModel.from_pretrained(gpt2_dir).eval()
    with torch.no_grad():
        return model(ids).logits


def test_logits_match_hugging_face(gpt2_dir: Path, imported: Path) -> None:
    model = load_model_dir(imported, expect=DecoderLM)
    cfg = model.cfg
    assert (cfg.positional, cfg.norm_first, cfg.activation) == ("learned", True, "gelu_tanh")
    assert not cfg.scale_embeddings and cfg.tie_output and cfg.dropout == 0.0
    assert cfg.pad_id == cfg.bos_id == cfg.eos_id == cfg.vocab_size - 1
    ids = torch.randint(cfg.vocab_size, (2, 40), generator=torch.Generator().manual_seed(1))
    want = hf_logits(gpt2_dir, ids)
    assert want.abs().max() > 1.0  # weights large enough that a wrong mapping shows
    with torch.no_grad():  # the prepacked oneDNN path (kernels.Linear)
        fast = model(ids)
    plain = model(ids).detach()  # the plain F.linear path
    for got in (fast, plain):
        assert got.shape == want.shape
        assert (got - want).abs().max().item() < 1e-4
    # A row's logits do not depend on the row beside it, nor on what follows it (causal).
    with torch.no_grad():
        assert (model(ids[:1, :25]) - want[:1, :25]).abs().max().item() < 1e-4


def test_tokenizer_matches_gpt2_tokenizer_fast(gpt2_dir: Path, imported: Path) -> None:
    tok = Tokenizer.load(imported)
    assert isinstance(tok, HFTokenizer) and (imported / "hf_tokenizer.json").is_file()
    hf = hf_tokenizer(gpt2_dir)
    assert tok.vocab_size == len(hf) and tok.eos_id == hf.eos_token_id == tok.pad_id
    tok.check_fits(load_model_dir(imported).cfg)
    for text in TEXTS:
        ids = tok.encode(text, eos=False)
        assert ids == hf(text)["input_ids"], text
        assert tok.decode(ids) == hf.decode(ids) or EOT in text
        if EOT not in text:
            assert tok.decode(ids) == text
            assert tok.decode([tok.bos_id, *ids, tok.eos_id, tok.pad_id]) == text
    assert tok.encode_batch(TEXTS[:2], bos=True) == [
        [tok.bos_id, *hf(t)["input_ids"], tok.eos_id] for t in TEXTS[:2]
    ]
    assert "".join(tok.pieces(tok.encode("the cat", eos=False))) == "theĠcat"


def test_tokenizer_json_directory(tmp_path: Path) -> None:
    hf_dir = make_gpt2_dir(tmp_path / "hf", tokenizer="json")
    done = import_gpt2(hf_dir, tmp_path / "out")
    assert done.tokenizer
    hf = transformers.PreTrainedTokenizerFast(tokenizer_file=str(hf_dir / "tokenizer.json"))
    tok = Tokenizer.load(tmp_path / "out")
    for text in TEXTS:
        assert tok.encode(text, eos=False) == hf(text)["input_ids"], text


def test_without_a_tokenizer_the_model_imports_alone(tmp_path: Path, caplog) -> None:
    hf_dir = make_gpt2_dir(tmp_path / "hf", tokenizer="none")
    assert not import_gpt2(hf_dir, tmp_path / "out").tokenizer
    assert "no tokenizer" in caplog.text
    model = load_model_dir(tmp_path / "out", expect=DecoderLM)
    ids = torch.tensor([[0, 5, 9, model.cfg.eos_id]])
    with torch.no_grad():
        assert (model(ids) - hf_logits(hf_dir, ids)).abs().max().item() < 1e-4
    with pytest.raises(CheckpointError):
        Tokenizer.load(tmp_path / "out")


def test_gpt2model_names_and_saved_buffers(gpt2_dir: Path, tmp_path: Path) -> None:
    """The hub's gpt2 file is GPT2Model's (no "transformer." prefix) with the causal-mask
    buffers saved (h.N.attn.bias); a file may also hold the tied lm_head.weight."""
    from safetensors.torch import load_file, save_file

    hf_dir = tmp_path / "hf"
    hf_dir.mkdir()
    for f in gpt2_dir.iterdir():
        (hf_dir / f.name).write_bytes(f.read_bytes())
    tensors = {
        k.removeprefix("transformer."): v
        for k, v in load_file(hf_dir / "model.safetensors").items()
    }
    tensors["lm_head.weight"] = tensors["wte.weight"].clone()
    for i in range(2):
        tensors[f"h.{i}.attn.bias"] = torch.tril(torch.ones(64, 64))[None, None]
    save_file(tensors, hf_dir / "model.safetensors")
    import_gpt2(hf_dir, tmp_path / "out")
    ids = torch.randint(300, (2, 16), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        got = load_model_dir(tmp_path / "out")(ids)
    assert (got - hf_logits(gpt2_dir, ids)).abs().max().item() < 1e-4
    tensors["lm_head.weight"] += 1.0  # untied: refused
    save_file(tensors, hf_dir / "model.safetensors")
    with pytest.raises(CheckpointError, match="lm_head.weight differs"):
        import_gpt2(hf_dir, tmp_path / "out2")


def test_python_dash_m_aiayn(gpt2_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "via-main"
    run = subprocess.run(
        [sys.executable, "-m", "aiayn", "import", "gpt2", str(gpt2_dir), "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr
    assert "DecoderLM" in run.stdout and "byte-level BPE" in run.stdout
    assert isinstance(load_model_dir(out), DecoderLM)


def _edit_config(d: Path, **changes: object) -> None:
    cfg = json.loads((d / "config.json").read_text())
    (d / "config.json").write_text(json.dumps({**cfg, **changes}))


BAD = {
    "no config.json": (lambda d: (d / "config.json").unlink(), "has no config.json"),
    "not gpt2": (lambda d: _edit_config(d, model_type="bert"), "not a GPT-2"),
    "no weights": (lambda d: (d / "model.safetensors").unlink(), "has no model.safetensors"),
    "pickle only": (
        lambda d: (d / "model.safetensors").rename(d / "pytorch_model.bin"),
        "never opens a pickle",
    ),
    "shape mismatch": (lambda d: _edit_config(d, n_positions=32), "wpe.weight has shape"),
    "activation": (lambda d: _edit_config(d, activation_function="quick_gelu"), "quick_gelu"),
    "tokenizer size": (lambda d: _edit_config(d, vocab_size=999), "vocab_size=999"),
    "not a directory": (lambda d: d.rename(d.with_name("gone")), "not found"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_input_is_one_line(case: str, gpt2_dir: Path, tmp_path: Path, capsys) -> None:
    hf_dir = tmp_path / "hf"
    hf_dir.mkdir()
    for f in gpt2_dir.iterdir():
        (hf_dir / f.name).write_bytes(f.read_bytes())
    spoil, expected = BAD[case]
    spoil(hf_dir)
    out = tmp_path / "out"
    assert main(["import", "gpt2", str(hf_dir), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("aiayn import: error:") and err.count("\n") == 1, err
    assert expected in err and "Traceback" not in err
    assert not out.exists()
