#!/usr/bin/env bash
# The GPU path re-checked in one lease (~5 minutes on an H100), one timed job after another, on 8 HumanEval
# problems and on the first Spec-Bench question of each category (SUBSETS), 128 new tokens, bf16:
# 1. engines: the static cache compiled (one CUDA graph per bucket, the draft compiled too), every drafter
#    faithful (decoder.auto=false) and hardware-aware (decoder.auto=true: each run times this GPU's own cost curve),
#    AR timed beside every decoder in each job (hf_static is left out: its own compile costs ~40 s a job;
#    run_engines.sh compares it);
# 2. batches: the dynamic engine (batched forwards run eagerly on every engine), PLD and TR-Jacobi faithful and auto
#    against batched AR in the same job, at B = 4 and 16 (16 HumanEval problems; Spec-Bench has 7 turns).
# The full engine and forward-cost figures are run_engines.sh's (~15 minutes with its 8B-shape compiles).
# Usage: bash experiments/gpu/run_checks.sh [OUT_DIR]; EXTRA="..." appends overrides to every job (a CPU dry run:
# EXTRA="model.device=cpu draft.device=cpu model.dtype=float32 draft.dtype=float32 model.compile=false
# draft.compile=false benchmark.limit=2 benchmark.max_new_tokens=16"). STEPS: which steps run ("engines batches",
# the default); STEP_S / BATCH_S: each step's time limit (seconds); LIMIT / REPEATS: prompts and timed repeats of the
# engine steps (8 / 1: the first run's); AFTER_STEP: a command run after each step (e.g. packing what is done so far).
set -uo pipefail
O=${1:-outputs/gpu-checks}
PY=${PYTHON:-python3}
STEP_S=${STEP_S:-170}
BATCH_S=${BATCH_S:-120}
mkdir -p "$O"
start=$SECONDS
step() {  # step NAME SECONDS OVERRIDES...: one sweep into $O/NAME, its log beside it, killed past SECONDS
  local name=$1 limit=$2; shift 2
  echo "== $name ($((SECONDS - start)) s): $*"
  # shellcheck disable=SC2086
  timeout -k 10 "$limit" $PY -m specnoise "$@" "hydra.sweep.dir=$O/$name" ${EXTRA:-} > "$O/$name.log" 2>&1
  echo "   exit $? ($((SECONDS - start)) s)"
  ${AFTER_STEP:-true}  # e.g. pack what is done so far
  grep -E "^\| *(ar|ar_bs1|jacobi|tr_jacobi|pld|lookahead|token_recycling|sam|rest|speculative|ouroboros|hf_static) +\|" \
    "$O/$name.log" | head -40
}
# Spec-Bench's summarization scorer needs rouge-score, which the GPU image lacks: the speed and the losslessness need
# no scores
scorer() { case $1 in spec_bench*) echo benchmark.scorer=none;; esac; }
for subset in ${SUBSETS:-humaneval-gpu spec_bench-gpu}; do
  [[ " ${STEPS:-engines batches} " == *" engines "* ]] || break
  step "engines-${subset%-gpu}" "$STEP_S" +experiment=bench-gpu "+subset=$subset" "benchmark.limit=${LIMIT:-8}" \
    "benchmark.repeats=${REPEATS:-1}" model.static_cache=true model.compile=true 'model.static_buckets=[1,8,16,64,72]' \
    draft.static_cache=true draft.compile=true 'draft.static_buckets=[1,8,16,64,128]' \
    'decoders=[jacobi,tr_jacobi,pld,lookahead,token_recycling,sam,rest,speculative,ouroboros]' \
    decoder.auto=false,true decoder.cost_cache="$O/cost_cache" $(scorer "$subset")
done
for subset in ${SUBSETS:-humaneval-gpu spec_bench-gpu}; do
  [[ " ${STEPS:-engines batches} " == *" batches "* ]] || break
  step "batches-${subset%-gpu}" "$BATCH_S" +experiment=bench-gpu "+subset=$subset" benchmark.limit=16 \
    benchmark.repeats=1 model.static_cache=false decoder=pld 'decoders=[tr_jacobi]' decoder.auto=false,true \
    benchmark.batch_size=4,16 decoder.cost_cache="$O/cost_cache" $(scorer "$subset")
done
echo "== done ($((SECONDS - start)) s)"
