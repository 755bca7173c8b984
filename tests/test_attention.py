"""attn_implementation=sdpa_gqa: the same logits as transformers' sdpa (no KV copy per query head), on both engines
and both families, and every greedy decoder still equals AR with it."""

from __future__ import annotations

import dataclasses

import pytest
import torch

import specnoise.attention  # noqa: F401  (registers sdpa_gqa)
from conftest import make_model, prompts
from specnoise.config import DECODER_SCHEMAS, ARConfig, ConfigError, ModelConfig
from specnoise.decoding.base import build_decoder
from specnoise.decoding.kv import DynamicEngine, causal_block, self_test
from specnoise.decoding.static_kv import StaticEngine


def with_attention(loaded, name: str):
    model = loaded.model
    model.config._attn_implementation = name  # read on every forward
    return loaded


@pytest.fixture(scope="module", params=["llama", "qwen2"])
def gqa_model(request):
    loaded = make_model(request.param, layers=2, seed=0, num_attention_heads=4, num_key_value_heads=2)
    assert loaded.model.config.num_attention_heads // loaded.model.config.num_key_value_heads == 2
    return loaded


@pytest.mark.parametrize("engine", [DynamicEngine, StaticEngine])
def test_sdpa_gqa_gives_sdpa_logits(gqa_model, engine, monkeypatch):
    fallback = specnoise.attention.sdpa_attention_forward
    masked_fallbacks = []
    monkeypatch.setattr(specnoise.attention, "sdpa_attention_forward", lambda *a, **k: (
        masked_fallbacks.append(a[4] is not None), fallback(*a, **k))[1])
    tree = torch.tensor([[1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 1, 0], [1, 1, 0, 1]], dtype=torch.bool)  # r, a, b, a->c
    logits = {}
    for name in ("sdpa", "sdpa_gqa"):
        kv = engine(with_attention(gqa_model, name).model)
        kv.forward(list(range(3, 20)))
        block = kv.forward([5, 6, 7, 8], positions=[17, 18, 18, 19], tree=tree)
        chain = kv.forward([9, 10, 11], tree=causal_block(3))
        logits[name] = torch.cat([block, chain])
    assert torch.allclose(logits["sdpa"], logits["sdpa_gqa"], atol=1e-5)
    assert not any(masked_fallbacks)  # every masked forward took the packed path (an unmasked prefill may not)
    assert self_test(gqa_model.model) < 1e-4  # tree masks and positions are honoured


@pytest.mark.parametrize("name", ["jacobi", "tr_jacobi", "pld", "lookahead"])
def test_decoders_equal_ar_with_sdpa_gqa(gqa_model, name):
    loaded = with_attention(gqa_model, "sdpa_gqa")
    decoder = build_decoder(DECODER_SCHEMAS[name](), dataclasses.replace(loaded, engines={}))
    reference = build_decoder(ARConfig(), loaded)  # not helpers' cached ar(): it keys on id(model), reused after GC
    for prompt in prompts(3, seed=5):
        assert decoder.generate(prompt, 20).tokens == reference.generate(prompt, 20).tokens


def test_attention_option_is_checked():
    assert ModelConfig(name="m", path="p", attn_implementation="sdpa_gqa").attn_implementation == "sdpa_gqa"
    with pytest.raises(ConfigError, match="attn_implementation"):
        ModelConfig(name="m", path="p", attn_implementation="flash")


@pytest.mark.parametrize("attention", ["default", "sdpa"])
def test_a_model_loaded_by_default_never_copies_its_cache_per_query_head(attention, tmp_path, monkeypatch):
    """``load_model`` with the default attention gives a grouped-query model ``sdpa_gqa``: a batch's drafted forward
    (two tokens per row under a 4D mask) makes no ``repeat_kv`` copy; ``sdpa`` asked for makes one per layer for K and
    V, and the two give the same logits."""
    import transformers.integrations.sdpa_attention as sdpa

    from helpers_models import save_tiny_model
    from specnoise.decoding.batch import BatchKV
    from specnoise.models import load_model

    path = save_tiny_model(tmp_path / "m", layers=2)
    options = {} if attention == "default" else {"attn_implementation": attention}
    loaded = load_model(ModelConfig(name="m", path=str(path), **options))
    assert loaded.model.config._attn_implementation == ("sdpa_gqa" if attention == "default" else "sdpa")
    copies, repeat = [], sdpa.repeat_kv
    monkeypatch.setattr(sdpa, "repeat_kv", lambda *a: copies.append(1) or repeat(*a))

    def drafted_forward(model) -> torch.Tensor:
        batch = BatchKV(DynamicEngine(model), 2, need=32)
        batch.forward({r: (list(range(3 + r, 20)), None, None, 1) for r in range(2)})  # (a prefill: a q-row block)
        copies.clear()
        out = batch.forward({r: ([5, 6], None, causal_block(2), None) for r in range(2)})
        return torch.stack([out[r] for r in range(2)])

    logits = drafted_forward(loaded.model)
    assert len(copies) == (0 if attention == "default" else 2 * 2)  # K and V, in each of the 2 layers
    other = load_model(ModelConfig(name="m", path=str(path), attn_implementation="sdpa"))
    assert torch.allclose(logits, drafted_forward(other.model), atol=1e-5)
