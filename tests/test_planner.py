"""The memory planner (planner.py) and device maps (models.py): verdicts before any weight loads, exact counts, and
every decoder lossless on a model that accelerate splits between the CPU and the disk."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM
from transformers.cache_utils import DynamicCache

from helpers_models import save_tiny_model
from specnoise.config import DECODER_SCHEMAS, ARConfig, ConfigError, ModelConfig, UserError
from specnoise.decoding.base import DECODER_MODULES, build_decoder
from specnoise.decoding.kv import cache_keyword
from specnoise.models import load_model
from specnoise.planner import KNOWN_CONFIGS, count_parameters, footprint, kv_bytes_per_token, parse_size, plan
from test_config import compose_object

SRC = Path(__file__).resolve().parents[1] / "src"


def test_parse_size():
    assert parse_size("80GB") == 80 * 10**9
    assert parse_size("79GiB") == 79 * 2**30
    assert parse_size("512 MB") == 512 * 10**6
    assert parse_size(1024) == 1024
    with pytest.raises(UserError, match="80GB"):
        parse_size("eighty")


@pytest.mark.parametrize("family", ["llama", "qwen2"])
@pytest.mark.parametrize("tied", [False, True])
def test_counts_match_the_real_model(tmp_path, family, tied):
    """Parameters from the meta-device build equal the loaded model's; KV bytes per token equal a real cache's."""
    path = save_tiny_model(tmp_path / "m", family=family, tie_word_embeddings=tied)
    config = AutoConfig.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path)
    assert count_parameters(config) == sum(p.numel() for p in model.parameters())
    cache, tokens = DynamicCache(), 7
    model(torch.arange(3, 3 + tokens)[None], **{cache_keyword(model): cache}, use_cache=True)  # the version's name
    held = sum(layer.keys.nbytes + layer.values.nbytes for layer in cache.layers)
    assert kv_bytes_per_token(config, 4) * tokens == held


def test_known_configs_build():
    """Every hub id of a shipped preset that the planner knows offline builds a config of the right size class."""
    sizes = {path: count_parameters(AutoConfig.for_model(**fields)) for path, fields in KNOWN_CONFIGS.items()}
    assert 68e9 < sizes["meta-llama/Llama-2-70b-chat-hf"] < 70e9
    assert 34e9 < sizes["01-ai/Yi-34B"] < 35e9
    assert 6.5e9 < sizes["meta-llama/Llama-2-7b-chat-hf"] < 7e9


def test_70b_pair_does_not_fit_one_80gb_device():
    conf = compose_object(["pair=llama2-70b-7b", "benchmark=humaneval", "model.device_map=null"])
    result = plan(conf, devices=["80GB"])
    assert not result.fits
    assert any("tensor parallel over 4 devices" in o for o in result.options)  # 138 GB / 2 + 13.5 > 72 GB usable
    assert any("device map over 3 devices" in o for o in result.options)


@pytest.mark.parametrize("pair", ["yi-34b-6b", "codellama-34b-7b", "deepseek-33b-6.7b", "llama2-70b-7b"])
def test_big_presets_fit_8x80_and_not_1x80(pair):
    """The presets' own setting (a device map) fits 8 x 80 GB, and is refused on one 80 GB device."""
    conf = compose_object([f"pair={pair}", "benchmark=humaneval"])
    assert conf.model.device_map == "auto"
    assert plan(conf, devices=["80GB"] * 8).fits
    assert not plan(conf, devices=["80GB"]).fits


def test_tensor_parallel_needs_divisible_heads():
    conf = compose_object(["pair=yi-34b-6b", "benchmark=humaneval", "model.device_map=null", "model.tp_plan=auto"])
    assert plan(conf, devices=["80GB"] * 2).fits
    with pytest.raises(UserError, match="56 attention and 8 KV heads"):
        plan(conf, devices=["80GB"] * 3)


def test_float32_advice_names_a_16_bit_dtype(tmp_path):
    path = save_tiny_model(tmp_path / "m", hidden=64, layers=2)
    conf = compose_object([f"model.path={path}", "model.dtype=float32", "benchmark=humaneval",
                           "benchmark.max_prompt_tokens=100"])
    need = footprint(conf.model, str(path), "target", conf, accelerator=True).total
    result = plan(conf, devices=[str(int(need * 0.8))])  # fp32 does not fit, 16-bit does (0.5 x need < 0.72 x need)
    assert not result.fits
    assert any("model.dtype=bfloat16" in o for o in result.options)


def test_small_model_fits_this_machine():
    conf = compose_object(["pair=small-code", "benchmark=humaneval", "benchmark.max_prompt_tokens=256"])
    assert plan(conf).fits


def test_bad_keys_fail_at_config_time():
    with pytest.raises(ConfigError, match="model.device_map"):
        compose_object(["model.device_map=everywhere"])
    with pytest.raises(ConfigError, match="model.tp_plan"):
        compose_object(["model.device_map=auto", "model.tp_plan=auto"])
    with pytest.raises(ConfigError, match="planner.devices"):
        compose_object(["planner.devices=[80 gigs]"])
    with pytest.raises(ConfigError, match="model.offload_folder"):
        compose_object(["model.offload_folder=/tmp/x"])


def test_static_engine_refuses_a_device_map(tmp_path):
    path = save_tiny_model(tmp_path / "m")
    with pytest.raises(UserError, match="use the dynamic engine"):
        load_model(ModelConfig(name="m", path=str(path), device_map="auto", static_cache=True))


@pytest.mark.slow
def test_entry_point_refuses_70b_before_loading(tmp_path):
    """The done-when command: no weights on this machine, no network; the verdict and exit 2."""
    env = {**os.environ, "PYTHONPATH": str(SRC), "HF_HUB_OFFLINE": "1"}
    done = subprocess.run([sys.executable, "-m", "specnoise", "pair=llama2-70b-7b", "benchmark=humaneval",
                           "model.device_map=null", f"hydra.run.dir={tmp_path / 'run'}"],
                          env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 2, done.stderr
    assert "154.9 GB" in done.stdout and "does NOT fit" in done.stdout + done.stderr


# ------------------------------------------------------------------------------------------- device maps
@pytest.fixture(scope="module")
def split(tmp_path_factory):
    """The same tiny model loaded plainly and through accelerate with max_memory forcing a CPU + disk split."""
    root = tmp_path_factory.mktemp("split")
    path = save_tiny_model(root / "m", layers=4)
    plain = load_model(ModelConfig(name="m", path=str(path), static_cache=False))
    cfg = ModelConfig(name="m", path=str(path), device_map="auto", max_memory={"cpu": "450KB"},
                      offload_folder=str(root / "offload"), static_cache=False)
    return plain, load_model(cfg)


def test_max_memory_splits_the_model(split):
    _, mapped = split
    assert set(mapped.model.hf_device_map.values()) == {"cpu", "disk"}
    assert mapped.device == torch.device("cpu")


@pytest.mark.parametrize("name", [n for n in DECODER_MODULES if n != "rest"])
def test_every_decoder_lossless_on_a_split_model(split, name):
    plain, mapped = split
    prompt = plain.tokenizer("def fibonacci(n):\n")["input_ids"]
    expected = build_decoder(ARConfig(), plain).generate(prompt, 24).tokens
    assert build_decoder(DECODER_SCHEMAS[name](), mapped, mapped).generate(prompt, 24).tokens == expected
