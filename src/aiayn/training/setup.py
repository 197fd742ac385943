"""A run set up: everything before its first step, every check before anything is written.

    prepare_run        checks (aiayn.training.checks), tokenizer, data, model, the optimizer
                       Adam(β1 = 0.9, β2 = 0.98, ε = 1e-9) (§5.3), resume; run_config.json
                       and a held-out validation set written into the run directory
    prepare_tokenizer  reloaded on resume, else given or trained on the training text

`prepare_run` hands the loop (aiayn.training.loop) the Run and the module to step: the model,
wrapped in DistributedDataParallel under torchrun and compiled where `train.compile` asks.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import logging
import os
import random
import time
from pathlib import Path

import torch

from aiayn.atomic import atomic_write_json, atomic_write_text
from aiayn.config import LM_DEFAULTS, Config, DecodeConfig, TrainConfig, check_recipe
from aiayn.config_files import RUN_CONFIG_FILE, to_dict
from aiayn.errors import ConfigError
from aiayn.nn.model import Transformer, _ModelBase
from aiayn.nn.variants import DecoderLM, EncoderClassifier, EncoderMLM
from aiayn.runtime.device import choose_precision
from aiayn.runtime.distributed import Dist, init_distributed
from aiayn.runtime.progress import interactive
from aiayn.store.model_dir import load_model_config, load_model_dir
from aiayn.store.run_dir import (
    TrainState,
    check_resumable,
    data_fingerprint,
    find_resume,
    restore_checkpoint,
)
from aiayn.text.corpus import HELDOUT_FILES, DataStats, Heldout, hold_out, read_parallel
from aiayn.text.data import RunData, load_data, require_corpus
from aiayn.text.label_check import log_labelled_check
from aiayn.text.labelled import LabelledData
from aiayn.text.lm_data import LMData, load_lm_data
from aiayn.text.text_check import log_text_check
from aiayn.text.tokenizer import Tokenizer
from aiayn.training.checks import check_batch_fits, check_model_fits
from aiayn.training.cls_setup import head_groups, load_encoder
from aiayn.training.encoder_task import prepare_encoder_task
from aiayn.training.lm_setup import fit_lm_tokenizer
from aiayn.training.mlm_setup import MaskedData
from aiayn.training.run import Run
from aiayn.training.shared_tokenizer import shared_tokenizer

log = logging.getLogger(__name__)


def prepare_tokenizer(
    cfg: Config,
    out: Path,
    resume: Path | None,
    given: Tokenizer | None,
    d: Dist,
    heldout: Heldout | None = None,
) -> Tokenizer:
    """The run's tokenizer: reloaded on resume, else given or trained on the training text
    (without the pairs `heldout` leaves out of training)."""

    def train_joint() -> Tokenizer:
        tc = cfg.train
        require_corpus(tc)
        stats = DataStats()
        texts = [
            side for pair in read_parallel(tc.src, tc.tgt or None, stats, heldout) for side in pair
        ]
        if not texts:  # every pair dropped: say why, as load_data's report would
            raise ConfigError(f"no training pairs left after filtering: {stats.report(tc.src)}")
        both = f"{tc.src} and {tc.tgt}" if tc.tgt else tc.src  # one joint vocabulary
        log.info(
            "training a joint %d-piece %s tokenizer on %s", tc.vocab_size, tc.spm_model_type, both
        )
        return Tokenizer.train(texts, tc.vocab_size, tc.spm_model_type)

    return shared_tokenizer(out, resume, given, d, train_joint)


def prepare_run(
    cfg: Config, tokenizer: Tokenizer | None, progress: bool = False
) -> tuple[Run, torch.nn.Module]:
    """Everything before the first step: checks, tokenizer, data, model, optimizer, resume.

    The device and every config value are checked before anything is written."""
    tc, d = cfg.train, init_distributed(cfg.train.device)
    precision = choose_precision(tc.dtype, d.device, "train.dtype")
    check_recipe(tc)
    if tc.tensorboard and importlib.util.find_spec("tensorboard") is None:
        raise ConfigError(
            "train.tensorboard = true needs the tensorboard package: pip install tensorboard"
        )
    out = Path(tc.out_dir)
    resume = find_resume(out)
    encoder_only = tc.task in ("classify", "mlm")  # aiayn.training.encoder_task's
    if tc.init_from and not encoder_only:  # the architecture and vocabulary are the model's
        cfg = dataclasses.replace(cfg, model=load_model_config(tc.init_from))
        tokenizer = Tokenizer.load(tc.init_from)
    lm = tc.task == "lm"  # a language model's examples are blocks of model.max_len tokens
    if lm and cfg.decode == DecodeConfig():  # no [decode] table: sampling, not a beam of 4
        cfg = dataclasses.replace(cfg, decode=LM_DEFAULTS)
    if tc.max_len > cfg.model.max_len and tc.task == "translate":
        raise ConfigError(f"train.max_len={tc.max_len} exceeds model.max_len={cfg.model.max_len}")
    vocab = tokenizer.vocab_size if tokenizer is not None else tc.vocab_size  # at most
    copies = int(os.environ.get("LOCAL_WORLD_SIZE", "1")) if d.device.type == "cpu" else 1
    fits_cfg = dataclasses.replace(cfg.model, vocab_size=vocab)
    check_model_fits(fits_cfg, d.device, copies, DecoderLM if lm else Transformer)
    heldout = _hold_out(tc, out, d) if tc.src and not tc.valid_src and not lm else None
    start = ""  # an encoder-only run's: "", "encoder" or "whole" (of train.init_from)
    if encoder_only:
        cfg, tok, enc_data, start = prepare_encoder_task(cfg, tokenizer, out, resume, d)
    elif lm:
        if not tc.text:
            raise ConfigError("train.text is empty: give the training text (--set train.text=FILE)")
        tok = shared_tokenizer(out, resume, tokenizer, d, lambda: fit_lm_tokenizer(tc))
    else:
        tok = prepare_tokenizer(cfg, out, resume, tokenizer, d, heldout)
    if heldout is not None and d.main and resume is None:
        # After the tokenizer's barrier: every rank has looked at out_dir (find_resume), so
        # none can take the files being written for foreign ones.
        for name, side in zip(HELDOUT_FILES, (0, 1), strict=True):
            atomic_write_text(out / name, "".join(pair[side] + "\n" for pair in heldout.pairs))
    cfg = dataclasses.replace(
        cfg,
        model=dataclasses.replace(  # the vocabulary's size and ids
            cfg.model,
            vocab_size=tok.vocab_size,
            pad_id=tok.pad_id,
            bos_id=tok.bos_id,
            eos_id=tok.eos_id,
        ),
    )
    fingerprint = data_fingerprint(tc)
    if resume is not None:
        check_resumable(out, cfg, fingerprint)
    data: RunData | LMData | LabelledData | MaskedData
    if encoder_only:
        data = enc_data
    elif lm:
        data = load_lm_data(tc.text, tc.valid_text, tc.valid_share, tok, cfg.model.max_len)
        if d.main:
            log.info(
                "text: %d training tokens, %d validation tokens (%s)",
                len(data.train),
                len(data.valid_stream),
                tc.valid_text or f"the last {tc.valid_share:.0%} of the training text",
            )
    else:
        data = load_data(tc, tok, d, heldout, bar=progress and d.main and interactive())
        check_batch_fits(cfg.model, data.train, tc, precision, copies)
    if d.main and resume is None:  # once per run: a resume has the same data
        if lm:  # the text's own check (docs/data.md, --text)
            log_text_check(tc.text, tc.valid_text, log, bar=progress and interactive())
        elif tc.task == "classify":
            log_labelled_check(tc, log)
        elif tc.task == "translate":
            _log_data_check(tc, bar=progress and interactive())  # a log file gets its lines
    torch.manual_seed(tc.seed)  # seeds the GPU's generator too
    random.seed(tc.seed)
    precision.apply()
    if d.main:
        log.info("device %s, precision: %s", d.device, precision.why)
    # On the device before the optimizer exists: restored Adam moments follow the parameters.
    model = build_for_task(cfg, data).to(d.device)
    if tc.init_from and resume is None:  # a resumed run has its own weights
        if isinstance(model, EncoderClassifier):
            load_encoder(model, tc.init_from, whole=start == "whole")
        else:
            pre = load_model_dir(tc.init_from, d.device, expect=type(model))
            model.load_state_dict(pre.state_dict())
            log.info("starting from the weights of %s", tc.init_from)
    groups = (
        head_groups(model, tc)
        if isinstance(model, EncoderClassifier) and start
        else [{"params": list(model.parameters())}]
    )
    opt = torch.optim.Adam(
        groups,  # type: ignore[arg-type]
        lr=0.0,
        betas=tc.adam_betas,
        eps=tc.adam_eps,
        weight_decay=tc.weight_decay,
    )
    state = restore_checkpoint(resume, model, opt, d) if resume is not None else TrainState()
    if d.main:  # `runtime` records how this session computes; resume checks only model/train
        run_config = {
            **to_dict(cfg),
            "data_sha256": fingerprint,
            "runtime": {**precision.to_json(), "world_size": d.world},
        }
        if isinstance(data, LMData | LabelledData | MaskedData) and data.heldout:
            run_config["heldout_valid"] = data.heldout
        if heldout is not None:
            run_config["heldout_valid"] = {
                "src": HELDOUT_FILES[0],
                "tgt": HELDOUT_FILES[1],
                "pairs": len(heldout.pairs),
                "corpus_lines": heldout.corpus_lines,
                "drawn": len(heldout.lines),
                "seed": tc.seed,
                "left_out_of_training": data.held_out if isinstance(data, RunData) else 0,
            }
        atomic_write_json(out / RUN_CONFIG_FILE, run_config)
    model.train()
    net: torch.nn.Module = model
    if d.world > 1:  # the positional tables are constant buffers: nothing to broadcast per step
        net = torch.nn.parallel.DistributedDataParallel(
            model,
            device_ids=[d.device.index] if d.device.type == "cuda" else None,
            broadcast_buffers=False,
        )
    if tc.compile:
        net = torch.compile(net)  # type: ignore[assignment]
    return Run(cfg, tok, data, model, opt, state, d, out, precision), net


def build_for_task(cfg: Config, data: object) -> _ModelBase:
    """The model `train.task` trains, built from `cfg.model` (a classifier: for the data's
    labels)."""
    task = cfg.train.task
    if task == "classify":
        assert isinstance(data, LabelledData)
        return EncoderClassifier(cfg.model, len(data.labels), data.labels)
    return {"translate": Transformer, "lm": DecoderLM, "mlm": EncoderMLM}[task](cfg.model)


def _log_data_check(tc: TrainConfig, bar: bool = False) -> None:
    """Say what `aiayn data check` finds in the corpus (counts only: one streaming pass, with
    its progress bar where `bar`: a large corpus takes a minute or more)."""
    from aiayn.text.check import check_corpus

    t0 = time.monotonic()
    evals: dict[str, tuple[str | Path, str | Path | None]] = {}
    if tc.valid_src:
        evals["valid"] = (tc.valid_src, tc.valid_tgt or None)
    report = check_corpus(tc.src, tc.tgt or None, evals, examples=False, bar=bar)
    if any(report.counts.values()):
        flags = f"--src {tc.src}" + (f" --tgt {tc.tgt}" if tc.tgt else "")
        if tc.valid_src:
            flags += f" --valid-src {tc.valid_src} --valid-tgt {tc.valid_tgt}"
        log.warning(
            "data check: %s (%.1f s); `aiayn data check %s` shows examples and can "
            "write a cleaned corpus (docs/data.md)",
            report.summary(),
            time.monotonic() - t0,
            flags,
        )
    else:
        log.info("data check: nothing found (%.1f s)", time.monotonic() - t0)


def _hold_out(tc: TrainConfig, out: Path, d: Dist) -> Heldout | None:
    """No validation files: hold a validation set out of the training corpus (`data.hold_out`;
    every rank draws the same). `prepare_run` writes it into the run directory (rank 0, a fresh
    run), so that `aiayn evaluate` can use it too."""
    heldout = hold_out(tc.src, tc.tgt or None, tc.seed)
    if not heldout.pairs:
        if d.main:
            log.warning(
                "no validation files, and %d lines are too few to hold 5%% out: "
                "training without validation",
                heldout.corpus_lines,
            )
        return None
    if d.main:
        log.info(
            "no validation files: held out %d of %d training pairs (seed %d) as %s and %s in %s",
            len(heldout.pairs),
            heldout.corpus_lines,
            tc.seed,
            *HELDOUT_FILES,
            out,
        )
    return heldout
