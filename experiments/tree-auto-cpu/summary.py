"""One row per run folder (results.json) and the median speedup per thread setting, as markdown."""

import json
import sys
from pathlib import Path

import pandas as pd

rows = []
for path in sorted(Path(sys.argv[1]).glob("*/results.json")):
    results = json.loads(path.read_text())
    by = {r["decoder"]: r for r in results["rows"] if r["category"] == "all"}
    tree = results["meta"]["decoders"]["tr_jacobi"]
    rows.append({"run": path.parent.name, "threads": results["meta"]["torch_threads"],
                 "ar_tok_s": by["ar"]["tokens_per_second"], "tr_jacobi_tok_s": by["tr_jacobi"]["tokens_per_second"],
                 "speedup": by["tr_jacobi"]["speedup"], "mat": by["tr_jacobi"]["mean_accepted_tokens"],
                 "lossless": by["tr_jacobi"]["lossless_fraction"], "tree_nodes": tree["tree_nodes"],
                 "retrieval_len": tree["retrieval_len"]})
table = pd.DataFrame(rows).sort_values(["threads", "run"])
print(table.to_markdown(index=False, floatfmt=".3f"))
print()
print(table.groupby("threads").speedup.agg(["median", "min", "max", "count"]).to_markdown(floatfmt=".3f"))
