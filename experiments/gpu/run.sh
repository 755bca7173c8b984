#!/usr/bin/env bash
# The committed GPU results, in one command (jobs one after another: they are timed). Usage:
#   bash experiments/gpu/run.sh [OUT_DIR]     (default outputs/gpu; then copy OUT_DIR/* to experiments/gpu/<device>/)
# 1. +experiment=bench-gpu: every decoder and peer, bf16, default backend policy, HumanEval + Spec-Bench subsets
# 2. the fp32 reference (HumanEval): AR speed fp32 vs bf16, exactness
# 3. bf16 with benchmark.strict_numerics=true, and 4. bf16 with eager attention (HumanEval)
set -uo pipefail
O=${1:-outputs/gpu}
PY=${PYTHON:-python3}
mkdir -p "$O"
run() {  # run NAME OVERRIDES...: one sweep into $O/NAME, its log beside it
  local name=$1; shift
  echo "== $name: $*"
  $PY -m specnoise +experiment=bench-gpu "hydra.sweep.dir=$O/$name" "$@" > "$O/$name.log" 2>&1
  echo "   exit $?"
  sed -n '/^    decoder  *prompts/,/^$/p' "$O/$name.log"
}
run bf16 ${BF16_EXTRA:-}
run fp32 +subset=humaneval-gpu model.dtype=float32 draft.dtype=float32 'decoders=[tr_jacobi,pld,lookahead]'
run bf16-strict +subset=humaneval-gpu benchmark.strict_numerics=true 'decoders=[tr_jacobi,pld,lookahead,speculative]'
run bf16-eager +subset=humaneval-gpu model.attn_implementation=eager draft.attn_implementation=eager \
  'decoders=[tr_jacobi,pld,lookahead,speculative]'
