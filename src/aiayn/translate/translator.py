"""Text in, text out: `Translator.load(dir).translate(["Hallo Welt"], beam=4) -> list[str]`.

The translator reads lines (a list, a file or a stream), encodes them, sorts each buffer of
lines by length and cuts it into batches under a token budget (so padding stays small), runs
the search of `aiayn.search.decode`, and gives back exactly one result per input line, in input
order. Empty (or blank) lines translate to empty lines without touching the model.

A source longer than the model's positional table (`max_len` tokens) cannot be encoded: it is
truncated to its first `max_len - 1` tokens plus EOS, with a warning that names the line.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from aiayn.config import MAX_ROWS, DecodeConfig, check_decode_config, search_rows
from aiayn.errors import DataError
from aiayn.nn.model import Transformer
from aiayn.runtime.device import Precision, choose_precision
from aiayn.search.decode import search
from aiayn.search.hypothesis import Hypothesis
from aiayn.search.sampling import sample_seed
from aiayn.store.directory import ModelDir, load_for_decoding
from aiayn.text.batches import cut_batches, pad_rows
from aiayn.text.corpus import source_text
from aiayn.text.tokenizer import Tokenizer

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Translation:
    """One output: its detokenized text and the search hypothesis it came from."""

    text: str
    hyp: Hypothesis
    src_tokens: int = 0  # the source's length in tokens, its EOS included (0 for an empty line)


# --- reading text ---------------------------------------------------------------------------------


def one_line(text: str) -> str:
    """Keep one output line per input line, whatever characters the model emits."""
    return " ".join(text.splitlines()) if text else text


# --- batching -------------------------------------------------------------------------------------


# A batch's search rows (sentences x beam or samples) at most: the token budget counts source
# tokens, and beam 400 on 2,048 of them (~40,000 rows of caches and logits) took 16 GB for a
# 500-word model. Beam 5 on Multi30k's ~15-token sentences (~680 rows) is not cut.
MAX_BATCH_ROWS = MAX_ROWS  # one sentence's widest search fills a batch


def token_budget_batches(
    lengths: Sequence[int], max_tokens: int, max_count: int | None = None
) -> list[list[int]]:
    """Indices grouped into batches of similar length, longest first, each with at most
    `max_tokens` tokens counting padding (a single longer sentence gets a batch of its own)
    and at most `max_count` sentences."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    return cut_batches(order, lengths, max_tokens, max_count)


class Translator:
    """A trained `Transformer` with its tokenizer and default search settings."""

    def __init__(
        self,
        model: Transformer,
        tokenizer: Tokenizer,
        cfg: DecodeConfig | None = None,
        precision: Precision | None = None,
    ) -> None:
        tokenizer.check_fits(model.cfg)
        # An exported model's engine (aiayn.interop.engines) is no torch module: it runs on the CPU.
        is_torch = isinstance(model, torch.nn.Module)
        self.model = model.eval() if is_torch else model
        self.tokenizer = tokenizer
        self.cfg = cfg or DecodeConfig()
        check_decode_config(self.cfg, model.cfg.vocab_size)  # e.g. a saved beam wider than it
        self.device = next(model.parameters()).device if is_torch else torch.device("cpu")
        self.precision = precision or choose_precision("fp32", self.device)

    @classmethod
    def load(
        cls,
        directory: str | Path | ModelDir,
        cfg: DecodeConfig | None = None,
        device: str | torch.device = "auto",
        dtype: str = "auto",
    ) -> Translator:
        """From a model directory (`config.json`, `model.safetensors`, `tokenizer.model`), or
        one already opened (`aiayn.store.directory.ModelDir`).

        Without `cfg`, the search settings are the `[decode]` table of the run that made the
        model (`run_config.json`, kept by `aiayn train` and `aiayn average`), else the defaults.
        `device` is auto | cpu | cuda | cuda:N | mps (auto: a GPU if there is one); `dtype`
        auto | fp32 | bf16 (auto: bf16 autocast on a GPU with native bf16, else fp32).
        """
        opened, model, precision = load_for_decoding(directory, Transformer, device, dtype)
        return cls(model, opened.tokenizer, cfg or opened.decode, precision)

    def settings(self, beam: int | None = None, **overrides: object) -> DecodeConfig:
        """The default search settings with `beam` and any DecodeConfig field replaced."""
        if beam is not None:
            overrides["beam_size"] = beam
        cfg = dataclasses.replace(self.cfg, **overrides)  # type: ignore[arg-type]
        check_decode_config(cfg, self.model.cfg.vocab_size)
        return cfg

    def translate(
        self,
        lines: Sequence[str],
        beam: int | None = None,
        *,
        batch_tokens: int = 2048,
        **overrides: object,
    ) -> list[str]:
        """The best translation of each line, e.g. `translate(["Hallo Welt"], beam=4)`.

        Keyword overrides are DecodeConfig fields (`alpha=1.0`, `sample=True, top_p=0.9`...).
        """
        cfg = self.settings(beam, **overrides)
        return [r[0].text for r in self.translate_hyps(lines, cfg, batch_tokens=batch_tokens)]

    def translate_hyps(
        self,
        lines: Sequence[str],
        cfg: DecodeConfig,
        *,
        batch_tokens: int = 2048,
        first_line_no: int = 1,
    ) -> list[list[Translation]]:
        """The `cfg.nbest` best translations of each line (one for an empty line), best first.

        `first_line_no` is the line number of `lines[0]` in its file: sampling seeds each line
        with `sample_seed(cfg.seed, line number)`.
        """
        check_decode_config(cfg, self.model.cfg.vocab_size)
        if batch_tokens < 1:
            raise DataError(f"batch_tokens must be at least 1, got {batch_tokens}")
        if isinstance(lines, str) or not all(isinstance(line, str) for line in lines):
            # a str is a sequence too: translate("Hallo") translated each of its characters
            raise TypeError("translate takes a list of sentences (str), e.g. translate([text])")
        results: list[list[Translation]] = [
            [Translation("", Hypothesis([], 0.0, 0.0, True))] for _ in lines
        ]
        todo, ids = self.encode_lines(lines, first_line_no)
        line_nos = [first_line_no + i for i in todo]
        found = self._search(ids, line_nos, cfg, batch_tokens)
        for i, src, hyps in zip(todo, ids, found, strict=True):
            results[i] = [
                Translation(one_line(self.tokenizer.decode(h.tokens)), h, len(src)) for h in hyps
            ]
        return results

    def _search(
        self, ids: list[list[int]], line_nos: list[int], cfg: DecodeConfig, batch_tokens: int
    ) -> list[list[Hypothesis]]:
        """The hypotheses of each encoded line, in order: token-budget batches through
        `aiayn.search.decode` (an exported model's translator replaces only this)."""
        found: list[list[Hypothesis]] = [[] for _ in ids]
        per_batch = max(1, MAX_BATCH_ROWS // search_rows(cfg))
        for batch in token_budget_batches([len(x) for x in ids], batch_tokens, per_batch):
            src_BS = self.pad([ids[j] for j in batch])
            # Each sentence samples from its own stream, seeded by its line number, so batching
            # and buffering do not change what it draws.
            seeds = [sample_seed(cfg.seed, line_nos[j]) for j in batch]
            with self.precision.autocast():
                hyps = search(self.model, src_BS, cfg, row_seeds=seeds)
            for j, h in zip(batch, hyps, strict=True):
                found[j] = h
        return found

    def translate_stream(
        self,
        lines: Iterable[str],
        cfg: DecodeConfig,
        *,
        batch_tokens: int = 2048,
        buffer_size: int = 1024,
        progress: Callable[[int], object] | None = None,
    ) -> Iterator[list[Translation]]:
        """Translate a (possibly endless) stream, `buffer_size` lines at a time, in order.

        Each buffer is sorted and batched on its own, so memory stays bounded and output
        appears after every buffer; `progress(n)` is called with each buffer's line count.
        """
        buffer: list[str] = []
        line_no = 1
        for line in lines:
            buffer.append(line)
            if len(buffer) >= buffer_size:
                yield from self.translate_hyps(
                    buffer, cfg, batch_tokens=batch_tokens, first_line_no=line_no
                )
                line_no += len(buffer)
                if progress is not None:
                    progress(len(buffer))
                buffer = []
        if buffer:
            yield from self.translate_hyps(
                buffer, cfg, batch_tokens=batch_tokens, first_line_no=line_no
            )
            if progress is not None:
                progress(len(buffer))

    def encode_lines(
        self, lines: Sequence[str], first_line_no: int = 1
    ) -> tuple[list[int], list[list[int]]]:
        """(the indices of the non-empty lines, their source ids): stripped, encoded, and cut
        to what the positional table holds (with a warning naming the line)."""
        texts = [source_text(line) for line in lines]
        todo = [i for i, text in enumerate(texts) if text]
        ids = self.tokenizer.encode_batch([texts[i] for i in todo])
        return todo, [self._fit(x, first_line_no + i) for x, i in zip(ids, todo, strict=True)]

    def pad(self, rows: list[list[int]]) -> torch.Tensor:
        """Source ids as one right-padded batch on the model's device."""
        return pad_rows(rows, self.model.cfg.pad_id).to(self.device)

    def _fit(self, ids: list[int], line_no: int) -> list[int]:
        """Truncate a source the positional table cannot hold, saying so (module docstring)."""
        limit = self.model.cfg.max_len
        if len(ids) <= limit:
            return ids
        log.warning(
            "line %d has %d tokens, more than the model's max_len=%d; "
            "translating only its first %d tokens",
            line_no,
            len(ids) - 1,
            limit,
            limit - 1,
        )
        return self.tokenizer.cut(ids, limit)
