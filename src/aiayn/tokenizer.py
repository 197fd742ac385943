"""SentencePiece subwords: one joint vocabulary for source and target (§5.1, §3.4 tying).

Trained on the training text (BPE or unigram), with byte fallback so that no character is ever
lost to <unk>, and no normalisation, so `decode(encode(s)) == s` for text without runs of
spaces. It is trained with aiayn's special-id layout (`aiayn.config.PAD_ID`, ...) and then
owns its ids: `tok.pad_id`, `tok.bos_id`, `tok.eos_id`, which a model trained on it records.
"""

from __future__ import annotations

import io
import re
from collections.abc import Iterable, Sequence
from pathlib import Path

import sentencepiece as spm

from aiayn.atomic import atomic_write_bytes
from aiayn.config import BOS_ID, EOS_ID, PAD_ID, UNK_ID
from aiayn.errors import CheckpointError, DataError

TOKENIZER_FILE = "tokenizer.model"


class Tokenizer:
    """A trained SentencePiece model plus the project's special-token conventions."""

    def __init__(self, proto: bytes) -> None:
        self.proto = proto
        self.sp = spm.SentencePieceProcessor()
        try:
            self.sp.LoadFromSerializedProto(proto)
        except (RuntimeError, OSError, TypeError) as e:
            raise CheckpointError(f"not a SentencePiece model: {e}") from None
        # The vocabulary owns its special ids; a model records them (ModelConfig.pad_id/...),
        # and every other part of aiayn reads them from one of the two, never from constants.
        self.pad_id, self.bos_id, self.eos_id = self.sp.pad_id(), self.sp.bos_id(), self.sp.eos_id()
        missing = [n for n, i in (("pad", self.pad_id), ("bos", self.bos_id), ("eos", self.eos_id))
                   if i < 0]  # fmt: skip
        if missing:
            raise CheckpointError(f"the tokenizer defines no {'/'.join(missing)} piece")

    @classmethod
    def train(
        cls,
        texts: Iterable[str],
        vocab_size: int = 8000,
        model_type: str = "bpe",
        *,
        seed_sentences: int = 2_000_000,
    ) -> Tokenizer:
        """Train a joint vocabulary on `texts` (source and target lines together).

        `vocab_size` is an upper bound: on small corpora SentencePiece cannot reach it, so we
        retry with the largest size the data supports (it names that size in its error).
        """
        if model_type not in ("bpe", "unigram"):
            raise DataError(f"model_type={model_type!r}: choose 'bpe' or 'unigram'")
        lines = [t for t in texts if t.strip()]
        if not lines:
            raise DataError("cannot train a tokenizer on empty text")
        size = vocab_size
        for _ in range(3):
            buf = io.BytesIO()
            try:
                spm.SentencePieceTrainer.train(
                    sentence_iterator=iter(lines),
                    model_writer=buf,
                    vocab_size=size,
                    model_type=model_type,
                    pad_id=PAD_ID,
                    unk_id=UNK_ID,
                    bos_id=BOS_ID,
                    eos_id=EOS_ID,
                    byte_fallback=True,  # unseen characters become bytes, never <unk>
                    character_coverage=1.0,
                    normalization_rule_name="identity",  # keep text as written: exact round trip
                    input_sentence_size=seed_sentences,
                    shuffle_input_sentence=True,
                    num_threads=2,
                    minloglevel=2,
                )
            except RuntimeError as e:
                # "Vocabulary size too high (N). Please set it to a value <= M."
                msg = str(e)
                too_high = re.search(r"Vocabulary size too high.*<= (\d+)", msg)
                if too_high:
                    size = int(too_high.group(1))
                    continue
                too_low = re.search(r"smaller than required_chars\. \d+ vs (\d+)", msg)
                if too_low:
                    raise DataError(
                        f"vocab_size={vocab_size} is too small: this text needs at least "
                        f"{too_low.group(1)} pieces (256 byte-fallback pieces, the special "
                        f"tokens and every distinct character)"
                    ) from None
                raise DataError(f"SentencePiece training failed: {msg.strip()}") from None
            return cls(buf.getvalue())
        raise DataError(f"SentencePiece could not train a vocabulary of size {vocab_size}")

    # --- persistence -------------------------------------------------------------------------

    def save(self, directory: str | Path) -> Path:
        path = Path(directory) / TOKENIZER_FILE
        atomic_write_bytes(path, self.proto)
        return path

    @classmethod
    def load(cls, path: str | Path) -> Tokenizer:
        """From a model directory (its `tokenizer.model`) or a `.model` file."""
        path = Path(path)
        if path.is_dir():
            path = path / TOKENIZER_FILE
        try:
            return cls(path.read_bytes())
        except FileNotFoundError:
            raise CheckpointError(f"no tokenizer at {path}") from None

    # --- use -----------------------------------------------------------------------------------

    @property
    def vocab_size(self) -> int:
        return self.sp.get_piece_size()

    @property
    def special_ids(self) -> dict[str, int]:
        """The ids a model trained on this vocabulary records (ModelConfig fields)."""
        return {"pad_id": self.pad_id, "bos_id": self.bos_id, "eos_id": self.eos_id}

    def encode(self, text: str, *, bos: bool = False, eos: bool = True) -> list[int]:
        """Subword ids of `text`; EOS appended by default (sources and targets both end in it).

        This is the one place aiayn adds BOS and EOS: a source is ids + EOS, a training
        target BOS + ids + EOS (`aiayn.data.Example`)."""
        return self.encode_batch([text], bos=bos, eos=eos)[0]

    def encode_batch(
        self, texts: Sequence[str], *, bos: bool = False, eos: bool = True
    ) -> list[list[int]]:
        pre, post = [self.bos_id] if bos else [], [self.eos_id] if eos else []
        return [pre + ids + post for ids in self.sp.encode(list(texts), out_type=int)]

    def decode(self, ids: Sequence[int]) -> str:
        """Text of `ids`, stopping at the first EOS and skipping PAD and BOS."""
        out = []
        for i in ids:
            i = int(i)
            if i == self.eos_id:
                break
            if i not in (self.pad_id, self.bos_id):
                out.append(i)
        return self.sp.decode(out)

    def pieces(self, ids: Sequence[int]) -> list[str]:
        """The subword strings of `ids`, for labelling attention pictures and traces."""
        return [self.sp.id_to_piece(int(i)) for i in ids]
