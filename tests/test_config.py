"""Every option of every config group composes and validates; bad input fails with a message naming the key."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.errors import ConfigCompositionException
from omegaconf import OmegaConf

from specnoise.config import DECODER_SCHEMAS, Config, ConfigError, config_dir
from specnoise.decoding.base import DECODER_MODULES

CONF = config_dir()
GROUPS = ["model", "draft", "pair", "train", "data", "decoder", "benchmark", "logger"]
# options that need a value the user must supply
REQUIRED = {("data", "jsonl"): ["data.path=x.jsonl"], ("benchmark", "jsonl"): ["benchmark.path=x.jsonl"]}


def options(group: str) -> list[str]:
    return sorted(p.stem for p in (CONF / group).glob("*.yaml"))


def compose_object(overrides: list[str]) -> Config:
    with initialize_config_dir(str(CONF), version_base="1.3"):
        return OmegaConf.to_object(compose("config", overrides=overrides))


@pytest.mark.parametrize("group,option", [(g, o) for g in GROUPS for o in options(g)])
def test_every_option_composes(group, option):
    conf = compose_object([f"{group}={option}", *REQUIRED.get((group, option), [])])
    if group in ("model", "draft") and option != "none":
        assert getattr(conf, group).path, f"{group}={option} has no path"
    if group == "decoder":
        assert isinstance(conf.decoder, DECODER_SCHEMAS[conf.decoder.name])


def test_every_decoder_option_has_an_implementation():
    names = {compose_object([f"decoder={o}"]).decoder.name for o in options("decoder")}
    assert names <= set(DECODER_MODULES)
    assert set(DECODER_SCHEMAS) == set(DECODER_MODULES)


def test_pair_sets_model_and_draft():
    conf = compose_object(["pair=yi-34b-6b"])
    assert (conf.model.name, conf.draft.name) == ("yi-34b", "yi-6b")
    assert conf.model.path == "01-ai/Yi-34B" and conf.draft.path == "01-ai/Yi-6B"


def test_shipped_models_resolve_inside_the_package():
    conf = compose_object(["model=small-code-msn"])
    assert Path(conf.model.path).is_absolute() and "assets/models/small-code-msn" in conf.model.path


@pytest.mark.parametrize(
    "overrides,key",
    [
        (["decoder=speculative", "decoder.gamma=-1"], "decoder.gamma"),
        (["decoder=speculative", "decoder.gamma=0"], "decoder.gamma"),
        (["train=msn", "train.noise.length=0"], "train.noise.length"),
        (["train=msn", "train.noise.content=gaussian"], "train.noise.content"),
        (["decoder=lookahead", "decoder.N=1"], "decoder.N"),
        (["decoder=ar", "decoder.top_p=0"], "decoder.top_p"),
        (["model.dtype=float8"], "model.dtype"),
        (["benchmark=jsonl"], "benchmark.path"),
        (["benchmark=jsonl", "benchmark.path=x", "benchmark.limit=0"], "benchmark.limit"),
    ],
)
def test_out_of_range_values_name_the_key(overrides, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        compose_object(overrides)


def test_wrong_type_and_unknown_key_fail_at_composition():
    with pytest.raises(ConfigCompositionException):
        compose_object(["decoder=speculative", "decoder.gamma=abc"])
    with pytest.raises(ConfigCompositionException):
        compose_object(["decoder=ar", "decoder.gamma=3"])  # AR has no gamma


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "specnoise", *args], capture_output=True, text=True, timeout=120,
                          cwd=Path(__file__).parents[1])


def test_cli_help_lists_every_group():
    out = run_cli("--help")
    assert out.returncode == 0
    for group in GROUPS:
        assert f"\n{group}: " in out.stdout


def test_cli_prints_composed_config():
    out = run_cli("--cfg", "job", "decoder=tr_jacobi")
    assert out.returncode == 0
    assert OmegaConf.create(out.stdout).decoder.tree == "mc_sim_7b_63"


@pytest.mark.parametrize(
    "args,message",
    [
        (["decoder=nope"], "Could not find 'decoder/nope'"),
        (["decoder=speculative", "decoder.gamma=-1", "logger=none"], "decoder.gamma: got -1, must be >= 1"),
        (["train=msn", "train.noise.length=0", "logger=none"], "train.noise.length: got 0, must be >= 1"),
        (["model.path=/nonexistent/model", "logger=none"], "no model at /nonexistent/model"),
    ],
)
def test_cli_bad_input_gives_one_clear_line(args, message, tmp_path):
    out = run_cli(*args, f"hydra.run.dir={tmp_path}")
    assert out.returncode != 0
    assert message in out.stdout + out.stderr
    assert "Traceback" not in out.stdout + out.stderr
