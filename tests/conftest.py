"""Shared fixtures: tiny random models of two families (fp32, CPU), small enough for many prompts.

Weights are drawn with a large init range so next-token distributions are peaked: exactness tests then
compare decoders on decisions with clear margins instead of near-ties that a different (equally exact
in real arithmetic) kernel shape could flip.
"""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

from specnoise.conf_store import register
from specnoise.models import LoadedModel

register()  # what the entry point does before Hydra composes: tests compose configs too

# Tiny matmuls gain nothing from threads, and on a busy 2-core machine torch's default threading makes
# them many times slower.
torch.set_num_threads(1)

VOCAB = 96
EOS = 2


@pytest.fixture(autouse=True, scope="session")
def _working_dir(tmp_path_factory):
    """Every test runs in a temporary working directory: the relative defaults a run writes under
    (``decoder.cost_cache=outputs/cost_cache``: decoder.auto's and tree=auto's curves, the cost bound's) fill that,
    not the repository's outputs/ with curves named after the tests' temporary models."""
    import os

    home = os.getcwd()
    os.chdir(tmp_path_factory.mktemp("cwd"))
    yield
    os.chdir(home)


def pytest_addoption(parser):
    parser.addoption(
        "--train-cache", metavar="DIR", default=None,
        help="tests/test_check_experiments.py: the train.cache_dir the miniatures marked `# train-cache: shared` "
             "train into (default: a new trained-models folder in the run's base temp). An earlier check run's "
             "folder reuses the models it recorded: an interrupted check resumes without training them again")


def _common(**kw):
    base = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_attention_heads=4,
                num_key_value_heads=2, max_position_embeddings=512, initializer_range=0.3,
                eos_token_id=EOS, bos_token_id=1, pad_token_id=0, tie_word_embeddings=False)
    base.update(kw)
    return base


def make_model(family: str = "llama", layers: int = 2, seed: int = 0, **kw) -> LoadedModel:
    torch.manual_seed(seed)
    if family == "llama":
        model = LlamaForCausalLM(LlamaConfig(**_common(num_hidden_layers=layers, **kw)))
    elif family == "qwen2":
        model = Qwen2ForCausalLM(Qwen2Config(**_common(num_hidden_layers=layers, use_sliding_window=False, **kw)))
    else:
        raise ValueError(family)
    model.eval()
    model.generation_config.eos_token_id = EOS
    model.generation_config.pad_token_id = 0
    return LoadedModel(f"random-{family}", "", model, None, frozenset({EOS}), "raw")


@pytest.fixture(scope="session", params=["llama", "qwen2"])
def family(request):
    return request.param


@pytest.fixture(scope="session")
def target(family):
    return make_model(family, layers=2, seed=0)


@pytest.fixture(scope="session")
def draft(family):
    """A smaller model of the same family and vocabulary, trained on nothing: a poor but valid drafter."""
    return make_model(family, layers=1, seed=1, hidden_size=32, intermediate_size=64)


def prompts(n: int = 8, seed: int = 0, min_len: int = 1, max_len: int = 24) -> list[list[int]]:
    """Random prompts that avoid EOS, with some repetition so lookup-based drafters find matches."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        length = int(torch.randint(min_len, max_len + 1, (1,), generator=gen))
        ids = torch.randint(3, VOCAB, (length,), generator=gen).tolist()
        if length > 6:
            ids += ids[: length // 2]
        out.append(ids)
    return out
