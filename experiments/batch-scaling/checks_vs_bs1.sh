#!/usr/bin/env bash
# The lock-step issue's "every decoder's batched speedup >= 0.9x its batch-1 speedup at B = 4", with decoder.auto=true:
# every drafter at batch 1 (against AR at batch 1) and at B = 4 (against batched AR, same job), on 16 HumanEval
# problems and 18 Spec-Bench questions (3 per category), 64 new tokens, 3 repeats, fp32, one thread, batches grouped
# by prompt length (the default); one job at a time (they are timed). Prints each job's table, then the ratios.
#   bash experiments/batch-scaling/checks_vs_bs1.sh [OUT_DIR] > tiny/checks-vs-bs1.md    (from the repository root)
#   QUEUE=64 bash ...: the B = 4 jobs with continuous batching (benchmark.queue=64: each subset one queue for 4 rows)
set -uo pipefail
O=${1:-outputs/batch-scaling/checks-vs-bs1}
PY=${PYTHON:-python}
mkdir -p "$O"
DECODERS="[tr_jacobi,pld,lookahead,token_recycling,sam,rest,speculative,ouroboros]"
echo "# decoder.auto=true at batch 1 and at B = 4 (fp32, CPU, one thread, 64 new tokens, 3 repeats)"
for data in "benchmark=humaneval benchmark.limit=16" "benchmark=spec_bench benchmark.limit_per_category=3"; do
  for B in 1 4; do
    name=B$B-$(echo "${data%% *}" | cut -d= -f2)
    queue=$([ "$B" -gt 1 ] && [ -n "${QUEUE:-}" ] && echo "benchmark.queue=$QUEUE")
    args="pair=small-code decoder=jacobi decoders=$DECODERS decoder.auto=true $data benchmark.batch_size=$B $queue ${EXTRA:-}"
    echo; echo "## python -m specnoise $args benchmark.max_new_tokens=64 benchmark.repeats=3 benchmark.threads=1"; echo
    # shellcheck disable=SC2086
    $PY -m specnoise $args benchmark.max_new_tokens=64 benchmark.repeats=3 benchmark.threads=1 logger=none \
        "hydra.run.dir=$O/$name" 2>"$O/$name.log" | sed -n '/^| decoder/,/^$/p' | grep -E '^\| decoder|^\|:-|\| all '
  done
done
echo; echo "## Batched speedup over batch-1 speedup, per decoder"; echo
$PY experiments/batch-scaling/vs_bs1.py "$O"
