#!/usr/bin/env bash
# The committed CPU results of the batch-size study, in one command (steps one after another: they are timed).
#   bash experiments/batch-scaling/run.sh [OUT_DIR]     (default outputs/batch-scaling; run from the repository root)
# then copy OUT_DIR/sweep/report/* to experiments/batch-scaling/tiny/, OUT_DIR/forward_cost to tiny/forward_cost,
# OUT_DIR/memory.md and OUT_DIR/checks.md to tiny/, and fill the README's tables with summarize.py.
# 1. +experiment=batch-scaling-tiny: every decoder at B = 1, 2, 4, 8, 16, 32, HumanEval + Spec-Bench subsets
# 2. the forward-cost curve t(B·q) of the target (one thread, fp32)
# 3. peak memory at B = 16: the AR job and the TR-Jacobi job as separate processes (memory.sh)
# 4. the two checks at B = 4 (benchmark.limit=8): every row lossless
set -uo pipefail
O=${1:-outputs/batch-scaling}
PY=${PYTHON:-python}
HERE=$(dirname "$0")
mkdir -p "$O"
echo "== sweep"
$PY -m specnoise +experiment=batch-scaling-tiny logger=none benchmark.threads=1 "hydra.sweep.dir=$O/sweep" \
    > "$O/sweep.log" 2>&1
echo "   exit $?"
echo "== forward cost t(B·q)"
$PY -m specnoise.bench.batch_cost model=small-code-msn --batch 1,2,4,8,16,32 --q 1,2,4,8,16,32,64,128 \
    --cache-len 128 --repeats 7 --threads 1 --out "$O/forward_cost" > "$O/forward_cost.log" 2>&1
echo "   exit $?"
echo "== memory at B = 16"
bash "$HERE/memory.sh" "$O/memory" > "$O/memory.md" 2> "$O/memory.log"
echo "   exit $?"
echo "== the checks at B = 4"
{
  echo "# The issue's checks at benchmark.batch_size=4 (fp32, CPU, one thread)"
  n=0
  for args in "model=small-code-msn decoder=tr_jacobi decoders=[jacobi,pld,lookahead]" \
              "pair=small-code decoder=speculative decoders=[ouroboros]"; do
    n=$((n + 1))
    echo; echo "## python -m specnoise $args benchmark=humaneval benchmark.limit=8 benchmark.batch_size=4"; echo
    # shellcheck disable=SC2086
    $PY -m specnoise $args benchmark=humaneval benchmark.limit=8 benchmark.batch_size=4 benchmark.threads=1 \
        logger=none "hydra.run.dir=$O/check-$n" 2>/dev/null | sed -n '/^| decoder/,/^$/p'
  done
} > "$O/checks.md"
echo "   exit $?"
