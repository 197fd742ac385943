"""Subword vocabularies: what every part of aiayn reads of one (`Tokenizer`), and its two kinds.

`JointTokenizer` is aiayn's own: one SentencePiece model for source and target (§5.1, §3.4
tying), trained on the training text (BPE or unigram), with byte fallback so that no character
is ever lost to <unk>, and no normalisation, so `decode(encode(s)) == s` for text without runs
of spaces. It is trained with aiayn's special-id layout (`aiayn.config.PAD_ID`, ...).

`MarianTokenizer` is an imported OPUS-MT model's (`aiayn import marian`): two SentencePiece
models, `source.spm` for sources and `target.spm` for targets, over one shared vocabulary
`vocab.json` that maps piece strings to ids (they are not the SentencePiece models' own ids).
Marian's layout: EOS 0, PAD the last id, and decoding starts from PAD.

Either owns its ids: `tok.pad_id`, `tok.bos_id`, `tok.eos_id`, which a model trained on it
records. `Tokenizer.load(dir)` reads whichever kind a model directory holds.
"""

from __future__ import annotations

import io
import re
from abc import ABC, abstractmethod
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Literal

import sentencepiece as spm

from aiayn.atomic import atomic_write_bytes, atomic_write_json, read_json_object
from aiayn.config import BOS_ID, EOS_ID, PAD_ID, UNK_ID, ModelConfig
from aiayn.errors import CheckpointError, DataError

TOKENIZER_FILE = "tokenizer.model"  # a JointTokenizer
# A MarianTokenizer: the names Hugging Face's MarianTokenizer uses.
MARIAN_FILES = ("source.spm", "target.spm", "vocab.json")
HF_TOKENIZER_FILE = "hf_tokenizer.json"  # `tokenizers` JSON: GPT-2's BPE or BERT's WordPiece
TOKENIZER_FILES = (  # every file a tokenizer may save
    TOKENIZER_FILE,
    *MARIAN_FILES,
    "charset.json",
    HF_TOKENIZER_FILE,
)

Side = Literal["source", "target"]
MASK_PIECE = "<mask>"  # `Tokenizer.train(mask=True)`'s piece for BERT's [MASK]
SIDES: tuple[Side, Side] = ("source", "target")


class Tokenizer(ABC):
    """What aiayn reads of a vocabulary: ids of text, text of ids, the special ids, files.

    `Tokenizer.train(...)` trains aiayn's own (a `JointTokenizer`); `Tokenizer.load(dir)`
    reads either kind from a model directory.
    """

    pad_id: int
    bos_id: int  # the token the decoder starts from
    eos_id: int
    samples = False  # has `sample_batch` (subword regularization)
    # the piece a masked language model reads in place of the tokens it predicts (BERT's
    # [MASK]); None: this vocabulary has none (a translator's, say)
    mask_id: int | None = None

    @staticmethod
    def train(
        texts: Iterable[str],
        vocab_size: int = 8000,
        model_type: str = "bpe",
        *,
        seed_sentences: int = 2_000_000,
        exact: bool = False,
        mask: bool = False,
    ) -> Tokenizer:
        """Train a joint vocabulary on `texts` (source and target lines together).

        `vocab_size` is an upper bound: on small corpora SentencePiece cannot reach it, so we
        retry with the largest size the data supports (it names that size in its error).
        `exact`: no space added in front of a text, and runs of spaces kept, so that any text
        (a language model's, newlines included: as bytes) decodes back to itself exactly.
        `mask`: a MASK_PIECE of its own, for masked-language-model pre-training (`mask_id`).
        """
        return JointTokenizer.train_joint(
            texts, vocab_size, model_type, seed_sentences=seed_sentences, exact=exact, mask=mask
        )

    @staticmethod
    def load(path: str | Path) -> Tokenizer:
        """From a model directory (its `tokenizer.model`, or Marian's `source.spm`,
        `target.spm` and `vocab.json`) or a `.model` file."""
        path = Path(path)
        if path.is_dir() and (path / "charset.json").is_file():  # a language model's
            import importlib  # by name: charset imports this module (no import cycle)

            charset = importlib.import_module("aiayn.text.charset")
            return charset._Charset.load_file(path / charset.CHARSET_FILE)  # type: ignore[no-any-return]
        if path.is_dir() and (path / HF_TOKENIZER_FILE).is_file():  # aiayn import gpt2/bert's
            import importlib  # by name: bert_tokenizer imports this module (no import cycle)

            # GPT-2's byte-level BPE or BERT's WordPiece: the file's model says which
            hf = importlib.import_module("aiayn.text.bert_tokenizer")
            loaded: Tokenizer = hf.load_tokenizers_file(path / HF_TOKENIZER_FILE)
            return loaded
        if path.is_dir() and not (path / TOKENIZER_FILE).exists():
            if any((path / name).exists() for name in MARIAN_FILES):
                return MarianTokenizer.load_dir(path)
            raise CheckpointError(
                f"no tokenizer at {path} ({TOKENIZER_FILE}, or {' + '.join(MARIAN_FILES)})"
            )
        return JointTokenizer.load_file(path / TOKENIZER_FILE if path.is_dir() else path)

    @abstractmethod
    def save(self, directory: str | Path) -> Path:
        """Write the tokenizer's files into `directory` (each atomically); returns the first."""

    @property
    @abstractmethod
    def vocab_size(self) -> int: ...

    @property
    def special_ids(self) -> dict[str, int]:
        """The ids a model trained on this vocabulary records (ModelConfig fields)."""
        return {"pad_id": self.pad_id, "bos_id": self.bos_id, "eos_id": self.eos_id}

    def check_fits(self, cfg: ModelConfig, where: str = "") -> None:
        """Raise unless a model with `cfg` was trained on this vocabulary (its size and special
        ids); `where` (a directory) starts the message."""
        prefix = f"{where}: " if where else ""
        if self.vocab_size != cfg.vocab_size:
            raise CheckpointError(
                f"{prefix}the tokenizer has {self.vocab_size} pieces but the model expects "
                f"{cfg.vocab_size}: they come from different runs"
            )
        model_ids = {k: getattr(cfg, k) for k in self.special_ids}
        if self.special_ids != model_ids:
            raise CheckpointError(
                f"{prefix}the tokenizer's special ids {self.special_ids} differ from the model's "
                f"{model_ids}: they come from different runs"
            )

    def encode(
        self, text: str, *, bos: bool = False, eos: bool = True, side: Side = "source"
    ) -> list[int]:
        """Subword ids of `text`; EOS appended by default (sources and targets both end in it).

        This is the one place aiayn adds BOS and EOS: a source is ids + EOS, a training
        target BOS + ids + EOS (`aiayn.text.data.Example`). `side="target"` encodes a target
        (only a MarianTokenizer splits the two sides differently)."""
        return self.encode_batch([text], bos=bos, eos=eos, side=side)[0]

    def cut(self, ids: list[int], max_len: int) -> list[int]:
        """A source `ids` (ending in EOS) that fits `max_len` positions: unchanged, or its
        first max_len - 1 tokens and EOS (what translate and explain feed a model)."""
        return ids if len(ids) <= max_len else [*ids[: max_len - 1], self.eos_id]

    @abstractmethod
    def encode_batch(
        self, texts: Sequence[str], *, bos: bool = False, eos: bool = True, side: Side = "source"
    ) -> list[list[int]]: ...

    def sample_batch(
        self, texts: Sequence[str], alpha: float, seed: int, *, bos: bool = False, eos: bool = True
    ) -> list[list[int]]:
        """`encode_batch`, each text segmented by sampling instead of the one best way:
        subword regularization (Kudo, 2018; for BPE, BPE-dropout: Provilkov et al., 2020,
        every merge skipped with probability `alpha`). The same `seed` gives the same ids, and
        `decode` gives the texts back. Only aiayn's own tokenizer samples (`samples`)."""
        raise DataError(f"a {type(self).__name__} cannot sample segmentations")

    @abstractmethod
    def decode(self, ids: Sequence[int]) -> str:
        """Text of `ids`, stopping at the first EOS and skipping PAD and BOS."""

    @abstractmethod
    def pieces(self, ids: Sequence[int]) -> list[str]:
        """The subword strings of `ids`, for labelling attention pictures and traces."""

    def _content(self, ids: Sequence[int]) -> list[int]:
        """`ids` up to the first EOS, without PAD and BOS."""
        out = []
        for i in ids:
            i = int(i)
            if i == self.eos_id:
                break
            if i not in (self.pad_id, self.bos_id):
                out.append(i)
        return out


# SentencePiece's call on a list sets up its thread pool each time: 30-40 us of CPU a call
# against ~6 us a short sentence (one thread). A server's requests hold a few
# sentences each, so fewer than this many are encoded one call each (the same ids).
ONE_BY_ONE = 32


class JointTokenizer(Tokenizer):
    """One SentencePiece model for both sides, with aiayn's special-token conventions.

    Its model is BPE or unigram (text segmented by the vocabulary), or "word" (text that comes
    segmented, its pieces between spaces: each is one entry); a word vocabulary has one
    segmentation of a text, so it cannot sample others (`samples` is False).
    """

    def __init__(self, proto: bytes) -> None:
        self.proto = proto
        self.sp = spm.SentencePieceProcessor()
        try:
            self.sp.LoadFromSerializedProto(proto)
        except (RuntimeError, OSError, TypeError) as e:
            raise CheckpointError(f"not a SentencePiece model: {e}") from None
        try:  # the Python binding names no model type; a word model refuses to sample
            self.sp.encode("a", enable_sampling=True, alpha=0.1, nbest_size=-1)
            self.samples = True
        except RuntimeError:
            self.samples = False
        # The vocabulary owns its special ids; a model records them (ModelConfig.pad_id/...),
        # and every other part of aiayn reads them from one of the two, never from constants.
        self.pad_id, self.bos_id, self.eos_id = self.sp.pad_id(), self.sp.bos_id(), self.sp.eos_id()
        missing = [
            n
            for n, i in (("pad", self.pad_id), ("bos", self.bos_id), ("eos", self.eos_id))
            if i < 0
        ]
        if missing:
            raise CheckpointError(f"the tokenizer defines no {'/'.join(missing)} piece")
        mask_id = self.sp.piece_to_id(MASK_PIECE)
        self.mask_id = mask_id if mask_id != self.sp.unk_id() else None

    @classmethod
    def train_joint(
        cls,
        texts: Iterable[str],
        vocab_size: int = 8000,
        model_type: str = "bpe",
        *,
        seed_sentences: int = 2_000_000,
        exact: bool = False,
        mask: bool = False,
    ) -> JointTokenizer:
        """`Tokenizer.train`: SentencePiece trained on both sides' lines together."""
        if model_type not in ("bpe", "unigram", "word"):
            raise DataError(f"model_type={model_type!r}: choose 'bpe', 'unigram' or 'word'")
        lines = [t for t in texts if t.strip()]
        if not lines:
            raise DataError("cannot train a tokenizer on empty text")
        if vocab_size < 256 + 4:  # SentencePiece fails below it with an INTERNAL error
            raise DataError(
                f"vocab_size={vocab_size} is too small: a vocabulary needs at least "
                "260 pieces (256 byte-fallback pieces and the 4 special tokens), "
                "and one more for each distinct character"
            )
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
                    user_defined_symbols=[MASK_PIECE] if mask else [],
                    byte_fallback=True,  # unseen characters become bytes, never <unk>
                    character_coverage=1.0,
                    normalization_rule_name="identity",  # keep text as written: exact round trip
                    add_dummy_prefix=not exact,
                    remove_extra_whitespaces=not exact,
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
    def load_file(cls, path: Path) -> JointTokenizer:
        try:
            return cls(path.read_bytes())
        except FileNotFoundError:
            raise CheckpointError(f"no tokenizer at {path}") from None

    # --- use -----------------------------------------------------------------------------------

    @property
    def vocab_size(self) -> int:
        return self.sp.get_piece_size()

    def encode_batch(
        self, texts: Sequence[str], *, bos: bool = False, eos: bool = True, side: Side = "source"
    ) -> list[list[int]]:
        pre, post = [self.bos_id] if bos else [], [self.eos_id] if eos else []
        if len(texts) < ONE_BY_ONE:
            encoded = [self.sp.encode(text, out_type=int) for text in texts]
        else:
            encoded = self.sp.encode(list(texts), out_type=int)
        return [pre + ids + post for ids in encoded]

    def sample_batch(
        self, texts: Sequence[str], alpha: float, seed: int, *, bos: bool = False, eos: bool = True
    ) -> list[list[int]]:
        pre, post = [self.bos_id] if bos else [], [self.eos_id] if eos else []
        # SentencePiece's sampler has one process-wide generator, and its threads draw from it
        # in no fixed order: seeded here and on one thread, the ids depend on the seed alone.
        spm.set_random_generator_seed(seed)
        encoded = self.sp.encode(
            list(texts),
            out_type=int,
            enable_sampling=True,
            alpha=alpha,
            nbest_size=-1,
            num_threads=1,
        )
        return [pre + ids + post for ids in encoded]

    def decode(self, ids: Sequence[int]) -> str:
        text = self.sp.decode(self._content(ids))
        if self.samples:
            return text
        # A word vocabulary spells an unseen piece in bytes, the space marker U+2581 in front
        # included, which SentencePiece decodes as that character: as a space here.
        return " ".join(text.replace("\u2581", " ").split())

    def pieces(self, ids: Sequence[int]) -> list[str]:
        return [self.sp.id_to_piece(int(i)) for i in ids]


class MarianTokenizer(Tokenizer):
    """Marian's (OPUS-MT's) tokenizer: `source.spm` splits sources, `target.spm` targets, and
    both pieces map through one shared `vocab.json` (piece -> id; a piece missing from it is
    <unk>). As in Hugging Face's MarianTokenizer: a source may start with a target-language
    code such as ">>fra<<" (multilingual models), which is one token, and EOS is appended;
    nothing is added at the front. Decoding starts from PAD (Marian's decoder start), so
    `bos_id == pad_id`.
    """

    def __init__(self, source_proto: bytes, target_proto: bytes, vocab: dict[str, int]) -> None:
        self.protos = (source_proto, target_proto)
        self.models: dict[str, spm.SentencePieceProcessor] = {}  # "source", "target"
        for side, proto, name in zip(SIDES, self.protos, MARIAN_FILES[:2], strict=True):
            model = spm.SentencePieceProcessor()
            try:
                model.LoadFromSerializedProto(proto)
            except (RuntimeError, OSError, TypeError) as e:
                raise CheckpointError(f"{name} is not a SentencePiece model: {e}") from None
            self.models[side] = model
        self.vocab = check_marian_vocab(vocab)
        self.id_to_piece = {i: piece for piece, i in vocab.items()}
        self.unk_id = vocab["<unk>"]
        self.pad_id = self.bos_id = vocab["<pad>"]
        self.eos_id = vocab["</s>"]

    def save(self, directory: str | Path) -> Path:
        directory = Path(directory)
        for name, proto in zip(MARIAN_FILES[:2], self.protos, strict=True):
            atomic_write_bytes(directory / name, proto)
        atomic_write_json(directory / MARIAN_FILES[2], self.vocab)
        return directory / MARIAN_FILES[0]

    @classmethod
    def load_dir(cls, directory: Path) -> MarianTokenizer:
        """From `source.spm`, `target.spm` and `vocab.json` in `directory`."""
        missing = [name for name in MARIAN_FILES if not (directory / name).is_file()]
        if missing:
            raise CheckpointError(f"{directory} has no {', '.join(missing)} (a Marian tokenizer)")
        path = directory / MARIAN_FILES[2]
        vocab = read_json_object(path)
        src, tgt = ((directory / name).read_bytes() for name in MARIAN_FILES[:2])
        return cls(src, tgt, vocab)

    @property
    def vocab_size(self) -> int:
        return len(self.vocab)

    def encode_batch(
        self, texts: Sequence[str], *, bos: bool = False, eos: bool = True, side: Side = "source"
    ) -> list[list[int]]:
        pre, post = [self.bos_id] if bos else [], [self.eos_id] if eos else []
        sp, out = self.models[side], []
        for text in texts:
            code, text = _language_code(text)
            found = code + sp.encode(text, out_type=str)
            out.append(pre + [self.vocab.get(p, self.unk_id) for p in found] + post)
        return out

    def decode(self, ids: Sequence[int]) -> str:
        # Marian decodes with the target model; a piece that model does not know (from the
        # source side of the shared vocabulary) comes out as written, "▁" as a space.
        text = self.models["target"].decode_pieces(self.pieces(self._content(ids)))
        return text.replace("\u2581", " ").strip()

    def pieces(self, ids: Sequence[int]) -> list[str]:
        return [self.id_to_piece.get(int(i), "<unk>") for i in ids]


def check_marian_vocab(vocab: object) -> dict[str, int]:
    """`vocab` as a piece -> id dict whose ids are exactly 0 .. n-1, with Marian's specials."""
    if not isinstance(vocab, dict) or not all(
        isinstance(k, str) and isinstance(v, int) and not isinstance(v, bool)
        for k, v in vocab.items()
    ):
        raise CheckpointError("vocab.json must map piece strings to integer ids")
    missing = [p for p in ("</s>", "<unk>", "<pad>") if p not in vocab]
    if missing:
        raise CheckpointError(f"vocab.json has no {', '.join(missing)} piece")
    if sorted(vocab.values()) != list(range(len(vocab))):
        raise CheckpointError(
            f"vocab.json's ids are not 0 .. {len(vocab) - 1}, each once (a gap or a repeat)"
        )
    return vocab


def _language_code(text: str) -> tuple[list[str], str]:
    """A leading target-language code (">>fra<<") split off, as Hugging Face does."""
    if text.startswith(">>") and (end := text.find("<<")) != -1:
        return [text[: end + 2]], text[end + 2 :]
    return [], text
