"""What a new user hit (the trial cases): each error says what to change and leaves nothing behind."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode

from specnoise.__main__ import continue_advice
from specnoise.config import config_dir


@pytest.fixture(autouse=True)
def no_hydra_left():
    yield
    HydraConfig.instance().cfg = None  # other tests in this process run outside any Hydra job


def with_hydra(*overrides: str, multirun: bool = False) -> None:
    with initialize_config_dir(config_dir=str(config_dir()), version_base="1.3"):
        cfg = compose("config", overrides=list(overrides), return_hydra_config=True)
    cfg.hydra.mode = RunMode.MULTIRUN if multirun else RunMode.RUN
    HydraConfig.instance().set_config(cfg)


def test_a_stopped_sweep_is_continued_in_its_sweep_dir(tmp_path):
    with_hydra(f"hydra.sweep.dir={tmp_path / 'sweep'}", multirun=True)
    advice = continue_advice(tmp_path / "sweep" / "0")
    assert f"hydra.sweep.dir={tmp_path / 'sweep'}" in advice and "hydra.run.dir" not in advice
    with_hydra(f"hydra.run.dir={tmp_path / 'run'}")
    assert continue_advice(Path(tmp_path / "run")) == f"run the same command with hydra.run.dir={tmp_path / 'run'} " \
                                                       "to continue"


def specnoise(*args: str, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "specnoise", *args, "logger=none"], capture_output=True, text=True,
                          timeout=300, cwd=cwd)


def test_a_refused_command_leaves_no_empty_folders(tmp_path):
    run = specnoise("decoder=pld", "benchmark.lmit=2", f"hydra.run.dir={tmp_path / 'run'}")
    assert run.returncode == 2 and "benchmark.lmit" in run.stderr
    sweep = specnoise("-m", "decoder=pld", "benchmark.limt=1,2", f"hydra.sweep.dir={tmp_path / 'sweep'}")
    assert sweep.returncode == 2 and "benchmark.limt" in sweep.stderr
    assert list(tmp_path.iterdir()) == []  # no empty run dir, no sweep dir holding only multirun.yaml


def test_a_report_with_an_out_dir_runs_there(tmp_path):
    from test_report import gamma_sweep

    sweep = gamma_sweep(tmp_path / "sweep")
    done = specnoise("task=report", f"report.runs=[{sweep}]", f"report.out_dir={tmp_path / 'out'}",
                     "report.plots=false", cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    assert (tmp_path / "out" / "report.md").is_file() and (tmp_path / "out" / ".hydra").is_dir()
    assert not (tmp_path / "outputs").exists()  # no timestamped run dir beside it
