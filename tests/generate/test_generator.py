"""The decoder-only LM through the translator's search: invariants (cache == no cache ==
the full forward's argmax, beam 1 == greedy, left padding == alone), the Generator's seeds,
context overflow, and `aiayn generate` / `aiayn evaluate --text` on a saved model."""

from __future__ import annotations

import json
import math

import pytest
import torch

from aiayn.cli.main import main
from aiayn.config import DecodeConfig, ModelConfig
from aiayn.generate.generator import Generator
from aiayn.generate.scoring import score_text
from aiayn.nn.variants import DecoderLM
from aiayn.search.decode import beam_search, greedy_search, sample_search
from aiayn.store.model_dir import save_model_dir
from aiayn.text.charset import ByteTokenizer, CharTokenizer
from aiayn.text.tokenizer import Tokenizer

TEXT = "the quick brown fox jumps over the lazy dog.\nto be or not to be, that is the question\n"


def tiny_lm(vocab: int, max_len: int = 24, seed: int = 0) -> DecoderLM:
    torch.manual_seed(seed)
    cfg = ModelConfig(
        vocab_size=vocab, d_model=32, n_heads=4, n_layers=2, d_ff=64, dropout=0.0, max_len=max_len
    )
    return DecoderLM(cfg).eval()


def rows(prompts: list[list[int]]) -> torch.Tensor:
    S = max(map(len, prompts))
    return torch.tensor([p + [0] * (S - len(p)) for p in prompts])


PROMPTS = [[2, 5, 6, 7, 8], [2, 9], [2]]
FIXED = DecodeConfig(beam_size=1, max_len_a=0.0, max_len_b=8, min_len=8)


def full_forward_greedy(model: DecoderLM, prompt: list[int], n: int) -> list[int]:
    ids = list(prompt)
    with torch.no_grad():
        for _ in range(n):
            lp = model(torch.tensor([ids]))[0, -1].log_softmax(-1)
            lp[[model.cfg.pad_id, model.cfg.bos_id, model.cfg.eos_id]] = -math.inf
            ids.append(int(lp.argmax()))
    return ids[len(prompt) :]


def test_cached_search_equals_recomputing_and_the_full_forward():
    model = tiny_lm(30)
    cached = greedy_search(model, rows(PROMPTS), FIXED)
    fresh = greedy_search(model, rows(PROMPTS), FIXED, use_cache=False)
    for p, a, b in zip(PROMPTS, cached, fresh, strict=True):
        assert a.tokens == b.tokens == full_forward_greedy(model, p, 8)
        assert a.log_prob == pytest.approx(b.log_prob, abs=1e-4)


def test_beam_1_is_greedy_and_a_row_alone_equals_the_row_in_a_batch():
    model = tiny_lm(30)
    greedy = greedy_search(model, rows(PROMPTS), FIXED)
    beam = beam_search(model, rows(PROMPTS), FIXED)
    assert [b[0].tokens for b in beam] == [g.tokens for g in greedy]
    for p, g in zip(PROMPTS, greedy, strict=True):  # left padding changes nothing
        assert greedy_search(model, rows([p]), FIXED)[0].tokens == g.tokens
    cfg = DecodeConfig(sample=True, nbest=2, max_len_a=0.0, max_len_b=6, seed=3)
    batch = sample_search(model, rows(PROMPTS), cfg, row_seeds=[11, 12, 13])
    alone = sample_search(model, rows([PROMPTS[1]]), cfg, row_seeds=[12])
    assert [h.tokens for h in batch[1]] == [h.tokens for h in alone[0]]


def test_the_generator_is_seeded_streams_what_it_returns_and_goes_past_the_context():
    tok = CharTokenizer.fit([TEXT])
    gen = Generator(tiny_lm(tok.vocab_size, max_len=16), tok)
    cfg = gen.settings(40, seed=5, nbest=2)
    heard: dict[int, str] = {}
    first = gen.generate_all(
        ["the ", "to"], cfg, on_token=lambda r, t: heard.update({r: heard.get(r, "") + t})
    )
    again = gen.generate_all(["the ", "to"], cfg)
    assert [[g.text for g in x] for x in first] == [[g.text for g in x] for x in again]
    assert heard[0] == first[0][0].text and heard[3] == first[1][1].text
    long = [g for x in first for g in x if not g.eos]
    assert all(len(g.tokens) == 40 for g in long)  # 40 new tokens from a 16-position context
    other = gen.generate_all(["the ", "to"], gen.settings(40, seed=6, nbest=2))
    assert [g.text for x in other for g in x] != [g.text for x in first for g in x]


def test_a_prompt_longer_than_the_context_is_cut_from_the_left(caplog):
    tok = CharTokenizer.fit([TEXT])
    gen = Generator(tiny_lm(tok.vocab_size, max_len=16), tok)
    ids = gen.prompt_ids(TEXT, room=8)
    assert ids == tok.encode(TEXT, eos=False)[-8:]
    assert "keeps the last 8" in caplog.text
    out = gen.generate([TEXT], max_tokens=5, sample=False)
    assert len(out) == 1


def test_charset_and_byte_vocabularies_round_trip(tmp_path):
    for tok in (CharTokenizer.fit([TEXT]), ByteTokenizer()):
        text = TEXT if isinstance(tok, CharTokenizer) else "naïve 中文 ok\n"
        assert tok.decode(tok.encode(text, eos=False)) == text
        tok.save(tmp_path / type(tok).__name__)
        again = Tokenizer.load(tmp_path / type(tok).__name__)
        assert again.encode(text) == tok.encode(text)
    assert CharTokenizer.fit([TEXT]).encode("Z", eos=False) == [1]  # unseen: UNK


@pytest.fixture
def lm_dir(tmp_path):
    tok = CharTokenizer.fit([TEXT])
    d = tmp_path / "lm"
    save_model_dir(tiny_lm(tok.vocab_size, max_len=32), d)
    tok.save(d)
    return d


def test_generate_and_evaluate_text_on_the_command_line(lm_dir, tmp_path, capsys):
    seeded = ["generate", "--model", str(lm_dir), "--prompt", "the", "--max-tokens", "12"]
    assert main([*seeded, "--seed", "1"]) == 0
    one = capsys.readouterr().out
    assert one.startswith("the") and main([*seeded, "--seed", "1"]) == 0
    assert capsys.readouterr().out == one  # same seed, same text
    prompts = tmp_path / "p.txt"
    prompts.write_text("the\nto be\n\n")
    assert (
        main(["generate", "--model", str(lm_dir), "--input", str(prompts), "--max-tokens", "5"])
        == 0
    )
    assert len(capsys.readouterr().out.splitlines()) == 3  # one completion a line, in order
    text = tmp_path / "t.txt"
    text.write_text(TEXT)
    assert main(["evaluate", "--model", str(lm_dir), "--text", str(text), "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["tokens"] == len(TEXT) + 1  # every character and EOS, each predicted once
    assert got["perplexity"] == pytest.approx(math.exp(got["nats_per_token"]))
    assert got["bits_per_char"] == pytest.approx(
        got["nats_per_token"] * got["tokens"] / math.log(2) / len(TEXT)
    )
    assert score_text(lm_dir, text)["nats_per_token"] == pytest.approx(got["nats_per_token"])


@pytest.mark.parametrize(
    "flags, says",
    [
        (["--temperature", "0"], "temperature"),
        (["--temperature", "nan"], "finite"),
        (["--top-p", "1.5"], "top_p"),
        (["--top-k", "0"], "--top-k"),
        (["--max-tokens", "0"], "--max-tokens"),
        (["--num-samples", "1000", "--max-tokens", "100000"], "held at once"),  # ~4 GB of ints
    ],
)
def test_bad_generation_settings_are_one_line(lm_dir, capsys, flags, says):
    assert main(["generate", "--model", str(lm_dir), "--prompt", "a", *flags]) == 2
    err = capsys.readouterr().err
    assert says in err and len(err.strip().splitlines()) == 1


def test_a_translator_command_on_an_lm_and_bad_text_files(lm_dir, tmp_path, capsys):
    assert main(["translate", "--model", str(lm_dir)]) == 2
    assert "language model" in capsys.readouterr().err
    for name, data, says in [
        ("e.txt", b"", "empty"),
        ("b.txt", b"ab\x00cd", "binary"),
        ("u.txt", b"\xff\xfe", "UTF-8"),
    ]:
        (tmp_path / name).write_bytes(data)
        assert main(["evaluate", "--model", str(lm_dir), "--text", str(tmp_path / name)]) == 2
        assert says in capsys.readouterr().err
