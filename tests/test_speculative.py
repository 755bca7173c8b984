"""Speculative decoding: greedy equality with AR, caches kept consistent, vocabulary checks, and sampling that keeps
the target's distribution exactly (a total-variation test that a wrong sampler fails)."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from conftest import make_model, prompts
from helpers_models import tiny_tokenizer
from specnoise.config import ARConfig, SpeculativeConfig, UserError
from specnoise.decoding.base import build_decoder
from specnoise.decoding.kv import KVModel
from specnoise.decoding.sampling import sample, warp
from specnoise.decoding.speculative import draft_vocab

_AR: dict = {}


def ar(target, prompt, n):
    """AR's tokens (greedy: a shorter budget is a prefix of a longer one), computed once per model and prompt."""
    key = (id(target.model), tuple(prompt), target.eos_ids)
    if key not in _AR:
        _AR[key] = build_decoder(ARConfig(), target).generate(prompt, 64).tokens
    assert n <= 64
    return _AR[key][:n]


class Recording(KVModel):
    """A KVModel that checks its cache on every forward: the first new token must get the logits of a fresh
    causal forward of everything the cache claims to hold, so stale or misplaced KV fails at once."""

    def __init__(self, model):
        super().__init__(model)
        self.fed: list[int] = []  # the tokens whose KV the cache holds, in slot order
        self.sizes: list[int] = []  # tokens per forward

    def reset(self):
        super().reset()
        self.fed, self.sizes = [], []

    def forward(self, tokens, positions=None, tree=None):
        tokens = [int(t) for t in tokens]
        logits = super().forward(tokens, positions, tree)
        ref = KVModel(self.model).forward(self.fed + tokens[:1])[-1]
        assert torch.allclose(logits[0], ref, atol=1e-4), "cache content differs from the tokens it should hold"
        self.fed += tokens
        self.sizes.append(len(tokens))
        return logits

    def crop(self, n):
        super().crop(n)
        del self.fed[n:]

    def compact(self, start, keep):
        fed = self.fed[:start] + [self.fed[i] for i in keep]
        super().compact(start, keep)  # (crops through self.crop)
        self.fed = fed


def recorded(decoder):
    decoder.target = Recording(decoder.target.model)
    decoder.draft = Recording(decoder.draft.model)
    return decoder


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
    assert decoder.vocab == 96
    for prompt in prompts(3, seed=5):
        assert decoder.generate(prompt, 24).tokens == ar(target, prompt, 24)
    sampled = build_decoder(SpeculativeConfig(temperature=1.0), target, padded).generate([5, 6], 16)
    assert max(sampled.tokens) < 96


def test_draft_vocab_must_cover_the_targets_real_tokens():
    tok = tiny_tokenizer()
    real = len(tok)
    target = dataclasses.replace(make_model("llama", vocab_size=real + 16), tokenizer=tok)  # padded rows
    smaller = dataclasses.replace(make_model("llama", layers=1, vocab_size=real), tokenizer=tok)
    assert draft_vocab(target, smaller, KVModel(target.model), KVModel(smaller.model)) == real + 16
    too_small = dataclasses.replace(make_model("llama", layers=1, vocab_size=real - 8), tokenizer=tok)
    with pytest.raises(UserError, match="vocabulary"):
        build_decoder(SpeculativeConfig(), target, too_small)
    other = dataclasses.replace(smaller, tokenizer=tiny_tokenizer(300))
    with pytest.raises(UserError, match="tokenizer"):
        build_decoder(SpeculativeConfig(), target, other)


# ---------------------------------------------------------------------------------------------- sampling
SAMPLES = 2500
# TV of 2500 exact draws over 6 outcomes: mean ~0.014, 99.9th percentile ~0.035 (simulated), so a correct sampler
# passes for any seed; the wrong samplers below are > 0.1 away
TV_MAX = 0.05
V = 6
PROMPT = [3, 5, 1]


def tiny_pair():
    """A tiny-vocabulary random target with spread-out next-token distributions, and a drafter close to it (its
    weights plus noise): the drafter's greedy token is the target's likeliest, yet their distributions differ
    (TV ~0.25 at PROMPT), so drafts are often accepted and the wrong sampler below is clearly wrong."""
    kw = dict(vocab_size=V, hidden_size=16, intermediate_size=32, initializer_range=0.3)
    target, drafter = make_model("llama", layers=1, seed=11, **kw), make_model("llama", layers=1, seed=11, **kw)
    gen = torch.Generator().manual_seed(12)
    with torch.no_grad():
        for weight in drafter.model.parameters():
            weight.add_(torch.randn(weight.shape, generator=gen) * 0.04)
    return target, drafter


def exact_marginals(model, cfg, prompt=PROMPT) -> tuple[torch.Tensor, torch.Tensor]:
    """The target's distributions of the first and second generated tokens (under cfg's warping)."""
    kv = KVModel(model.model)
    first = warp(kv.forward(prompt)[-1], cfg)
    second = sum(first[t] * warp(KVModel(model.model).forward(prompt + [t])[-1], cfg) for t in range(V))
    return first, second


def tv(samples: list[int], p: torch.Tensor) -> float:
    counts = torch.bincount(torch.tensor(samples), minlength=len(p)).float()
    return 0.5 * float((counts / counts.sum() - p).abs().sum())


def sampled_marginals(decoder, n=SAMPLES, budget=2, prompt=PROMPT) -> tuple[list[int], list[int]]:
    outs = [decoder.generate(prompt, budget).tokens for _ in range(n)]
    assert all(len(o) == budget for o in outs)  # no EOS in this vocabulary's way: id 2 is rare enough
    return [o[0] for o in outs], [o[-1] for o in outs]


def test_sampling_keeps_the_target_distribution():
    target, drafter = tiny_pair()
    target = dataclasses.replace(target, eos_ids=frozenset())  # never stop early: exactly two tokens each
    cfg = SpeculativeConfig(temperature=1.0, gamma=3, seed=1)
    first, second = exact_marginals(target, cfg)
    q = warp(KVModel(drafter.model).forward(PROMPT)[-1], cfg)
    decoder = build_decoder(cfg, target, drafter)
    got_first, got_second = sampled_marginals(decoder)
    assert tv(got_first, first) < TV_MAX and tv(got_second, second) < TV_MAX
    assert decoder.generate(PROMPT, 2).target_forwards <= 2
    # the test can fail: emitting the draft's own samples is a different distribution
    gen = torch.Generator().manual_seed(0)
    assert tv([sample(q, gen) for _ in range(SAMPLES)], first) > 2 * TV_MAX
