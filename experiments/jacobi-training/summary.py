"""The jacobi-training table: one row per study row (+jacobi_training=NAME), from a sweep directory.

    python experiments/jacobi-training/summary.py SWEEP_DIR [OUT_DIR]

Reads each job's results.json (Jacobi, TR-Jacobi and AR rows, category "all") and train_results.json (held-out
loss, training and trajectory-collection seconds, tokens seen), and writes summary.md / summary.csv /
summary.png to OUT_DIR (default: SWEEP_DIR): every metric also relative to the shipped small-code-sft row.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pandas as pd

ORDER = ["sft-shipped", "msn-shipped", "sft", "msn", "cllm", "jacobi_forcing", "cllm-gold", "jf-nols",
         "cllm-gold-lr1e-3", "jf-nols-lr1e-3"]
SHIPPED_HELDOUT = {"sft-shipped": 0.836, "msn-shipped": 0.852}  # src/specnoise/assets/models/README.md


def row(job: Path) -> dict | None:
    if not (job / ".hydra" / "overrides.yaml").is_file():
        return None
    overrides = (job / ".hydra" / "overrides.yaml").read_text().splitlines()
    name = next((o.split("=", 1)[1] for o in overrides if "+jacobi_training=" in o), None)
    if name is None or not (job / "results.json").is_file():
        return None
    rows = {r["decoder"]: r for r in json.loads((job / "results.json").read_text())["rows"] if r["category"] == "all"}
    train = json.loads((job / "train_results.json").read_text()) if (job / "train_results.json").is_file() else {}
    jac, tr, ar = rows["jacobi"], rows["tr_jacobi"], rows["ar"]
    return {
        "row": name,
        "heldout_loss": train.get("heldout_loss", SHIPPED_HELDOUT.get(name)),
        "ref_nll": ar["ref_nll"],
        "pass@1": ar["task_score"],
        "jacobi_mat": jac["mean_accepted_tokens"],
        "tr_jacobi_mat": tr["mean_accepted_tokens"],
        "jacobi_speedup": jac["speedup"],
        "tr_jacobi_speedup": tr["speedup"],
        "ar_tokens_per_s": ar["tokens_per_second"],
        "lossless": min(jac["lossless_fraction"], tr["lossless_fraction"]),
        "steps": train.get("steps", 0),
        "tokens_seen": train.get("tokens_seen", 0),
        "train_s": train.get("train_seconds", 0.0),
        "collect_s": train.get("collect_seconds", 0.0),
        "trajectory_prompts_kept": train.get("trajectory_kept"),
    }


def main(sweep: str, out: str | None = None) -> pd.DataFrame:
    sweep_dir, out_dir = Path(sweep), Path(out or sweep)
    if not sweep_dir.is_dir():
        sys.exit(f"{sweep}: no such sweep directory\n\n{__doc__.strip()}")
    rows = [r for job in sorted(sweep_dir.iterdir()) if job.is_dir() and (r := row(job))]
    if not any(r["row"] == "sft-shipped" for r in rows):  # every metric is relative to that row
        sys.exit(f"{sweep}: no finished +jacobi_training=sft-shipped job (the reference row); is it the sweep of "
                 "+experiment=jacobi-training(-tiny)?")
    df = pd.DataFrame(rows).set_index("row")
    df = df.loc[[r for r in ORDER if r in df.index]]
    ref = df.loc["sft-shipped"]
    for col in ("heldout_loss", "ref_nll", "jacobi_mat", "tr_jacobi_mat"):
        df[f"{col}_vs_sft"] = df[col] / ref[col]
    df["cost_s"] = df["train_s"] + df["collect_s"]
    out_dir.mkdir(parents=True, exist_ok=True)
    df.to_csv(out_dir / "summary.csv")
    (out_dir / "summary.md").write_text(df.to_markdown(floatfmt=".3f") + "\n")
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, axes = plt.subplots(1, 3, figsize=(13, 3.6))
        for ax, col, title in zip(axes, ("jacobi_mat_vs_sft", "tr_jacobi_mat_vs_sft", "ref_nll_vs_sft"),
                                  ("Jacobi MAT / SFT", "TR-Jacobi MAT / SFT", "ref_nll / SFT (lower is better)")):
            df[col].plot.bar(ax=ax, color="tab:blue")
            ax.axhline(1.0, ls="--", c="k", lw=0.8)
            ax.set_title(title)
            ax.set_xlabel("")
        fig.tight_layout()
        fig.savefig(out_dir / "summary.png", dpi=110)
    except ImportError:
        pass
    print(df.to_markdown(floatfmt=".3f"))
    return df


if __name__ == "__main__":
    if not 1 <= len(sys.argv) - 1 <= 2 or sys.argv[1] in ("-h", "--help"):
        sys.exit(__doc__.strip())
    main(*sys.argv[1:])
