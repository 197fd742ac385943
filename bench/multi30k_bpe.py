"""Multi30k's tok/ files segmented as the published fairseq recipe's were: subword-nmt BPE.

The published Transformer-tiny figure (41.02 tokenized BLEU en -> de, Wu et al. 2021) trained on
text segmented by subword-nmt with 10,000 merges learned on the English and German training
text together; aiayn's own recipes learn a SentencePiece vocabulary instead. This writes the
same segmentation of `tok/` (the codes learned here, `codes`, and every train/val/test file,
named as in `tok/`), for `aiayn train --set train.spm_model_type=word`, whose vocabulary is
then the segmented pieces themselves:

    python bench/multi30k_bpe.py --out runs/m30k_bpe
    aiayn train --config configs/multi30k_en_de_published.toml \
        --set train.spm_model_type=word --set train.vocab_size=20000 \
        --set train.src=runs/m30k_bpe/train.lc.norm.tok.en ... (valid_src/tgt likewise)
    python bench/multi30k_eval.py --model RUN/averaged --src en --tgt de --tokenized \
        --bpe-codes runs/m30k_bpe/codes          # sources segmented, "@@ " joined back

It prints one JSON line: merges, the pieces of the training text, and, with --compare DIR (a
directory of already segmented files of the same names), how many lines differ.
"""

from __future__ import annotations

import argparse
import io
import json
import sys
from pathlib import Path

from subword_nmt.apply_bpe import BPE
from subword_nmt.learn_bpe import learn_bpe

SPLITS = ("train", "val", "test_2016_flickr", "test_2017_flickr")


def tok_file(data: Path, split: str, lang: str) -> Path:
    return data / "tok" / f"{split}.lc.norm.tok.{lang}"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", type=Path, default=Path("../shared/data/multi30k"))
    p.add_argument("--out", type=Path, required=True, help="directory for codes and the files")
    p.add_argument("--merges", type=int, default=10_000, help="BPE merges (published: 10,000)")
    p.add_argument("--compare", type=Path, help="segmented files to compare with, by name")
    args = p.parse_args()
    if not (args.data / "tok").is_dir():
        sys.exit(f"multi30k_bpe: no tok/ under {args.data}")
    args.out.mkdir(parents=True, exist_ok=True)
    joint = "".join(tok_file(args.data, "train", lang).read_text(encoding="utf-8")
                    for lang in ("en", "de"))  # fmt: skip
    codes = io.StringIO()
    learn_bpe(io.StringIO(joint), codes, args.merges)
    (args.out / "codes").write_text(codes.getvalue(), encoding="utf-8")
    bpe = BPE(io.StringIO(codes.getvalue()))
    pieces: set[str] = set()
    differ: dict[str, int] = {}
    for split in SPLITS:
        for lang in ("en", "de"):
            src = tok_file(args.data, split, lang)
            text = src.read_text(encoding="utf-8").splitlines()
            lines = [bpe.process_line(line) for line in text]
            (args.out / src.name).write_text("".join(x + "\n" for x in lines), encoding="utf-8")
            if split == "train":
                pieces.update(w for x in lines for w in x.split())
            theirs = args.compare / src.name if args.compare else None
            if theirs is not None and theirs.is_file():
                other = theirs.read_text(encoding="utf-8").splitlines()
                differ[src.name] = sum(a != b for a, b in zip(lines, other, strict=False)) + abs(
                    len(lines) - len(other))  # fmt: skip
    print(json.dumps({"merges": args.merges, "training_piece_types": len(pieces),
                      "out": str(args.out), "lines_differing": differ or None}))  # fmt: skip


if __name__ == "__main__":
    main()
