"""Nothing silent: a key the job's options do not read is refused before anything loads; sampling keys at
temperature 0 run (a temperature sweep includes 0) but say they do nothing."""

from __future__ import annotations

import subprocess
import sys

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from specnoise.config import ConfigError, config_dir, config_warnings, refuse_ignored_overrides


def check(*overrides: str):
    with initialize_config_dir(config_dir=str(config_dir()), version_base="1.3"):
        conf = OmegaConf.to_object(compose("config", overrides=list(overrides)))
    refuse_ignored_overrides(conf, list(overrides))
    return conf


@pytest.mark.parametrize("overrides,key,reader", [
    (["train=jacobi_forcing", "train.cllm.prompts=8"], "train.cllm.prompts", "train=cllm"),
    (["train=cllm", "train.jacobi_forcing.window=2"], "train.jacobi_forcing.window", "train=jacobi_forcing"),
    (["train=sft", "train.noise.length=8"], "train.noise.length", "train=msn"),
    (["train=msn", "train.arch.hidden_size=64"], "train.arch.hidden_size", "train=pretrain"),
    (["train.max_steps=5"], "train.max_steps", "a training stage"),
    (["data=lima"], "data", "a training stage"),
    (["forward_cost.q=[1,2]"], "forward_cost.q", "task=forward_cost"),
    (["benchmark.limit=2"], "benchmark.limit", "a benchmark"),
    (["+decoders=[pld]"], "decoders", "a benchmark"),
])
def test_a_key_no_stage_reads_is_refused_naming_it_and_its_reader(overrides, key, reader):
    with pytest.raises(ConfigError, match=rf"^{key}: only {reader}"):
        check(*overrides)


@pytest.mark.parametrize("overrides", [
    ["train=cllm", "train.cllm.prompts=8"],
    ["train=msn", "train.noise.length=8", "train.max_steps=2", "data=lima"],
    ["train=pretrain", "train.arch.hidden_size=64", "train.tokenizer_path=/x"],
    ["task=forward_cost", "forward_cost.arch=random", "train.arch.hidden_size=64", "forward_cost.q=[1,2]"],
    ["benchmark=humaneval", "benchmark.limit=2", "decoders=[pld]"],
    ["benchmark.max_new_tokens=8", "benchmark.template=raw"],  # a single `prompt` reads them too
    ["train=none", "benchmark=humaneval", "train.cache_dir=/x"],  # a sweep's jobs that train nothing share nothing
    ["+experiment=jacobi-training-tiny"],  # a preset may set keys of any stage: only overrides are checked
])
def test_keys_the_job_reads_are_accepted(overrides):
    check(*overrides)


def test_the_refusal_is_one_line_exit_2_before_loading(tmp_path):
    out = subprocess.run([sys.executable, "-m", "specnoise", "train=jacobi_forcing", "train.cllm.prompts=8",
                          "model.path=/nonexistent/model", "logger=none", f"hydra.run.dir={tmp_path}"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2
    errors = [line for line in (out.stdout + out.stderr).splitlines() if "error" in line]
    assert len(errors) == 1 and "train.cllm.prompts: only train=cllm reads it" in errors[0]
    assert "no model at" not in out.stdout + out.stderr and "Traceback" not in out.stdout + out.stderr


def test_sampling_keys_at_temperature_zero_warn_and_run():
    assert config_warnings(check("decoder=pld")) == []
    (warning,) = config_warnings(check("decoder=pld", "decoder.top_p=0.9", "decoder.top_k=5"))
    assert "decoder.top_p=0.9 and decoder.top_k=5 ignored: decoder.temperature=0 decodes greedily" in warning
    assert config_warnings(check("decoder=pld", "decoder.top_p=0.9", "decoder.temperature=0.7")) == []
