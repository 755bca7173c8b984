#!/usr/bin/env bash
# The lock-step issue's speed check with decoder.auto=true (each row's proposals priced at t(B x q) / B): PLD and
# TR-Jacobi against batched AR in the same job, at B = 4 and 16, on HumanEval (16 problems at B = 4, 48 at B = 16: the
# bootstrap CI resamples groups, and 16 problems at B = 16 are one group, no CI; checks-auto-plan-15.md and earlier ran
# 16 there) and 18 Spec-Bench questions (3 per category), 64 new tokens, 3 repeats, fp32, one thread; one job at a time
# (they are timed).
# Batches of similar prompt length (benchmark.group_by_length, the default since 2026-11-29; checks-auto-plan-11.md and
# earlier ran in dataset order: EXTRA=benchmark.group_by_length=false repeats them).
#   bash experiments/batch-scaling/checks_auto.sh [OUT_DIR] > tiny/checks-auto.md    (from the repository root)
#   EXTRA="model.attn_implementation=sdpa_gqa" bash ...: more overrides for every job
set -uo pipefail
O=${1:-outputs/batch-scaling/checks-auto}
PY=${PYTHON:-python}
mkdir -p "$O"
echo "# decoder.auto=true at benchmark.batch_size=4 and 16 (fp32, CPU, one thread, 64 new tokens, 3 repeats)"
for B in 4 16; do
  humaneval=$([ "$B" -ge 16 ] && echo 48 || echo 16)
  for data in "benchmark=humaneval benchmark.limit=$humaneval" "benchmark=spec_bench benchmark.limit_per_category=3"; do
    name=B$B-$(echo "${data%% *}" | cut -d= -f2)
    args="model=small-code-msn decoder=pld decoders=[tr_jacobi] decoder.auto=true $data benchmark.batch_size=$B ${EXTRA:-}"
    echo; echo "## python -m specnoise $args benchmark.max_new_tokens=64 benchmark.repeats=3 benchmark.threads=1"; echo
    # shellcheck disable=SC2086
    $PY -m specnoise $args benchmark.max_new_tokens=64 benchmark.repeats=3 benchmark.threads=1 logger=none \
        "hydra.run.dir=$O/$name" 2>"$O/$name.log" | sed -n '/^| decoder/,/^$/p'
  done
done
