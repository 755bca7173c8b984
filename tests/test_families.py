"""Every common decoder-only family (helpers_families.FAMILIES, tiny random configs built offline): every decoder's
greedy tokens equal AR's, on both engines where the family's cache allows; sliding-window models run inside their
window and are refused with the numbers beyond it; recurrent architectures are refused before loading.

The default suite runs each family with a tree decoder and a draft-model decoder on the dynamic engine; the full
cross product (every decoder x both engines) is slow. experiments/families/make_table.py runs the same checks and
writes README's support table.
"""

from __future__ import annotations

import dataclasses

import pytest
from transformers import AutoConfig

from conftest import prompts
from helpers_decoding import schema
from helpers_families import FAMILIES, WINDOW, family_config, family_model
from helpers_models import tiny_tokenizer
from specnoise.config import ARConfig, ModelConfig, UserError
from specnoise.decoding.base import DECODER_MODULES, build_decoder
from specnoise.models import check_architecture, load_model, model_context, sliding_window

NEW_TOKENS = 24
PROMPTS = prompts(2, seed=1)  # <= 36 tokens: prompt + budget stay inside WINDOW
ENGINE_DECODERS = [n for n in DECODER_MODULES if not n.startswith("hf_")]  # hf_* run generate() on HF's own cache
SLIDING = [f for f in FAMILIES if sliding_window(family_config(f))]
_MODELS: dict = {}


def models(family: str, static: bool = False):
    """(target, draft) of ``family``, built once; ``static``: the same models on the static engine."""
    if family not in _MODELS:
        target, draft = family_model(family), family_model(family, layers=1, seed=1)
        expected = [build_decoder(ARConfig(), target).generate(p, NEW_TOKENS).tokens for p in PROMPTS]
        _MODELS[family] = target, draft, expected
    target, draft, expected = _MODELS[family]
    if static:
        target, draft = (dataclasses.replace(m, static_cache=True, engines={}) for m in (target, draft))
    return target, draft, expected


def check_lossless(family: str, name: str, static: bool = False) -> None:
    target, draft, expected = models(family, static)
    assert all(len(set(tokens)) > 3 for tokens in expected), f"{family}: a degenerate model proves nothing"
    decoder = build_decoder(schema(name), target, draft)
    for prompt, tokens in zip(PROMPTS, expected):
        assert decoder.generate(prompt, NEW_TOKENS).tokens == tokens, f"{family}/{name} diverges from AR on {prompt}"


def test_at_least_twelve_families():
    assert len(FAMILIES) >= 12 and len(SLIDING) >= 3


@pytest.mark.parametrize("family", list(FAMILIES))
@pytest.mark.parametrize("name", ["tr_jacobi", "speculative"])
def test_family_lossless(family, name):
    check_lossless(family, name)


@pytest.mark.slow
@pytest.mark.parametrize("family", list(FAMILIES))
@pytest.mark.parametrize("name", list(DECODER_MODULES))
def test_family_lossless_every_decoder(family, name):
    check_lossless(family, name)


@pytest.mark.slow
@pytest.mark.parametrize("family", [f for f in FAMILIES if f not in SLIDING])
@pytest.mark.parametrize("name", ENGINE_DECODERS)
def test_family_lossless_static_engine(family, name):
    check_lossless(family, name, static=True)


# --------------------------------------------------------------------------------------- sliding windows
@pytest.mark.parametrize("family", SLIDING[:2])
def test_sliding_window_beyond_the_window_is_refused(family):
    model = family_model(family, sliding_window=16)
    assert model.max_length == 16  # the window, not max_position_embeddings
    decoder = build_decoder(schema("jacobi"), model)
    assert len(decoder.generate([5, 6, 7, 8], 12).tokens) <= 12  # 4 + 12 = 16: inside the window, runs
    with pytest.raises(UserError, match="prompt of 5 tokens \\+ max_new_tokens=12 exceeds the model's context of 16"):
        decoder.generate([5, 6, 7, 8, 9], 12)


def test_disabled_sliding_window_is_no_limit():
    assert sliding_window(family_config("qwen2", sliding_window=16, use_sliding_window=False)) is None
    assert sliding_window(family_config("gemma2")) == WINDOW


def save_config(path, family, **overrides):
    family_config(family, **overrides).save_pretrained(path)
    tiny_tokenizer().save_pretrained(path)
    return ModelConfig(name=family, path=str(path))


def test_static_engine_refuses_a_sliding_window_before_loading(tmp_path):
    cfg = dataclasses.replace(save_config(tmp_path / "g", "gemma2"), static_cache=True)  # config.json, no weights
    with pytest.raises(UserError, match="rolling cache .*use the dynamic engine"):
        load_model(cfg)


@pytest.mark.parametrize("model_type", ["bamba", "jamba", "mamba"])
def test_recurrent_architectures_refused_before_loading(tmp_path, model_type):
    with pytest.raises(UserError, match="recurrent state"):
        check_architecture(AutoConfig.for_model(model_type), model_type)
    AutoConfig.for_model(model_type).save_pretrained(tmp_path)  # config.json alone: no weights to load
    with pytest.raises(UserError, match="recurrent state"):
        model_context(ModelConfig(name=model_type, path=str(tmp_path)))


# ------------------------------------------------------------------------------------------ tensor parallel
TP_FAMILIES = [f for f in FAMILIES if getattr(family_config(f), "base_model_tp_plan", None)]


def save_family(root, family: str) -> None:
    """``family``'s tiny target (and a 1-layer draft) with a tokenizer, for from_pretrained under torchrun."""
    tok = tiny_tokenizer()
    for name, model in ((family, family_model(family)), (f"{family}-draft", family_model(family, layers=1, seed=1))):
        model.model.save_pretrained(root / name)
        tok.save_pretrained(root / name)


def run_tp_families(root, families: list[str]) -> dict:
    """Every family's tokens with the target split over 2 torchrun processes (tests/tp_families.py)."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    for family in families:
        save_family(root, family)
    (root / "prompts.json").write_text(json.dumps({"prompts": PROMPTS, "new_tokens": NEW_TOKENS}))
    here = Path(__file__).resolve().parent
    env = {**os.environ, "PYTHONPATH": str(here.parent / "src"), "OMP_NUM_THREADS": "1"}
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port", "29531"]
    done = subprocess.run([*torchrun, str(here / "tp_families.py"), str(root), *families], env=env,
                          capture_output=True, text=True, timeout=1800)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads((root / "tp.json").read_text())


@pytest.mark.slow
def test_tensor_parallel_two_processes_match_one(tmp_path):
    from tp_families import TP_DECODERS, as_loaded, decode

    found = run_tp_families(tmp_path, TP_FAMILIES)
    for family in TP_FAMILIES:
        assert "error" not in found[family], f"{family}: {found[family]}"
        one = decode(as_loaded(tmp_path / family, tp=False), as_loaded(tmp_path / f"{family}-draft", tp=False),
                     PROMPTS, NEW_TOKENS)
        assert {name: found[family][name] for name in TP_DECODERS} == one, f"{family}: 2 processes differ from 1"
