"""Each decoder's speedup at B = 4 (against batched AR) over its speedup at batch 1 (against AR at batch 1), from
``checks_vs_bs1.sh``'s jobs: the lock-step issue's bar is >= 0.9.

    python experiments/batch-scaling/vs_bs1.py OUT_DIR
"""

from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd


def speedups(folder: Path) -> pd.DataFrame:
    df = pd.read_csv(folder / "results.csv")
    df = df[(df["category"] == "all") & ~df["decoder"].isin(["ar", "ar_bs1"])]
    return df.set_index("decoder")[["speedup", "speedup_ci_low", "speedup_ci_high", "mean_accepted_tokens"]]


def main(out: Path) -> None:
    print("| benchmark | decoder | batch 1 [95% CI] | MAT | B = 4 [95% CI] | MAT | B = 4 / batch 1 |")
    print("|---|---|---|---|---|---|---|")
    for bench in ("humaneval", "spec_bench"):
        one, four = speedups(out / f"B1-{bench}"), speedups(out / f"B4-{bench}")
        for name in one.index:
            a, b = one.loc[name], four.loc[name]
            print(f"| {bench} | {name} | {a.speedup:.3f} [{a.speedup_ci_low:.2f}, {a.speedup_ci_high:.2f}] | "
                  f"{a.mean_accepted_tokens:.2f} | {b.speedup:.3f} [{b.speedup_ci_low:.2f}, {b.speedup_ci_high:.2f}] | "
                  f"{b.mean_accepted_tokens:.2f} | {b.speedup / a.speedup:.2f} |")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
