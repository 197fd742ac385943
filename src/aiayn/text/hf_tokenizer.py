"""GPT-2's byte-level BPE, run by Hugging Face's `tokenizers` library (`aiayn import gpt2`).

    HFTokenizer.from_hf_dir(dir)   a GPT-2 directory's tokenizer.json, or vocab.json + merges.txt
    HFTokenizer.load_file(path)    a model directory's `hf_tokenizer.json` (`Tokenizer.load`)

Byte-level BPE spells every text in its 256 byte pieces before merging them, so nothing is ever
unknown and `decode(encode(s)) == s` for any text. The tokenizer is saved as the library's own
JSON (`hf_tokenizer.json`), read back with no pickle.

GPT-2 has one special token, "<|endoftext|>" (id 50256 in GPT-2's vocabulary), which ends one
document and starts the next: here it is EOS and BOS, and PAD too, as GPT-2 has no PAD of its
own. Nothing in a `DecoderLM` masks PAD, so a padded row's positions after its text are simply
never read; `decode` stops at the first "<|endoftext|>".
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from aiayn.atomic import atomic_write_bytes
from aiayn.errors import AiaynError, CheckpointError

try:  # a dependency of transformers, and of aiayn's `test` extra; not of aiayn itself
    from tokenizers import AddedToken, decoders, models, pre_tokenizers, processors
    from tokenizers import Tokenizer as HFLibTokenizer
except ImportError:  # pragma: no cover
    raise AiaynError(
        "GPT-2's tokenizer needs Hugging Face's `tokenizers` library: pip install tokenizers"
    ) from None
from aiayn.text.tokenizer import HF_TOKENIZER_FILE, Side, Tokenizer

END_OF_TEXT = "<|endoftext|>"  # GPT-2's one special token: BOS, EOS and PAD here
# What a Hugging Face GPT-2 directory may hold: the library's JSON, or the two files it is
# built from (GPT-2's original release).
HF_JSON, HF_VOCAB, HF_MERGES = "tokenizer.json", "vocab.json", "merges.txt"


class LibTokenizer(Tokenizer):
    """What every vocabulary of Hugging Face's `tokenizers` library shares here: one JSON file
    (`hf_tokenizer.json`), its size, and encoding without the library's own special tokens
    (aiayn adds BOS and EOS where it asks for them)."""

    tok: HFLibTokenizer

    def save(self, directory: str | Path) -> Path:
        path = Path(directory) / HF_TOKENIZER_FILE
        atomic_write_bytes(path, self.tok.to_str().encode("utf-8"))
        return path

    @property
    def vocab_size(self) -> int:
        return self.tok.get_vocab_size(with_added_tokens=True)

    def encode_batch(
        self, texts: Sequence[str], *, bos: bool = False, eos: bool = True, side: Side = "source"
    ) -> list[list[int]]:
        pre, post = [self.bos_id] if bos else [], [self.eos_id] if eos else []
        encoded = self.tok.encode_batch(list(texts), add_special_tokens=False)
        return [pre + e.ids + post for e in encoded]


class HFTokenizer(LibTokenizer):
    """A `tokenizers` byte-level BPE with GPT-2's special-token layout: "<|endoftext|>" is BOS,
    EOS and PAD. `encode` adds only what aiayn asks for (`bos`, `eos`), never the library's own
    post-processing; a literal "<|endoftext|>" in a text is that token, as in Hugging Face's
    GPT2TokenizerFast."""

    def __init__(self, tok: HFLibTokenizer) -> None:
        self.tok = tok
        eot = tok.token_to_id(END_OF_TEXT)
        if eot is None:
            raise CheckpointError(f"the tokenizer has no {END_OF_TEXT} token (GPT-2's EOS)")
        self.pad_id = self.bos_id = self.eos_id = eot
        if not any(t.content == END_OF_TEXT for t in tok.get_added_tokens_decoder().values()):
            # vocab.json lists it as an ordinary piece: made special, a literal one in a text
            # is one token (as GPT2TokenizerFast does), never spelled in bytes
            tok.add_special_tokens([AddedToken(END_OF_TEXT, special=True)])

    # --- reading and writing -----------------------------------------------------------------

    @classmethod
    def from_hf_dir(cls, hf_dir: Path) -> HFTokenizer | None:
        """The tokenizer of a Hugging Face GPT-2 directory: tokenizer.json, else vocab.json +
        merges.txt (built as transformers' GPT2TokenizerFast builds it); None when it has
        neither."""
        if (hf_dir / HF_JSON).is_file():
            return cls.load_file(hf_dir / HF_JSON)
        vocab, merges = hf_dir / HF_VOCAB, hf_dir / HF_MERGES
        if not (vocab.is_file() and merges.is_file()):
            return None
        try:
            pieces, ranks = models.BPE.read_file(str(vocab), str(merges))
            tok = HFLibTokenizer(
                models.BPE(pieces, ranks, continuing_subword_prefix="", end_of_word_suffix="")
            )
        except Exception as e:  # the library raises plain Exceptions for malformed files
            raise CheckpointError(f"{hf_dir}: unreadable {HF_VOCAB} / {HF_MERGES} ({e})") from None
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        tok.post_processor = processors.ByteLevel(trim_offsets=False)
        return cls(tok)

    @classmethod
    def load_file(cls, path: Path) -> HFTokenizer:
        """From a `tokenizers` JSON file (`hf_tokenizer.json`, or HF's tokenizer.json)."""
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            raise CheckpointError(f"no tokenizer at {path}") from None
        except UnicodeDecodeError:
            raise CheckpointError(f"{path} is not a tokenizers JSON file (not UTF-8)") from None
        try:
            tok = HFLibTokenizer.from_str(text)
        except Exception as e:  # the library raises plain Exceptions for malformed JSON
            raise CheckpointError(f"{path} is not a tokenizers JSON file ({e})") from None
        return cls(tok)

    # --- use -----------------------------------------------------------------------------------

    def decode(self, ids: Sequence[int]) -> str:
        """Text of `ids`, the leading "<|endoftext|>"s (BOS) skipped, up to the next (EOS)."""
        ids = [int(i) for i in ids]
        start = next((k for k, i in enumerate(ids) if i != self.bos_id), len(ids))
        return self.tok.decode(self._content(ids[start:]), skip_special_tokens=False)

    def pieces(self, ids: Sequence[int]) -> list[str]:
        """GPT-2's pieces as its vocabulary spells them: a leading space is "Ġ", each byte of a
        character outside printable ASCII one stand-in character."""
        return [self.tok.id_to_token(int(i)) or "<unk>" for i in ids]
