"""Text in, more text out: `Generator.load(dir).generate(["ROMEO:"], max_tokens=200)`.

A decoder-only model (`aiayn.nn.variants.DecoderLM`) continues each prompt through the same
search as the translator (`aiayn.search.decode.search`: greedy, beam or sampling, the KV cache):
its "source" is BOS + the prompt, which the model's `init_cache` runs into the cache.

Positions run out at the model's `max_len`. A prompt longer than the context is cut from the
left (with a warning). An output that outgrows the context continues from the last half of
it, recomputed as a new prompt (nanoGPT crops its context to the block at every step; this
recomputes once per half a block), so sampling and greedy search go on for as long as asked.
Beam search ranks whole hypotheses and stops at the context's end.

Each output row samples from its own generator, seeded by (seed, line number, sample, window),
so the same seed gives the same text, whatever else is in the batch.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from aiayn.config import LM_DEFAULTS, DecodeConfig, check_decode_config
from aiayn.errors import ConfigError
from aiayn.nn.variants import DecoderLM
from aiayn.runtime.device import Precision, choose_precision
from aiayn.search.decode import search
from aiayn.search.hypothesis import Hypothesis
from aiayn.search.sampling import sample_seed
from aiayn.search.step import Decodable
from aiayn.search.step_view import StepView
from aiayn.store.directory import ModelDir, load_for_decoding
from aiayn.text.batches import pad_rows
from aiayn.text.tokenizer import Tokenizer

log = logging.getLogger(__name__)

# Rows searched together: prompts x samples (each row its own KV cache).
BATCH_ROWS = 64

OnToken = Callable[[int, str], None]  # (output row, its new text)


@dataclass(frozen=True)
class Generation:
    """One continuation: its text, its token ids and their summed log-probability."""

    text: str
    tokens: list[int]
    log_prob: float
    prompt_tokens: int  # tokens of the prompt the model saw (after any cut), BOS included
    eos: bool  # it ended with EOS (else at the token limit)


class Generator:
    """A trained `DecoderLM` with its tokenizer and default search settings."""

    def __init__(
        self,
        model: DecoderLM | Decodable,
        tokenizer: Tokenizer,
        cfg: DecodeConfig | None = None,
        precision: Precision | None = None,
    ) -> None:
        # An export's engine (aiayn.interop.lm_engines) is no torch module: it runs on the CPU.
        is_torch = isinstance(model, torch.nn.Module)
        if is_torch and not isinstance(model, DecoderLM):
            raise ConfigError(
                f"a {type(model).__name__} is not a language model (a DecoderLM): "
                "generate needs one (aiayn train --config lm)"
            )
        tokenizer.check_fits(model.cfg)
        self.model: Decodable = model.eval() if isinstance(model, DecoderLM) else model
        self.tokenizer = tokenizer
        self.cfg = cfg or LM_DEFAULTS
        check_decode_config(self.cfg, model.cfg.vocab_size)
        self.device = next(model.parameters()).device if is_torch else torch.device("cpu")  # type: ignore[union-attr]
        self.precision = precision or choose_precision("fp32", self.device)

    @classmethod
    def load(
        cls,
        directory: str | Path | ModelDir,
        cfg: DecodeConfig | None = None,
        device: str | torch.device = "auto",
        dtype: str = "auto",
    ) -> Generator:
        """From a model directory (`aiayn train --config lm`, `aiayn import gpt2`); without
        `cfg`, the search settings saved with it (`aiayn.config.LM_DEFAULTS` if none)."""
        opened, model, precision = load_for_decoding(directory, DecoderLM, device, dtype)
        return cls(model, opened.tokenizer, cfg or opened.decode, precision)

    def settings(self, max_tokens: int | None = None, **overrides: object) -> DecodeConfig:
        """The default settings with any DecodeConfig field replaced; `max_tokens`: new tokens
        per output (the length rule's b, with a = 0)."""
        if max_tokens is not None:
            overrides.update(max_len_a=0.0, max_len_b=max_tokens)
        cfg = dataclasses.replace(self.cfg, **overrides)  # type: ignore[arg-type]
        check_decode_config(cfg, self.model.cfg.vocab_size)
        return cfg

    def generate(
        self, prompts: Sequence[str], max_tokens: int | None = None, **overrides: object
    ) -> list[str]:
        """One continuation of each prompt, e.g. `generate(["ROMEO:"], max_tokens=100)`."""
        cfg = self.settings(max_tokens, **overrides)
        return [g[0].text for g in self.generate_all(prompts, cfg)]

    def prompt_ids(self, text: str, room: int, line_no: int = 1) -> list[int]:
        """BOS + the prompt's ids, cut from the left to leave `room` positions (warned)."""
        ids = [self.tokenizer.bos_id, *self.tokenizer.encode(text, eos=False)]
        keep = max(self.model.cfg.max_len - room, 1)
        if len(ids) > keep:
            log.warning(
                "prompt %d has %d tokens; the model's context holds %d with %d to generate: "
                "it keeps the last %d",
                line_no,
                len(ids),
                self.model.cfg.max_len,
                room,
                keep,
            )
            ids = ids[-keep:]
        return ids

    def generate_all(
        self,
        prompts: Sequence[str],
        cfg: DecodeConfig,
        *,
        first_line_no: int = 1,
        on_token: OnToken | None = None,
    ) -> list[list[Generation]]:
        """`cfg.nbest` continuations of each prompt (samples with `cfg.sample`, else the best
        `nbest` of the beam), in prompt order. `on_token(row, text)` hears each output row's
        new text as it is produced (greedy and sampling; rows are prompt * nbest + sample)."""
        check_decode_config(cfg, self.model.cfg.vocab_size)
        if isinstance(prompts, str) or not all(isinstance(p, str) for p in prompts):
            raise TypeError("generate takes a list of prompts (str), e.g. generate([text])")
        want = min(cfg.max_len_b, cfg.max_tokens) if cfg.max_tokens > 0 else cfg.max_len_b
        half = self.model.cfg.max_len // 2
        # one hypothesis a row (sampling, greedy) goes on past the context; a beam ranks whole
        # hypotheses, within one context
        room = min(want, half) if _one_per_row(cfg) else min(want, self.model.cfg.max_len - 1)
        starts = [self.prompt_ids(p, room, first_line_no + i) for i, p in enumerate(prompts)]
        n = cfg.nbest if cfg.sample else 1
        rows = [(i, k) for i in range(len(prompts)) for k in range(n)]
        row_cfg = dataclasses.replace(cfg, nbest=1) if cfg.sample else cfg
        per_batch = BATCH_ROWS if cfg.sample else max(1, BATCH_ROWS // cfg.beam_size)
        out: list[list[Generation]] = []
        for a in range(0, len(rows), per_batch):
            part = rows[a : a + per_batch]
            seeds = [sample_seed(cfg.seed + 7919 * k, first_line_no + i) for i, k in part]
            out.extend(self._run([starts[i] for i, _ in part], seeds, row_cfg, want, on_token, a))
        if not cfg.sample:
            return out
        return [[g[0] for g in out[i * n : (i + 1) * n]] for i in range(len(prompts))]

    def _run(
        self,
        starts: list[list[int]],
        seeds: list[int],
        cfg: DecodeConfig,
        want: int,
        on_token: OnToken | None,
        first_row: int,
    ) -> list[list[Generation]]:
        """Rows of prompts searched together; sampled rows go on past the context's end from
        the last half of it (module docstring), each a window at a time."""
        tok, half = self.tokenizer, self.model.cfg.max_len // 2
        ctx = [list(s) for s in starts]
        made: list[list[int]] = [[] for _ in starts]
        log_prob = [0.0] * len(starts)
        shown = [0] * len(starts)  # characters of each row's text already heard by on_token
        waited = [0] * len(starts)
        results: list[list[Generation] | None] = [None] * len(starts)
        active, window = list(range(len(starts))), 0

        def heard(view: StepView) -> None:  # each live row's picked token, as text
            assert on_token is not None
            for c in view.candidates:
                r = active[c.sent]
                if c.fate == "pruned" or c.token == tok.eos_id or len(made[r]) >= want:
                    continue
                made[r].append(c.token)
                text = tok.decode(made[r])
                # A character cut mid-way (bytes) decodes as U+FFFD: wait up to 3 more bytes.
                if not text.endswith("\ufffd") or waited[r] >= 3:
                    on_token(first_row + r, text[shown[r] :])
                    shown[r], waited[r] = len(text), 0
                else:
                    waited[r] += 1

        def hear_rest(r: int) -> None:  # what the steps did not say (an engine's whole output)
            if on_token is not None:
                text = tok.decode(made[r])
                if len(text) > shown[r]:
                    on_token(first_row + r, text[shown[r] :])
                    shown[r] = len(text)

        while active:
            left = [want - len(made[r]) for r in active]
            step_cfg = dataclasses.replace(cfg, max_len_a=0.0, max_len_b=max(left), max_tokens=0)
            row_seeds = [sample_seed(seeds[r], window) for r in active]
            before = [list(made[r]) for r in active]
            listen = heard if on_token is not None and _one_per_row(cfg) else None
            found = self._search([ctx[r] for r in active], step_cfg, row_seeds, listen)
            still = []
            for j, r in enumerate(active):
                if not _one_per_row(cfg):  # a beam: one window, the nbest best
                    results[r] = [
                        self._generation(h.tokens, h.log_prob, h.eos, starts[r]) for h in found[j]
                    ]
                    continue
                h = found[j][0]
                new = h.tokens[: left[j]]
                made[r] = before[j] + new
                log_prob[r] += h.log_prob
                hear_rest(r)
                if (h.eos and len(new) == len(h.tokens)) or len(made[r]) >= want:
                    ended = h.eos and len(new) == len(h.tokens)
                    results[r] = [self._generation(made[r], log_prob[r], ended, starts[r])]
                else:  # the context is full: go on from its last half
                    ctx[r] = (ctx[r] + new)[-half:]
                    still.append(r)
            active, window = still, window + 1
        return [r for r in results if r is not None]

    def _search(
        self,
        rows: list[list[int]],
        cfg: DecodeConfig,
        row_seeds: list[int],
        on_step: Callable[[StepView], None] | None,
    ) -> list[list[Hypothesis]]:
        """One window of the search over `rows` (BOS + prompt, or a context going on): what
        an export's engine replaces (aiayn.interop.export_lm_ct2)."""
        src_BS = pad_rows(rows, self.model.cfg.pad_id).to(self.device)
        with self.precision.autocast():
            return search(self.model, src_BS, cfg, row_seeds=row_seeds, on_step=on_step)

    def _generation(
        self, tokens: list[int], log_prob: float, eos: bool, prompt: list[int]
    ) -> Generation:
        return Generation(self.tokenizer.decode(tokens), tokens, log_prob, len(prompt), eos)


def _one_per_row(cfg: DecodeConfig) -> bool:
    """Sampling or greedy: each output one row of the search, which can go on past the
    context from its last half (module docstring)."""
    return cfg.sample or cfg.beam_size == 1
