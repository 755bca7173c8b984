"""task=forward_cost: the t(q) probe (engine state left as found), its fit, random models from a config, the files."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf
from transformers import AutoConfig, LlamaForCausalLM

from helpers_models import save_tiny_model
from specnoise.bench.forward_cost import random_model, run_forward_cost
from specnoise.config import ConfigError, ForwardCostConfig, UserError, config_dir
from specnoise.decoding.cost import interpolate, measure_forward_costs
from specnoise.decoding.kv import DynamicEngine

TINY_ARCH = ["train.arch.vocab_size=128", "train.arch.hidden_size=32", "train.arch.intermediate_size=64",
             "train.arch.num_hidden_layers=1", "train.arch.num_attention_heads=2", "train.arch.num_key_value_heads=1",
             "train.arch.max_position_embeddings=256"]
FAST = ["forward_cost.q=[2,4]", "forward_cost.cache_len=32", "forward_cost.repeats=2", "forward_cost.warmup=1"]


def configure(*overrides):
    with initialize_config_dir(config_dir=str(config_dir()), version_base="1.3"):
        cfg = compose("config", overrides=["task=forward_cost", "logger=none", *overrides])
    return OmegaConf.to_object(cfg)


def test_probe_leaves_the_engine_as_found(target):
    kv = DynamicEngine(target.model)
    prefix = list(range(3, 20))
    before = kv.forward(prefix)
    costs = measure_forward_costs(kv, [4, 1, 8], cache_len=40, repeats=2, warmup=1)
    assert sorted(costs) == [1, 4, 8] and all(t > 0 for t in costs.values())
    assert kv.length == len(prefix) and kv.forwards == 1  # topped-up cache and probes cropped, count restored
    kv.crop(len(prefix) - 1)
    assert torch.allclose(kv.forward(prefix[-1:])[0], before[-1], atol=1e-5)  # the cached prefix is intact


def test_both_kinds_are_probed_in_turn_at_every_size(target, monkeypatch):
    """``causal=(True, False)``: a chain (no mask) and a tree (a mask) of every size, one after the other within each
    round (their order reversed in the next, as the sizes' is), so a drift of the machine reaches both kinds alike;
    keyed (q, causal)."""
    kv = DynamicEngine(target.model)
    fed, forward = [], kv.forward
    monkeypatch.setattr(kv, "forward", lambda tokens, tree=None, **kw: fed.append((len(tokens), tree is None))
                        or forward(tokens, tree=tree, **kw))
    costs = measure_forward_costs(kv, [1, 4], cache_len=20, repeats=2, warmup=0, causal=(True, False))
    assert sorted(costs) == [(1, False), (1, True), (4, False), (4, True)]
    probes = [f for f in fed if f[0] in (1, 4)]
    assert probes == [(1, True), (1, False), (4, True), (4, False), (4, False), (4, True), (1, False), (1, True)]


def test_probe_refuses_sizes_beyond_the_context(target):
    kv = DynamicEngine(target.model)  # context 512
    with pytest.raises(UserError, match="forward_cost.cache_len"):
        measure_forward_costs(kv, [1, 64], cache_len=500)


def test_cost_fit_is_non_decreasing_and_exact_where_measured():
    cost = interpolate({1: 1.0, 2: 1.5, 4: 2.0, 8: 4.0})
    assert [cost(q) for q in (1, 2, 4, 8)] == [1.0, 1.5, 2.0, 4.0]
    assert cost(3) == pytest.approx(1.75) and cost(12) == pytest.approx(6.0)  # linear between and beyond
    noisy = interpolate({1: 1.0, 2: 3.0, 4: 2.0, 8: 5.0})  # a busy machine timed q=2 slower than q=4
    assert noisy(2) == noisy(4) == pytest.approx(2.5)
    values = [noisy(q) for q in range(1, 12)]
    assert values == sorted(values)


def test_random_model_from_a_config_has_real_rope_and_weights():
    config = AutoConfig.for_model("llama", vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                  num_attention_heads=2, num_key_value_heads=1)
    model = random_model(config, configure())
    reference = LlamaForCausalLM(config)
    assert torch.equal(model.model.rotary_emb.inv_freq, reference.model.rotary_emb.inv_freq)  # lost on meta, rebuilt
    for name, weight in model.named_parameters():
        assert torch.isfinite(weight).all() and weight.std() > 0 or "norm" in name, name
    assert model.lm_head.weight.std().item() == pytest.approx(0.02, rel=0.2)


def test_forward_cost_files_for_a_random_model(tmp_path, capsys):
    conf = configure("forward_cost.arch=random", *TINY_ARCH, *FAST)
    md = run_forward_cost(conf, tmp_path)
    table = pd.read_csv(tmp_path / "forward_cost.csv")
    assert list(table.q) == [1, 2, 4]  # t(1) always measured
    assert list(table.columns) == ["q", "ms", "ms_per_token", "ratio_to_q1", "min_ms"]
    assert table.min_ms.notna().all() and (table.min_ms <= table.ms).all() and table.ratio_to_q1[0] == 1.0
    assert table.ms_per_token.tolist() == pytest.approx((table.ms / table.q).tolist())
    text = md.read_text()
    assert "cache_len: 32" in text and "ratio_to_q1" in text and "forward_cost.png" in text
    assert (tmp_path / "forward_cost.png").stat().st_size > 1000
    assert "ratio_to_q1" in capsys.readouterr().out


def test_forward_cost_of_the_configured_model(tmp_path):
    path = save_tiny_model(tmp_path / "model")
    conf = configure(f"model.path={path}", *FAST, "forward_cost.plot=false")
    run_forward_cost(conf, tmp_path)
    assert "model: small-code-msn" in (tmp_path / "forward_cost.md").read_text()
    assert not (tmp_path / "forward_cost.png").exists()


def test_bad_forward_cost_options():
    with pytest.raises(ConfigError, match="forward_cost.config_path"):
        ForwardCostConfig(arch="config")
    with pytest.raises(ConfigError, match="forward_cost.q"):
        ForwardCostConfig(q=[0, 2])
    with pytest.raises(ConfigError, match="forward_cost.arch"):
        ForwardCostConfig(arch="hub")


def cli(*args):
    return subprocess.run([sys.executable, "-m", "specnoise", "task=forward_cost", "logger=none", *args],
                          capture_output=True, text=True, timeout=300, cwd=Path(__file__).parents[1])


@pytest.mark.slow  # two interpreter start-ups: ~10 s on an idle 2-core machine
def test_cli_probes_a_config_json_and_reports_bad_paths(tmp_path):
    path = save_tiny_model(tmp_path / "model")
    out = cli("forward_cost.arch=config", f"forward_cost.config_path={path / 'config.json'}", *FAST,
              f"hydra.run.dir={tmp_path / 'run'}")
    assert out.returncode == 0, out.stderr
    assert {"forward_cost.csv", "forward_cost.md", "forward_cost.png"} <= {p.name for p in (tmp_path / "run").iterdir()}
    bad = cli("forward_cost.arch=config", f"forward_cost.config_path={tmp_path / 'missing.json'}",
              f"hydra.run.dir={tmp_path / 'bad'}")
    assert bad.returncode == 2 and "forward_cost.config_path" in bad.stderr + bad.stdout
    assert not (tmp_path / "bad" / "forward_cost.csv").exists()
    assert "forward_cost.config_path" in json.loads((tmp_path / "bad" / "FAILED.json").read_text())["error"]
