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
from specnoise.decoding.base import DECODER_MODULES, decoder_class

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
        (["decoder=hf_greedy", "decoder.top_p=0.9", "model.path=/nonexistent/model", "logger=none"],  # before loading
         "decoder.top_p: decoder=hf_greedy is greedy-only"),
    ],
)
def test_cli_bad_input_gives_one_clear_line(args, message, tmp_path):
    out = run_cli(*args, f"hydra.run.dir={tmp_path}")
    assert out.returncode != 0
    assert message in out.stdout + out.stderr
    assert "Traceback" not in out.stdout + out.stderr


SAMPLERS = ["ar", "jacobi", "tr_jacobi", "pld", "lookahead", "token_recycling", "sam", "rest", "speculative",
            "ouroboros"]


@pytest.mark.parametrize("decoder,key,value", [("hf_greedy", "temperature", 1.0), ("hf_assisted", "top_p", 0.5),
                                               ("hf_pld", "top_k", 3), ("hf_static", "temperature", 0.7)])
def test_greedy_only_decoders_reject_sampling_keys(decoder, key, value):
    with pytest.raises(ConfigError, match=rf"decoder\.{key}: decoder={decoder} is greedy-only.*"
                                          rf"\({', '.join(SAMPLERS)}\)"):
        compose_object([f"decoder={decoder}", f"decoder.{key}={value}"])


@pytest.mark.parametrize("decoder", SAMPLERS)
def test_sampling_decoders_take_every_sampling_key(decoder):
    conf = compose_object([f"decoder={decoder}", "decoder.temperature=0.8", "decoder.top_p=0.9", "decoder.top_k=5",
                           f"decoders=[{','.join(SAMPLERS)}]"])
    assert (conf.decoder.temperature, conf.decoder.top_p, conf.decoder.top_k) == (0.8, 0.9, 5)


def test_decoders_list_shares_sampling_so_greedy_only_entries_are_rejected():
    with pytest.raises(ConfigError, match=r"decoders\[\]: hf_greedy is greedy-only.*temperature=0\.8"):
        compose_object(["decoder=speculative", "decoder.temperature=0.8", "decoders=[ouroboros,hf_greedy]"])
    with pytest.raises(ConfigError, match=r"decoders\[\]: hf_pld is greedy-only.*top_k=4"):
        compose_object(["decoder=ar", "decoder.top_k=4", "decoders=[hf_pld]"])
    assert compose_object(["decoder=speculative", "decoders=[hf_pld,jacobi]"]).decoders == ["hf_pld", "jacobi"]


def test_every_drafter_samples_and_the_generate_peers_do_not():
    """Sampling lives in the verifier, so every decoder over it samples; the config schema is the one place that
    says so."""
    for name, schema in DECODER_SCHEMAS.items():
        assert schema.samples == (decoder_class(name).drafter_class is not None), name


def test_one_generation_length_for_a_benchmark():
    with pytest.raises(ConfigError, match=r"decoder\.max_new_tokens: got 64 but benchmark\.max_new_tokens=512"):
        compose_object(["benchmark=humaneval", "decoder.max_new_tokens=64"])
    conf = compose_object(["benchmark=humaneval", "decoder.max_new_tokens=512"])  # repeating it is fine
    assert conf.benchmark.max_new_tokens == 512
    assert compose_object(["decoder.max_new_tokens=64"]).decoder.max_new_tokens == 64  # `prompt` generation


def test_ouroboros_phrase_len_and_the_retired_beta():
    conf = compose_object(["decoder=ouroboros_hh"])
    assert conf.decoder.phrase_len == 5 and conf.decoder.beta is None
    with pytest.raises(ConfigError, match=r"decoder\.beta: renamed decoder\.phrase_len.*decoder\.phrase_len=6"):
        compose_object(["decoder=ouroboros", "decoder.beta=6"])
    with pytest.raises(ConfigError, match=r"decoder\.phrase_len: got 0"):
        compose_object(["decoder=ouroboros", "decoder.phrase_len=0"])


@pytest.mark.parametrize("module", ["specnoise.decoding.trees", "specnoise.config"])
def test_modules_import_first_without_a_cycle(module):
    out = subprocess.run([sys.executable, "-c", f"import {module}"], capture_output=True, text=True, timeout=120,
                         cwd=Path(__file__).parents[1])
    assert out.returncode == 0, out.stderr
