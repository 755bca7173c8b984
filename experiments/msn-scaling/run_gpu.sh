#!/usr/bin/env bash
# The MSN scaling study on one GPU (~9 minutes on an H100), with the project's presets:
#   1. pretrain the m base (25.7M) with small-code's corpus, tokenizer and recipe, while
#   2. xs (1.26M, the shipped draft's base, expected at outputs/msn-scaling/bases/scaling-xs/model) and
#      s (5.48M, the shipped small-code) are fine-tuned with every noise setting and benchmarked (12 jobs at once);
#   3. then m with every noise setting (6 jobs at once).
# Jobs run side by side (joblib), so their timings are not comparable: the study reads MAT, ref_nll and
# held-out losses, which are exact counts / deterministic. Extra arguments go to every job.
set -euo pipefail
S=outputs/msn-scaling
PY=${PYTHON:-python3}
mkdir -p $S/bases/scaling-m
$PY -m specnoise +experiment=msn-scaling-pretrain +scaling_base=m logger=none hydra.run.dir=$S/bases/scaling-m \
  ${M_PRETRAIN:-} "$@" > $S/bases/scaling-m/log 2>&1 &
pre=$!
$PY -m specnoise +experiment=msn-scaling +scaling_base=xs,s logger=none hydra/launcher=joblib \
  hydra.launcher.n_jobs=12 hydra.sweep.dir=$S/sweep-xs-s "$@" > $S/sweep-xs-s.log 2>&1 || echo "xs/s sweep: some jobs failed"
wait $pre || { echo "m pretraining failed"; tail -20 $S/bases/scaling-m/log; exit 1; }
echo "m base: $(grep -o "held-out loss [0-9.]*" $S/bases/scaling-m/log | tail -1)"
$PY -m specnoise +experiment=msn-scaling +scaling_base=m logger=none hydra/launcher=joblib \
  hydra.launcher.n_jobs=6 hydra.sweep.dir=$S/sweep-m "$@" > $S/sweep-m.log 2>&1 || echo "m sweep: some jobs failed"
