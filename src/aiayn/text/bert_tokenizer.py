"""BERT's WordPiece, run by Hugging Face's `tokenizers` library (`aiayn import bert`).

    BertTokenizer.from_hf_dir(dir)   a BERT directory's tokenizer.json, or vocab.txt (built as
                                     transformers' BertTokenizerFast builds it)
    load_tokenizers_file(path)       a model directory's `hf_tokenizer.json`: a BertTokenizer
                                     or GPT-2's HFTokenizer, by the model the file holds

BERT normalises a text (cleans control characters, spaces out CJK characters, lower-cases and
strips accents for an uncased model), splits it at spaces and punctuation, and spells each word
in the longest vocabulary pieces from its start, "##" marking a piece inside a word; a word it
cannot spell is [UNK]. Both BERT's files give the same pipeline, saved as the library's own
JSON (`hf_tokenizer.json`, the GPT-2 tokenizer's file name: the file says which it is) and read
back with no pickle.

BERT's special tokens take aiayn's roles: [CLS] is BOS (a classifier input starts with it and
pools its output), [SEP] is EOS, [PAD] is PAD and [MASK] is `mask_id`. `encode` adds only what
aiayn asks for, so `classifier_ids` gives "[CLS] text [SEP]", as Hugging Face's tokenizer does
for one sentence.
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from aiayn.atomic import read_json_object
from aiayn.errors import AiaynError, CheckpointError

try:  # a dependency of transformers, and of aiayn's `test` extra; not of aiayn itself
    from tokenizers import AddedToken, decoders, models, normalizers, pre_tokenizers
    from tokenizers import Tokenizer as HFLibTokenizer
except ImportError:  # pragma: no cover
    raise AiaynError(
        "BERT's tokenizer needs Hugging Face's `tokenizers` library: pip install tokenizers"
    ) from None
from aiayn.text.hf_tokenizer import HFTokenizer, LibTokenizer
from aiayn.text.tokenizer import Tokenizer

# aiayn's role -> BERT's token; every BERT checkpoint Google and Hugging Face publish names
# them so (a tokenizer_config.json naming others is refused at import)
SPECIALS = {"bos_id": "[CLS]", "eos_id": "[SEP]", "pad_id": "[PAD]", "mask_id": "[MASK]"}
UNK = "[UNK]"
HF_JSON, HF_VOCAB, HF_TOKENIZER_CONFIG = "tokenizer.json", "vocab.txt", "tokenizer_config.json"
# tokenizer_config.json's key for each special token
CONFIG_KEYS = {
    "cls_token": "[CLS]",
    "sep_token": "[SEP]",
    "pad_token": "[PAD]",
    "mask_token": "[MASK]",
    "unk_token": UNK,
}


class BertTokenizer(LibTokenizer):
    """A `tokenizers` WordPiece with BERT's special tokens as aiayn's: [CLS] = BOS, [SEP] = EOS,
    [PAD] = PAD, [MASK] = `mask_id`. Padding and truncation set in the file are switched off:
    aiayn pads and cuts (`classifier_ids`)."""

    def __init__(self, tok: HFLibTokenizer) -> None:
        self.tok = tok
        tok.no_padding()
        tok.no_truncation()
        found = {t: tok.token_to_id(t) for t in CONFIG_KEYS.values()}
        missing = [t for t, i in found.items() if i is None]
        if missing:
            raise CheckpointError(f"the WordPiece vocabulary has no {', '.join(missing)} token")
        ids = {role: int(found[t] or 0) for role, t in SPECIALS.items()}  # none is None
        self.bos_id, self.eos_id = ids["bos_id"], ids["eos_id"]
        self.pad_id, self.mask_id = ids["pad_id"], ids["mask_id"]
        special = {t.content for t in tok.get_added_tokens_decoder().values() if t.special}
        if not special >= {*SPECIALS.values(), UNK}:
            # a vocab.txt lists them as ordinary pieces: made special, a literal "[MASK]" in a
            # text is that one token, as in BertTokenizerFast
            tok.add_special_tokens([AddedToken(t, special=True) for t in CONFIG_KEYS.values()])

    # --- reading and writing -----------------------------------------------------------------

    @classmethod
    def from_hf_dir(cls, hf_dir: Path) -> BertTokenizer | None:
        """The tokenizer of a Hugging Face BERT directory: tokenizer.json, else vocab.txt with
        tokenizer_config.json's settings; None when it has neither. Special tokens named other
        than BERT's are refused in one line."""
        settings = _read_settings(hf_dir)
        if (hf_dir / HF_JSON).is_file():
            return cls.load_file(hf_dir / HF_JSON)
        if not (hf_dir / HF_VOCAB).is_file():
            return None
        try:
            vocab = models.WordPiece.read_file(str(hf_dir / HF_VOCAB))
        except Exception as e:  # the library raises plain Exceptions for malformed files
            raise CheckpointError(f"{hf_dir}: unreadable {HF_VOCAB} ({e})") from None
        tok = HFLibTokenizer(models.WordPiece(vocab, unk_token=UNK, max_input_chars_per_word=100))
        # BertTokenizerFast's defaults; strip_accents None = follow lowercase
        tok.normalizer = normalizers.BertNormalizer(
            clean_text=True,
            handle_chinese_chars=bool(settings.get("tokenize_chinese_chars", True)),
            strip_accents=settings.get("strip_accents"),
            lowercase=bool(settings.get("do_lower_case", True)),
        )
        tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        tok.decoder = decoders.WordPiece(prefix="##")
        return cls(tok)

    @classmethod
    def load_file(cls, path: Path) -> BertTokenizer:
        """From a `tokenizers` JSON file holding a WordPiece model."""
        return cls(_from_json(_read_text(path), path))

    # --- use -----------------------------------------------------------------------------------

    def decode(self, ids: Sequence[int]) -> str:
        """Text of `ids` up to the first [SEP], [CLS] and [PAD] skipped, "##" pieces joined (an
        uncased model's text comes back lower-cased); [MASK] and [UNK] stay as written."""
        return self.tok.decode(self._content(ids), skip_special_tokens=False)

    def pieces(self, ids: Sequence[int]) -> list[str]:
        """The WordPiece pieces ("##ing" for a piece inside a word)."""
        return [self.tok.id_to_token(int(i)) or UNK for i in ids]


def _read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise CheckpointError(f"no tokenizer at {path}") from None
    except UnicodeDecodeError:
        raise CheckpointError(f"{path} is not a tokenizers JSON file (not UTF-8)") from None


def _from_json(text: str, path: Path) -> HFLibTokenizer:
    """The library's tokenizer in `text` (the file `path`'s), checked to be a WordPiece."""
    if model_type(text, path) != "WordPiece":
        raise CheckpointError(f"{path} holds no WordPiece model (BERT's tokenizer)")
    try:
        return HFLibTokenizer.from_str(text)
    except Exception as e:  # the library raises plain Exceptions for malformed JSON
        raise CheckpointError(f"{path} is not a tokenizers JSON file ({e})") from None


def model_type(text: str, path: Path) -> str:
    """The `model.type` of a `tokenizers` JSON file's text ("BPE", "WordPiece", ...)."""
    try:
        found = json.loads(text).get("model", {}).get("type")
    except (json.JSONDecodeError, AttributeError):
        raise CheckpointError(f"{path} is not a tokenizers JSON file") from None
    if not isinstance(found, str):
        raise CheckpointError(f"{path} is not a tokenizers JSON file (no model.type)")
    return found


def _read_settings(hf_dir: Path) -> dict[str, Any]:
    """tokenizer_config.json (or nothing), its special tokens checked to be BERT's."""
    path = hf_dir / HF_TOKENIZER_CONFIG
    settings = read_json_object(path) if path.is_file() else {}
    for key, ours in CONFIG_KEYS.items():
        named = settings.get(key, ours)
        named = named.get("content") if isinstance(named, dict) else named
        if named != ours:
            raise CheckpointError(
                f"{path}: {key}={named!r}; aiayn reads BERT's special tokens as "
                f"{', '.join(CONFIG_KEYS.values())}"
            )
    return settings


def load_tokenizers_file(path: Path) -> Tokenizer:
    """A model directory's `hf_tokenizer.json`: BERT's WordPiece (a BertTokenizer) or GPT-2's
    byte-level BPE (an HFTokenizer), by the model the file holds."""
    if (path.parent / "hf_special_ids.json").is_file():  # aiayn import llama's: ids beside it
        return importlib.import_module("aiayn.interop.llama").LlamaTokenizer.load_file(path)  # type: ignore[no-any-return]
    text = _read_text(path)
    if model_type(text, path) == "WordPiece":
        return BertTokenizer(_from_json(text, path))
    return HFTokenizer.load_file(path)
