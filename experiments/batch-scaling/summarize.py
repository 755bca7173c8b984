"""The README's tables from a batch-scaling report: speedup per decoder at each B (against AR at the same B and at
batch 1), AR's and hf_greedy's throughput, losslessness, and the forward-cost ratios t(B·q) / t(B·1) at each
decoder's mean verify block.

    python experiments/batch-scaling/summarize.py experiments/batch-scaling/tiny [--batches 1,4,16]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pandas as pd


def fmt(df: pd.DataFrame, digits: int = 2) -> str:
    return df.to_markdown(floatfmt=f".{digits}f")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("folder", help="a folder with report.csv (and forward_cost/batch_cost.csv)")
    parser.add_argument("--batches", default="1,4,16", help="batch sizes of the speedup tables")
    args = parser.parse_args()
    folder = Path(args.folder)
    df = pd.read_csv(folder / "report.csv")
    df = df[df["category"] == "all"].copy()
    df["B"] = pd.to_numeric(df["benchmark.batch_size"])
    batches = [int(b) for b in args.batches.split(",")]
    order = list(dict.fromkeys(df["decoder"]))
    for bench, part in df.groupby("benchmark", sort=False):
        print(f"\n## {bench}\n")
        for metric, title in (("speedup", "speedup vs AR at the same B"),
                              ("speedup_vs_bs1_ar", "speedup vs AR at batch 1 (AR's row: batching alone)"),
                              ("mean_accepted_tokens", "mean accepted tokens per target forward")):
            table = part.pivot_table(index="decoder", columns="B", values=metric, aggfunc="mean")
            table = table.reindex([d for d in order if d in table.index and d != "ar_bs1"])
            print(f"### {title}\n\n{fmt(table[[b for b in table.columns if b in batches] or table.columns])}\n")
        tps = part.pivot_table(index="decoder", columns="B", values="tokens_per_second", aggfunc="mean")
        if {"ar", "hf_greedy"} <= set(tps.index):
            ratio = (tps.loc["ar"] / tps.loc["hf_greedy"]).rename("ar / hf_greedy")
            both = pd.concat([tps.loc[["ar", "hf_greedy"]], ratio.to_frame().T])
            print(f"### throughput (tokens/s)\n\n{fmt(both, 2)}\n")
        lossless = part.groupby("B")[["lossless_fraction", "mismatch_fraction"]].agg(["min", "max"])
        print(f"### lossless_fraction and mismatch_fraction (min, max over decoders)\n\n{fmt(lossless)}\n")
    cost = folder / "forward_cost" / "batch_cost.csv"
    if cost.is_file():
        c = pd.read_csv(cost)
        ratio = c.pivot(index="batch_size", columns="q", values="ratio_to_bq1")
        print(f"## t(B·q) / t(B·1)\n\n{fmt(ratio)}\n")
        blocks = df[df["B"] == 1].dropna(subset=["verify_block"]) if "verify_block" in df else df.iloc[:0]
        if len(blocks):  # the forward-cost bound MAT x t(B·1) / t(B·q) at each decoder's mean verify block
            rows = {}
            for _, r in blocks.iterrows():
                q = float(r["verify_block"])
                at = {b: np.interp(np.log2(q), np.log2(ratio.columns.astype(float)), ratio.loc[b].values)
                      for b in ratio.index}
                rows[(r["benchmark"], r["decoder"])] = {"verify_block": q, **{f"bound B={b}": r["mean_accepted_tokens"]
                                                                              / at[b] for b in ratio.index}}
            print(f"## bound MAT x t(B·1) / t(B·q) at each decoder's verify block (B = 1 MAT)\n\n"
                  f"{fmt(pd.DataFrame(rows).T)}\n")


if __name__ == "__main__":
    main()
