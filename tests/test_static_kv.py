"""The static-cache engine (decoding/static_kv.py) and the hf_static peer.

Every decoder runs unchanged on the static engine (uncompiled here: the CPU path) and must give AR's tokens on two
model families; crop, compact, bucket padding, the eager path for long blocks and cache growth must give the dynamic
engine's logits; hf_static must give AR's tokens; speedup_vs_best_ar is computed against the faster peer.
"""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from conftest import prompts
from helpers_decoding import CYCLE, ar, cycle_successor, map_model, schema
from helpers_models import save_tiny_model, tiny_tokenizer
from specnoise.bench.engines import add_speedup_vs_best_ar, engine_meta
from specnoise.bench.runner import run_benchmark
from specnoise.config import ConfigError, ModelConfig, config_dir
from specnoise.decoding import static_kv
from specnoise.decoding.base import DECODER_MODULES, build_decoder
from specnoise.decoding.kv import DynamicEngine
from specnoise.decoding.static_kv import StaticEngine, capacity_for
from specnoise.models import load_model, use_static_cache

ALL = list(DECODER_MODULES)
ENGINE_DECODERS = [n for n in ALL if not n.startswith("hf_")]  # the hf_* peers run generate() on their own cache
NEW_TOKENS = 40
PROMPTS = prompts(5, seed=1)


def static(loaded, **flags):
    """The same model, switched to the static engine (its own shared engine)."""
    return dataclasses.replace(loaded, static_cache=True, engines={}, **flags)


def build(name, target, draft, **overrides):
    return build_decoder(schema(name, **overrides), target, draft)


@pytest.fixture(scope="module")
def static_pair(target, draft):
    return static(target), static(draft)


# ------------------------------------------------------------------------------------------ exactness
@pytest.mark.parametrize("name", ENGINE_DECODERS)
def test_every_decoder_on_the_static_engine_equals_ar(name, target, static_pair):
    decoder = build(name, *static_pair)
    assert isinstance(decoder.target, StaticEngine)
    for prompt in PROMPTS:
        out = decoder.generate(prompt, NEW_TOKENS)
        assert out.tokens == ar(target, prompt, NEW_TOKENS), f"{name} on the static engine diverges from AR"
        assert sum(out.accepted) == len(out.tokens) and out.target_forwards >= len(out.accepted)


@pytest.mark.parametrize("name", ENGINE_DECODERS)
def test_budget_and_eos_inside_accepted_drafts_on_the_static_engine(name, family):
    target = static(map_model(family, cycle_successor, {13}))
    draft = static(map_model(family, cycle_successor, {13}))
    decoder = build(name, target, draft)
    prompt = CYCLE * 3
    for budget in (1, 2, 3, 7):
        assert decoder.generate(prompt, budget).tokens == ar(target, prompt, budget) == CYCLE[:min(budget, 4)]


@pytest.mark.parametrize("name", ["ar", "speculative", "ouroboros"])
def test_sampling_draws_the_same_tokens_on_both_engines(name, target, draft, static_pair):
    """Same seed, same logits (to float rounding): the same samples, drafts and acceptances."""
    for prompt in PROMPTS[:3]:
        outs = [build(name, t, d, temperature=0.8, seed=3).generate(prompt, 16)
                for t, d in ((target, draft), static_pair)]
        assert outs[0].tokens == outs[1].tokens and outs[0].accepted == outs[1].accepted


def test_hf_static_equals_ar(target):
    decoder = build("hf_static", target, None)
    for prompt in PROMPTS:
        out = decoder.generate(prompt, NEW_TOKENS)
        assert out.tokens == ar(target, prompt, NEW_TOKENS)
        assert out.target_forwards == len(out.tokens) and out.accepted == [1] * len(out.tokens)
    cache = decoder.cache
    decoder.generate(PROMPTS[0], 8)
    assert decoder.cache is cache  # one cache, reset per call: compiled graphs are built once


# ------------------------------------------------------------------------------------ the primitives
def compare(ops, model, **engine):
    """Run the same operations on both engines; every forward's logits and every length must agree."""
    dynamic, fixed = DynamicEngine(model), StaticEngine(model, **engine)
    for op, *args in ops:
        if op == "forward":
            a, b = dynamic.forward(*args), fixed.forward(*args)
            assert a.shape == b.shape and torch.allclose(a, b, atol=1e-4), (op, args)
        else:
            getattr(dynamic, op)(*args)
            getattr(fixed, op)(*args)
        assert dynamic.length == fixed.length, (op, args)
    assert dynamic.forwards == fixed.forwards
    return fixed


def tree_ops():
    """Prefill, a tree verified with positions and a mask, compaction of a path, crops, chains and a long block."""
    tree = torch.eye(6, dtype=torch.bool)
    for i, p in enumerate([-1, 0, 0, 1, 1, 4]):  # r; a b under r; c d under a; e under d
        if p >= 0:
            tree[i] |= tree[p]
    depth = [0, 1, 1, 2, 2, 3]
    return [
        ("forward", [11, 12, 13, 14, 15, 16, 17]),
        ("forward", [15, 21, 22, 23, 24, 25], [7 + d for d in depth], tree),
        ("compact", 7, [7, 8, 11, 12]),  # r -> a -> d -> e
        ("forward", [30, 31, 32], None, None, 2),  # last rows only
        ("crop", 9),  # stale slots past the length must stay invisible
        ("forward", [40]),
        ("crop", 20),  # past the length: nothing happens
        ("forward", list(range(3, 23))),  # 20 tokens: past small buckets, so eager and unpadded there
        ("compact", 12, [12, 13]),  # a contiguous prefix: just a crop
        ("forward", [50, 51, 52, 53, 54], None, None, 1),
        ("reset",),
        ("forward", [60, 61]),
    ]


@pytest.mark.parametrize("buckets", [static_kv.BUCKETS, (1, 2, 4)], ids=["default-buckets", "small-buckets"])
def test_static_engine_matches_the_dynamic_engine(target, buckets):
    engine = compare(tree_ops(), target.model, buckets=buckets)
    assert engine.capacity == capacity_for(engine.capacity, engine.max_length, buckets[-1])


def test_the_cache_grows_keeping_its_contents(target, monkeypatch):
    monkeypatch.setattr(static_kv, "MIN_CAPACITY", 8)
    engine = compare(tree_ops()[:-2] + [("forward", list(range(3, 40)))], target.model, buckets=(1, 2, 4))
    assert engine.capacity >= 12 + 37  # grew past its first 8 + 4 slots, mid-sequence


def test_reserve_sizes_the_cache_before_the_first_forward(target):
    engine = StaticEngine(target.model)
    engine.reserve(100)
    cache, capacity = engine.cache, engine.capacity
    assert capacity >= 100 + static_kv.BUCKETS[-1]
    engine.forward(list(range(3, 50)))
    engine.reset()
    engine.reserve(80)
    assert engine.cache is cache and engine.capacity == capacity and engine.length == 0


def test_capacity_is_a_power_of_two_within_the_context():
    assert capacity_for(3, context=1 << 20) == static_kv.MIN_CAPACITY
    assert capacity_for(300, context=1 << 20) == 512
    assert capacity_for(3000, context=1 << 20) == 4096
    assert capacity_for(600, context=512, block=128) == 640  # the context and one padded block, not 1024
    assert capacity_for(900, context=512, block=128) == 900  # never less than asked


def test_decoders_of_one_model_share_one_static_engine(static_pair):
    a, b = build("ar", *static_pair), build("jacobi", *static_pair)
    assert a.target is b.target
    assert build("ar", dataclasses.replace(static_pair[0], static_cache=False), None).target is not a.target


# ------------------------------------------------------------------------------------------ the choice
def test_static_cache_setting():
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert not use_static_cache("auto", False, cpu) and not use_static_cache("auto", False, cuda)
    assert use_static_cache("auto", True, cpu) and use_static_cache(True, False, cpu)
    assert not use_static_cache(False, False, cuda)


def test_bad_engine_settings_are_config_errors():
    with pytest.raises(ConfigError, match="model.static_cache"):
        ModelConfig(name="m", path="p", static_cache="yes")
    with pytest.raises(ConfigError, match="model.compile.*static_cache=true"):
        ModelConfig(name="m", path="p", static_cache=False, compile=True)


def test_load_model_picks_the_engine(tmp_path):
    path = str(save_tiny_model(tmp_path / "m", layers=1, hidden=32))
    picks = {setting: load_model(ModelConfig(name="m", path=path, device="cpu", static_cache=setting)).static_cache
             for setting in (True, False, "auto")}
    assert picks == {True: True, False: False, "auto": False}  # auto: the dynamic engine on CPU


def compose_config(*overrides):
    with initialize_config_dir(config_dir=str(config_dir()), version_base="1.3"):
        cfg = compose("config", overrides=list(overrides))
    return OmegaConf.to_object(cfg), cfg


def test_command_line_values():
    conf, _ = compose_config("model.static_cache=true", "model.compile=true", "draft.static_cache=false")
    assert conf.model.static_cache is True and conf.model.compile is True and conf.draft.static_cache is False
    assert compose_config()[0].model.static_cache == "auto"


# ------------------------------------------------------------------------------------------ results
def test_runner_on_the_static_engine_with_the_hf_static_peer(tmp_path):
    path = save_tiny_model(tmp_path / "m", tokenizer=tiny_tokenizer())
    prompts_file = tmp_path / "p.jsonl"
    prompts_file.write_text("".join(json.dumps({"text": t}) + "\n" for t in ("def add(a, b):", "for i in range(")))
    conf, cfg = compose_config(f"model.path={path}", "model.static_cache=true", "logger=none", "decoder=tr_jacobi",
                               "decoders=[hf_static]", "benchmark=jsonl", f"benchmark.path={prompts_file}",
                               "benchmark.prompt_field=text", "benchmark.max_new_tokens=12")
    results = json.loads(run_benchmark(conf, cfg, tmp_path).read_text())
    rows = {r["decoder"]: r for r in results["rows"] if r["category"] == "all"}
    assert set(rows) == {"ar", "tr_jacobi", "hf_static"}
    assert all(r["lossless_fraction"] == 1.0 for r in rows.values())
    best = max(rows["ar"]["tokens_per_second"], rows["hf_static"]["tokens_per_second"])
    assert rows["tr_jacobi"]["speedup_vs_best_ar"] == pytest.approx(rows["tr_jacobi"]["tokens_per_second"] / best)
    assert results["meta"]["static_cache"] is True and results["meta"]["compile"] is False


def test_speedup_vs_best_ar_uses_the_faster_peer():
    rows = [dict(decoder="ar", category="all", tokens_per_second=100.0),
            dict(decoder="hf_static", category="all", tokens_per_second=200.0),
            dict(decoder="tr_jacobi", category="all", tokens_per_second=300.0),
            dict(decoder="ar", category="code", tokens_per_second=50.0),
            dict(decoder="hf_static", category="code", tokens_per_second=25.0),
            dict(decoder="tr_jacobi", category="code", tokens_per_second=100.0)]
    got = {(r["decoder"], r["category"]): r["speedup_vs_best_ar"] for r in add_speedup_vs_best_ar(rows)}
    assert got == {("ar", "all"): 0.5, ("hf_static", "all"): 1.0, ("tr_jacobi", "all"): 1.5,
                   ("ar", "code"): 1.0, ("hf_static", "code"): 0.5, ("tr_jacobi", "code"): 2.0}
    plain = [dict(decoder="ar", category="all", tokens_per_second=1.0)]
    assert "speedup_vs_best_ar" not in add_speedup_vs_best_ar(plain)[0]  # only when hf_static ran


def test_engine_meta(static_pair, target, draft):
    meta = engine_meta([build("speculative", *static_pair), build("ar", *static_pair)])
    assert meta == {"static_cache": True, "compile": False, "compile_seconds": 0.0}
    assert engine_meta([build("ar", target, draft)])["static_cache"] is False


# ------------------------------------------------------------------------------------------ compiled
@pytest.mark.slow
def test_compiled_static_engine_matches_the_dynamic_engine_on_cpu(target):
    """torch.compile on CPU (inductor, no CUDA graphs): slow, but the code path the GPU check compiles."""
    engine = compare(tree_ops(), target.model, compile=True, buckets=(1, 8))
    assert engine.compile_seconds > 0


@pytest.mark.slow
def test_compiled_batches_equal_ar_alone_and_compile_once_on_cpu(target):
    """A compiling static engine's lock-step batches: each (batch bucket, block bucket) forward is compiled the first
    time a batch meets it, over the engine's cache of that batch bucket, which every later group reuses: the same
    group again, its rows moving into a smaller bucket as one ends, runs compiled forwards of blocks of 1 and 8 tokens
    at 4 and 2 rows without recompiling; every row equals AR alone. (PLD proposes at most 7 tokens: its blocks fit
    the 8-token bucket; the prompts' first forward fits none and runs eagerly.)"""
    ps = PROMPTS[:3]
    target = dataclasses.replace(target, eos_ids=frozenset({ar(target, ps[1], 4)[3]}))  # row 1 ends after 4 tokens
    engine = StaticEngine(target.model, compile=True, buckets=(1, 8))
    decoder = build_decoder(schema("pld", num_pred_tokens=7), target)
    decoder.bind(engine, None)
    first = decoder.generate_batch(ps, 12)
    compiled = engine.compile_seconds
    assert compiled > 0 and decoder.compile_seconds() == compiled
    step, shapes = engine._batch_step, []
    engine._batch_step = lambda cache, ids, *rest: shapes.append(tuple(ids.shape)) or step(cache, ids, *rest)
    with torch._dynamo.config.patch(error_on_recompile=True):
        again = decoder.generate_batch(ps, 12)
    assert engine.compile_seconds == compiled
    assert {q for _, q in shapes} == {1, 8} and {rows for rows, _ in shapes} >= {4, 2}, shapes  # 3 rows, then 2
    for out, prompt in zip(first + again, ps + ps):
        assert out.tokens == ar(target, prompt, 12)
