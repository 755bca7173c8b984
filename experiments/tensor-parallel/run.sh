#!/usr/bin/env bash
# Tensor parallel on the CPU: the two checks, 2 processes (torchrun, gloo) vs 1 process, same tokens.
#   bash experiments/tensor-parallel/run.sh [OUT_DIR]   (default outputs/tensor-parallel; run from the repository root)
# then copy OUT_DIR/compare.md and OUT_DIR/*/results.json's rows to experiments/tensor-parallel/ (README tables).
set -uo pipefail
O=${1:-outputs/tensor-parallel}
PY=${PYTHON:-python}
TORCHRUN=${TORCHRUN:-torchrun}
HERE=$(dirname "$0")
mkdir -p "$O"
SOLO="model=small-code-msn decoder=tr_jacobi decoders=[jacobi,pld,lookahead,sam] benchmark=humaneval benchmark.limit=4"
PAIR="pair=small-code decoder=speculative decoders=[ouroboros] benchmark=humaneval benchmark.limit=4"
for job in solo pair; do
  args=$([ $job = solo ] && echo "$SOLO" || echo "$PAIR")
  echo "== $job: 2 processes"
  # shellcheck disable=SC2086
  $TORCHRUN --nproc-per-node 2 -m specnoise $args model.tp_plan=auto logger=none "hydra.run.dir=$O/$job-tp2" \
      > "$O/$job-tp2.out" 2> "$O/$job-tp2.err"
  echo "   exit $?"
  echo "== $job: 1 process"
  # shellcheck disable=SC2086
  OMP_NUM_THREADS=1 $PY -m specnoise $args logger=none "hydra.run.dir=$O/$job-tp1" > "$O/$job-tp1.out" 2>&1
  echo "   exit $?"
done
$PY "$HERE/compare.py" "$O" | tee "$O/compare.md"
