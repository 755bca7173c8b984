"""wandb tracking: mode resolution, the no-op tracker, and a real offline run written under the run directory."""

from __future__ import annotations

import pandas as pd
import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from specnoise.config import config_dir
from specnoise.tracking import Tracker, WandbTracker, has_api_key, resolve_mode, run_tags, start_run


def composed(*overrides: str):
    with initialize_config_dir(config_dir=str(config_dir()), version_base="1.3"):
        cfg = compose("config", overrides=list(overrides))
    return OmegaConf.to_object(cfg), cfg


@pytest.fixture
def no_key(monkeypatch, tmp_path):
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.netrc
    return tmp_path


def test_mode_resolution(no_key, monkeypatch):
    assert not has_api_key() and resolve_mode("auto") == "offline"  # no key: never tries the network
    (no_key / ".netrc").write_text("machine api.wandb.ai\n  login user\n  password " + "x" * 40 + "\n")
    (no_key / ".netrc").chmod(0o600)
    assert has_api_key() and resolve_mode("auto") == "online"
    monkeypatch.setenv("WANDB_MODE", "offline")
    assert resolve_mode("auto") == "offline"  # the environment overrides auto-detection
    monkeypatch.setenv("WANDB_MODE", "dryrun")
    assert resolve_mode("auto") == "offline"
    assert resolve_mode("online") == "online" and resolve_mode("disabled") == "disabled"  # explicit values win
    monkeypatch.setenv("WANDB_API_KEY", "k" * 40)
    assert has_api_key()


def test_none_and_disabled_are_no_ops(tmp_path):
    for overrides in (["logger=none"], ["logger.mode=disabled"]):
        conf, cfg = composed(*overrides)
        tracker = start_run(conf, cfg, tmp_path, job_type="bench")
        assert type(tracker) is Tracker
        with tracker:
            tracker.log({"x": 1}, step=1)
            tracker.summary({"y": 2})
            tracker.table("t", pd.DataFrame({"a": [1]}))
    assert not (tmp_path / "wandb").exists()


def test_tags():
    conf, _ = composed("decoder=jacobi", "decoders=[pld]", "benchmark=humaneval", "logger.tags=[mine]")
    assert run_tags(conf) == ["decoder:jacobi", "model:small-code-msn", "benchmark:humaneval", "decoder:pld", "mine"]


def test_offline_run_is_written_under_the_run_dir(no_key, tmp_path):
    conf, cfg = composed("decoder=ar", "benchmark=humaneval", "logger.group=my-study")
    with start_run(conf, cfg, tmp_path / "run", job_type="bench") as tracker:
        assert isinstance(tracker, WandbTracker) and tracker.mode == "offline"
        run = tracker.run
        assert run.group == "my-study" and run.job_type == "bench" and "decoder:ar" in run.tags
        assert run.config["decoder"]["name"] == "ar" and run.config["benchmark"]["max_new_tokens"] == 512
        tracker.log({"loss": 1.0}, step=1)
        tracker.summary({"speedup": 1.5})
        tracker.table("results", pd.DataFrame({"decoder": ["ar"], "speedup": [1.0]}))
    runs = list((tmp_path / "run" / "wandb").glob("offline-run-*"))
    assert len(runs) == 1 and list(runs[0].glob("run-*.wandb"))  # syncable with `wandb sync`


def test_resumed_training_continues_the_same_run(no_key, tmp_path):
    conf, cfg = composed("train=msn", "logger.mode=offline")
    run_dir = tmp_path / "run"
    ids = []
    for resume in (False, True):
        with start_run(conf, cfg, run_dir, job_type="train", resume=resume) as tracker:
            ids.append(tracker.run.id)
            tracker.log({"loss": 2.0 - resume}, step=10 * (1 + resume))
    assert ids[0] == ids[1] == (run_dir / "wandb" / "train.id").read_text()
    with start_run(conf, cfg, run_dir, job_type="train") as tracker:  # a fresh start in the same folder: a new run
        assert tracker.run.id != ids[0]
    with start_run(conf, cfg, tmp_path / "other", job_type="train", resume=True) as tracker:  # nothing to resume
        assert tracker.run.id not in ids
