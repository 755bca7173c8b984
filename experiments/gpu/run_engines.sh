#!/usr/bin/env bash
# The engine figures (issue 11) on one GPU, one job after another: the compiled static-cache engine against
# hf_static on HumanEval, and the forward-cost curve t(q) of the shipped model and of a Llama-3-8B-shaped random model
# (eager and compiled, with the memory floor). Usage: bash experiments/gpu/run_engines.sh [OUT_DIR]
set -uo pipefail
O=${1:-outputs/gpu}
PY=${PYTHON:-python3}
mkdir -p "$O"
start=$SECONDS
step() {  # step NAME OVERRIDES...: one job into $O/NAME, its log beside it
  local name=$1; shift
  echo "== $name ($((SECONDS - start)) s): $*"
  $PY -m specnoise "$@" > "$O/$name.log" 2>&1
  echo "   exit $?"
}
BUCKETS='model.static_buckets=[1,8,16,64,72]'  # what AR, Jacobi, PLD, Lookahead and TR-Jacobi use: fewer graphs
step bf16-compiled +experiment=bench-gpu +subset=humaneval-gpu benchmark.limit=12 model.static_cache=true \
  model.compile=true "$BUCKETS" 'decoders=[jacobi,tr_jacobi,pld,lookahead,hf_static]' "hydra.sweep.dir=$O/bf16-compiled"
step fc-small task=forward_cost model.dtype=bfloat16 model.static_cache=false logger=none "hydra.run.dir=$O/fc-small"
step fc-8b task=forward_cost forward_cost.arch=config forward_cost.config_path=experiments/gpu/llama3-8b-config.json \
  model.dtype=bfloat16 model.static_cache=false 'forward_cost.q=[1,4,16,64,128]' logger=none "hydra.run.dir=$O/fc-8b"
step fc-8b-compiled task=forward_cost forward_cost.arch=config \
  forward_cost.config_path=experiments/gpu/llama3-8b-config.json model.dtype=bfloat16 model.static_cache=true \
  model.compile=true 'forward_cost.q=[1,16]' logger=none "hydra.run.dir=$O/fc-8b-compiled"
if [ $((SECONDS - start)) -lt "${SPEC_BENCH_IF_BEFORE:-300}" ]; then  # the Spec-Bench subset, if time allows
  step bf16-spec_bench +experiment=bench-gpu +subset=spec_bench-gpu "hydra.sweep.dir=$O/bf16-spec_bench"
fi
echo "== done ($((SECONDS - start)) s)"
for f in "$O"/fc-*/forward_cost.md; do echo "$f"; grep -E "memory_floor|compile_seconds|engine" "$f"; sed -n '/^|/p' "$f"; done
