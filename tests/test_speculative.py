"""Speculative decoding: greedy equality with AR, caches kept consistent, vocabulary checks, and sampling that keeps
the target's distribution exactly (a total-variation test that a wrong sampler fails)."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from conftest import make_model, prompts
from helpers_decoding import PROMPT, SAMPLES, TV_MAX, ar, exact_marginals, recorded, sampled_marginals, tiny_pair, tv
from helpers_models import tiny_tokenizer
from specnoise.config import SpeculativeConfig, UserError
from specnoise.decoding.base import build_decoder
from specnoise.decoding.kv import DynamicEngine
from specnoise.decoding.sampling import sample, warp
from specnoise.decoding.speculative import draft_vocab


@pytest.mark.parametrize("overrides", [dict(gamma=1), dict(gamma=3, schedule="heuristic")], ids=["gamma1", "heuristic"])
def test_greedy_equals_ar(target, draft, overrides):
    """(The defaults run in test_lossless.py.)"""
    decoder = build_decoder(SpeculativeConfig(**overrides), target, draft)
    for prompt in prompts(3, seed=4) + [[9]]:
        for budget in (6, 40):
            out = decoder.generate(prompt, budget)
            assert out.tokens == ar(target, prompt, budget), (overrides, prompt, budget)
            assert sum(out.accepted) == len(out.tokens) and out.target_forwards == len(out.accepted)


@pytest.mark.parametrize("drafter", ["random", "perfect"])
def test_caches_stay_consistent(target, draft, drafter):
    """Every forward of either model finds in its cache exactly the KV of the tokens it should hold."""
    decoder = recorded(build_decoder(SpeculativeConfig(gamma=3), target, draft if drafter == "random" else target))
    for prompt in ([11, 12, 13, 14], [9]):
        out = decoder.generate(prompt, 40)
        assert out.tokens == ar(target, prompt, 40)
        # only unseen tokens are fed: after the prefill, [root] (rejection) or [last draft, root] per step
        assert all(s <= 2 for s in decoder.draft.sizes[1:])
        # the target is fed [root] + drafts every step, so it holds exactly the accepted tokens
        assert decoder.target.fed[:len(prompt) + len(out.tokens) - 1] == (prompt + out.tokens)[:-1]


def test_perfect_drafter_is_always_accepted(target):
    """The target drafting for itself: every step emits gamma drafts + the bonus."""
    out = build_decoder(SpeculativeConfig(gamma=4), target, target).generate([11, 12, 13, 14], 42)
    assert out.tokens == ar(target, [11, 12, 13, 14], 42)
    if target.eos_ids.isdisjoint(out.tokens):
        assert out.target_forwards == math.ceil(42 / 5) and out.accepted[:-1] == [5] * 8


def test_heuristic_schedule_grows_on_full_acceptance(target):
    decoder = build_decoder(SpeculativeConfig(gamma=2, schedule="heuristic"), target, target)
    out = decoder.generate([11, 12, 13, 14], 40)
    if target.eos_ids.isdisjoint(out.tokens):
        assert out.accepted[:4] == [3, 5, 7, 9]  # HF: +2 each time every draft was accepted


def test_eos_and_budget_inside_accepted_drafts(target):
    prompt = [11, 12, 13, 14]
    tokens = ar(target, prompt, 30)
    for i in (3, 8, 14):
        eos_model = dataclasses.replace(target, eos_ids=frozenset({tokens[i]}))
        out = build_decoder(SpeculativeConfig(gamma=4), eos_model, eos_model).generate(prompt, 30)
        assert out.tokens == tokens[:tokens.index(tokens[i]) + 1]
    decoder = build_decoder(SpeculativeConfig(gamma=4), target, target)
    for budget in range(1, 13):
        assert decoder.generate(prompt, budget).tokens == tokens[:budget]


# ---------------------------------------------------------------------------------------------- vocabulary
def test_padded_draft_vocab_is_sliced(target, family):
    padded = make_model(family, layers=1, seed=2, hidden_size=32, intermediate_size=64, vocab_size=128)
    decoder = build_decoder(SpeculativeConfig(), target, padded)
    assert decoder.drafter.vocab == 96
    for prompt in prompts(3, seed=5):
        assert decoder.generate(prompt, 24).tokens == ar(target, prompt, 24)
    sampled = build_decoder(SpeculativeConfig(temperature=1.0), target, padded).generate([5, 6], 16)
    assert max(sampled.tokens) < 96


def test_draft_vocab_must_cover_the_targets_real_tokens():
    tok = tiny_tokenizer()
    real = len(tok)
    target = dataclasses.replace(make_model("llama", vocab_size=real + 16), tokenizer=tok)  # padded rows
    smaller = dataclasses.replace(make_model("llama", layers=1, vocab_size=real), tokenizer=tok)
    assert draft_vocab(target, smaller, DynamicEngine(target.model), DynamicEngine(smaller.model)) == real + 16
    too_small = dataclasses.replace(make_model("llama", layers=1, vocab_size=real - 8), tokenizer=tok)
    with pytest.raises(UserError, match="vocabulary"):
        build_decoder(SpeculativeConfig(), target, too_small)
    other = dataclasses.replace(smaller, tokenizer=tiny_tokenizer(300))
    with pytest.raises(UserError, match="tokenizer"):
        build_decoder(SpeculativeConfig(), target, other)


# ---------------------------------------------------------------------------------------------- sampling
def test_sampling_keeps_the_target_distribution():
    target, drafter = tiny_pair()
    target = dataclasses.replace(target, eos_ids=frozenset())  # never stop early: exactly two tokens each
    cfg = SpeculativeConfig(temperature=1.0, gamma=3, seed=1)
    first, second = exact_marginals(target, cfg)
    q = warp(DynamicEngine(drafter.model).forward(PROMPT)[-1], cfg)
    decoder = build_decoder(cfg, target, drafter)
    got_first, got_second = sampled_marginals(decoder)
    assert tv(got_first, first) < TV_MAX and tv(got_second, second) < TV_MAX
    assert decoder.generate(PROMPT, 2).target_forwards <= 2
    # the test can fail: emitting the draft's own samples is a different distribution
    gen = torch.Generator().manual_seed(0)
    assert tv([int(sample(q, gen)) for _ in range(SAMPLES)], first) > 2 * TV_MAX
