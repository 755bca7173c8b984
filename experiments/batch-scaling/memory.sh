#!/usr/bin/env bash
# Peak resident memory at benchmark.batch_size=16: the AR job and the TR-Jacobi job, each its own process, on the first
# 16 HumanEval problems (one group), shipped small-code-msn, fp32, one thread, 128 new tokens. Each job's
# results.json["meta"] holds peak_rss_mib (getrusage(RUSAGE_SELF).ru_maxrss: the whole process, loading included)
# and peak_rss_before_timing_mib (the same once the models are loaded, before the first generation); the TR-Jacobi job
# also runs batched AR and AR at batch 1 (ar_bs1), like every batched job, so its peak is at least the AR job's.
#   bash experiments/batch-scaling/memory.sh [OUT_DIR]    (prints a Markdown table)
set -uo pipefail
O=${1:-outputs/batch-scaling-memory}
PY=${PYTHON:-python}
mkdir -p "$O"
for decoder in ar tr_jacobi; do
  $PY -m specnoise model=small-code-msn "decoder=$decoder" benchmark=humaneval benchmark.limit=16 \
      benchmark.batch_size=16 benchmark.threads=1 benchmark.cost_bound=false logger=none \
      "hydra.run.dir=$O/$decoder" > "$O/$decoder.log" 2>&1 || echo "job $decoder failed: $O/$decoder.log" >&2
done
$PY - "$O" <<'PY'
import json, sys
from pathlib import Path
out = Path(sys.argv[1])
meta = {d: json.loads((out / d / "results.json").read_text())["meta"] for d in ("ar", "tr_jacobi")}
print("| job (B = 16) | peak RSS MiB | RSS before timing MiB | growth while decoding MiB |")
print("|---|---|---|---|")
for d, m in meta.items():
    print(f"| {d} | {m['peak_rss_mib']:.1f} | {m['peak_rss_before_timing_mib']:.1f} | "
          f"{m['peak_rss_mib'] - m['peak_rss_before_timing_mib']:.1f} |")
a, t = meta["ar"], meta["tr_jacobi"]
print(f"\npeak ratio tr_jacobi / ar = {t['peak_rss_mib'] / a['peak_rss_mib']:.3f} (the lock-step issue: done when <= 1.3)")
PY
