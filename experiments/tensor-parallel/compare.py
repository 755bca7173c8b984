"""Compares the 2-process (tensor-parallel) runs of run.sh with the 1-process ones: every decoder's tokens on every
prompt, the lossless column, and the mean seconds per generation. Usage: python compare.py OUT_DIR"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from statistics import fmean


def rows(run: Path) -> dict:
    return {(r["id"], r["decoder"], r["turn"]): r for r in map(json.loads, (run / "per_prompt.jsonl").open())}


def main(out: Path) -> None:
    print("| job | decoder | prompts | tokens identical 1 vs 2 processes | lossless (2 processes) | MAT | "
          "s/generation 1 process | s/generation 2 processes |")
    print("|---|---|---|---|---|---|---|---|")
    for job in ("solo", "pair"):
        one, two = rows(out / f"{job}-tp1"), rows(out / f"{job}-tp2")
        assert one.keys() == two.keys(), f"{job}: the runs measured different prompts"
        results = json.loads((out / f"{job}-tp2" / "results.json").read_text())["rows"]
        for decoder in dict.fromkeys(k[1] for k in one):
            keys = [k for k in one if k[1] == decoder]
            same = sum(one[k]["tokens"] == two[k]["tokens"] for k in keys)
            row = next(r for r in results if r["decoder"] == decoder and r["category"] == "all")
            print(f"| {job} | {decoder} | {len(keys)} | {same}/{len(keys)} | {row['lossless_fraction']:.3f} | "
                  f"{row['mean_accepted_tokens']:.3f} | {fmean(one[k]['seconds'] for k in keys):.3f} | "
                  f"{fmean(two[k]['seconds'] for k in keys):.3f} |")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
