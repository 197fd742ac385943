#!/bin/bash
# Multi30k en -> de on tok/ at the published batch (~8,192 tokens an update, as fairseq's two
# GPUs of 4,096 tokens each gave the published 41.0), three runs side by side on one GPU:
#   E, F  the own-data recipe (configs/multi30k_en_de_8000.toml), seeds 1 and 2, its schedule
#         fitted to MINUTES (8,000 updates at most)
#   H, I  the published fairseq recipe (configs/multi30k_en_de_published.toml: inverse_sqrt,
#         warmup 2,000, peak 5e-3), seeds 1 and 2, 8,000 updates or MINUTES, whichever first
#   H32, I32  the same in fp32, as fairseq trained it (H and I take `dtype = "auto"`: bf16
#         autocast where the hardware has it natively)
#   HB, IB  H and I on the published subwords: tok/ segmented by subword-nmt with 10,000 joint
#         merges (bench/multi30k_bpe.py, into OUT/bpe; the published files line for line) and a
#         `word` vocabulary of its pieces, scored with the sources segmented and "@@ " undone
# (RUNS picks them: "E F H" by default; RUNS="H I" MINUTES=0 is the published recipe's whole
# 8,000 updates twice), then each run's last 10 checkpoints averaged and scored greedy / beam 5
# on test2016/2017. docs/lab/translation_quality.md, "The published batch on a GPU", has the
# figures of one H100; docs/performance.md the current ones.
#
#   bash bench/multi30k_published_batch.sh [DATA] [OUT]    # MINUTES=5.5 DEVICE=cuda by default
#   EXTRA="--set train.compile=true" bash bench/multi30k_published_batch.sh   # options for all
#   PYTHON=python3 bash bench/multi30k_published_batch.sh   # where `python` is not the one with torch
#   SCORE=0 bash bench/multi30k_published_batch.sh          # train only, no averaging or scoring
# MINUTES counts a run's whole training time, resumes included (`aiayn train` saves it in its
# checkpoints): to go on with runs that stopped at their minutes, call again with a larger MINUTES.
# DATA holds raw/ and tok/ (default ../shared/data/multi30k); OUT gets the runs (runs/b8k).
# One process's Python host thread is the limit on a GPU (~15-25 updates/s each on an H100),
# so side by side they use it better than one at a time.
set -u
DATA=${1:-../shared/data/multi30k}; OUT=${2:-runs/b8k}
MINUTES=${MINUTES:-5.5}; DEVICE=${DEVICE:-cuda}; PY=${PYTHON:-python}
[ -d "$DATA/tok" ] || { echo "multi30k_published_batch: no tok/ under $DATA" >&2; exit 2; }
mkdir -p "$OUT"
T=$DATA/tok
C=(--set "train.src=$T/train.lc.norm.tok.en" --set "train.tgt=$T/train.lc.norm.tok.de"
   --set "train.valid_src=$T/val.lc.norm.tok.en" --set "train.valid_tgt=$T/val.lc.norm.tok.de"
   --set "train.device=$DEVICE" --set train.threads=1 --set train.max_tokens=8192
   --set train.keep_last=10 --set "train.max_minutes=$MINUTES" --no-progress ${EXTRA:-})
OWN=(--config configs/multi30k_en_de_8000.toml)
PUBLISHED=(--config configs/multi30k_en_de_published.toml)
B=$OUT/bpe  # the subword-nmt segmentation of tok/ (runs HB, IB)
BPE_DATA=(--set "train.src=$B/train.lc.norm.tok.en" --set "train.tgt=$B/train.lc.norm.tok.de"
   --set "train.valid_src=$B/val.lc.norm.tok.en" --set "train.valid_tgt=$B/val.lc.norm.tok.de"
   --set train.spm_model_type=word --set train.vocab_size=20000)
recipe() {  # R: the options of run $1; D: its data's, after C's
  D=()
  case $1 in
    E) R=("${OWN[@]}" --set train.seed=1) ;;
    F) R=("${OWN[@]}" --set train.seed=2) ;;
    H) R=("${PUBLISHED[@]}" --set train.seed=1) ;;
    I) R=("${PUBLISHED[@]}" --set train.seed=2) ;;
    H32) R=("${PUBLISHED[@]}" --set train.seed=1 --set train.dtype=fp32) ;;
    I32) R=("${PUBLISHED[@]}" --set train.seed=2 --set train.dtype=fp32) ;;
    HB) R=("${PUBLISHED[@]}" --set train.seed=1); D=("${BPE_DATA[@]}") ;;
    IB) R=("${PUBLISHED[@]}" --set train.seed=2); D=("${BPE_DATA[@]}") ;;
    *) echo "multi30k_published_batch: unknown run $1 (E, F, H, I, H32, I32, HB, IB)" >&2
       exit 2 ;;
  esac
}
codes() {  # run $1's multi30k_eval flag: its sources segmented, "@@ " undone
  case $1 in *B) echo "--bpe-codes $B/codes" ;; esac
}
RUNS=${RUNS:-E F H}
for r in $RUNS; do recipe "$r"; done  # every name checked before a run starts
case " $RUNS" in *B\ *|*B) [ -f "$B/codes" ] || "$PY" bench/multi30k_bpe.py --data "$DATA" \
    --out "$B" || exit ;; esac
# Ctrl-C or a TERM stops the runs too (background jobs of a script ignore Ctrl-C): each saves a
# checkpoint and exits (`aiayn train` on SIGTERM), and the same command later resumes them.
stop() { kill -TERM $(jobs -p) 2> /dev/null; wait; exit 130; }
trap stop INT TERM
for r in $RUNS; do
  recipe "$r"
  "$PY" -m aiayn train "${R[@]}" "${C[@]}" "${D[@]}" --set "train.out_dir=$OUT/$r" \
      >> "$OUT/$r.log" 2>&1 &  # a resume appends
done
wait
# SCORE=0: train only (a call that stops at MINUTES and is resumed later: bench/gpu_checks.sh)
[ "${SCORE:-1}" = 0 ] && exit 0
score() {  # run $1: its last 10 checkpoints averaged, then each model scored
  grep -h "^stopped" "$OUT/$1.log" | tail -1 | sed "s/^/$1: /"
  rm -rf "$OUT/$1/avg10"  # derived: a resumed run has newer checkpoints
  "$PY" -m aiayn average --run "$OUT/$1" --last 10 --out "$OUT/$1/avg10" > /dev/null
  for m in averaged avg10; do
    [ -d "$OUT/$1/$m" ] || continue
    echo "== $1/$m"
    "$PY" bench/multi30k_eval.py --model "$OUT/$1/$m" --data "$DATA" --src en --tgt de \
        --beams 1,5 --tokenized --confidence $(codes "$1") | grep -v '^{'
  done
  echo "== $1/avg10, GNMT length penalty 0.6 (the search of the runs before session 32)"
  "$PY" bench/multi30k_eval.py --model "$OUT/$1/avg10" --data "$DATA" --src en --tgt de \
      --beams 5 --tokenized --length-penalty gnmt --alpha 0.6 $(codes "$1") | grep -v '^{'
}
for r in $RUNS; do score "$r" > "$OUT/$r.scores" 2>&1 & done  # side by side, as they trained
wait
for r in $RUNS; do cat "$OUT/$r.scores"; done
