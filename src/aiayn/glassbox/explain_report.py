"""One sentence of a model traced and rendered: the settings a trace may have (checked before
anything runs), `trace_sentence` (what `aiayn explain` renders and `/v1/explain` sends) and
`explain_report` (what `aiayn explain` prints for a model directory).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from aiayn.config import DecodeConfig, check_decode_config
from aiayn.errors import AiaynError
from aiayn.glassbox.explain import explain, trace_beam
from aiayn.glassbox.explanation import Explanation
from aiayn.glassbox.render import View, to_json_text, to_text
from aiayn.glassbox.render_html import to_html
from aiayn.nn.model import Transformer
from aiayn.runtime.device import resolve_device
from aiayn.store.directory import ModelDir
from aiayn.text.tokenizer import Tokenizer


def trace_settings(
    cfg: DecodeConfig,
    top_k: int,
    max_len: int | None,
    beam: int,
    overrides: dict | None,
    vocab_size: int = 0,
) -> tuple[DecodeConfig, DecodeConfig]:
    """(the traced search's settings, the beam trace's), checked: a one-line AiaynError (with
    `vocab_size`, the model's, also a beam wider than its vocabulary, before any tracing)."""
    if top_k < 1:
        raise AiaynError(f"--top-k must be at least 1, got {top_k}")
    if max_len is not None and max_len < 1:
        raise AiaynError(f"--max-len must be at least 1, got {max_len}")
    if beam < 0:
        raise AiaynError(f"--beam must be >= 0 (0 = no beam trace), got {beam}")
    cfg = dataclasses.replace(cfg, **(overrides or {}))
    beam_cfg = dataclasses.replace(cfg, beam_size=max(beam, 1), nbest=1, sample=False)
    for c in (dataclasses.replace(cfg, beam_size=1, nbest=1), beam_cfg):
        check_decode_config(c, vocab_size)
    return cfg, beam_cfg


def trace_sentence(
    model: Transformer,
    tok: Tokenizer,
    sentence: str,
    cfg: DecodeConfig,
    *,
    top_k: int = 5,
    max_len: int | None = None,
    beam: int = 0,
    overrides: dict[str, object] | None = None,
    want: Callable[[str], bool] | None = None,
    max_numel: int | None = None,
) -> Explanation:
    """The trace `aiayn explain` renders and `aiayn serve`'s /v1/explain sends.

    `cfg` is the model's saved search settings, with `overrides` (DecodeConfig fields)
    replaced; the traced search is greedy, or sampling when `sample` is set, and `beam` > 0
    also traces beam search of that size. `want` and `max_numel`: see
    `aiayn.glassbox.explain.explain`; the beam trace has a budget of `max_numel` of its own
    (`aiayn.glassbox.explain.trace_beam`).
    """
    cfg, beam_cfg = trace_settings(cfg, top_k, max_len, beam, overrides, model.cfg.vocab_size)
    trace = explain(
        model, tok, sentence, top_k=top_k, max_len=max_len, cfg=cfg, want=want, max_numel=max_numel
    )
    if beam:  # warn=False: a sentence cut to the model's length was said by explain, once
        trace.beam = trace_beam(
            model, tok, sentence, beam_cfg, max_len=max_len, max_numel=max_numel, warn=False
        )
    return trace


def explain_report(
    model_dir: str,
    sentence: str,
    *,
    fmt: str = "text",
    view: View | None = None,
    top_k: int = 5,
    max_len: int | None = None,
    beam: int = 0,
    device: str = "auto",
    overrides: dict[str, object] | None = None,
    max_numel: int | None = None,
) -> str:
    """What `aiayn explain` prints: load the model directory onto `device`, trace it with
    `trace_sentence` and the model's saved `[decode]` table (as `aiayn translate` uses), render
    as `fmt` (numbers are computed in fp32 wherever the model runs).

    Only what `view` shows is recorded (the rest would be copied and never printed), and at
    most `max_numel` numbers (`TraceTooLargeError` past it)."""
    where = resolve_device(device)  # a missing device is said before any file is read
    opened = ModelDir.open(model_dir)
    cfg = opened.decode
    trace_settings(cfg, top_k, max_len, beam, overrides)  # bad settings fail before the load
    model = opened.load_model(Transformer, where)
    tok = opened.tokenizer
    trace = trace_sentence(
        model,
        tok,
        sentence,
        cfg,
        top_k=top_k,
        max_len=max_len,
        beam=beam,
        overrides=overrides,
        want=view.shows if view else None,
        max_numel=max_numel,
    )
    render = {"text": to_text, "json": to_json_text, "html": to_html}[fmt]
    return render(trace, view)


def lm_settings(opened: ModelDir, overrides: dict[str, object] | None) -> DecodeConfig:
    """A language model's search settings, as `aiayn generate` takes them (the directory's
    saved `[decode]` table, else `LM_DEFAULTS`), with `overrides` replaced; checked."""
    saved = opened.decode
    fields = {**(overrides or {}), "beam_size": 1, "nbest": 1}
    cfg = dataclasses.replace(saved, **fields)  # type: ignore[arg-type]
    check_decode_config(cfg)
    return cfg


def explain_lm_report(
    model_dir: str,
    prompt: str,
    *,
    fmt: str = "text",
    view: View | None = None,
    top_k: int = 5,
    max_len: int | None = None,
    device: str = "auto",
    overrides: dict[str, object] | None = None,
    max_numel: int | None = None,
) -> str:
    """What `aiayn explain` prints for a language model (a DecoderLM directory): its forward
    pass over BOS + `prompt`, the next-token distribution, and `max_len` generation steps
    (aiayn.glassbox.explain_lm), rendered as `fmt`."""
    from aiayn.glassbox.explain_lm import explain_lm
    from aiayn.glassbox.render_lm import lm_to_html, lm_to_json_text, lm_to_text
    from aiayn.nn.variants import DecoderLM

    where = resolve_device(device)
    opened = ModelDir.open(model_dir)
    cfg = lm_settings(opened, overrides)  # bad settings fail before the load
    if top_k < 1:
        raise AiaynError(f"--top-k must be at least 1, got {top_k}")
    if max_len is not None and max_len < 0:
        raise AiaynError(f"--max-len must be >= 0 (generation steps), got {max_len}")
    model = opened.load_model(DecoderLM, where)
    trace = explain_lm(
        model,
        opened.tokenizer,
        prompt,
        cfg=cfg,
        top_k=top_k,
        max_len=max_len,
        want=view.shows if view else None,
        max_numel=max_numel,
    )
    render = {"text": lm_to_text, "json": lm_to_json_text, "html": lm_to_html}[fmt]
    return render(trace, view)
