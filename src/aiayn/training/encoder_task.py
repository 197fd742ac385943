"""The data side of an encoder-only run (`train.task = "classify"` or `"mlm"`): its starting
point, vocabulary and examples, set up as `prepare_run` (aiayn.training.setup) asks.

    prepare_encoder_task   (config, tokenizer, examples, start) of a classify or mlm run
    fit_sentence_tokenizer a SentencePiece vocabulary of the training texts, with a mask piece
                           (so that a classifier's vocabulary can also pre-train, and back)
"""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path

from aiayn.config import Config, TrainConfig
from aiayn.errors import ConfigError
from aiayn.runtime.distributed import Dist
from aiayn.store.model_dir import load_model_config, read_model_meta
from aiayn.text.labelled import (
    LabelledData,
    class_balance,
    label_set,
    load_labelled,
    training_pairs,
)
from aiayn.text.tokenizer import Tokenizer
from aiayn.training.cls_setup import start_classifier
from aiayn.training.mlm_setup import MaskedData, load_mlm_data, text_lines
from aiayn.training.shared_tokenizer import shared_tokenizer

log = logging.getLogger(__name__)


def fit_sentence_tokenizer(tc: TrainConfig, texts: list[str]) -> Tokenizer:
    log.info(
        "training a %d-piece %s tokenizer on %d texts", tc.vocab_size, tc.spm_model_type, len(texts)
    )
    return Tokenizer.train(texts, tc.vocab_size, tc.spm_model_type, mask=True)


def prepare_encoder_task(
    cfg: Config,
    tokenizer: Tokenizer | None,
    out: Path,
    resume: Path | None,
    d: Dist,
) -> tuple[Config, Tokenizer, LabelledData | MaskedData, str]:
    """The run's config (a pre-trained model's architecture with `train.init_from`), its
    tokenizer (shared over ranks), its examples, and what it starts from: "" (random),
    "encoder" (a pre-trained encoder, a new head) or "whole" (every weight of init_from)."""
    tc, start = cfg.train, ""
    if tc.init_from:
        if tc.task == "classify":
            cfg, start = start_classifier(cfg)
        else:
            cfg, start = dataclasses.replace(cfg, model=load_model_config(tc.init_from)), "whole"
            if read_model_meta(tc.init_from).get("architecture") != "EncoderMLM":
                raise ConfigError(
                    f"train.init_from={tc.init_from}: masked-LM pre-training continues an mlm "
                    "run only (a classifier starts from any encoder)"
                )
        tokenizer = Tokenizer.load(tc.init_from)
    data: LabelledData | MaskedData
    if tc.task == "classify":
        if not tc.data:
            raise ConfigError("train.data is empty: give labelled texts (--set train.data=FILE)")
        train, valid, heldout = training_pairs(
            tc.data, tc.valid_data, tc.valid_share, tc.seed, tc.label_column, tc.text_column
        )
        texts = [text for _, text in train]
        tok = shared_tokenizer(out, resume, tokenizer, d, lambda: fit_sentence_tokenizer(tc, texts))
        labels = None
        if start == "whole":  # a classifier, continued: its labels, if the data's are among them
            prior = list(read_model_meta(tc.init_from).get("extra", {}).get("labels") or [])
            found = label_set([label for label, _ in train])
            labels = prior if set(found) <= set(prior) else None
            start = "whole" if labels else "encoder"
        data = load_labelled(train, valid, tok, cfg.model.max_len, labels)
        data.heldout = heldout
        if d.main:
            log.info(
                "%d training texts, %d validation texts (%s); %d labels: %s",
                len(data.train_ids),
                len(data.valid_ids),
                tc.valid_data or f"a stratified {tc.valid_share:.0%} held out, seed {tc.seed}",
                len(data.labels),
                class_balance([data.labels[y] for y in data.train_y], data.labels),
            )
            if data.cut:
                log.warning(
                    "%d training texts are longer than model.max_len=%d positions and were cut",
                    data.cut,
                    cfg.model.max_len,
                )
    else:
        if not tc.text:
            raise ConfigError("train.text is empty: give unlabelled text (--set train.text=FILE)")
        tok = shared_tokenizer(
            out, resume, tokenizer, d, lambda: fit_sentence_tokenizer(tc, text_lines(tc.text))
        )
        data = load_mlm_data(tc, tok, cfg.model.max_len)
        if d.main:
            log.info(
                "%d training lines, %d validation lines (%s)",
                len(data.train_ids),
                len(data.valid_ids),
                tc.valid_text or f"the last {tc.valid_share:.0%} of the lines",
            )
    return cfg, tok, data, start
