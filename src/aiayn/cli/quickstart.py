"""`aiayn quickstart`: a working English -> German number translator in a few CPU minutes.

No download: the corpus is generated from num2words' language rules (`aiayn.text.synthetic`), so
a fresh machine with no network can train, evaluate and look inside a real Transformer:

    1. write 50,000 training pairs ("three hundred and forty-two" -> "dreihundertzweiundvierzig"),
       plus validation and test pairs whose numbers never occur in training;
    2. train the `cpu_tiny` model (d_model 128, 4 heads, 2+2 layers) for a fixed wall-clock budget;
    3. translate the held-out test set greedily and score it (exact match, BLEU, chrF);
    4. draw the cross-attention of one long number (German puts units before tens, so the
       picture shows the model looking back and forth in the English source);
    5. leave a model directory that `aiayn translate --model OUT/model` uses as it is.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from aiayn.atomic import atomic_write_json, atomic_write_text
from aiayn.config import Config, DecodeConfig, ModelConfig, TrainConfig

if TYPE_CHECKING:
    from aiayn.translate.translator import Translator

log = logging.getLogger(__name__)

SHOWCASE = "seven hundred and twenty-three thousand, one hundred and fifty-four"


def quickstart_config(
    data_dir: Path, model_dir: Path, minutes: float, seed: int = 1, device: str = "auto"
) -> Config:
    """The recipe: the paper's model and loss at toy size, tuned to converge in ~3 CPU minutes.

    A higher peak rate (2e-3) and shorter warmup (300) than the paper's base model suit a model
    this small; everything else (Adam betas, label smoothing 0.1, post-LN, tied embeddings) is
    the paper's. Validation loss picks the checkpoint that is kept.
    """
    return Config(
        model=ModelConfig.preset("cpu_tiny", vocab_size=500, max_len=128),
        train=TrainConfig(
            src=str(data_dir / "train.en"),
            tgt=str(data_dir / "train.de"),
            valid_src=str(data_dir / "valid.en"),
            valid_tgt=str(data_dir / "valid.de"),
            out_dir=str(model_dir),
            vocab_size=500,  # 256 byte-fallback pieces + ~240 subwords: "drei", "hundert", "und"...
            max_tokens=4000,
            max_len=64,
            lr_schedule="inverse_sqrt",
            lr=2e-3,
            warmup_steps=300,
            clip_norm=1.0,
            max_steps=100_000,
            max_minutes=minutes,
            valid_every=200,
            save_every=200,
            keep_last=2,
            bleu_samples=0,
            seed=seed,
            log_every=20,
            device=device,
        ),
        decode=DecodeConfig(beam_size=1),
    )


def run_quickstart(
    out_dir: str | Path,
    *,
    minutes: float = 3.5,
    n_train: int = 50_000,
    n_test: int = 1000,
    seed: int = 1,
    progress: bool = True,
    show: int = 8,
    device: str = "auto",
) -> dict[str, Any]:
    """Build the corpus, train, evaluate, draw; return (and write) `OUT/metrics.json`.

    Args:
        out_dir: everything goes here: `data/`, `model/` (a model directory),
            `cross_attention.png`, `translations.txt`, `metrics.json`.
        minutes: the training budget in wall-clock minutes (training stops at the first
            validation after it, so allow a few seconds more).
        n_train, n_test: corpus sizes; the test numbers never occur in training.
        show: how many test translations to print.
        device: where to train and translate (auto | cpu | cuda | cuda:N | mps).
    """
    from aiayn.runtime.device import resolve_device
    from aiayn.store.checkpoints import checkpoint_step
    from aiayn.store.run_dir import find_resume
    from aiayn.text.synthetic import write_corpus
    from aiayn.training.loop import train
    from aiayn.translate.translator import Translator

    resolve_device(device)  # a device that is not here fails before anything is written
    out = Path(out_dir)
    t0 = time.monotonic()
    data_dir, model_dir = out / "data", out / "model"
    n_valid = min(1000, max(100, n_test))
    # the quick start's own corpus: a rerun replaces it
    write_corpus(
        data_dir, "numbers", "en", "de", n_train, n_valid, n_test, seed=seed, overwrite=True
    )
    log.info(
        "corpus: %d train / %d valid / %d test pairs in %s", n_train, n_valid, n_test, data_dir
    )

    cfg = quickstart_config(data_dir, model_dir, minutes, seed, device)
    # A rerun resumes the run in OUT/model (its budget spent: no step more); say so, not
    # "trained N steps in 0 s".
    resumed = find_resume(model_dir)
    first_step = checkpoint_step(resumed) if resumed is not None else 0
    t_train = time.monotonic()
    result = train(cfg, progress=progress)
    train_seconds = time.monotonic() - t_train

    translator = Translator.load(model_dir, cfg.decode, device=device)
    summary = {
        **_score_test_set(translator, data_dir, out / "translations.txt", show),
        "train_pairs": n_train,
        "train_seconds": round(train_seconds, 1),
        "steps": result.step,
        "resumed_from_step": first_step,
        "stopped": result.stopped,
        "model_dir": str(model_dir),
        "picture": str(_draw_showcase(translator, out / "cross_attention.png")),
    }
    summary["total_seconds"] = round(time.monotonic() - t0, 1)  # scoring and drawing included
    atomic_write_json(out / "metrics.json", summary)
    return summary


def _score_test_set(
    translator: Translator, data_dir: Path, listing: Path, show: int
) -> dict[str, Any]:
    """Greedy translations of the held-out test set, scored; all of them listed in `listing`."""
    from aiayn.translate import metrics

    src = (data_dir / "test.en").read_text(encoding="utf-8").splitlines()
    ref = (data_dir / "test.de").read_text(encoding="utf-8").splitlines()
    hyps = translator.translate(src, beam=1)
    bleu, chrf = metrics.bleu(hyps, ref), metrics.chrf(hyps, ref)
    atomic_write_text(
        listing, "".join(f"{s}\t{r}\t{h}\n" for s, r, h in zip(src, ref, hyps, strict=True))
    )
    return {
        "exact_match": metrics.exact_match(hyps, ref),
        "bleu": bleu.score,
        "chrf": chrf.score,
        "bleu_signature": bleu.signature,
        "test_pairs": len(src),
        "examples": [
            {"source": s, "reference": r, "output": h}
            for s, r, h in zip(src[:show], ref[:show], hyps[:show], strict=True)
        ],
    }


def _draw_showcase(translator: Translator, picture: Path) -> Path:
    """The cross-attention of one long number, where German reorders units and tens."""
    from aiayn.glassbox.viz import attention_for_translations, plot_attention_grid, write_figure

    example = attention_for_translations(translator.model, translator.tokenizer, [SHOWCASE])[0]
    rows, cols = example.labels("cross")
    fig = plot_attention_grid(
        example.maps["cross"],
        rows,
        cols,
        f"cross-attention: {SHOWCASE!r} -> {translator.translate([SHOWCASE])[0]!r}",
    )
    write_figure(fig, picture, dpi=110)
    return picture


def format_summary(summary: dict[str, Any]) -> str:
    """The quickstart's closing report, as the terminal shows it."""
    lines = ["", "Held-out English -> German numbers (never seen in training), greedy decoding:"]
    for ex in summary["examples"]:
        mark = "ok " if ex["output"] == ex["reference"] else "ERR"
        lines.append(f"  {mark} {ex['source']}\n      -> {ex['output']}")
        if mark == "ERR":
            lines.append(f"      (expected {ex['reference']})")
    lines += [
        "",
        f"exact match {summary['exact_match']:.1f}%  BLEU {summary['bleu']:.1f}  "
        f"chrF {summary['chrf']:.1f}  on {summary['test_pairs']} test pairs",
        "(German writes a number as one word, and BLEU counts word 4-grams, so BLEU is ~0 "
        "for any system here; exact match and chrF are the scores that mean something)",
        _training_line(summary),
        f"cross-attention picture: {summary['picture']}",
        f"translate more: aiayn translate --model {summary['model_dir']}",
    ]
    return "\n".join(lines)


def summary_json(summary: dict[str, Any]) -> str:
    return json.dumps(summary, indent=2, ensure_ascii=False)


def _training_line(summary: dict[str, Any]) -> str:
    took = f"{summary['train_seconds']:.0f} s ({summary['total_seconds']:.0f} s in all)"
    first = summary.get("resumed_from_step", 0)
    if not first:
        return f"trained {summary['steps']} steps in {took}"
    return (
        f"resumed {summary['model_dir']} at step {first}: {summary['steps'] - first} steps more "
        f"in {took}; delete that directory to train afresh"
    )
