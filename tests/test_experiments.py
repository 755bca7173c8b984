"""Experiment presets compose; sweeps give one directory per job and one report; a failing job is recorded
while the others keep their results; the -tiny experiments run end to end (slow: on the shipped models)."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from hydra import compose, initialize_config_dir
from hydra.core.hydra_config import HydraConfig
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import OmegaConf, open_dict

from helpers_models import save_tiny_model
from specnoise.config import ASSETS_DIR, config_dir

CONF = config_dir()
REPO = CONF.parent
PRESETS = sorted(p.stem for p in (CONF / "experiment").glob("*.yaml"))
SWEEPS = [n for n in PRESETS if "MULTIRUN" in (CONF / "experiment" / f"{n}.yaml").read_text()]
TINY = [n for n in SWEEPS if n.endswith("-tiny")]
PAPER = [n[: -len("-tiny")] for n in TINY]
CALLBACK = "++hydra.callbacks.report._target_=specnoise.callbacks.ReportCallback"
SHIPPED = all((ASSETS_DIR / "models" / m / "config.json").is_file()
              for m in ("small-code", "small-code-sft", "small-code-msn", "small-code-draft"))
needs_shipped = pytest.mark.skipif(not SHIPPED, reason="the shipped tiny models are not in src/specnoise/assets yet")


def sweep_jobs(preset: str) -> list[list[str]]:
    """The override lists of every job of ``preset``'s sweep, as Hydra's basic sweeper expands them (for an Optuna
    search, the ends of each range). The sweep is the composed one: a preset built on another sweeps its axes too."""
    with initialize_config_dir(str(CONF), version_base="1.3"):
        cfg = compose("config", overrides=[f"+experiment={preset}"], return_hydra_config=True)
    params = cfg.hydra.sweeper.get("params")
    parser = OverridesParser.create()
    dims = []
    for key, value in (OmegaConf.to_container(params) if params is not None else {}).items():
        override = parser.parse_override(f"{key}={value}")
        if override.is_interval_sweep():  # an Optuna search's range (+experiment=tune-*): its two ends
            dims.append([f"{key}={override.value().start}", f"{key}={override.value().end}"])
            continue
        dims.append([f"{key}={v}" for v in override.sweep_string_iterator()] if override.is_sweep_override()
                    else [f"{key}={value}"])
    return [list(job) for job in itertools.product(*dims)]


def compose_job(preset: str, job: list[str]):
    with initialize_config_dir(str(CONF), version_base="1.3"):
        cfg = compose("config", overrides=[*job, f"+experiment={preset}"], return_hydra_config=True)
    HydraConfig.instance().set_config(cfg)  # a preset may name its sweep's folder (${hydra:sweep.dir}), as jobs do
    with open_dict(cfg):
        del cfg["hydra"]
    return OmegaConf.to_object(cfg)


@pytest.mark.parametrize("preset", PRESETS)
def test_every_preset_composes(preset):
    """The preset alone (what a multirun composes first) and the first job of its sweep compose and pass every
    range check."""
    compose_job(preset, [])
    conf = compose_job(preset, sweep_jobs(preset)[0])
    if preset in SWEEPS:
        assert conf.experiment == preset  # groups the preset's wandb runs and titles its report


@pytest.mark.slow
@pytest.mark.parametrize("preset", SWEEPS)
def test_every_job_of_every_sweep_composes(preset):
    for job in sweep_jobs(preset):
        compose_job(preset, job)


def test_paper_presets_have_tiny_variants_readmes_and_the_report():
    expected = {"msn-table1", "msn-table2", "msn-table3", "msn-table4", "msn-figure4", "msn-figure5", "msn-figure6",
                "ouroboros-table2", "ouroboros-table3", "ouroboros-table4", "ouroboros-figure6", "ouroboros-table10",
                "ouroboros-table13", "ouroboros-table15", "ouroboros-table17"}
    assert expected <= set(PAPER) and expected <= set(PRESETS)
    for preset in SWEEPS:
        text = (CONF / "experiment" / f"{preset}.yaml").read_text()
        assert "specnoise.callbacks.ReportCallback" in text, preset
    for name in sorted(expected) + ["quickstart", "bench-decoders"]:
        readme = (REPO / "experiments" / name / "README.md").read_text()
        assert f"+experiment={name}" in readme, name
        if name in expected:
            assert f"+experiment={name}-tiny" in readme, name


# ------------------------------------------------------------------------------------- real sweeps
def specnoise(*args: str, cwd: Path, timeout: int = 600, status: int = 0) -> subprocess.CompletedProcess:
    env = dict(os.environ, WANDB_MODE="disabled", TOKENIZERS_PARALLELISM="false")
    proc = subprocess.run([sys.executable, "-m", "specnoise", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout)
    assert proc.returncode == status, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


def multirun_dirs(cwd: Path) -> list[Path]:
    return sorted((cwd / "outputs" / "multirun").glob("*/*"))


@pytest.fixture(scope="module")
def random_model(tmp_path_factory) -> Path:
    # a long context: the tiny test tokenizer needs ~1 token per byte of a HumanEval prompt
    return save_tiny_model(tmp_path_factory.mktemp("models") / "tiny-llama", max_position_embeddings=2048)


@pytest.fixture(scope="module")
def prompts(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("data") / "prompts.jsonl"
    path.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in ("def add(a, b):", "for i in range(10):")))
    return path


def test_sweep_one_dir_per_job_one_report_failed_job_recorded_no_overwrite(tmp_path, random_model, prompts):
    bench = ["benchmark=jsonl", f"benchmark.path={prompts}", "benchmark.limit=2", "benchmark.max_new_tokens=8",
             "benchmark.warmup=0", "logger=none", CALLBACK]
    proc = specnoise("-m", "decoder=ar,pld", f"model.path={random_model},{tmp_path / 'no-such-model'}", *bench,
                     cwd=tmp_path, status=1)  # a sweep with failed jobs exits non-zero, after all of them
    assert "2 of 4 jobs failed: see " in proc.stderr
    (sweep,) = multirun_dirs(tmp_path)
    jobs = sorted(p for p in sweep.iterdir() if p.name.isdigit())
    assert [j.name for j in jobs] == ["0", "1", "2", "3"]  # decoder x model.path
    good, bad = [jobs[0], jobs[2]], [jobs[1], jobs[3]]
    for job in good:
        rows = json.loads((job / "results.json").read_text())["rows"]
        assert {r["lossless_fraction"] for r in rows} == {1.0}
    for job in bad:
        assert not (job / "results.json").exists()
        assert "no model at" in json.loads((job / "FAILED.json").read_text())["error"]

    report = sweep / "report"
    df = pd.read_csv(report / "report.csv")
    assert set(df["job"].astype(str)) == {"0", "2"} and set(df["decoder"]) == {"ar", "pld"}
    md = (report / "report.md").read_text()
    assert "4 jobs: 2 with results, 2 failed." in md and "no-such-model" in md
    assert (report / "decoders.png").is_file()

    # the same sweep again: a new timestamped directory, the first one untouched
    before = (jobs[0] / "results.json").read_bytes()
    specnoise("-m", "decoder=ar", f"model.path={tmp_path / 'no-such-model'}", *bench, cwd=tmp_path, status=1)
    assert len(multirun_dirs(tmp_path)) == 2
    assert (jobs[0] / "results.json").read_bytes() == before


@pytest.mark.slow
def test_tiny_experiment_runs_with_its_own_report(tmp_path, random_model):
    """A -tiny preset end to end (MULTIRUN and the report callback come from the preset itself), with a
    random model standing in for the shipped ones and the sweep narrowed on the command line."""
    specnoise("+experiment=msn-table1-tiny", "+subset=humaneval", f"model.path={random_model}", "benchmark.limit=1",
              "benchmark.max_new_tokens=8", "benchmark.warmup=0", "logger=none", cwd=tmp_path)
    (sweep,) = multirun_dirs(tmp_path)
    df = pd.read_csv(sweep / "report" / "report.csv")
    assert set(df["decoder"]) == {"ar", "jacobi", "tr_jacobi"}
    assert set(df["model"]) == {"small-code-sft", "small-code-msn"}  # the preset's sweep over model=...
    assert (df["lossless_fraction"] == 1.0).all()


@pytest.mark.slow
def test_noise_length_sweep_trains_then_benchmarks_each_job(tmp_path, random_model, prompts):
    specnoise("-m", "train=msn", "train.noise.length=1,4", f"model.path={random_model}", "data=codegen-instruct",
              "data.max_samples=32", "train.max_steps=2", "train.per_device_batch_size=2", "train.eval_samples=4",
              "train.max_seq_len=128", "benchmark=jsonl", f"benchmark.path={prompts}", "benchmark.max_new_tokens=8",
              "benchmark.warmup=0", "logger=none", CALLBACK, cwd=tmp_path)
    (sweep,) = multirun_dirs(tmp_path)
    df = pd.read_csv(sweep / "report" / "report.csv")
    assert sorted(df["train.noise.length"].unique()) == [1, 4]
    for job in ("0", "1"):
        assert (sweep / job / "results.json").is_file()


# ---------------------------------------------------------------------- the presets on shipped models
# the presets' own subsets (CNN/DM: the first 3 articles that fit the tiny context), short answers
TINY_OVERRIDES = ["benchmark.max_new_tokens=8", "benchmark.warmup=0", "logger=none"]
TRAIN_OVERRIDES = ["train.max_steps=2", "train.eval_samples=4"]  # only where the jobs train: refused elsewhere
# sweeps whose jobs train and whose other jobs do not (on a shipped model): the smoke run keeps the ones that train,
# as a train.* override would be refused by the others (and without one they would train for an hour); the others'
# runs are the committed miniatures' (`make check-experiments`). jacobi-training's cllm / jacobi_forcing jobs are left
# out too: they collect trajectories on every training prompt first (hours; test_consistency runs them on tiny models)
TRAINING_JOBS = {"msn-table3-tiny": ["msn_table3=l1,l8"],
                 "msn-figure4-lengths-tiny": ["msn_table3=l1,l8", "decoder.draft_len=1,8"],
                 "jacobi-training-tiny": ["+jacobi_training=sft,msn"],
                 "quickstart": ["+quickstart=train-sft,train-msn"]}


def train_overrides(preset: str) -> list[str]:
    """TRAIN_OVERRIDES if the preset's jobs (TRAINING_JOBS' selection, where it has one) train, else none."""
    if preset in TRAINING_JOBS:
        return TRAIN_OVERRIDES
    trains = {compose_job(preset, job).train.name != "none" for job in sweep_jobs(preset)}
    assert len(trains) == 1, f"{preset}: some jobs train, others not: add it to TRAINING_JOBS"
    return TRAIN_OVERRIDES if True in trains else []


SMOKE = TINY + ["quickstart", "bench-decoders"]


def test_smoke_runs_know_which_jobs_train():
    """The smoke runs below are slow: that a sweep mixing training and shipped-model jobs is missing from
    TRAINING_JOBS shows here, in the default suite."""
    for preset in SMOKE:
        train_overrides(preset)


@pytest.mark.slow
@needs_shipped
@pytest.mark.parametrize("preset", SMOKE)
def test_tiny_preset_smoke_run(tmp_path, preset):
    specnoise(f"+experiment={preset}", *TINY_OVERRIDES, *train_overrides(preset), *TRAINING_JOBS.get(preset, []),
              cwd=tmp_path, timeout=1800)
    (sweep,) = multirun_dirs(tmp_path)
    md = (sweep / "report" / "report.md").read_text()
    assert "## Failed jobs" not in md, md
    df = pd.read_csv(sweep / "report" / "report.csv")
    greedy = df[df["temperature"].fillna(0.0) == 0.0] if "temperature" in df else df
    assert (greedy["lossless_fraction"].dropna() == 1.0).all()
