"""Character and byte vocabularies for language models (`train.tokenizer = "char" | "byte"`).

    CharTokenizer   one id per character seen in the training text (nanoGPT's shakespeare_char)
    ByteTokenizer   one id per UTF-8 byte: 256 pieces, any text, nothing unknown

Both put aiayn's four special ids first (PAD, UNK, BOS, EOS: aiayn.config), so a model trained
on either records the same layout as one trained on a SentencePiece vocabulary. They are saved
as one JSON file, `charset.json` ({"kind": "char", "chars": [...]} or {"kind": "byte"}).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Literal

from aiayn.atomic import atomic_write_json, read_json_object
from aiayn.config import BOS_ID, EOS_ID, PAD_ID, UNK_ID
from aiayn.errors import CheckpointError, DataError
from aiayn.text.tokenizer import Side, Tokenizer

CHARSET_FILE = "charset.json"
SPECIALS = ("<pad>", "<unk>", "<s>", "</s>")  # at ids PAD_ID, UNK_ID, BOS_ID, EOS_ID
N_SPECIAL = len(SPECIALS)
assert tuple(range(N_SPECIAL)) == (PAD_ID, UNK_ID, BOS_ID, EOS_ID)
# A character vocabulary larger than this is not a character-level corpus (a CJK text is
# ~5,000); it would make a large, sparse output layer: a byte or BPE vocabulary fits it better.
MAX_CHARS = 20_000


class _Charset(Tokenizer):
    pad_id, bos_id, eos_id, unk_id = PAD_ID, BOS_ID, EOS_ID, UNK_ID
    kind: Literal["char", "byte"]

    def encode_batch(
        self, texts: Sequence[str], *, bos: bool = False, eos: bool = True, side: Side = "source"
    ) -> list[list[int]]:
        pre, post = [self.bos_id] if bos else [], [self.eos_id] if eos else []
        return [pre + self.ids(text) + post for text in texts]

    def ids(self, text: str) -> list[int]:
        """The ids of `text`, no special ids added."""
        raise NotImplementedError

    def decode(self, ids: Sequence[int]) -> str:
        return self.text(self._content(ids))

    def text(self, ids: Sequence[int]) -> str:
        """The text of content ids (UNK as U+FFFD; special ids skipped)."""
        raise NotImplementedError

    @staticmethod
    def load_file(path: Path) -> Tokenizer:
        meta = read_json_object(path)
        kind = meta.get("kind")
        if kind == "byte":
            return ByteTokenizer()
        chars = meta.get("chars")
        if kind != "char" or not isinstance(chars, list):
            raise CheckpointError(f"{path}: not a character or byte vocabulary")
        if not all(isinstance(c, str) and len(c) == 1 for c in chars) or len(set(chars)) != len(
            chars
        ):
            raise CheckpointError(f"{path}: 'chars' must be distinct single characters")
        return CharTokenizer(chars)


class CharTokenizer(_Charset):
    """One id per character of the training text (sorted, after the special ids); a character
    the training text lacks encodes as UNK."""

    kind = "char"

    def __init__(self, chars: Sequence[str]) -> None:
        self.chars = list(chars)
        self.index = {c: i + N_SPECIAL for i, c in enumerate(self.chars)}

    @classmethod
    def fit(cls, texts: Iterable[str]) -> CharTokenizer:
        seen: set[str] = set()
        for text in texts:
            seen.update(text)
        if not seen:
            raise DataError("cannot build a character vocabulary from empty text")
        if len(seen) > MAX_CHARS:
            raise DataError(
                f"the text has {len(seen):,} distinct characters (more than {MAX_CHARS:,}): "
                "use train.tokenizer = 'byte' or 'bpe'"
            )
        return cls(sorted(seen))

    @property
    def vocab_size(self) -> int:
        return N_SPECIAL + len(self.chars)

    def ids(self, text: str) -> list[int]:
        get, unk = self.index.get, self.unk_id
        return [get(c, unk) for c in text]

    def text(self, ids: Sequence[int]) -> str:
        n = len(self.chars)
        return "".join(
            self.chars[i - N_SPECIAL] if 0 <= i - N_SPECIAL < n else "\ufffd"
            for i in map(int, ids)
            if i == self.unk_id or i >= N_SPECIAL
        )

    def pieces(self, ids: Sequence[int]) -> list[str]:
        n = len(self.chars)
        return [
            self.chars[i - N_SPECIAL] if 0 <= i - N_SPECIAL < n else SPECIALS[i]
            for i in map(int, ids)
        ]

    def save(self, directory: str | Path) -> Path:
        path = Path(directory) / CHARSET_FILE
        atomic_write_json(path, {"kind": "char", "chars": self.chars})
        return path


class ByteTokenizer(_Charset):
    """One id per UTF-8 byte (byte b is id b + 4): every text, no unknown token. Decoding
    replaces an incomplete character (a sample cut mid-character) with U+FFFD."""

    kind = "byte"

    @property
    def vocab_size(self) -> int:
        return N_SPECIAL + 256

    def ids(self, text: str) -> list[int]:
        return [b + N_SPECIAL for b in text.encode("utf-8")]

    def text(self, ids: Sequence[int]) -> str:
        data = bytes(i - N_SPECIAL for i in map(int, ids) if N_SPECIAL <= i < N_SPECIAL + 256)
        return data.decode("utf-8", errors="replace")

    def pieces(self, ids: Sequence[int]) -> list[str]:
        out = []
        for i in map(int, ids):
            if i < N_SPECIAL:
                out.append(SPECIALS[i])
            else:
                b = i - N_SPECIAL
                out.append(chr(b) if 32 <= b < 127 else f"<0x{b:02X}>")
        return out

    def save(self, directory: str | Path) -> Path:
        path = Path(directory) / CHARSET_FILE
        atomic_write_json(path, {"kind": "byte"})
        return path
