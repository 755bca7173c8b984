"""The report's PNG plots (report.py collects the table): a bar per decoder and metric, a metric against a swept key,
and the batch-size study's three panels. Matplotlib's Agg backend: files only, never a display, also on a head node."""

from __future__ import annotations

import warnings
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from specnoise.bench.measure import REFERENCE  # noqa: E402  (a batched job's AR at batch 1, drawn like AR)
from specnoise.files import write_atomic  # noqa: E402


def as_text(df: pd.DataFrame) -> pd.DataFrame:
    """Every cell as text, a missing one included: a label or a group key (``astype(str)`` keeps NaN as NaN on
    pandas >= 3, and joining it fails)."""
    return df.map(str)


def label(df: pd.DataFrame, cols: list[str]) -> pd.Series:
    """Each row's ``key=value`` of ``cols``."""
    if not cols:
        return pd.Series("", index=df.index)
    return as_text(df[cols]).apply(lambda r: " ".join(f"{k}={v}" for k, v in r.items()), axis=1)


def plot_bars(df: pd.DataFrame, hue: list[str], metrics: list[str], path: Path, by: str = "decoder") -> None:
    """One panel per metric: a bar per ``by`` value, one colour per hue group."""
    series = label(df, hue).rename("group")
    ticks, bars = df[by].nunique(), df[by].nunique() * series.nunique()
    legend = 3.5 if hue else 0.0  # room for the legend right of the axes
    size = (max(5.0, 0.6 * ticks + 0.2 * bars + 1.5) + legend, 3.0 * len(metrics))
    fig, axes = plt.subplots(len(metrics), 1, squeeze=False, figsize=size)
    for ax, metric in zip(axes[:, 0], metrics):
        data = df.assign(group=series).pivot_table(index=by, columns="group", values=metric, aggfunc="mean",
                                                   sort=False)
        data.plot.bar(ax=ax, rot=30 if ticks > 4 else 0, legend=bool(hue), width=0.8, capsize=3,
                      yerr=ci_errors(df.assign(group=series), data, by) if metric == "speedup" else None)
        if ticks > 4:
            plt.setp(ax.get_xticklabels(), ha="right", rotation_mode="anchor")
        ax.set_ylabel(metric)
        ax.set_xlabel("")
        finish_axes(ax, metric, hue)
    save(fig, path)


def ci_errors(df: pd.DataFrame, data: pd.DataFrame, by: str):
    """The speedup CI as asymmetric error bars for ``data`` (rows: ``by``, columns: groups): an array of shape
    (groups, 2, rows) as pandas wants it; None when no row has a CI."""
    if "speedup_ci_low" not in df or df["speedup_ci_low"].isna().all():
        return None
    bounds = [df.pivot_table(index=by, columns="group", values=c, aggfunc="mean", sort=False).reindex_like(data)
              for c in ("speedup_ci_low", "speedup_ci_high")]
    below, above = (data - bounds[0]).clip(lower=0).fillna(0), (bounds[1] - data).clip(lower=0).fillna(0)
    return np.stack([below.T.to_numpy(), above.T.to_numpy()], axis=1)


def finish_axes(ax, metric: str, hue: list[str]) -> None:
    if metric in ("speedup", "mean_accepted_tokens"):
        ax.axhline(1.0, color="grey", linestyle="--", linewidth=0.8, label="_AR")  # AR's level by definition
    if hue:
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))


def save(fig, path: Path) -> None:
    with warnings.catch_warnings():  # "Tight layout not applied" on crowded figures: bbox_inches="tight" still fits
        warnings.simplefilter("ignore", UserWarning)
        fig.tight_layout()
    write_atomic(path, lambda tmp: fig.savefig(tmp, dpi=110, format="png", bbox_inches="tight"))
    plt.close(fig)


def plot_sweep(df: pd.DataFrame, x: str, hue: list[str], metrics: list[str], path: Path) -> None:
    """Metric vs the swept key, one line per decoder (and per other varying key)."""
    fig, axes = plt.subplots(len(metrics), 1, figsize=(6.5 + (3.5 if hue else 0.0), 3.0 * len(metrics)), squeeze=False)
    data = df.assign(group=label(df, hue), _x=df[x])
    numeric = pd.to_numeric(data["_x"], errors="coerce").notna().all()
    data["_x"] = pd.to_numeric(data["_x"]) if numeric else data["_x"].astype(str)
    for ax, metric in zip(axes[:, 0], metrics):
        table = data.pivot_table(index="_x", columns="group", values=metric, aggfunc="mean").sort_index()
        table.plot(ax=ax, marker="o", legend=bool(hue))
        ax.set_xlabel(x)
        ax.set_ylabel(metric)
        finish_axes(ax, metric, hue)
    save(fig, path)


def plot_batch_scaling(df: pd.DataFrame, x: str, groups: list[str], path: Path) -> None:
    """The batch-size study (``benchmark.batch_size`` swept): per decoder against B, the speedup over AR at the same
    B, the speedup over AR at batch 1 (AR's own line: what batching alone gives) and the throughput (tokens/s of
    the whole group); one column per other setting that varies (benchmark, subset)."""
    data = df[df["decoder"] != REFERENCE].assign(_x=pd.to_numeric(df[x], errors="coerce"), _g=label(df, groups))
    panels = [("speedup", "speedup vs AR at the same B"), ("speedup_vs_bs1_ar", "speedup vs AR at batch 1"),
              ("tokens_per_second", "tokens per second (group)")]
    panels = [(m, t) for m, t in panels if m in data and data[m].notna().any()]
    columns = list(dict.fromkeys(data["_g"]))
    if not panels or not columns:
        return
    decoders = list(dict.fromkeys(data["decoder"]))
    palette = plt.get_cmap("tab20" if len(decoders) > 10 else "tab10")
    style = {d: dict(color=palette(i % palette.N), marker="os^vD<>ph*"[i % 10], linestyle="-" if i < 10 else "--")
             for i, d in enumerate(decoders)}  # one look per decoder in every panel
    fig, axes = plt.subplots(len(panels), len(columns), squeeze=False,
                             figsize=(5.0 * len(columns) + 2.5, 3.2 * len(panels)))
    for j, group in enumerate(columns):
        part = data[data["_g"] == group]
        for i, (metric, title) in enumerate(panels):
            ax = axes[i, j]
            table = part.pivot_table(index="_x", columns="decoder", values=metric, aggfunc="mean").sort_index()
            for decoder in [d for d in decoders if d in table and not (metric == "speedup" and d == "ar")]:
                line = table[decoder].dropna()  # AR's speedup is the dashed line at 1
                ax.plot(line.index, line.values, label=decoder, markersize=4, linewidth=1.2, **style[decoder])
            ax.set_xscale("log", base=2)
            ax.set_xticks(table.index, [str(int(v)) for v in table.index])
            if metric == "tokens_per_second":
                ax.set_yscale("log")
            ax.set_xlabel("batch size B")
            ax.set_ylabel(metric)
            ax.set_title(f"{title}{' | ' + group if group else ''}", fontsize=8)
            if metric != "tokens_per_second":
                ax.axhline(1.0, color="grey", linestyle="--", linewidth=0.8)
    handles = {h.get_label(): h for ax in axes.flat for h in ax.get_lines() if not h.get_label().startswith("_")}
    order = [d for d in decoders if d in handles]
    fig.legend([handles[d] for d in order], order, fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 0.98))
    save(fig, path)
