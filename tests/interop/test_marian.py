"""`aiayn import marian`: a MarianMT directory made here with `transformers` (no download), its
numbers against Hugging Face's own, every command on the imported model, and bad input."""

from __future__ import annotations

import io
import json
from dataclasses import replace
from pathlib import Path

import pytest
import sentencepiece as spm
import torch
from paths import CONFIGS
from safetensors.torch import load_file, save_file
from transformers import MarianConfig, MarianMTModel
from transformers import MarianTokenizer as HFMarianTokenizer

from aiayn.cli.main import main
from aiayn.config import DecodeConfig
from aiayn.errors import CheckpointError
from aiayn.interop.marian import import_marian
from aiayn.nn.model import Transformer
from aiayn.search.decode import beam_search, greedy_search
from aiayn.store.model_dir import load_model_dir
from aiayn.text.batches import encode_pairs, pad_rows
from aiayn.text.tokenizer import MarianTokenizer, Tokenizer

SRC_WORDS = ["ein", "eine", "der", "die", "das", "Mann", "Frau", "Hund", "Katze", "läuft",
             "spielt", "schläft", "im", "Park", "auf", "Straße", "schnell", "langsam", "rot",
             "blau", "groß", "klein"]  # fmt: skip
TGT_WORDS = ["a", "the", "man", "woman", "dog", "cat", "runs", "plays", "sleeps", "in", "park",
             "on", "street", "fast", "slow", "red", "blue", "big", "small"]  # fmt: skip
SOURCES = ["der Mann läuft im Park.", "eine rote Katze schläft schnell auf der Straße.",
           "Hund.", "ein blauer Hund spielt im Park", "Zebra ẞ!"]  # fmt: skip
TARGETS = ["the man runs in the park.", "a small dog.", "red"]
VOCAB_SIZE = 300  # the pieces of both SentencePiece models, padded with unused ones


def _corpus(words: tuple[str, ...] | list[str], n: int, seed: int) -> list[str]:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(3, 9, (n,), generator=g).tolist()
    return [" ".join(words[int(i)] for i in torch.randint(len(words), (k,), generator=g)) + "."
            for k in lengths]  # fmt: skip


def _spm(lines: list[str], size: int) -> bytes:
    buf = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(lines), model_writer=buf, vocab_size=size, model_type="unigram",
        character_coverage=1.0, minloglevel=2,
    )  # fmt: skip
    return buf.getvalue()


def make_marian_dir(path: Path, seed: int = 0, **config: object) -> Path:
    """A randomly initialised MarianMTModel saved as OPUS-MT models are: config.json,
    model.safetensors, source.spm, target.spm (trained here), vocab.json (Marian's layout:
    </s> 0, <unk> 1, the pieces of both models, <pad> last)."""
    protos = _spm(_corpus(SRC_WORDS, 400, 1), 50), _spm(_corpus(TGT_WORDS, 400, 2), 45)
    pieces = ["</s>", "<unk>", ">>en<<"]
    for proto in protos:
        sp = spm.SentencePieceProcessor()
        sp.LoadFromSerializedProto(proto)
        pieces += [p for i in range(sp.get_piece_size()) if not sp.is_control(i)
                   and not sp.is_unknown(i) and (p := sp.id_to_piece(i)) not in pieces]  # fmt: skip
    pieces += [f"▁unused{i}" for i in range(VOCAB_SIZE - 1 - len(pieces))] + ["<pad>"]
    V = len(pieces)
    settings = dict(
        vocab_size=V, decoder_vocab_size=V, d_model=32, encoder_layers=2, decoder_layers=2,
        encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=64,
        decoder_ffn_dim=64, activation_function="swish", max_position_embeddings=64,
        pad_token_id=V - 1, decoder_start_token_id=V - 1, eos_token_id=0,
        forced_eos_token_id=None, scale_embedding=True, init_std=0.2, dropout=0.1,
    )  # fmt: skip
    settings.update(config)
    torch.manual_seed(seed)
    model = MarianMTModel(MarianConfig(**settings)).eval()
    with torch.no_grad():  # HF starts it at 0; random here, so that the mapping is tested
        model.final_logits_bias.normal_(0.0, 0.5)
        model.final_logits_bias[0, 0] += 2.0  # EOS: some outputs end before the length limit
    model.save_pretrained(path)
    (path / "source.spm").write_bytes(protos[0])
    (path / "target.spm").write_bytes(protos[1])
    vocab = {p: i for i, p in enumerate(pieces)}
    (path / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False), encoding="utf-8")
    (path / "tokenizer_config.json").write_text(json.dumps({"source_lang": "de",
                                                            "target_lang": "en"}))  # fmt: skip
    return path


@pytest.fixture(scope="module")
def dirs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(the Hugging Face directory, its import)."""
    root = tmp_path_factory.mktemp("marian")
    hf_dir = make_marian_dir(root / "opus-mt-de-en")
    import_marian(hf_dir, root / "imported")
    return hf_dir, root / "imported"


@pytest.fixture(scope="module")
def pair(dirs: tuple[Path, Path]) -> tuple[MarianMTModel, Transformer, Tokenizer]:
    hf_dir, ours = dirs
    torch.set_num_threads(1)
    hf = MarianMTModel.from_pretrained(hf_dir).eval()
    hf.generation_config.forced_eos_token_id = None  # aiayn stops at the limit without EOS
    return hf, load_model_dir(ours, expect=Transformer), Tokenizer.load(ours)


# --- the tokenizer --------------------------------------------------------------------------


def test_tokenizer_encodes_as_hugging_face_does(dirs, pair):
    hf_tok = HFMarianTokenizer.from_pretrained(dirs[0])
    tok = pair[2]
    assert isinstance(tok, MarianTokenizer) and tok.vocab_size == VOCAB_SIZE
    assert (tok.eos_id, tok.pad_id, tok.bos_id) == (0, VOCAB_SIZE - 1, VOCAB_SIZE - 1)
    lines = [*SOURCES, ">>en<< der Hund"]
    assert tok.encode_batch(lines) == hf_tok(lines)["input_ids"]
    assert tok.encode_batch(TARGETS, side="target") == hf_tok(text_target=TARGETS)["input_ids"]
    assert tok.encode(">>en<< der")[0] == 2 and tok.unk_id in tok.encode("Zebra ẞ")
    (example,) = encode_pairs([("der Hund", TARGETS[0])], tok, max_len=64)  # training pairs
    assert example.tgt == (tok.bos_id, *hf_tok(text_target=TARGETS[:1])["input_ids"][0])
    ids = tok.encode("the man runs in the park.", side="target")
    assert tok.decode([*ids, 5, 6]) == "the man runs in the park."  # stops at EOS
    assert tok.decode(ids) == hf_tok.decode(ids, skip_special_tokens=True,
                                            use_source_tokenizer=False)  # fmt: skip


def test_tokenizer_files_round_trip(dirs, tmp_path):
    tok = Tokenizer.load(dirs[1])
    tok.save(tmp_path)
    again = Tokenizer.load(tmp_path)
    assert isinstance(again, MarianTokenizer)
    assert again.encode_batch(SOURCES) == tok.encode_batch(SOURCES)
    (tmp_path / "vocab.json").write_text(json.dumps({"</s>": 0, "<unk>": 1, "<pad>": 3}))
    with pytest.raises(CheckpointError, match="not 0 .. 2"):
        Tokenizer.load(tmp_path)
    (tmp_path / "target.spm").unlink()
    with pytest.raises(CheckpointError, match="no target.spm"):
        Tokenizer.load(tmp_path)


# --- parity with Hugging Face ---------------------------------------------------------------


def _batch(tok: Tokenizer) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded sources and shifted-right targets (decoding starts from PAD)."""
    src_BS = pad_rows(tok.encode_batch(SOURCES), tok.pad_id)
    targets = tok.encode_batch([*TARGETS, "a dog", "the cat sleeps"], side="target")
    tgt_in_BT = pad_rows([[tok.bos_id, *t[:-1]] for t in targets], tok.pad_id)
    return src_BS, tgt_in_BT


@torch.no_grad()
def test_logits_match_hugging_face(pair):
    hf, ours, tok = pair
    src_BS, tgt_in_BT = _batch(tok)
    expected_BTV = hf(input_ids=src_BS, attention_mask=src_BS != tok.pad_id,
                      decoder_input_ids=tgt_in_BT).logits  # fmt: skip
    torch.testing.assert_close(ours(src_BS, tgt_in_BT), expected_BTV, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    ("variant", "shared"),
    [
        ({"activation_function": "relu"}, True),
        ({"share_encoder_decoder_embeddings": False, "tie_word_embeddings": False}, False),
    ],
    ids=["relu", "unshared-untied"],
)
@torch.no_grad()
def test_logits_match_for_other_options(tmp_path, variant, shared):
    hf_dir = make_marian_dir(tmp_path / "hf", seed=1, **variant)
    import_marian(hf_dir, tmp_path / "ours")
    hf = MarianMTModel.from_pretrained(hf_dir).eval()
    ours, tok = load_model_dir(tmp_path / "ours", expect=Transformer), Tokenizer.load(hf_dir)
    assert ours.cfg.share_embeddings == ours.cfg.tie_output == shared
    src_BS, tgt_in_BT = _batch(tok)
    expected_BTV = hf(input_ids=src_BS, attention_mask=src_BS != tok.pad_id,
                      decoder_input_ids=tgt_in_BT).logits  # fmt: skip
    torch.testing.assert_close(ours(src_BS, tgt_in_BT), expected_BTV, rtol=1e-5, atol=1e-5)


def _hf_outputs(sequences: torch.Tensor, pad_id: int, eos_id: int) -> list[tuple[list[int], bool]]:
    """generate()'s rows as (tokens without the start token and EOS, ended with EOS)."""
    out = []
    for row in sequences[:, 1:].tolist():
        ended = eos_id in row
        row = row[: row.index(eos_id)] if ended else row
        out.append(([t for t in row if t != pad_id], ended))
    return out


# The length limit: HF's max_new_tokens counts EOS, aiayn's max_len_b counts it too when it is
# the last token (a hypothesis that reaches the limit stops there without EOS in both).
LIMIT = 12


def test_greedy_matches_generate(pair):
    hf, ours, tok = pair
    src_BS, _ = _batch(tok)
    sequences = hf.generate(input_ids=src_BS, attention_mask=src_BS != tok.pad_id, num_beams=1,
                            do_sample=False, max_new_tokens=LIMIT,
                            bad_words_ids=[[tok.pad_id]])  # fmt: skip
    cfg = DecodeConfig(beam_size=1, max_len_a=0.0, max_len_b=LIMIT)
    got = [(h.tokens, h.eos) for h in greedy_search(ours, src_BS, cfg)]
    expected = _hf_outputs(sequences, tok.pad_id, tok.eos_id)
    assert got == expected
    assert {eos for _, eos in got} == {True, False}  # both ways of ending are compared


@pytest.mark.parametrize("beam", [2, 4])
def test_beam_search_matches_generate(pair, beam):
    """With length_penalty 0 HF's len ** 0 and aiayn's ((5 + len) / 6) ** 0 are both 1: the two
    rank hypotheses by the same summed log-probability, so their searches can be compared.
    early_stopping=True is aiayn's rule (a sentence is done once `beam` hypotheses ended)."""
    hf, ours, tok = pair
    src_BS, _ = _batch(tok)
    sequences = hf.generate(input_ids=src_BS, attention_mask=src_BS != tok.pad_id,
                            num_beams=beam, do_sample=False, max_new_tokens=LIMIT,
                            bad_words_ids=[[tok.pad_id]], length_penalty=0.0,
                            early_stopping=True)  # fmt: skip
    cfg = DecodeConfig(beam_size=beam, alpha=0.0, max_len_a=0.0, max_len_b=LIMIT)
    got = [(h[0].tokens, h[0].eos) for h in beam_search(ours, src_BS, cfg)]
    assert got == _hf_outputs(sequences, tok.pad_id, tok.eos_id)
    assert {eos for _, eos in got} == {True, False}


def test_beam_search_with_hf_length_penalty_matches_generate(pair):
    """HF divides a finished hypothesis's log-probability by |Y| ** length_penalty (|Y| its
    generated tokens, EOS included): aiayn's length_penalty = "power", so an imported model
    searches as `generate()` does at its own setting (1.0 by default), not only at 0."""
    hf, ours, tok = pair
    src_BS, _ = _batch(tok)
    differs = set()
    for beam, alpha in [(2, 1.0), (4, 1.0), (4, 0.6), (4, 2.0)]:
        sequences = hf.generate(input_ids=src_BS, attention_mask=src_BS != tok.pad_id,
                                num_beams=beam, do_sample=False, max_new_tokens=LIMIT,
                                bad_words_ids=[[tok.pad_id]], length_penalty=alpha,
                                early_stopping=True)  # fmt: skip
        cfg = DecodeConfig(beam_size=beam, alpha=alpha, length_penalty="power", max_len_a=0.0,
                           max_len_b=LIMIT)  # fmt: skip
        got = [(h[0].tokens, h[0].eos) for h in beam_search(ours, src_BS, cfg)]
        assert got == _hf_outputs(sequences, tok.pad_id, tok.eos_id), (beam, alpha)
        for other in (replace(cfg, length_penalty="gnmt"), replace(cfg, alpha=0.0)):
            if [(h[0].tokens, h[0].eos) for h in beam_search(ours, src_BS, other)] != got:
                differs.add(other.length_penalty if other.alpha else "none")
    assert differs == {"gnmt", "none"}  # the comparison tells the three rules apart


# --- every command on the imported model ----------------------------------------------------


def aiayn(capsys: pytest.CaptureFixture[str], *args: str | Path, code: int = 0) -> str:
    """Run the CLI in this process; return what it printed (stdout, or stderr on failure)."""
    assert main([str(a) for a in args]) == code
    printed = capsys.readouterr()
    return printed.out if code == 0 else printed.err


def test_commands_run_on_the_imported_model(dirs, pair, tmp_path, capsys):
    hf_dir, ours = dirs
    hf, _, tok = pair
    (tmp_path / "src.txt").write_text("der Mann läuft im Park.\n\nHund.\n", encoding="utf-8")
    greedy = aiayn(capsys, "translate", "--model", ours, "--input", tmp_path / "src.txt",
                   "--beam", "1").splitlines()  # fmt: skip
    src_BS = pad_rows(tok.encode_batch(["der Mann läuft im Park.", "Hund."]), tok.pad_id)
    limit = src_BS.size(1) + 50  # aiayn's default limit: source length + 50, EOS included
    seqs = hf.generate(input_ids=src_BS, attention_mask=src_BS != tok.pad_id, num_beams=1,
                       max_new_tokens=limit, bad_words_ids=[[tok.pad_id]])  # fmt: skip
    hf_text = [tok.decode(row) for row in seqs[:, 1:].tolist()]
    assert greedy == [hf_text[0], "", hf_text[1]]

    (tmp_path / "ref.txt").write_text("the man runs.\n\na dog.\n", encoding="utf-8")
    scores = json.loads(aiayn(capsys, "evaluate", "--model", ours, "--src", tmp_path / "src.txt",
                              "--ref", tmp_path / "ref.txt", "--json"))  # fmt: skip
    assert scores["sentences"] == 3 and "tok:13a" in scores["bleu"]["signature"]

    report = aiayn(capsys, "explain", "--model", ours, "Hund.", "--max-len", "3")
    assert "swish FFN, sines then cosines (halves), bias on the logits" in report
    assert "'H'" in report and "'</s>'" in report  # the source's pieces
    beam = json.loads(aiayn(capsys, "explain", "--model", ours, "Hund.", "--beam", "2",
                            "--max-len", "3", "--format", "json"))["beam"]  # fmt: skip
    assert beam["beam_size"] == 2 and beam["steps"]

    pictures = aiayn(capsys, "attend", "--model", ours, "Hund.", "--max-len", "4", "--out",
                     tmp_path / "att")  # fmt: skip
    assert "Hund." in pictures and (tmp_path / "att" / "attention.html").is_file()
    assert list((tmp_path / "att").glob("*.png"))

    import_marian(hf_dir, tmp_path / "copy")
    aiayn(capsys, "average", "--inputs", ours, tmp_path / "copy", "--out", tmp_path / "avg")
    assert isinstance(Tokenizer.load(tmp_path / "avg"), MarianTokenizer)
    averaged, original = load_file(tmp_path / "avg" / "model.safetensors"), load_file(
        ours / "model.safetensors")  # fmt: skip
    assert averaged.keys() == original.keys()
    assert all(torch.equal(averaged[k], original[k]) for k in original)  # mean of two copies


def test_continued_training_starts_from_the_imported_weights(dirs, tmp_path, capsys):
    _, ours = dirs
    src, tgt = _corpus(SRC_WORDS, 40, 5), _corpus(TGT_WORDS, 40, 6)
    (tmp_path / "train.de").write_text("\n".join(src) + "\n", encoding="utf-8")
    (tmp_path / "train.en").write_text("\n".join(tgt) + "\n", encoding="utf-8")
    config = CONFIGS / "tiny_copy.toml"
    common = ["train", "--config", config, "--no-progress",
              "--set", f"train.src={tmp_path / 'train.de'}",
              "--set", f"train.tgt={tmp_path / 'train.en'}", "--set", f"train.init_from={ours}",
              "--set", "train.lr_schedule=constant", "--set", "train.max_steps=2",
              "--set", "train.valid_every=0"]  # fmt: skip
    aiayn(capsys, *common, "--set", "train.lr=0", "--set", f"train.out_dir={tmp_path / 'still'}")
    start = load_file(ours / "model.safetensors")
    still = load_file(tmp_path / "still" / "model.safetensors")
    assert all(torch.equal(start[k], still[k]) for k in start)  # lr 0: the imported weights
    assert isinstance(Tokenizer.load(tmp_path / "still"), MarianTokenizer)
    aiayn(capsys, *common, "--set", "train.lr=1e-3", "--set", f"train.out_dir={tmp_path / 'moved'}")
    moved = load_file(tmp_path / "moved" / "model.safetensors")
    name = "encoder.layers.0.ffn.w_1.weight"
    assert not torch.equal(start[name], moved[name])
    err = aiayn(capsys, *common, "--set", "train.subword_alpha=0.1",
                "--set", f"train.out_dir={tmp_path / 'sampled'}", code=2)  # fmt: skip
    assert err.count("\n") == 1
    assert "subword_alpha samples segmentations, and this MarianTokenizer has one" in err


def test_search_settings_and_languages_come_from_the_hf_files(pristine, tmp_path, capsys):
    import shutil

    hf_dir = tmp_path / "opus-mt-tc-big-en-fr"
    shutil.copytree(pristine, hf_dir)
    (hf_dir / "tokenizer_config.json").unlink()  # the languages then come from the name
    generation = json.loads((hf_dir / "generation_config.json").read_text())
    generation |= {"num_beams": 6, "min_length": 3, "length_penalty": 1.2, "max_length": 512}
    (hf_dir / "generation_config.json").write_text(json.dumps(generation))
    printed = aiayn(capsys, "import", "marian", hf_dir, "--out", tmp_path / "m")
    assert "(en -> fr)" in printed and "beam 6, alpha 1.2 (power length penalty)" in printed
    saved = json.loads((tmp_path / "m" / "run_config.json").read_text())
    decode = saved["decode"]
    assert (decode["beam_size"], decode["min_len"]) == (6, 2)
    assert (decode["alpha"], decode["length_penalty"]) == (1.2, "power")  # HF's own rule
    assert saved["imported"] | {"directory": "?"} == {
        "from": "marian", "directory": "?", "source_lang": "en", "target_lang": "fr"}  # fmt: skip


@torch.no_grad()
def test_older_files_with_every_tied_copy_and_the_positions_table(pristine, pair, tmp_path):
    """Older transformers saved each tied copy and the sinusoids too: all are checked, the
    result is the same model; a positional table that is not Marian's is refused."""
    import shutil

    from transformers.models.marian.modeling_marian import MarianSinusoidalPositionalEmbedding

    hf_dir = tmp_path / "hf"
    shutil.copytree(pristine, hf_dir)
    tensors = load_file(hf_dir / "model.safetensors")
    shared = tensors["model.shared.weight"]
    table = MarianSinusoidalPositionalEmbedding(64, 32).create_weight()
    for name in ("lm_head", "model.encoder.embed_tokens", "model.decoder.embed_tokens"):
        tensors[f"{name}.weight"] = shared.clone()
    for stack in ("encoder", "decoder"):
        tensors[f"model.{stack}.embed_positions.weight"] = table.clone()
    save_file(tensors, hf_dir / "model.safetensors")
    import_marian(hf_dir, tmp_path / "ours")
    src_BS, tgt_in_BT = _batch(pair[2])
    ours = load_model_dir(tmp_path / "ours")
    expected = load_model_dir(import_marian(pristine, tmp_path / "plain").out)
    torch.testing.assert_close(ours(src_BS, tgt_in_BT), expected(src_BS, tgt_in_BT), rtol=0, atol=0)
    tensors["model.decoder.embed_positions.weight"] = table.flip(1).contiguous()
    save_file(tensors, hf_dir / "model.safetensors")
    with pytest.raises(CheckpointError, match="is not Marian's sinusoidal table"):
        import_marian(hf_dir, tmp_path / "refused")


# --- bad input: one line, exit 2, nothing written ---------------------------------------------


def _config(hf_dir: Path, **changes: object) -> None:
    path = hf_dir / "config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **changes}))


def _break_missing_vocab(d: Path) -> None:
    (d / "vocab.json").unlink()


def _break_missing_config(d: Path) -> None:
    (d / "config.json").unlink()


def _break_bert(d: Path) -> None:
    (d / "config.json").write_text(json.dumps({"model_type": "bert", "vocab_size": 30522,
                                               "architectures": ["BertForMaskedLM"]}))  # fmt: skip


def _break_t5(d: Path) -> None:
    t5 = {"model_type": "t5", "vocab_size": 32128, "architectures": ["T5ForConditionalGeneration"]}
    (d / "config.json").write_text(json.dumps(t5))


def _break_pickle_only(d: Path) -> None:
    (d / "model.safetensors").unlink()
    (d / "pytorch_model.bin").write_bytes(b"not to be unpickled")


def _break_vocab_size(d: Path) -> None:
    vocab = json.loads((d / "vocab.json").read_text(encoding="utf-8"))
    (d / "vocab.json").write_text(json.dumps({**vocab, "▁extra": len(vocab)}))


def _break_weights_vocab(d: Path) -> None:  # config and vocab.json agree, the weights do not
    vocab = json.loads((d / "vocab.json").read_text(encoding="utf-8"))
    pad = vocab.pop("<pad>")
    (d / "vocab.json").write_text(json.dumps({**vocab, "▁extra": pad, "<pad>": pad + 1}))
    _config(d, vocab_size=pad + 2, decoder_vocab_size=pad + 2, pad_token_id=pad + 1,
            decoder_start_token_id=pad + 1)  # fmt: skip


def _break_shape(d: Path) -> None:
    tensors = load_file(d / "model.safetensors")
    name = "model.decoder.layers.1.fc1.weight"
    tensors[name] = tensors[name][:, :-1].contiguous()
    save_file(tensors, d / "model.safetensors")


def _break_shard_path(d: Path) -> None:  # an index that sends the reader out of the directory
    index = {"weight_map": {"model.shared.weight": "../elsewhere.safetensors"}}
    (d / "model.safetensors.index.json").write_text(json.dumps(index))


BAD = {
    "no vocab.json": (_break_missing_vocab, "has no vocab.json"),
    "no config.json": (_break_missing_config, "has no config.json"),
    "bert": (_break_bert, "holds a 'bert' model (BertForMaskedLM), not a MarianMTModel"),
    "t5": (_break_t5, "holds a 't5' model"),
    "pickle only": (_break_pickle_only, "only as pytorch_model.bin"),
    "vocab.json size": (_break_vocab_size, "vocab.json has 301 pieces but config.json says "
                        "vocab_size=300"),
    "weights vocab": (_break_weights_vocab, "model.shared.weight has shape (300, 32), "
                      "config.json implies (301, 32)"),
    "tensor shape": (_break_shape, "model.decoder.layers.1.fc1.weight has shape (64, 31)"),
    "gelu": (lambda d: _config(d, activation_function="gelu"), "activation_function='gelu'"),
    "layers": (lambda d: _config(d, decoder_layers=3), "one n_layers"),
    "unscaled": (lambda d: _config(d, scale_embedding=False), "scale_embedding=false"),
    "pre-LN": (lambda d: _config(d, normalize_before=True), "normalize_before=true"),
    "shard path": (_break_shard_path, "names a shard that is not a file name of the directory: "
                   "'../elsewhere.safetensors'"),
    "shard not a name": (lambda d: (d / "model.safetensors.index.json").write_text(
        '{"weight_map": {"a": "model.safetensors", "b": ["x"]}}'), "directory: ['x']"),
}  # fmt: skip


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_marian_dir(tmp_path_factory.mktemp("pristine") / "hf")


@pytest.mark.parametrize("case", list(BAD))
def test_bad_input_is_one_line_and_writes_nothing(pristine, tmp_path, capsys, case):
    import shutil

    hf_dir = tmp_path / "hf"
    shutil.copytree(pristine, hf_dir)
    breaker, message = BAD[case]
    breaker(hf_dir)
    err = aiayn(capsys, "import", "marian", hf_dir, "--out", tmp_path / "out", code=2)
    assert err.count("\n") == 1 and message in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hf"]  # no output, no temporary dir


def test_out_must_be_new_or_empty(pristine, tmp_path, capsys):
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "mine.txt").write_text("keep")
    err = aiayn(capsys, "import", "marian", pristine, "--out", tmp_path / "out", code=2)
    assert "exists and is not empty" in err
    assert [p.name for p in (tmp_path / "out").iterdir()] == ["mine.txt"]
    (tmp_path / "empty").mkdir()
    assert "imported" in aiayn(capsys, "import", "marian", pristine, "--out", tmp_path / "empty")
    assert load_model_dir(tmp_path / "empty").cfg.positional_layout == "halves"


def test_the_imported_model_is_served_with_its_languages(dirs, tmp_path, capsys):
    pytest.importorskip("fastapi", reason="the serve extra is not installed (pip install .[serve])")
    import httpx
    from serving import ServerProcess

    _, ours = dirs
    (tmp_path / "src.txt").write_text("der Mann läuft im Park.\nHund.\n", encoding="utf-8")
    expected = aiayn(capsys, "translate", "--model", ours, "--input", tmp_path / "src.txt",
                     "--beam", "2").splitlines()  # fmt: skip
    server = ServerProcess(ours)
    try:
        languages = httpx.get(f"{server.url}/languages", timeout=30).json()
        assert [(lang["code"], lang["targets"]) for lang in languages] == [
            ("de", ["en"]),
            ("en", []),
        ]
        q = ["der Mann läuft im Park.", "Hund."]
        r = httpx.post(f"{server.url}/v1/translate", json={"q": q, "beam": 2}, timeout=60)
        assert r.status_code == 200, r.text
        assert [t["text"] for t in r.json()["translations"]] == expected
        body = {"q": q, "source": "de", "target": "fr", "format": "text"}
        wrong = httpx.post(f"{server.url}/translate", json=body, timeout=30)
        assert wrong.status_code == 400 and "en" in wrong.json()["error"]
        explained = httpx.post(f"{server.url}/v1/explain", json={"q": "Hund."}, timeout=60)
        assert explained.status_code == 200, explained.text
        assert explained.json()["source"]["pieces"][-1] == "</s>"
    finally:
        code, _, err = server.stop()
    assert code == 0, err[-2000:]
