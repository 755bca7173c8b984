#!/usr/bin/env bash
# TR-Jacobi with decoder.tree=auto against AR on the CPU (issue 11): the shipped MSN model, 12 HumanEval problems x
# 128 new tokens, one process, AR interleaved; REPEATS runs with torch's default intra-op threads and with one thread
# (a shared machine's speed moves between runs, so one run says little). Usage: bash experiments/tree-auto-cpu/run.sh
# [OUT_DIR] [REPEATS]; then python experiments/tree-auto-cpu/summary.py OUT_DIR > summary.md
set -euo pipefail
O=${1:-outputs/tree-auto-cpu}
N=${2:-4}
mkdir -p "$O"
for i in $(seq 1 "$N"); do
  for threads in default 1; do
    extra=(); [ "$threads" = default ] || extra=("benchmark.threads=$threads")
    python -m specnoise decoder=tr_jacobi decoder.tree=auto benchmark=humaneval benchmark.limit=12 \
      benchmark.max_new_tokens=128 benchmark.template=raw logger=none 'decoders=[]' ${extra[@]+"${extra[@]}"} \
      "hydra.run.dir=$O/threads-$threads-$i" > "$O/threads-$threads-$i.log" 2>&1  # the log beside the run
    echo "threads=$threads run $i done"
  done
done
