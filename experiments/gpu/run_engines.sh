#!/usr/bin/env bash
# The engine figures (issue 11) on one GPU, one job after another: the compiled static-cache engine (CUDA graphs)
# against hf_static on HumanEval and on the Spec-Bench subset, every decoder on it (the draft compiled too), and the
# forward cost t(q) of a Llama-3-8B-shaped random model on the compiled engine with transformers' sdpa and with
# sdpa_gqa, beside the memory floor. Usage: bash experiments/gpu/run_engines.sh [OUT_DIR]
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
BUCKETS='static_buckets=[1,8,16,64,72]'  # the block sizes AR, Jacobi, PLD, Lookahead and TR-Jacobi use: fewer graphs
DRAFT='static_buckets=[1,8,16,64,128]'  # speculative's drafts, and Ouroboros' lookahead window on the draft (121 tokens)
step bf16-compiled +experiment=bench-gpu +subset=humaneval-gpu benchmark.limit=12 \
  model.static_cache=true model.compile=true "model.$BUCKETS" draft.static_cache=true draft.compile=true \
  "draft.$DRAFT" 'decoders=[jacobi,tr_jacobi,pld,lookahead,speculative,ouroboros,hf_static]' \
  "hydra.sweep.dir=$O/bf16-compiled"
step bf16-compiled-spec_bench +experiment=bench-gpu +subset=spec_bench-gpu \
  model.static_cache=true model.compile=true "model.$BUCKETS" draft.static_cache=true draft.compile=true \
  "draft.$DRAFT" 'decoders=[jacobi,tr_jacobi,pld,lookahead,speculative,ouroboros,hf_static]' \
  "hydra.sweep.dir=$O/bf16-compiled-spec_bench"
for attn in sdpa_gqa sdpa; do
  step fc-8b-compiled-$attn task=forward_cost forward_cost.arch=config \
    forward_cost.config_path=experiments/gpu/llama3-8b-config.json model.dtype=bfloat16 model.static_cache=true \
    model.compile=true model.attn_implementation=$attn 'forward_cost.q=[1,16]' logger=none \
    "hydra.run.dir=$O/fc-8b-compiled-$attn"
done
echo "== done ($((SECONDS - start)) s)"
grep -E "^\| (ar|jacobi|tr_jacobi|pld|lookahead|speculative|ouroboros|hf_static) +\| all" "$O"/bf16-compiled*.log
for f in "$O"/fc-*/forward_cost.md; do echo "$f"; grep -E "memory_floor|compile_seconds|attn" "$f"; sed -n '/^|/p' "$f"; done
