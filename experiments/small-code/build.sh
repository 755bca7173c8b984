#!/usr/bin/env bash
# Build the shipped small-code model set on one GPU with the project's own presets (~7 minutes on an H100):
#   1. base (small-code-pretrain; trains the tokenizer first)   } in parallel once the tokenizer exists
#   2. draft base (small-code-draft-pretrain, same tokenizer)    }
#   3. SFT and MSN of the base, SFT of the draft base (same data, steps and seed), in parallel
#   4. a check: Jacobi, TR-Jacobi and speculative decoding on 10 HumanEval prompts
# Outputs in outputs/build/<preset>/ (model/, train_results.json, log). Extra Hydra overrides for every
# training job can be passed as arguments (e.g. train.max_minutes=0.2 for a smoke run).
set -euo pipefail
B=outputs/build
PY=${PYTHON:-python3}
mkdir -p "$B"
run() {  # run PRESET [overrides...]: one job, its log beside its run dir
  local name=$1; shift
  mkdir -p "$B/$name"
  $PY -m specnoise "+experiment=$name" logger=none "hydra.run.dir=$B/$name" "$@" > "$B/$name/log" 2>&1
}
run small-code-pretrain "$@" &
base=$!
until [ -f "$B/small-code-pretrain/tokenizer/tokenizer.json" ]; do
  kill -0 $base 2>/dev/null || { echo "base pretraining failed:"; tail -30 "$B/small-code-pretrain/log"; exit 1; }
  sleep 2
done
run small-code-draft-pretrain "train.tokenizer_path=$B/small-code-pretrain/tokenizer" "$@" &
draft=$!
wait $base; echo "base: $(grep -o "held-out loss [0-9.]*" $B/small-code-pretrain/log | tail -1)"
run small-code-sft "model.path=$B/small-code-pretrain/model" "$@" &
sft=$!
run small-code-msn "model.path=$B/small-code-pretrain/model" "$@" &
msn=$!
wait $draft; echo "draft base: $(grep -o "held-out loss [0-9.]*" $B/small-code-draft-pretrain/log | tail -1)"
run small-code-draft "model.path=$B/small-code-draft-pretrain/model" "$@" &
dsft=$!
wait $sft $msn $dsft
for n in small-code-sft small-code-msn small-code-draft; do
  echo "$n: $(grep -o "held-out loss [0-9.]*" $B/$n/log | tail -1)"
done
$PY -m specnoise pair=small-code "model.path=$B/small-code-msn/model" "draft.path=$B/small-code-draft/model" \
  model.dtype=float32 draft.dtype=float32 decoder=jacobi "decoders=[tr_jacobi,speculative]" benchmark=humaneval \
  benchmark.limit=10 benchmark.max_new_tokens=128 logger=none "hydra.run.dir=$B/check" 2>&1 | tail -8
