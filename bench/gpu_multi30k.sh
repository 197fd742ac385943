#!/bin/bash
# Issue 20's check on a lent GPU: the published fairseq recipe (runs H and I of
# bench/multi30k_published_batch.sh: configs/multi30k_en_de_published.toml, seeds 1 and 2, side
# by side) to its 8,000 updates at the published batch on Multi30k en -> de `tok/`, averaged
# and scored (tokenized BLEU, greedy and beam 5), with the cuda tests beside the first call.
# The GPU machine reaches no network and sees nothing outside the repository (not
# ../shared), and its image lacks some of aiayn's dependencies, so the work has two halves:
#
#   bash bench/gpu_multi30k.sh prepare   # here, once: gpu/data (the corpus, 8 MB) and gpu/whl
#                                        # (wheels for the GPU machine's Python 3.12); gpu/ is
#                                        # ignored by git and carried by the device tool
#   # there, through the device tool (carry ["gpu"], timeout_s 600), on one warm machine:
#   CUDA_TESTS=1 SCORE=0 MINUTES=6 bash bench/gpu_multi30k.sh run
#   MINUTES=14 bash bench/gpu_multi30k.sh run   # resumes both runs; scores them once they end
#
# MINUTES counts each run's whole training time across calls (`aiayn train` saves it), so a
# call with a larger MINUTES goes on where the last stopped (runs/ stays on a warm machine).
# On an H100 one such run made ~14 updates/s alone and 15-25 beside others (docs/benchmarks.md,
# "The published batch on a GPU"): 8,000 updates take ~6-9 minutes, more than one call leaves.
# The logs, the scores and the cuda tests' output are copied to $OUT. PY_VERSION (prepare) and
# DEVICE (run) are for trying the two halves on a CPU machine with another Python.
set -u
cd "$(dirname "$0")/.."
case ${1:-} in
prepare)
  SHARED=${SHARED:-../shared/data/multi30k}
  [ -d "$SHARED/tok" ] || { echo "gpu_multi30k: no tok/ under $SHARED" >&2; exit 2; }
  mkdir -p gpu/data gpu/whl
  cp -r "$SHARED/raw" "$SHARED/tok" gpu/data/
  # What aiayn (train, evaluate, serve, bench/multi30k_eval.py, tests/test_cuda.py) imports and
  # the GPU image lacks (device README, "Python packages already there"); pinned to the
  # versions CI tests with, built for CPython 3.12 on manylinux.
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version "${PY_VERSION:-3.12}" \
      --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
      --platform manylinux2014_x86_64 -d gpu/whl \
      pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5 \
      num2words==0.5.14 babel==2.19.0 sacremoses==0.2.0 fastapi==0.165.0 starlette==1.10.0 \
      uvicorn==0.54.0 httptools==0.9.0 opentelemetry-api==1.45.2 || exit
  du -sh gpu
  ;;
run)
  [ -d gpu/data/tok ] && [ -d gpu/whl ] || { echo "gpu_multi30k: run 'prepare' first" >&2; exit 2; }
  OUT=${OUT:-runs/gpu_out}; mkdir -p "$OUT"
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target /tmp/site gpu/whl/*.whl || exit
  export PYTHONPATH=$PWD/src:/tmp/site PYTHONUNBUFFERED=1
  python3 -c "import torch, aiayn.cli.main; print('torch', torch.__version__, 'cuda', torch.cuda.is_available())" || exit
  nvidia-smi --query-gpu=name,memory.total --format=csv,noheader 2> /dev/null
  if [ "${CUDA_TESTS:-0}" = 1 ]; then
    python3 -m pytest -q -p no:cacheprovider -m cuda tests/test_cuda.py > "$OUT/cuda_tests.log" 2>&1 &
  fi
  RUNS="H I" DEVICE=${DEVICE:-cuda} PYTHON=python3 MINUTES=${MINUTES:-6} SCORE=${SCORE:-1} \
      bash bench/multi30k_published_batch.sh gpu/data runs/gpu
  wait
  for r in H I; do
    grep "INFO step" "runs/gpu/$r.log" | tail -1 | sed "s/^/$r: /"
    cp "runs/gpu/$r.log" "$OUT/$r.log"
    [ -f "runs/gpu/$r.scores" ] && cp "runs/gpu/$r.scores" "$OUT/$r.scores"
  done
  [ -f "$OUT/cuda_tests.log" ] && tail -3 "$OUT/cuda_tests.log"
  ;;
*)
  echo "usage: bash bench/gpu_multi30k.sh prepare|run (see its head)" >&2; exit 2 ;;
esac
