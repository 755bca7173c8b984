"""The Optuna search (+experiment=tune-*): the trial's objective and checks, resuming a study, the presets, and (slow)
a real search on the shipped model stopped by SIGINT and resumed without repeating its finished trials."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import optuna
import pytest
from optuna.distributions import IntUniformDistribution

from specnoise.config import BenchmarkConfig, LookaheadConfig, UserError
from specnoise.tune import Search, check_tunable, objective
from test_report import result_row

REPO = Path(__file__).resolve().parents[1]
SPACE = {"decoder.W": IntUniformDistribution(1, 15), "decoder.N": IntUniformDistribution(2, 7)}


def results(path: Path, **pld) -> Path:
    rows = [result_row("ar", speedup_ci_low=1.0, speedup_ci_high=1.0),
            result_row("pld", **{"speedup": 1.3, "speedup_ci_low": 1.1, "speedup_ci_high": 1.5, **pld})]
    path.write_text(json.dumps({"config": {"decoder": {"name": "pld"}}, "rows": rows}))
    return path


def test_objective_is_the_ci_lower_bound_of_a_lossless_trial(tmp_path):
    assert objective(results(tmp_path / "ok.json"), "pld") == 1.1
    with pytest.raises(RuntimeError, match="different tokens from AR on 50% of the prompts"):
        objective(results(tmp_path / "lossy.json", lossless_fraction=0.5), "pld")
    with pytest.raises(UserError, match="not checked lossless"):
        objective(results(tmp_path / "unchecked.json", lossless_fraction=None), "pld")
    with pytest.raises(UserError, match="no speedup CI"):
        objective(results(tmp_path / "noci.json", speedup_ci_low=None), "pld")
    with pytest.raises(UserError, match="no row for decoder=lookahead"):
        objective(results(tmp_path / "ok.json"), "lookahead")


def test_a_trial_needs_repeats_greedy_and_the_lossless_check():
    def conf(**bench):
        return SimpleNamespace(benchmark=BenchmarkConfig(**{"name": "humaneval", "repeats": 2, **bench}),
                               decoder=LookaheadConfig())

    check_tunable(conf())
    with pytest.raises(UserError, match="benchmark.repeats=1"):
        check_tunable(conf(repeats=1))
    with pytest.raises(UserError, match="checked lossless"):
        check_tunable(conf(check_lossless=False))
    with pytest.raises(UserError, match="benchmark.limit=1"):
        check_tunable(conf(limit=1))
    with pytest.raises(UserError, match="benchmark=NAME"):
        check_tunable(conf(name="none"))
    with pytest.raises(UserError, match="checked lossless"):
        check_tunable(SimpleNamespace(benchmark=conf().benchmark, decoder=LookaheadConfig(temperature=0.7)))


def open_search(tmp_path: Path, arguments=("+experiment=x",)) -> Search:
    sampler = optuna.samplers.RandomSampler(seed=0)
    return Search.open(f"sqlite:///{tmp_path}/optuna.db", "s", sampler, ["maximize"], tmp_path / "sweep", seed=0,
                       arguments=list(arguments))


def test_resume_reruns_the_interrupted_trial_and_counts_the_finished(tmp_path):
    search = open_search(tmp_path)
    assert search.resume(5) == (5, 0)  # a new search: the whole budget, jobs from 0
    trials = [search.study.ask(SPACE) for _ in range(3)]
    search.study.tell(trials[0], 1.0)
    search.study.tell(trials[1], state=optuna.trial.TrialState.FAIL)  # a failed trial counts: never run again
    # trials[2] is left RUNNING, as a SIGINT leaves it

    again = open_search(tmp_path)
    assert again.resume(5) == (3, 3)  # 2 of 5 done; the first new job is trial 3: the interrupted one, queued
    rerun = again.study.ask()
    for name, dist in SPACE.items():
        rerun._suggest(name, dist)
    assert rerun.number == 3 and rerun.params == trials[2].params
    fresh = again.study.ask(SPACE)
    assert fresh.number == 4 and fresh.params != trials[0].params  # reseeded: not the first draws again
    states = [t.state.name for t in again.study.get_trials()]
    assert states == ["COMPLETE", "FAIL", "FAIL", "RUNNING", "RUNNING"]
    assert again.best().number == 0


def test_the_configured_setting_is_a_trial_of_its_own_once(tmp_path):
    search = open_search(tmp_path)
    search.enqueue_default({"decoder.W": 7, "decoder.N": 5})
    assert search.resume(4) == (4, 0)
    first = search.study.ask(SPACE)  # left RUNNING: as if interrupted
    assert first.params == {"decoder.W": 7, "decoder.N": 5}

    again = open_search(tmp_path)
    again.enqueue_default({"decoder.W": 7, "decoder.N": 5})  # already in the study: not queued twice
    assert again.resume(4) == (4, 1)
    rerun = again.study.ask(SPACE)
    assert rerun.number == 1 and rerun.params == first.params and rerun.system_attrs["specnoise:default"]
    assert [t.state.name for t in again.study.get_trials()] == ["FAIL", "RUNNING"]


def test_resume_refuses_other_overrides(tmp_path):
    open_search(tmp_path, ["+experiment=x", "benchmark.limit=5"])
    with pytest.raises(UserError, match="run the same command to resume it"):
        open_search(tmp_path, ["+experiment=x", "benchmark.limit=6"])
    open_search(tmp_path, ["benchmark.limit=5", "+experiment=x"])  # the order does not matter


def test_search_needs_storage_and_a_name(tmp_path):
    with pytest.raises(UserError, match="hydra.sweeper.storage"):
        Search.open(None, "s", optuna.samplers.RandomSampler(), ["maximize"], tmp_path, seed=0, arguments=[])


@pytest.mark.parametrize("preset", sorted(p.stem for p in (REPO / "conf" / "experiment").glob("tune-*.yaml")))
def test_every_tune_preset_composes_to_a_valid_search(preset):
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from specnoise.conf_store import register
    from specnoise.config import config_dir

    register()
    with initialize_config_dir(version_base="1.3", config_dir=str(config_dir())):
        sweeper = compose("config", overrides=[f"+experiment={preset}"], return_hydra_config=True).hydra.sweeper
        conf = OmegaConf.to_object(compose("config", overrides=[f"+experiment={preset}"]))
    assert sweeper._target_.endswith("TuneSweeper") and sweeper.direction == "maximize"
    assert sweeper.sampler.seed == 0 and sweeper.n_trials >= 12 and str(sweeper.storage).startswith("sqlite:///")
    assert sweeper.params and all(key.startswith("decoder.") and hasattr(conf.decoder, key[len("decoder."):])
                                  for key in sweeper.params)
    assert conf.experiment == preset and conf.decoder.name in preset
    check_tunable(conf)


@pytest.mark.slow
def test_search_resumes_after_sigint_without_repeating_finished_trials(tmp_path):
    """A real 3-trial search (shipped model, 3 prompts): SIGINT in trial 1, then the same command finishes it."""
    sweep = tmp_path / "sweep"
    cmd = [sys.executable, "-m", "specnoise", "+experiment=tune-pld-tiny", "benchmark.limit=3",
           "benchmark.max_new_tokens=32", f"hydra.sweep.dir={sweep}", "hydra.sweeper.n_trials=3"]
    env = dict(os.environ, WANDB_MODE="disabled", PYTHONPATH=str(REPO / "src"))
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.time() + 600
    while not (sweep / "1" / "per_prompt.jsonl").is_file() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.2)  # the first prompt of trial 1 is done: it is mid-benchmark
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 130, out[-3000:]
    first = (sweep / "0" / "results.json").stat().st_mtime_ns

    done = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    summary = json.loads((sweep / "tune.json").read_text())
    trials = summary["trials"]
    assert [t["state"] for t in trials] == ["COMPLETE", "FAIL", "COMPLETE", "COMPLETE"]
    assert trials[1]["interrupted"] and trials[2]["params"] == trials[1]["params"]  # the interrupted one, again
    assert (sweep / "0" / "results.json").stat().st_mtime_ns == first  # trial 0 was not run again
    assert summary["finished"] == 3 and summary["failed"] == 0
    complete = [t for t in trials if t["state"] == "COMPLETE"]
    assert all(t["lossless_fraction"] == 1.0 and t["job"] == str(t["trial"]) for t in complete)
    assert summary["best"]["value"] == max(t["value"] for t in complete) == summary["best"]["speedup_ci_low"]
    assert "re-run it: python -m specnoise" in done.stdout and "hydra.mode=RUN" in summary["rerun"]
    assert (sweep / "report" / "report.html").is_file() and "Search tune-pld-tiny" in \
        (sweep / "report" / "report.html").read_text()
