"""Collect finished runs into one pandas table: CSV, Markdown, PNG plots (report_plots.py), an HTML page
(report_html.py) and a console table.

``python -m specnoise task=report report.runs=[DIR,...]`` (and the multirun callback, after every sweep)
searches each DIR recursively for job directories - ``results.json`` (a benchmark), ``FAILED.json`` (a job
that raised) or just ``.hydra/`` (e.g. a training-only job) - and builds one row per job x decoder x
category. Each job's command-line overrides (``.hydra/overrides.yaml``) become columns, so whatever a
sweep varied is a column; the keys that vary decide how the plots are grouped.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
import yaml
from omegaconf import DictConfig, OmegaConf

from specnoise.bench.measure import REFERENCE  # (a batched job's AR at batch 1, drawn like AR)
from specnoise.bench.timing import ADVICE, noise_reasons
from specnoise.config import Config, ReportConfig, UserError
from specnoise.files import write_atomic
from specnoise.report_html import write_html
from specnoise.report_plots import as_text, plot_bars, plot_batch_scaling, plot_sweep
from specnoise.training.reuse import TRAINED_LABEL

log = logging.getLogger("specnoise.report")

ROW_KEYS = ("decoder", "model", "draft", "benchmark", "category")
METRICS = ("prompts", "new_tokens", "target_forwards", "draft_forwards", "mean_accepted_tokens", "tokens_per_second",
           "ar_tokens_per_second", "speedup", "speedup_ci_low", "speedup_ci_high", "ar_time_cv", "timing_noisy",
           "repeats", "lossless_fraction", "mismatch_fraction", "task_score", "score_metric", "ref_nll",
           "target_seconds", "draft_seconds", "other_seconds", "priced_seconds", "verify_block", "cost_ratio",
           "cost_bound", "speedup_exceeds_mat", "batch_size", "speedup_vs_bs1_ar", "identical_to_ar_fraction",
           "sampling_check", "timing_note", "units", "slower_units", "worst_unit", "worst_unit_speedup")
# benchmark.batch_size > 1 somewhere in the report: rows decoded together, and the speedup against AR at batch 1
BATCH_METRICS = ("batch_size", "speedup_vs_bs1_ar")
TABLE_METRICS = ("prompts", "new_tokens", "mean_accepted_tokens", "tokens_per_second", "speedup", "speedup_ci",
                 "timing_noisy", "lossless_fraction", "mismatch_fraction", "identical_to_ar_fraction", "sampling_check",
                 "task_score", "ref_nll")
SAMPLING_METRICS = ("identical_to_ar_fraction", "sampling_check")  # shown where some job sampled
# where the time goes, and what the machine allows (bench/bound.py): one table per report when measured
TIME_COLUMNS = ("category", "seconds", "target_seconds", "draft_seconds", "other_seconds", "priced_seconds",
                "mean_accepted_tokens", "verify_block", "cost_ratio", "cost_bound", "speedup", "speedup_exceeds_mat")
GROUP_KEYS = ("model", "draft", "benchmark")  # row fields that tell jobs apart before any override does
ROW_FIELDS = frozenset(ROW_KEYS + METRICS)
TRAIN_KEYS = ("stage", "steps", "train_loss", "heldout_loss", "train_seconds", "parameters")  # train_results.json


@dataclass
class Job:
    path: Path
    overrides: dict[str, object]
    rows: list[dict] = field(default_factory=list)
    error: str | None = None
    note: str = ""
    train: dict = field(default_factory=dict)  # train_results.json of a job that trained
    calibration: str | None = None  # results.json meta.calibration_warning (hf_greedy far from our AR)
    dir: Path | None = None  # the job's directory (``collect`` turns ``path`` into its label in the report)
    config: dict = field(default_factory=dict)  # the composed config: what a key the job did not override was


def config_value(config: dict, key: str) -> object:
    """``key`` (dotted) in a job's composed config; None when absent (an option without that key)."""
    value: object = config
    for part in key.split("."):
        if not isinstance(value, dict) or part not in value:
            return None
        value = value[part]
    if isinstance(value, list):  # as the command line writes it: one label, like an override's list
        return "[" + ",".join(map(str, value)) + "]"
    return json.dumps(value) if isinstance(value, dict) else value


# ------------------------------------------------------------------------------------------- collect
def find_jobs(roots: list[Path]) -> list[Path]:
    """Every job directory under the roots: the folders holding results.json, FAILED.json or .hydra/."""
    found: set[Path] = set()
    for root in (Path(r).resolve() for r in roots):
        if not root.exists():
            raise UserError(f"report.runs: {root} does not exist: pass run or multirun directories (outputs/...)")
        for name in ("results.json", "FAILED.json", ".hydra/overrides.yaml"):
            found.update(p.parent for p in root.rglob(name))
    found = {p.parent if p.name == ".hydra" else p for p in found}
    return sorted(found, key=_natural_key)


def _natural_key(path: Path) -> list[tuple[int, str]]:
    # multirun job folders are 0, 1, ..., 10: sort them as numbers (before names such as report/), not as strings
    return [(int(part), "") if part.isdigit() else (1 << 62, part) for part in path.parts]


def parse_value(text: str) -> object:
    try:
        value = yaml.safe_load(text)
    except yaml.YAMLError:
        return text
    if isinstance(value, (list, dict)):
        return text  # a list such as decoders=[jacobi,pld] is one label, not data
    return text if value is None else value


def read_overrides(job_dir: Path) -> dict[str, object]:
    path = job_dir / ".hydra" / "overrides.yaml"
    if not path.is_file():
        return {}
    overrides = {}
    for item in yaml.safe_load(path.read_text()) or []:
        key, _, value = str(item).partition("=")
        overrides[key.lstrip("+~")] = parse_value(value)
    return overrides


def read_job(job_dir: Path) -> Job | None:
    job = Job(job_dir, read_overrides(job_dir))
    if job.overrides.get("task") == "report":
        return None  # an earlier report run, not an experiment
    results, failed, trained = job_dir / "results.json", job_dir / "FAILED.json", job_dir / "train_results.json"
    if trained.is_file():
        try:
            job.train = json.loads(trained.read_text())
        except json.JSONDecodeError:
            job.note = "unreadable train_results.json"
    if results.is_file():
        try:
            data = json.loads(results.read_text())
            job.rows = list(data["rows"])
            job.calibration = (data.get("meta") or {}).get("calibration_warning")
            job.config = data.get("config") or {}
            job.overrides.setdefault("experiment", job.config.get("experiment"))
            if data.get("complete") is False:  # stopped by a signal; rerunning it in its directory continues it
                done = data.get("progress", {})
                job.note = (f"incomplete: stopped by {data.get('interrupted')} after {done.get('prompts')} of "
                            f"{done.get('of')} prompts")
        except (json.JSONDecodeError, KeyError, TypeError) as err:
            job.error = f"unreadable results.json ({type(err).__name__}: {err})"
    if failed.is_file():
        try:
            job.error = json.loads(failed.read_text()).get("error") or "failed (no message)"
        except json.JSONDecodeError:
            job.error = "failed (unreadable FAILED.json)"
    if not job.rows and job.error is None and not job.train:
        job.note = job.note or "no results.json (still running, or killed)"
    if job.overrides.get("experiment") is None:
        job.overrides.pop("experiment", None)
    if not job.config and (job_dir / ".hydra" / "config.yaml").is_file():  # a failed job: the config Hydra composed
        try:
            job.config = yaml.safe_load((job_dir / ".hydra" / "config.yaml").read_text()) or {}
        except yaml.YAMLError:
            pass
    return job


def collect(roots: list[Path]) -> tuple[pd.DataFrame, list[Job]]:
    """One DataFrame row per job x decoder x category, plus every job (failed ones carry their error)."""
    jobs = [job for job in map(read_job, find_jobs(roots)) if job is not None]
    if not jobs:
        where = ", ".join(map(str, roots))
        raise UserError(f"no results.json or FAILED.json under {where}: pass the run or multirun directories of "
                        "benchmark jobs with report.runs=[DIR,...]")
    base = _common_root([job.path for job in jobs])
    keys = list(dict.fromkeys(k for job in jobs for k in job.overrides))
    records = []
    for job in jobs:
        label = str(job.path.relative_to(base)) if job.path != base else job.path.name
        # a key another job overrode shows this job's own value of it (its default), not a blank
        settings = {k: job.overrides[k] if k in job.overrides else config_value(job.config, k) for k in keys}
        for row in job.rows:
            record = {"job": label}
            record.update({_column(k): v for k, v in settings.items()})
            record.update({f"train_{k}": job.train.get(k) for k in TRAIN_KEYS if job.train})
            record.update(row)
            records.append(record)
        job.dir, job.path = job.path, Path(label)
    return pd.DataFrame.from_records(records), jobs


def _column(key: str) -> str:
    return f"job.{key}" if key in ROW_FIELDS else key  # `decoder=pld` must not clobber the AR row's decoder


def _common_root(paths: list[Path]) -> Path:
    return Path(os.path.commonpath([str(p) for p in paths]))


# ------------------------------------------------------------------------------------------ analyse
def varying(df: pd.DataFrame, candidates: list[str]) -> list[str]:
    """The fewest candidate columns (in order) that tell apart every distinct job in ``df``."""
    chosen: list[str] = []
    groups = 1
    for col in candidates:
        if col not in df or df[col].nunique(dropna=False) < 2:
            continue
        n = as_text(df[chosen + [col]]).drop_duplicates().shape[0]
        if n > groups:
            chosen.append(col)
            groups = n
    return chosen


def spread_across_jobs(jobs: list[Job]) -> list[str]:
    """Override columns whose value differs between jobs, those without results included."""
    keys = dict.fromkeys(k for job in jobs for k in job.overrides)
    setting = lambda j, k: j.overrides[k] if k in j.overrides else config_value(j.config, k)  # noqa: E731
    return [_column(k) for k in keys if len({str(setting(j, k)) for j in jobs}) > 1]


def override_columns(df: pd.DataFrame, jobs: list[Job]) -> list[str]:
    keys = dict.fromkeys(_column(k) for job in jobs for k in job.overrides)
    return [k for k in keys if k in df]


def sweep_key(df: pd.DataFrame, cols: list[str], x: str | None, others: list[str] = ()) -> str | None:
    """report.x if given; else the first swept key whose values are all numbers and that varies on its own: among
    jobs that agree on every other setting in ``others``, it takes two values or more. A key that only differs
    between jobs of different kinds (HumanEval jobs with limit 6, Spec-Bench jobs with limit 1) is no axis."""
    if x == "off":
        return None
    if x:
        if x not in df:
            raise UserError(f"report.x={x}: not a column of the report; swept keys: {', '.join(cols) or 'none'}")
        return x
    for col in cols:
        values = df[col].dropna()
        if values.nunique() > 1 and pd.to_numeric(values, errors="coerce").notna().all() and \
                varies_alone(df, col, [c for c in others if c != col and not own_models(df, c, col)]):
            return col
    return None


def own_models(df: pd.DataFrame, col: str, x: str) -> bool:
    """Whether ``col`` is the model column of jobs that each trained their own model (``base+stage@job``), one per
    value of ``x`` (a sweep over noise length): the label names a job, not a setting, and does not stop ``x`` from
    being the axis. A model shared by the jobs of one training (``train.cache_dir``) is a setting again."""
    if col != "model" or not df[col].astype(str).str.contains(TRAINED_LABEL).all():
        return False
    pairs = as_text(df[[col, x]]).drop_duplicates()
    return pairs[col].is_unique and pairs[x].is_unique


def varies_alone(df: pd.DataFrame, col: str, others: list[str]) -> bool:
    keys = [c for c in others if c in df and df[c].nunique(dropna=False) > 1]
    if not keys:
        return True
    groups = as_text(df[keys]).agg("|".join, axis=1)
    return bool((df.groupby(groups)[col].nunique() > 1).any())


# ------------------------------------------------------------------------------------------- output
def _fmt(df: pd.DataFrame) -> pd.DataFrame:
    def cell(v):
        if isinstance(v, float):
            return "" if v != v else (f"{v:.0f}" if abs(v) >= 100 else f"{v:.3g}")
        return "" if v is None else v

    return df.map(cell)


def tables(df: pd.DataFrame, ids: list[str], metrics: list[str]) -> dict[str, pd.DataFrame]:
    """The main table (category `all`) and, when a benchmark has categories, one pivot per metric."""
    out: dict[str, pd.DataFrame] = {}
    if df.empty:
        return out
    main = shown_columns(df[df["category"] == "all"] if "category" in df else df)
    trained = ["train_heldout_loss"] if "train_heldout_loss" in df and df["train_heldout_loss"].notna().any() else []
    batched = ["decoder", *BATCH_METRICS] if is_batched(df) else ["decoder"]
    shown = [m for m in TABLE_METRICS if m in main and (m not in SAMPLING_METRICS or main[m].notna().any())]
    cols = [c for c in ids + batched + shown + trained if c in main]
    out["main"] = main[list(dict.fromkeys(cols))].reset_index(drop=True)
    if has_categories(df):
        order = [c for c in df["category"].unique() if c != "all"] + ["all"]
        for metric in metrics:
            if metric in df and df[metric].notna().any():
                index = [c for c in ids if c != "category"] + ["decoder"]
                pivot = df.pivot_table(index=index, columns="category", values=metric, aggfunc="mean", sort=False)
                out[f"{metric} by category"] = pivot.reindex(columns=order).reset_index()
    return out


def shown_columns(df: pd.DataFrame) -> pd.DataFrame:
    """The speedup's CI as one readable cell, and NOISY where the timing alarm went off (bench/timing.py)."""
    if "speedup_ci_low" in df:
        df = df.assign(speedup_ci=[f"{lo:.3g}-{hi:.3g}" if pd.notna(lo) and pd.notna(hi) else ""
                                   for lo, hi in zip(df["speedup_ci_low"], df["speedup_ci_high"])])
    if "timing_noisy" in df:
        df = df.assign(timing_noisy=df["timing_noisy"].map(lambda v: "NOISY" if v is True else ""))
    return df


def time_table(df: pd.DataFrame, ids: list[str]) -> pd.DataFrame | None:
    """Where each decoder's time went and its cost-model bound; None when no job measured them."""
    measured = [c for c in ("target_seconds", "cost_bound") if c in df and df[c].notna().any()]
    if not measured:
        return None
    cols = [c for c in ids if c != "category"] + ["decoder"] + [c for c in TIME_COLUMNS if c in df]
    return df[list(dict.fromkeys(cols))].reset_index(drop=True)


def noise_notes(df: pd.DataFrame, jobs: list[Job], ids: list[str]) -> tuple[list[str], list[str]]:
    """report.md's warnings, each one line per job (after the tables), and the rows they name (a details section at
    the end): noisy timings with why and what to do, hf_greedy calibrations, speedups above MAT."""
    lines: list[str] = []
    details: list[str] = []
    name = lambda r: " ".join(f"{c}={r[c]}" for c in [*ids, "decoder", "category"] if c in r)  # noqa: E731
    noisy = df[df["timing_noisy"] == True] if "timing_noisy" in df else df.iloc[:0]  # noqa: E712 (None: not judged)
    if not noisy.empty:
        lines += ["", "## Timing noise", "", ADVICE, ""]
        for job, rows in noisy.groupby("job", sort=False):
            judged = df[(df["job"] == job) & df["timing_noisy"].notna()]
            lines.append(f"- {job}: {len(rows)} of {len(judged)} rows noisy ({noise_reasons(rows.to_dict('records'))})")
        details += ["", "<details><summary>Noisy rows (also the timing_noisy column of report.csv)</summary>", ""]
        details += [f"- {r['job']}: {name(r)}" for _, r in noisy.iterrows()] + ["", "</details>"]
    if "why" in df and df["why"].notna().any():  # bench/timing.py's one line per decoder: what its speed comes from
        rows = df[df["why"].notna() & (df["category"] == "all" if "category" in df else True)]
        job = lambda r: "".join(f"{r[c]} " for c in ids if c in r and c != "decoder")  # noqa: E731
        lines += ["", "## Why each decoder runs at its speed", ""]
        lines += [f"- {job(r)}{r['why']}" for _, r in rows.iterrows()]
    calibrations = [j for j in jobs if j.calibration]
    if calibrations:
        lines += ["", "## Calibration", ""] + [f"- {j.path}: {j.calibration}" for j in calibrations]
    if "speedup_exceeds_mat" in df and (df["speedup_exceeds_mat"] == True).any():  # noqa: E712
        rows = df[df["speedup_exceeds_mat"] == True]  # noqa: E712
        lines += ["", "## Speedup above mean accepted tokens", "",
                  "No decoder can beat AR by more than the tokens it accepts per target forward: these rows are "
                  "timing artefacts.", ""] + [f"- {r['job']}: {name(r)}" for _, r in rows.iterrows()]
    return lines, details


def is_batched(df: pd.DataFrame) -> bool:
    """Whether some job of the report decoded its prompts in groups (``benchmark.batch_size`` > 1)."""
    return "batch_size" in df and bool((pd.to_numeric(df["batch_size"], errors="coerce") > 1).any())


def has_categories(df: pd.DataFrame) -> bool:
    """Whether some benchmark in ``df`` reports more than one category (Spec-Bench does; HumanEval does not)."""
    if "category" not in df:
        return False
    parts = df[df["category"] != "all"]
    if "benchmark" not in parts:
        return parts["category"].nunique() > 1
    return bool((parts.groupby("benchmark")["category"].nunique() > 1).any())


def markdown(title: str, sections: dict[str, pd.DataFrame], jobs: list[Job], plots: list[Path],
             notes: list[str] = (), details: list[str] = ()) -> str:
    """The results table first (what a reader came for), then the warnings, one line per job, the other tables,
    plots and job lists; the rows a warning names at the very end."""
    lines = [f"# {title}", ""]
    ok = [j for j in jobs if j.rows]
    lines.append(f"{len(jobs)} jobs: {len(ok)} with results, {sum(j.error is not None for j in jobs)} failed.")
    for i, (name, table) in enumerate(sections.items()):
        lines += ["", f"## {'Results (category all)' if name == 'main' else name}", "",
                  _fmt(table).to_markdown(index=False)]
        if i == 0:
            lines += notes
    if not sections:
        lines += notes
    if plots:
        lines += ["", "## Plots", ""] + [f"![{p.stem}]({p.name})" for p in plots]
    trained = [j for j in jobs if j.train]
    if trained:
        cols = (*TRAIN_KEYS, "model")
        header = "| job | overrides | " + " | ".join(cols) + " |"
        lines += ["", "## Training", "", header, "|---" * (len(cols) + 2) + "|"]
        lines += [f"| {j.path} | {_overrides(j)} | " + " | ".join(_cell(_num(j.train.get(c))) for c in cols) + " |"
                  for j in trained]
    failed = [j for j in jobs if j.error is not None]
    if failed:
        lines += ["", "## Failed jobs", "", "| job | overrides | error |", "|---|---|---|"]
        lines += [f"| {j.path} | {_overrides(j)} | {_cell(j.error)} |" for j in failed]
    partial = [j for j in jobs if j.rows and j.note.startswith("incomplete")]
    if partial:
        lines += ["", "## Incomplete jobs", "", "| job | overrides | note |", "|---|---|---|"]
        lines += [f"| {j.path} | {_overrides(j)} | {_cell(j.note)} |" for j in partial]
    other = [j for j in jobs if not j.rows and j.error is None and not j.train]
    if other:
        lines += ["", "## Jobs without benchmark results", "", "| job | overrides | note |", "|---|---|---|"]
        lines += [f"| {j.path} | {_overrides(j)} | {_cell(j.note)} |" for j in other]
    return "\n".join(lines + list(details)) + "\n"


def _num(value) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return "" if value is None else str(value)


def _overrides(job: Job) -> str:
    return _cell(" ".join(f"{k}={v}" for k, v in job.overrides.items()) or "-")


def _cell(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def build_report(roots: list[Path], out_dir: Path, cfg: ReportConfig | None = None, title: str = "specnoise report"
                 ) -> Path:
    """Collect ``roots`` and write report.csv, report.md, report.html and PNG plots into ``out_dir``; returns
    report.md."""
    cfg = cfg or ReportConfig()
    df, jobs = collect([Path(r) for r in roots])
    out_dir.mkdir(parents=True, exist_ok=True)
    swept = override_columns(df, jobs)
    for col in [c for c in (*GROUP_KEYS, *swept) if c in df and not pd.api.types.is_numeric_dtype(df[c])]:
        df[col] = df[col].fillna("none")  # `draft: null` is a setting like any other; pivots drop NaN keys
    hue = varying(df, [c for c in GROUP_KEYS] + swept)
    # a key the jobs set apart, whose other values only failed jobs had: still a column beside the surviving rows
    hue += [c for c in spread_across_jobs(jobs) if c in df and c not in hue and df[c].nunique(dropna=False) < 2]
    x = sweep_key(df, swept, cfg.x, [*GROUP_KEYS, *swept]) if not df.empty else None
    metrics = [m for m in cfg.metrics if m in df and df[m].notna().any()]
    sections = tables(df, [c for c in hue if c != x] + ([x] if x else []), cfg.metrics)
    if not cfg.categories:
        sections = {k: v for k, v in sections.items() if k == "main"}
    times = time_table(df, hue)
    if times is not None:
        sections["where the time goes (seconds; cost_bound = AR's priced time / the decoder's, prefills included, "
                 "on the job's machine)"] = times

    plots: list[Path] = []
    shown = df[~df["decoder"].isin(["ar", REFERENCE])] if "decoder" in df else df  # AR is the dashed line at 1.0
    if cfg.plots and metrics and not shown.empty:
        main = shown[shown["category"] == "all"] if "category" in shown else shown
        decoder = ["decoder"] if shown["decoder"].nunique() > 1 else []  # a line or colour per decoder
        plot_bars(main, [c for c in hue if not c.endswith("decoder")], metrics, out_dir / "decoders.png")
        plots.append(out_dir / "decoders.png")
        if cfg.categories and any(k.endswith(" by category") for k in sections):
            cats = shown[shown["category"] != "all"]
            for metric in metrics:
                plot_bars(cats, [c for c in hue if not c.endswith("decoder")] + decoder, [metric],
                          out_dir / f"categories_{metric}.png", by="category")
                plots.append(out_dir / f"categories_{metric}.png")
        if x:
            others = [c for c in hue if c != x and not c.endswith("decoder") and not own_models(main, c, x)] + decoder
            plot_sweep(main, x, others, metrics, out_dir / f"sweep_{x.replace('/', '_')}.png")
            plots.append(out_dir / f"sweep_{x.replace('/', '_')}.png")
        if x and x.endswith("batch_size"):  # the batch-size study: AR's own curves belong in it
            every = df[df["category"] == "all"] if "category" in df else df
            plot_batch_scaling(every, x, [c for c in hue if c != x and not c.endswith("decoder")],
                               out_dir / "batch_scaling.png")
            plots.append(out_dir / "batch_scaling.png")

    columns = ["job"] + swept + [c for c in df.columns if c not in swept and c != "job"]
    write_atomic(out_dir / "report.csv", lambda tmp: df.reindex(columns=columns).to_csv(tmp, index=False))
    notes, details = noise_notes(df, jobs, hue) if not df.empty else ([], [])
    md = markdown(title, sections, jobs, plots, notes, details)
    write_atomic(out_dir / "report.md", md)
    write_html(out_dir, title, df, sections, jobs, plots, notes, swept, [Path(r) for r in roots])
    noisy = notes[notes.index("## Timing noise") + 4:] if "## Timing noise" in notes else []
    print_console(sections, jobs, out_dir, noisy=[line for line in noisy if line.startswith("- ")][:len(jobs)])
    return out_dir / "report.md"


def print_console(sections: dict[str, pd.DataFrame], jobs: list[Job], out_dir: Path, noisy: list[str] = ()) -> None:
    """The main table, then one line per job whose timings are noise (the rows: report.md, report.csv)."""
    main = sections.get("main")
    if main is not None and not main.empty:
        print("\n" + _fmt(main).to_string(index=False))
    if noisy:
        print(f"\nNOISY TIMING: {ADVICE}")
        for line in noisy:
            print(f"  {line[2:]}")
    for job in jobs:
        if job.calibration:
            print(f"CALIBRATION {job.path}: {job.calibration}")
    for job in jobs:
        if job.error is not None:
            print(f"FAILED {job.path}: {job.error}")
    print(f"\nreport: {out_dir}/report.md (and report.html, report.csv, *.png)")


def log_to_wandb(out_dir: Path, conf: Config, cfg: DictConfig | None = None) -> None:
    """One wandb run (job_type `report`, in the experiment's group) with the whole table and the plots: the
    table is what dashboard bar charts of speedup per decoder across jobs and sweeps are built from."""
    from specnoise.tracking import start_run

    try:
        with start_run(conf, cfg if cfg is not None else OmegaConf.structured(conf), out_dir, "report") as tracker:
            if tracker.mode == "disabled":
                return
            import wandb

            table = pd.read_csv(out_dir / "report.csv")
            text = [c for c in table if not pd.api.types.is_numeric_dtype(table[c])]  # wandb: no NaN among strings
            table[text] = table[text].fillna("").astype(str)
            tracker.table("report", table)
            tracker.log({f"plots/{p.stem}": wandb.Image(str(p)) for p in sorted(out_dir.glob("*.png"))})
    except Exception as err:  # noqa: BLE001 - tracking is a convenience; the files on disk are the report
        log.warning(f"report not logged to wandb ({type(err).__name__}: {err})")


def run_report(conf: Config, run_dir: Path) -> Path:
    """``task=report``: the report of ``report.runs`` in ``report.out_dir`` (default: this run's directory)."""
    if not conf.report.runs:
        raise UserError("task=report needs runs to collect: report.runs=[outputs/multirun/DATE/TIME,...]")
    out_dir = Path(conf.report.out_dir) if conf.report.out_dir else run_dir
    created = not out_dir.exists()
    try:
        path = build_report([Path(r) for r in conf.report.runs], out_dir, conf.report,
                            title=f"specnoise report: {conf.experiment}")
    except BaseException:  # a failed report leaves no empty folder behind
        if created and out_dir.is_dir() and not any(out_dir.iterdir()):
            out_dir.rmdir()
        raise
    if conf.report.wandb:
        log_to_wandb(out_dir, conf)
    return path.parent
