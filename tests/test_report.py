"""The report on synthetic run trees: real results.json / FAILED.json / .hydra files written by the test."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from specnoise.config import ReportConfig, UserError
from specnoise.report import build_report, collect, find_jobs

PNG = b"\x89PNG\r\n\x1a\n"


def result_row(decoder: str, category: str = "all", speedup: float = 1.0, mat: float = 1.0, **kw) -> dict:
    row = dict(decoder=decoder, model="small-code-msn", draft=None, benchmark="spec_bench", category=category,
               prompts=2, new_tokens=64, target_forwards=int(64 / mat), draft_forwards=0, mean_accepted_tokens=mat,
               seconds=1.0 / speedup, tokens_per_second=64 * speedup, ar_seconds=1.0, ar_tokens_per_second=64.0,
               speedup=speedup, lossless_fraction=1.0, task_score=None, score_metric=None)
    row.update(kw)
    return row


def write_job(job: Path, overrides: list[str], rows: list[dict] | None = None, error: str | None = None) -> Path:
    (job / ".hydra").mkdir(parents=True)
    (job / ".hydra" / "overrides.yaml").write_text("".join(f"- {o}\n" for o in overrides))
    if rows is not None:
        (job / "results.json").write_text(json.dumps({"config": {"experiment": "test"}, "rows": rows}))
    if error is not None:
        (job / "FAILED.json").write_text(json.dumps({"error": error, "traceback": None}))
    return job


def gamma_sweep(root: Path) -> Path:
    """A multirun over decoder.gamma=2,4,8 whose last job failed; two categories plus `all`."""
    for num, gamma in enumerate((2, 4)):
        cats = ("all", "qa", "rag")
        rows = [result_row("ar", cat) for cat in cats]
        rows += [result_row("speculative", cat, speedup=1 + gamma / 10, mat=1 + gamma / 5) for cat in cats]
        write_job(root / str(num), ["decoder=speculative", f"decoder.gamma={gamma}"], rows)
    write_job(root / "2", ["decoder=speculative", "decoder.gamma=8"], error="error: model=x: no model at /nope")
    return root


def test_report_of_a_sweep_with_a_failed_job(tmp_path):
    sweep = gamma_sweep(tmp_path / "sweep")
    out = tmp_path / "out"
    md = build_report([sweep], out)

    df = pd.read_csv(out / "report.csv")
    assert len(df) == 2 * 2 * 3  # jobs with results x decoders x categories
    assert set(df["decoder.gamma"]) == {2, 4}  # the swept key is a column, read from .hydra/overrides.yaml
    assert set(df["job.decoder"]) == {"speculative"}  # an override never clobbers the row's own decoder
    assert set(df["decoder"]) == {"ar", "speculative"}
    spec = df[(df.decoder == "speculative") & (df.category == "all")].set_index("decoder.gamma")
    assert spec.loc[4, "speedup"] == pytest.approx(1.4)

    text = md.read_text()
    assert "3 jobs: 2 with results, 1 failed." in text
    assert "## Failed jobs" in text and "no model at /nope" in text and "decoder.gamma=8" in text
    assert "speedup by category" in text  # per-category pivot, since the benchmark has categories
    for name in ("decoders.png", "categories_speedup.png", "sweep_decoder.gamma.png"):
        assert (out / name).read_bytes()[:8] == PNG, name
        assert f"]({name})" in text
    assert not list(out.glob(".*"))  # no temporary files left behind


def test_numeric_sweep_key_is_detected_and_can_be_overridden(tmp_path):
    sweep = gamma_sweep(tmp_path / "sweep")
    build_report([sweep], tmp_path / "off", ReportConfig(x="off"))
    assert not list((tmp_path / "off").glob("sweep_*.png"))
    with pytest.raises(UserError, match="report.x=nope"):
        build_report([sweep], tmp_path / "bad", ReportConfig(x="nope"))


def test_categorical_sweep_groups_bars_without_a_line_plot(tmp_path):
    root = tmp_path / "multirun"
    for num, model in enumerate(("small-code-sft", "small-code-msn")):
        rows = [result_row("ar", model=model), result_row("jacobi", speedup=1.1 + num, mat=1.2 + num, model=model)]
        write_job(root / str(num), [f"model={model}"], rows)
    out = tmp_path / "out"
    build_report([root], out)
    assert (out / "decoders.png").is_file() and not list(out.glob("sweep_*.png"))
    main = (out / "report.md").read_text().split("## Results (category all)")[1]
    assert "small-code-sft" in main and "small-code-msn" in main


def test_several_roots_single_runs_and_train_only_jobs(tmp_path, monkeypatch):
    write_job(tmp_path / "runs" / "a", ["decoder=pld"], [result_row("ar"), result_row("pld", speedup=1.3)])
    write_job(tmp_path / "runs" / "b", ["decoder=jacobi"], [result_row("ar"), result_row("jacobi", speedup=1.1)])
    trained = write_job(tmp_path / "multirun" / "0", ["train=msn"])
    (trained / "train_results.json").write_text(json.dumps({"stage": "msn", "steps": 20, "train_loss": 2.5,
                                                            "heldout_loss": 2.25, "model": str(trained / "model")}))
    write_job(tmp_path / "multirun" / "1", ["train=sft"])  # killed before it wrote anything
    write_job(tmp_path / "reports" / "r", ["task=report"])  # an earlier report run is not a job

    df, jobs = collect([tmp_path / "runs", tmp_path / "multirun", tmp_path / "reports"])
    assert sorted(df.loc[df.decoder != "ar", "decoder"]) == ["jacobi", "pld"]
    assert len(jobs) == 4
    monkeypatch.chdir(tmp_path)  # relative paths, as the multirun callback sees outputs/multirun/...
    build_report([Path("runs"), Path("multirun")], Path("out"))
    text = (tmp_path / "out" / "report.md").read_text()
    assert "## Training" in text and "| msn | 20 | 2.5 | 2.25 |" in text
    assert "Jobs without benchmark results" in text and "still running, or killed" in text


def test_no_results_is_a_clear_error(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(UserError, match="no results.json or FAILED.json under"):
        collect([tmp_path / "empty"])
    with pytest.raises(UserError, match="does not exist"):
        collect([tmp_path / "missing"])


def test_unreadable_results_are_reported_as_failed(tmp_path):
    job = write_job(tmp_path / "0", ["decoder=pld"])
    (job / "results.json").write_text("{not json")
    _, jobs = collect([tmp_path])
    assert jobs[0].error.startswith("unreadable results.json")


def test_task_report_entry_point(tmp_path):
    sweep = gamma_sweep(tmp_path / "sweep")
    out = tmp_path / "out"
    proc = subprocess.run(
        [sys.executable, "-m", "specnoise", "task=report", f"report.runs=[{sweep}]", f"report.out_dir={out}",
         "logger=none", f"hydra.run.dir={tmp_path / 'run'}"],
        capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "speculative" in proc.stdout and "FAILED 2" in proc.stdout  # the console table and the failure
    assert (out / "report.md").is_file() and (out / "report.csv").is_file()

    empty = tmp_path / "empty"
    empty.mkdir()
    proc = subprocess.run(
        [sys.executable, "-m", "specnoise", "task=report", f"report.runs=[{empty}]", "logger=none",
         f"hydra.run.dir={tmp_path / 'run2'}"],
        capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 2 and "no results.json or FAILED.json" in proc.stderr + proc.stdout
    assert "Traceback" not in proc.stderr


def test_jobs_without_a_draft_stay_in_the_category_tables(tmp_path):
    for num, draft in enumerate((None, "small-code-draft")):
        rows = [result_row(d, cat, speedup=1.5, draft=draft) for d in ("ar", "pld") for cat in ("all", "qa", "rag")]
        write_job(tmp_path / "sweep" / str(num), [f"pair={'none' if draft is None else 'small-code'}"], rows)
    build_report([tmp_path / "sweep"], tmp_path / "out")
    df = pd.read_csv(tmp_path / "out" / "report.csv")
    assert set(df["draft"]) == {"none", "small-code-draft"}
    by_category = (tmp_path / "out" / "report.md").read_text().split("## speedup by category")[1].split("##")[0]
    assert by_category.count("| pld ") == 2  # one row per job, the draft-less one included


def test_report_of_a_folder_that_already_holds_a_report(tmp_path):
    sweep = gamma_sweep(tmp_path / "sweep")
    write_job(sweep / "report", ["task=report", f"report.runs=[{sweep}]"])  # a task=report run kept inside it
    old = os.umask(0o022)
    try:
        build_report([sweep], sweep / "report")  # used to fail sorting the folders 0, 1, 2, report
    finally:
        os.umask(old)
    df, jobs = collect([sweep])
    assert [j.path.name for j in jobs] == ["0", "1", "2"]
    for name in ("report.md", "report.csv", "decoders.png"):  # the umask's mode, not mkstemp's 0600
        assert (sweep / "report" / name).stat().st_mode & 0o777 == 0o644, name


def test_natural_order_of_job_folders(tmp_path):
    for name in ("10", "2", "report", "1"):
        write_job(tmp_path / name, ["decoder=pld"], [result_row("ar")])
    assert [p.name for p in find_jobs([tmp_path])] == ["1", "2", "10", "report"]


def test_an_interrupted_job_is_listed_as_incomplete(tmp_path):
    job = write_job(tmp_path / "0", ["decoder=pld"])
    (job / "results.json").write_text(json.dumps({"rows": [result_row("ar"), result_row("pld", speedup=1.2)],
                                                  "complete": False, "interrupted": "SIGTERM",
                                                  "progress": {"prompts": 3, "of": 10, "resumed": 0}}))
    build_report([tmp_path], tmp_path / "out")
    text = (tmp_path / "out" / "report.md").read_text()
    assert "## Incomplete jobs" in text and "stopped by SIGTERM after 3 of 10 prompts" in text


def test_noisy_rows_calibration_and_ci_reach_the_report(tmp_path, capsys):
    rows = [result_row("ar", speedup_ci_low=1.0, speedup_ci_high=1.0, timing_noisy=False),
            result_row("pld", speedup=1.5, mat=2.0, speedup_ci_low=0.9, speedup_ci_high=2.4, timing_noisy=True,
                       target_seconds=0.5, draft_seconds=0.0, other_seconds=0.17, cost_bound=1.6),
            result_row("hf_greedy", speedup=3.35, speedup_ci_low=3.0, speedup_ci_high=3.6, timing_noisy=False,
                       speedup_exceeds_mat=True)]
    job = write_job(tmp_path / "run", ["decoder=pld"], rows)
    data = json.loads((job / "results.json").read_text())
    data["meta"] = {"calibration_warning": "hf_greedy runs at 3.35x our AR"}
    (job / "results.json").write_text(json.dumps(data))
    text = build_report([tmp_path / "run"], tmp_path / "out").read_text()
    assert re.search(r"\| pld .*\| 0.9-2.4 +\| NOISY +\|", text)  # the row is marked, its CI readable
    assert "## Timing noise" in text and "benchmark.repeats" in text and "- small-code-msn" not in text.split(
        "## Timing noise")[0]
    assert "## Calibration" in text and "3.35x our AR" in text
    assert "## Speedup above mean accepted tokens" in text
    assert "where the time goes" in text and "cost_bound" in text
    out = capsys.readouterr().out
    assert "NOISY TIMING" in out and "CALIBRATION" in out


def test_speedup_bars_carry_the_ci_as_error_bars():
    from specnoise.report_plots import ci_errors

    df = pd.DataFrame({"decoder": ["pld", "jacobi"], "group": ["", ""], "speedup": [1.5, 0.8],
                       "speedup_ci_low": [1.2, 0.7], "speedup_ci_high": [1.9, 0.85]})
    data = df.pivot_table(index="decoder", columns="group", values="speedup", sort=False)
    errors = ci_errors(df, data, "decoder")
    assert errors.shape == (1, 2, 2)
    assert errors[0, 0].tolist() == pytest.approx([0.3, 0.1]) and errors[0, 1].tolist() == pytest.approx([0.4, 0.05])
    assert ci_errors(df.drop(columns=["speedup_ci_low", "speedup_ci_high"]), data, "decoder") is None


def test_sweep_plot_axis_only_for_a_key_that_varies_on_its_own(tmp_path):
    """Jobs of different kinds (a HumanEval job with limit 6, a Spec-Bench job with limit 1): benchmark.limit
    differs between them but is no sweep axis, so no sweep_*.png is drawn against it."""
    write_job(tmp_path / "m" / "0", ["+quickstart=sft-humaneval", "benchmark.limit=6"],
              [result_row("ar"), result_row("pld", speedup=1.4, mat=2.0)])
    write_job(tmp_path / "m" / "1", ["+quickstart=sft-spec_bench", "benchmark.limit=1"],
              [result_row("ar"), result_row("pld", speedup=1.2, mat=1.8)])
    build_report([tmp_path / "m"], tmp_path / "out")
    assert not list((tmp_path / "out").glob("sweep_*.png"))
    # the same key swept with everything else equal is an axis
    for num, limit in enumerate((2, 4)):
        write_job(tmp_path / "s" / str(num), ["decoder=pld", f"benchmark.limit={limit}"],
                  [result_row("ar"), result_row("pld", speedup=1.0 + limit / 10)])
    build_report([tmp_path / "s"], tmp_path / "out2")
    assert (tmp_path / "out2" / "sweep_benchmark.limit.png").is_file()


def test_mixed_numeric_overrides_report_with_defaults_shown_as_values(tmp_path, capsys):
    """Jobs that set different numeric keys (one benchmark.repeats=3, one not): the report is built, and a job that
    left a key at its default shows that default (from its results.json config), not a blank or "none"."""
    rows = lambda s: [result_row("ar"), result_row("speculative", speedup=s, mat=2.0)]  # noqa: E731
    write_job(tmp_path / "m" / "0", ["decoder=speculative", "decoder.gamma=2", "benchmark.repeats=3"], rows(1.1))
    job = write_job(tmp_path / "m" / "1", ["decoder=speculative", "decoder.gamma=4"], rows(1.2))
    data = json.loads((job / "results.json").read_text())
    data["config"]["benchmark"] = {"repeats": 1}
    (job / "results.json").write_text(json.dumps(data))
    write_job(tmp_path / "m" / "2", ["decoder=speculative", "decoder.gamma=8"], rows(1.3))  # no config: unknown
    build_report([tmp_path / "m"], tmp_path / "out")
    df = pd.read_csv(tmp_path / "out" / "report.csv")
    assert df.groupby("job")["benchmark.repeats"].first().tolist()[:2] == [3, 1]
    assert "## Results (category all)" in (tmp_path / "out" / "report.md").read_text()


def test_a_failed_job_keeps_the_swept_column_of_the_surviving_row(tmp_path):
    write_job(tmp_path / "s" / "0", ["decoder=pld", "decoder.num_pred_tokens=4"], [result_row("ar"),
                                                                                    result_row("pld", speedup=1.2)])
    write_job(tmp_path / "s" / "1", ["decoder=pld", "decoder.num_pred_tokens=8"], error="error: boom")
    text = build_report([tmp_path / "s"], tmp_path / "out").read_text()
    results = text.split("## Results (category all)")[1].split("##")[0]
    assert "decoder.num_pred_tokens" in results.splitlines()[2]  # the table's header


def test_noise_is_one_line_per_job_after_the_results(tmp_path, capsys):
    for num in range(2):
        rows = [result_row("ar", speedup_ci_low=1.0, speedup_ci_high=1.0, timing_noisy=False)]
        rows += [result_row(d, speedup=1.5, speedup_ci_low=0.9, speedup_ci_high=2.4, timing_noisy=True,
                            ar_time_cv=0.3 if d == "pld" else 0.01) for d in ("pld", "jacobi", "lookahead")]
        write_job(tmp_path / "m" / str(num), [f"decoder.draft_len={num + 3}"], rows)
    text = build_report([tmp_path / "m"], tmp_path / "out").read_text()
    assert text.index("## Results (category all)") < text.index("## Timing noise")
    noise = text.split("## Timing noise")[1].split("<details>")[0]
    job_lines = [line for line in noise.splitlines() if line.startswith("- ")]
    assert len(job_lines) == 2 and all("3 of 4 rows noisy" in line for line in job_lines)
    assert "3 with a 95% CI wider than +-15%" in job_lines[0] and "1 where AR's time moved" in job_lines[0]
    listed = text.split("<details>")[1]
    assert "- 0: decoder.draft_len=3 decoder=pld category=all" in listed  # keys named, not bare values
    out = capsys.readouterr().out
    assert out.index("speedup") < out.index("NOISY TIMING") and out.count("rows noisy") == 2


def test_sampling_rows_show_which_check_applies(tmp_path):
    rows = [result_row("ar", lossless_fraction=None, identical_to_ar_fraction=1.0, sampling_check="tokens"),
            result_row("pld", lossless_fraction=None, identical_to_ar_fraction=1.0, sampling_check="tokens"),
            result_row("speculative", lossless_fraction=None, identical_to_ar_fraction=None,
                       sampling_check="distribution")]
    write_job(tmp_path / "s", ["decoder.temperature=0.8"], rows)
    text = build_report([tmp_path / "s"], tmp_path / "out").read_text()
    assert "identical_to_ar_fraction" in text and re.search(r"\| speculative .*\| distribution +\|", text)
    write_job(tmp_path / "g", ["decoder=pld"], [result_row("ar"), result_row("pld")])  # greedy: no such columns
    assert "sampling_check" not in build_report([tmp_path / "g"], tmp_path / "out2").read_text()


def test_a_crowded_figure_saves_without_warnings(tmp_path):
    import warnings

    import matplotlib.pyplot as plt

    from specnoise.report_plots import save

    fig, axes = plt.subplots(4, 1, figsize=(1.0, 1.0))  # too small for its labels: tight_layout gives up, warning
    for ax in axes:
        ax.set_ylabel("a long label " * 3)
        ax.set_title("t " * 30)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        save(fig, tmp_path / "crowded.png")
    assert (tmp_path / "crowded.png").read_bytes().startswith(PNG)


def test_a_training_sweep_plots_against_its_key(tmp_path):
    """A sweep over a training setting: each job benchmarks the model it trained (model ``base+msn@JOB``), so the
    model column differs with the key itself; it is still the axis, with one line per decoder. Jobs that share
    one trained model per setting (train.cache_dir) keep the model as a line of its own."""
    for num, length in enumerate((1, 4, 8)):
        write_job(tmp_path / "s" / str(num), ["train=msn", f"train.noise.length={length}"],
                  [result_row("ar", model=f"small-code+msn@{num}"),
                   result_row("jacobi", speedup=1.0 + length / 20, mat=1.1, model=f"small-code+msn@{num}")])
    build_report([tmp_path / "s"], tmp_path / "out")
    assert (tmp_path / "out" / "sweep_train.noise.length.png").is_file()
    # two jobs of one model (@0) at two draft lengths, a second model (@2) at two: the axis is the draft length
    for num, (model, slots) in enumerate((("@0", 1), ("@0", 4), ("@2", 1), ("@2", 4))):
        write_job(tmp_path / "f" / str(num), ["train=msn", f"decoder.draft_len={slots}"],
                  [result_row("ar", model=f"small-code+msn{model}"),
                   result_row("jacobi", speedup=1.0, mat=1.1, model=f"small-code+msn{model}")])
    build_report([tmp_path / "f"], tmp_path / "out2")
    assert (tmp_path / "out2" / "sweep_decoder.draft_len.png").is_file()
