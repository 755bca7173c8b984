"""The MSN scaling study's analysis: what MSN buys (Jacobi MAT lift) and costs (quality) at each model size.

Input: the job directories of ``+experiment=msn-scaling`` (each job fine-tunes one base size with one noise
setting, then benchmarks Jacobi and TR-Jacobi with ref_nll), collected by ``specnoise.report.collect``: one row per
job x decoder x category, the job's overrides as columns (``scaling_base``, ``scaling_noise``) and its
train_results.json as ``train_*`` columns (``train_parameters``, ``train_heldout_loss``). Against SFT at the same
size, for every noise setting:

    lift          = mean accepted tokens / SFT's     (per decoder)
    ref_nll_ratio = ref_nll / SFT's                  quality cost: the larger of the two ratios;
    heldout_ratio = held-out loss / SFT's            "within 2%" = at most 1.02

    python -m specnoise.studies.msn_scaling outputs/multirun/DATE/TIME [DIR ...] [--out experiments/msn-scaling]

writes study.csv (every number), study.md (the table, the best setting per size, whether the lift grows with
scale - said only when no larger size's SFT model is worse than a smaller one's, else why it cannot be said) and
lift_vs_params.png (lift against parameter count, log x, one line per noise setting).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd

from specnoise.config import UserError
from specnoise.files import write_atomic
from specnoise.report import _fmt, collect
from specnoise.report_plots import save

SIZE, NOISE, BASELINE = "scaling_base", "scaling_noise", "sft"
DECODERS = ("jacobi", "tr_jacobi")
TOLERANCE = 0.02  # quality within 2% of SFT's, the paper's "same quality"


def study_table(df: pd.DataFrame, size: str = SIZE, noise: str = NOISE, baseline: str = BASELINE) -> pd.DataFrame:
    """One row per size x noise setting: parameters, MAT per decoder, ref_nll, held-out loss, and each as a
    ratio to SFT's at the same size; sorted by parameter count."""
    missing = {size, noise, "decoder", "category", "mean_accepted_tokens"} - set(df)
    if missing:
        raise UserError(f"not an msn-scaling sweep: the runs lack {sorted(missing)} (expected jobs of "
                        f"+experiment=msn-scaling, whose overrides name +{size}=... and +{noise}=...)")
    optional = ("train_parameters", "train_heldout_loss", "ref_nll")  # absent from runs that did not train / score
    rows = df[df["category"] == "all"].assign(**{c: float("nan") for c in optional if c not in df})
    jobs = rows.groupby([size, noise]).agg(parameters=("train_parameters", "first"), ref_nll=("ref_nll", "mean"),
                                           heldout_loss=("train_heldout_loss", "first"))
    mat = rows[rows["decoder"].isin(DECODERS)].pivot_table(index=[size, noise], columns="decoder",
                                                          values="mean_accepted_tokens", aggfunc="mean")
    table = jobs.join(mat.add_prefix("mat_")).reset_index()
    if baseline not in set(table[noise]):
        raise UserError(f"no {noise}={baseline} jobs among the runs: every lift is relative to SFT at the same size")
    sft = table[table[noise] == baseline].set_index(size)
    for d in (d for d in DECODERS if f"mat_{d}" in table):
        table[f"lift_{d}"] = table[f"mat_{d}"] / table[size].map(sft[f"mat_{d}"])
    table["ref_nll_ratio"] = table["ref_nll"] / table[size].map(sft["ref_nll"])
    table["heldout_ratio"] = table["heldout_loss"] / table[size].map(sft["heldout_loss"])
    table["quality_ratio"] = table[["ref_nll_ratio", "heldout_ratio"]].max(axis=1)  # NaN-skipping
    table["within_2pct"] = table["quality_ratio"] <= 1 + TOLERANCE
    table["parameters"] = table[size].map(table.groupby(size)["parameters"].max())  # one count per base
    table["_after_sft"] = table[noise] != baseline  # SFT first within each size
    table = table.sort_values(["parameters", size, "_after_sft", noise], na_position="last")
    return table.drop(columns="_after_sft").reset_index(drop=True)


def best_per_size(table: pd.DataFrame, size: str = SIZE, noise: str = NOISE, baseline: str = BASELINE,
                  lift: str = "lift_jacobi") -> pd.DataFrame:
    """At each size, the noise setting with the largest lift among those whose quality stays within 2%."""
    out = []
    for value, group in table.groupby(size, sort=False):
        ok = group[(group[noise] != baseline) & group["within_2pct"]].dropna(subset=[lift])
        best = ok.loc[ok[lift].idxmax()] if not ok.empty else None
        out.append({size: value, "parameters": group["parameters"].iloc[0],
                    "best": best[noise] if best is not None else "none within 2%",
                    **{c: best[c] if best is not None else None
                       for c in (lift, "lift_tr_jacobi", "ref_nll_ratio", "heldout_ratio") if c in table}})
    return pd.DataFrame(out)


def weaker_larger_bases(table: pd.DataFrame, sizes: list[str], size: str = SIZE, noise: str = NOISE,
                        baseline: str = BASELINE) -> list[str]:
    """Consecutive pairs of ``sizes`` (ascending parameter count) whose larger SFT model is worse than the smaller
    one's on ref_nll or held-out loss, in words. A larger model of one family trained comparably is at least as
    good; if it is worse, its base was under-trained and size is confounded with training, so no trend can be read."""
    sft = table[table[noise] == baseline].set_index(size)
    out = []
    for small, large in zip(sizes, sizes[1:]):
        worse = [f"{col} {sft.at[large, col]:.3f} vs {sft.at[small, col]:.3f}"
                 for col in ("ref_nll", "heldout_loss")
                 if col in sft and pd.notna(sft.at[large, col]) and pd.notna(sft.at[small, col])
                 and sft.at[large, col] > sft.at[small, col]]
        if worse:
            out.append(f"{large}'s SFT model is worse than {small}'s ({', '.join(worse)})")
    return out


def trend(best: pd.DataFrame, table: pd.DataFrame | None = None, size: str = SIZE, lift: str = "lift_jacobi") -> str:
    """Plain words: does the best within-2% lift grow with the parameter count? Only said when the sizes' SFT
    baselines (from ``table``) are of comparable training, i.e. a larger one is never worse than a smaller one."""
    known = best.dropna(subset=[lift])
    steps = " -> ".join(f"{r[size]} {r[lift]:.3f} ({r['parameters'] / 1e6:.1f}M)" for _, r in known.iterrows())
    if len(known) < 2:
        return f"Too few sizes with a setting within 2% of SFT's quality to tell a trend ({steps or 'none'})."
    head = f"Jacobi MAT lift of the best setting within 2% of SFT's quality: {steps}"
    weaker = weaker_larger_bases(table, list(known[size]), size) if table is not None else []
    if weaker:
        return (f"{head}; no trend with scale can be read from this: {'; '.join(weaker)}, so the larger base is "
                "the weaker model and size is confounded with training. A trend needs bases of comparable training "
                "(the larger one at least as good as the smaller one).")
    diffs = known[lift].diff().dropna()
    verdict = ("grows with scale" if (diffs > 0).all() else "shrinks with scale" if (diffs < 0).all()
               else "does not change monotonically with scale")
    return f"{head}; it {verdict}."


def plot_lift(table: pd.DataFrame, path: Path, size: str = SIZE, noise: str = NOISE,
              baseline: str = BASELINE) -> None:
    """Lift against parameter count (log x), one line per noise setting, one panel per decoder; an open marker is
    a setting whose quality is more than 2% worse than SFT's."""
    import matplotlib.pyplot as plt  # after specnoise.report_plots chose the Agg backend

    lifts = [c for c in (f"lift_{d}" for d in DECODERS) if c in table]
    fig, axes = plt.subplots(len(lifts), 1, figsize=(7.5, 3.2 * len(lifts)), squeeze=False)
    data = table[table[noise] != baseline]
    sizes = sorted(data["parameters"].dropna().unique())
    for ax, col in zip(axes[:, 0], lifts):
        for setting, group in data.groupby(noise, sort=False):
            (line,) = ax.plot(group["parameters"], group[col], marker="o", label=setting)
            worse = group[~group["within_2pct"]]
            ax.plot(worse["parameters"], worse[col], "o", color=line.get_color(), mfc="white", label="_worse")
        ax.axhline(1.0, color="grey", linestyle="--", linewidth=0.8)  # SFT at the same size
        ax.set_xscale("log")
        ax.set_xticks(sizes, [f"{p / 1e6:.3g}M" for p in sizes])
        ax.minorticks_off()
        ax.set_xlabel("parameters (open marker: quality more than 2% worse than SFT's)")
        ax.set_ylabel(f"MAT lift over SFT ({col.removeprefix('lift_')})")
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    save(fig, path)


def exact_ratios(df: pd.DataFrame) -> pd.DataFrame:
    """Quality ratios to four decimals: the 2% line must be readable off the table (1.0204 is out, 1.0196 in)."""
    cols = [c for c in ("ref_nll_ratio", "heldout_ratio") if c in df]
    return df.assign(**{c: df[c].map(lambda v: "" if pd.isna(v) else f"{v:.4f}") for c in cols})


def markdown_table(df: pd.DataFrame) -> str:
    return _fmt(exact_ratios(df)).to_markdown(index=False, disable_numparse=True)  # keep the four decimals


def write_study(roots: list[Path], out_dir: Path) -> Path:
    """Collect ``roots``, write study.csv, study.md and lift_vs_params.png into ``out_dir``; returns study.md."""
    df, _ = collect(roots)
    table = study_table(df)
    best = best_per_size(table)
    out_dir.mkdir(parents=True, exist_ok=True)
    write_atomic(out_dir / "study.csv", lambda tmp: table.to_csv(tmp, index=False))
    plot_lift(table, out_dir / "lift_vs_params.png")
    shown = [c for c in (SIZE, NOISE, "parameters", "mat_jacobi", "lift_jacobi", "mat_tr_jacobi", "lift_tr_jacobi",
                         "ref_nll", "ref_nll_ratio", "heldout_loss", "heldout_ratio", "within_2pct") if c in table]
    md = "\n".join([
        "# MSN scaling study", "",
        f"Runs: {', '.join(map(str, roots))}. Lift and ratios are against SFT at the same size; quality within 2% "
        "means both ref_nll and held-out loss at most 1.02x SFT's.", "",
        "## Every size and noise setting", "", markdown_table(table[shown]), "",
        "## Best setting per size (quality within 2%)", "", markdown_table(best), "",
        trend(best, table), "", "![lift_vs_params](lift_vs_params.png)", ""])
    write_atomic(out_dir / "study.md", md)
    print(_fmt(best).to_string(index=False) + "\n\n" + trend(best, table) + f"\n\nstudy: {out_dir}/study.md")
    return out_dir / "study.md"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m specnoise.studies.msn_scaling", description=__doc__.split("\n")[0])
    parser.add_argument("runs", nargs="+", type=Path, help="sweep or run directories of +experiment=msn-scaling")
    parser.add_argument("--out", type=Path, help="output folder (default: <first run dir>/study)")
    args = parser.parse_args(argv)
    try:
        write_study(args.runs, args.out or args.runs[0] / "study")
    except UserError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
