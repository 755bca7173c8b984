#!/usr/bin/env bash
# The GPU path re-checked in one lease (~5 minutes on an H100 with LIMIT=8), one timed job after another, on 8 HumanEval
# problems and on the first Spec-Bench question of each category (SUBSETS), 128 new tokens, bf16:
# 1. side: the static cache compiled (one CUDA graph per bucket, the draft compiled too), every drafter faithful and
#    hardware-aware (NAME+auto entries: each times this GPU's own cost curve) side by side in one job against one AR
#    (hf_static is left out: its own compile costs ~40 s a job; run_engines.sh compares it); or "engines", as the
#    first runs did (h100/checks, h100/checks2, h200/checks): faithful and auto in two jobs (decoder.auto=false,true),
#    each against its own AR, whose baselines moved 6-8% apart on a lease;
# 2. batches: the dynamic engine, PLD and TR-Jacobi faithful and auto side by side against batched AR in one job
#    (h100/checks and checks2 ran them in two), at B = 4 and 16 (16 HumanEval problems; Spec-Bench has 7 turns);
# 3. compiled (not in the default STEPS): the same batches on the static compiled engine, whose batched forwards are
#    compiled and CUDA-graphed per (batch bucket, block bucket) the first time a batch meets one (up to 5 x 5 for
#    B = 16, nearly all in the untimed warm-up; COMPILED_S: its time limit, 500 s).
# The full engine and forward-cost figures are run_engines.sh's (~15 minutes with its 8B-shape compiles).
# Usage: bash experiments/gpu/run_checks.sh [OUT_DIR]; DRAFTERS=a,b: the side and engines steps' drafters (default
# all nine; e.g. DRAFTERS=lookahead,rest,tr_jacobi to re-measure what changed: faithful Jacobi, the experiment's
# own decoder, runs too); EXTRA="..." appends overrides to every
# job (a CPU dry run:
# EXTRA="model.device=cpu draft.device=cpu model.dtype=float32 draft.dtype=float32 model.compile=false
# draft.compile=false benchmark.limit=2 benchmark.max_new_tokens=16"). STEPS: which steps run ("side batches", the
# default; or "engines"); STEP_S / BATCH_S: each step's time limit (seconds); LIMIT / REPEATS: prompts and timed
# repeats of the side or engines steps (8 / 1: the first run's); AFTER_STEP: a command run after each step (e.g.
# packing what is done so far). A fresh machine's first side step compiles cold: ~110 s before its progress bar, then
# a warm-up generation per decoder (19 here) compiles more; at LIMIT=20 REPEATS=2 the HumanEval side step (760
# generations) did not finish in 170 s on 2026-11-27 (h100/checks3), the Spec-Bench one, compiled warm, took 89 s.
# With STEP_S=300 the default steps can need ~9 minutes: near a device call's 10-minute limit, run STEPS=side and
# STEPS=batches as two calls. What fit one lease on 2026-11-27 (h100/checks4, 731 s of device time): a first call on the
# fresh machine, LIMIT=8 REPEATS=2 STEP_S=250 STEPS=side, then STEPS=batches SUBSETS=humaneval-gpu BATCH_S=110 (381 s:
# the cold HumanEval side step wrote its results just inside 250 s), then three calls on the warm machine (each must
# start within the 30 s it stays warm), each one side or batches step with LIMIT=8 REPEATS=3: 47-87 s apiece.
set -uo pipefail
O=${1:-outputs/gpu-checks}
PY=${PYTHON:-python3}
STEP_S=${STEP_S:-300}
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
  grep -E "^\| *(ar|ar_bs1|jacobi|tr_jacobi|pld|lookahead|token_recycling|sam|rest|speculative|ouroboros|hf_static)(\+auto)? +\|" \
    "$O/$name.log" | head -40
}
# Spec-Bench's summarization scorer needs rouge-score, which the GPU image lacks: the speed and the losslessness need
# no scores
scorer() { case $1 in spec_bench*) echo benchmark.scorer=none;; esac; }
DRAFTERS=${DRAFTERS:-jacobi,tr_jacobi,pld,lookahead,token_recycling,sam,rest,speculative,ouroboros}
ENGINE=(model.static_cache=true model.compile=true 'model.static_buckets=[1,8,16,64,72]' draft.static_cache=true
        draft.compile=true 'draft.static_buckets=[1,8,16,64,128]')
for subset in ${SUBSETS:-humaneval-gpu spec_bench-gpu}; do
  [[ " ${STEPS:-side batches} " == *" side "* ]] || break
  step "side-${subset%-gpu}" "$STEP_S" +experiment=bench-gpu "+subset=$subset" "benchmark.limit=${LIMIT:-8}" \
    "benchmark.repeats=${REPEATS:-1}" "${ENGINE[@]}" "decoders=[$(sed 's/\([a-z_]*\)/\1,\1+auto/g' <<< "$DRAFTERS")]" \
    decoder.auto=false decoder.cost_cache="$O/cost_cache" $(scorer "$subset")
done
for subset in ${SUBSETS:-humaneval-gpu spec_bench-gpu}; do
  [[ " ${STEPS:-side batches} " == *" engines "* ]] || break
  step "engines-${subset%-gpu}" "$STEP_S" +experiment=bench-gpu "+subset=$subset" "benchmark.limit=${LIMIT:-8}" \
    "benchmark.repeats=${REPEATS:-1}" "${ENGINE[@]}" "decoders=[$DRAFTERS]" decoder.auto=false,true decoder.cost_cache="$O/cost_cache" $(scorer "$subset")
done
for subset in ${SUBSETS:-humaneval-gpu spec_bench-gpu}; do
  [[ " ${STEPS:-side batches} " == *" batches "* ]] || break
  step "batches-${subset%-gpu}" "$BATCH_S" +experiment=bench-gpu "+subset=$subset" benchmark.limit=16 \
    benchmark.repeats=1 model.static_cache=false decoder=pld 'decoders=[pld+auto,tr_jacobi,tr_jacobi+auto]' \
    decoder.auto=false \
    benchmark.batch_size=4,16 decoder.cost_cache="$O/cost_cache" $(scorer "$subset")
done
for subset in ${SUBSETS:-humaneval-gpu spec_bench-gpu}; do
  [[ " ${STEPS:-side batches} " == *" compiled "* ]] || break
  step "compiled-${subset%-gpu}" "${COMPILED_S:-500}" +experiment=bench-gpu "+subset=$subset" benchmark.limit=16 \
    benchmark.repeats=1 "${ENGINE[@]}" decoder=pld 'decoders=[pld+auto,tr_jacobi,tr_jacobi+auto]' decoder.auto=false \
    benchmark.batch_size=4,16 decoder.cost_cache="$O/cost_cache" $(scorer "$subset")
done
echo "== done ($((SECONDS - start)) s)"
