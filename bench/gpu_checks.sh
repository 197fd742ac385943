#!/bin/bash
# The checks that wait for a lent GPU, ready to run (a GPU is lent to few sessions, for 15
# minutes of device time: each check below fits one session, with the machine's start):
#   multi30k  issue 20: the published fairseq recipe (runs H and I of
#             bench/multi30k_published_batch.sh: configs/multi30k_en_de_published.toml, seeds
#             1 and 2, side by side) to its 8,000 updates at the published batch on Multi30k
#             en -> de `tok/`, averaged and scored (tokenized BLEU, greedy and beam 5), with the
#             cuda tests beside the first call; RUNS="H I H32 I32" adds the same two in fp32
#             (fairseq's precision; H and I train in bf16 autocast on a GPU), HB and IB the same
#             two on the published subword-nmt segmentation
#   serving   issue 22 on a GPU: bench/serve_head_of_line.py (one-sentence requests while 16
#             clients keep long 8-sentence ones in flight) and bench/serve_load.py at 32 and
#             128 clients, the quick start model served with --device cuda
# The GPU machine reaches no network and sees nothing outside the repository (not
# ../shared, not /tmp here), and its image lacks some of aiayn's dependencies, so:
#
#   bash bench/gpu_checks.sh prepare   # here, once, in aiayn's environment: into gpu/ (ignored
#       # by git, ~27 MB): the
#       # corpus, the quick start model (built if QS names no `aiayn quickstart` output) and
#       # the wheels the GPU image lacks, for its Python 3.12
#   # there, through the device tool (carry ["gpu"], timeout_s 600), on one warm machine:
#   CUDA_TESTS=1 SCORE=0 MINUTES=6 bash bench/gpu_checks.sh multi30k
#   MINUTES=14 bash bench/gpu_checks.sh multi30k   # resumes both runs; scores them when they end
#   # or, in another session:
#   bash bench/gpu_checks.sh serving
#
# MINUTES counts each run's whole training time across calls (`aiayn train` saves it), so a
# call with a larger MINUTES goes on where the last stopped (runs/ stays on a warm machine).
# On an H100 one such run made ~14 updates/s alone and 15-25 beside others
# (docs/lab/translation_quality.md, "The published batch on a GPU"): 8,000 updates take ~6-9
# minutes, more than one call leaves.
# Logs, scores, JSON and the cuda tests' output are copied to $OUT. PY_VERSION (prepare) and
# DEVICE (multi30k, serving) are for trying both halves on a CPU machine with another Python.
set -u
cd "$(dirname "$0")/.."
case ${1:-} in
prepare)
  SHARED=${SHARED:-../shared/data/multi30k}
  [ -d "$SHARED/tok" ] || { echo "gpu_checks: no tok/ under $SHARED" >&2; exit 2; }
  mkdir -p gpu/data gpu/whl
  cp -r "$SHARED/raw" "$SHARED/tok" gpu/data/
  QS=${QS:-}
  if [ -z "$QS" ]; then QS=gpu/quickstart; [ -f "$QS/model/config.json" ] || \
      PYTHONPATH=$PWD/src python3 -m aiayn quickstart --out "$QS" || exit; fi
  mkdir -p gpu/qs/model  # the model alone (not its checkpoints) and the test sentences
  cp "$QS"/model/{config.json,model.safetensors,tokenizer.model,run_config.json} gpu/qs/model/
  cp "$QS/data/test.en" gpu/qs/test.en
  rm -rf gpu/quickstart
  # What aiayn (train, evaluate, serve, bench/multi30k_eval.py, tests/test_cuda.py) imports and
  # the GPU image lacks (device README, "Python packages already there"); pinned to versions
  # aiayn's tests passed with (session 30), built for CPython 3.12 on manylinux.
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version "${PY_VERSION:-3.12}" \
      --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
      --platform manylinux2014_x86_64 -d gpu/whl \
      pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5 \
      num2words==0.5.14 babel==2.19.0 sacremoses==0.2.0 fastapi==0.165.0 starlette==1.10.0 \
      uvicorn==0.54.0 httptools==0.9.0 opentelemetry-api==1.45.2 subword-nmt==0.3.8 || exit
  du -sh gpu
  ;;
multi30k | serving)
  [ -d gpu/data/tok ] && [ -d gpu/qs ] && [ -d gpu/whl ] || \
      { echo "gpu_checks: run 'prepare' first (gpu/ carried?)" >&2; exit 2; }
  OUT=${OUT:-runs/gpu_out}; mkdir -p "$OUT"
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target /tmp/site gpu/whl/*.whl || exit
  export PYTHONPATH=$PWD/src:/tmp/site PYTHONUNBUFFERED=1
  python3 -c "import torch, aiayn.cli.main; print('torch', torch.__version__, 'cuda', torch.cuda.is_available())" || exit
  nvidia-smi --query-gpu=name,memory.total --format=csv,noheader 2> /dev/null
  ;;&
serving)
  # The server and the load generator on CPUs of their own; one torch thread, as on the CPU.
  python3 bench/serve_head_of_line.py --model gpu/qs/model --corpus gpu/qs/test.en \
      --device "${DEVICE:-cuda}" --batching continuous --threads 1 --server-cpus 0 \
      --client-cpus 1 > "$OUT/head_of_line.json" || exit
  for c in 32 128; do
    python3 bench/serve_load.py --model gpu/qs/model --corpus gpu/qs/test.en \
        --device "${DEVICE:-cuda}" --concurrency $c --threads 1 --server-cpus 0 \
        --client-cpus 1 --requests 1000 --reps 2 > "$OUT/load_$c.json" || exit
  done
  python3 - "$OUT" << 'PY'
import json, sys
out = sys.argv[1]
h = json.load(open(f"{out}/head_of_line.json"))
for run in h["runs"]:
    print("head of line:", {k: run[k] for k in ("p90_idle_s", "p90_under_load_s", "p90_ratio",
                                                "long_sentences_per_s")})
print("model floor:", h["model_floor"], "engine ratio:", (h["engine"] or {}).get("p90_ratio"))
for c in (32, 128):
    d = json.load(open(f"{out}/load_{c}.json"))
    print(c, "clients:", d["served_sentences_per_s"], "served/s,", d["served_over_in_process"],
          "of in-process; errors", d["errors"], "differing",
          d["translations_differing_from_in_process"])
PY
  ;;
multi30k)
  if [ "${CUDA_TESTS:-0}" = 1 ]; then
    python3 -m pytest -q -p no:cacheprovider -m cuda tests/test_cuda.py > "$OUT/cuda_tests.log" 2>&1 &
  fi
  RUNS=${RUNS:-H I}
  RUNS=$RUNS DEVICE=${DEVICE:-cuda} PYTHON=python3 MINUTES=${MINUTES:-6} SCORE=${SCORE:-1} \
      bash bench/multi30k_published_batch.sh gpu/data runs/gpu
  wait
  for r in $RUNS; do
    grep "INFO step" "runs/gpu/$r.log" | tail -1 | sed "s/^/$r: /"
    cp "runs/gpu/$r.log" "$OUT/$r.log"
    [ -f "runs/gpu/$r.scores" ] && cp "runs/gpu/$r.scores" "$OUT/$r.scores"
  done
  [ -f "$OUT/cuda_tests.log" ] && tail -3 "$OUT/cuda_tests.log"
  ;;
*)
  echo "usage: bash bench/gpu_checks.sh prepare|multi30k|serving (see its head)" >&2; exit 2 ;;
esac
