"""Sampling through the verifier keeps the target distribution exactly, for every decoder.

Two checks. (1) Per-position randomness: with one seed, a decoder whose proposals are deterministic (all but
speculative, which samples its drafts) emits AR's very sampled tokens, on both model families. (2) The distribution
test: over SAMPLES generations (one seed each) of 3 tokens, each of the 3 marginals is within TV_MAX of the exact
distribution, computed by enumeration on a 6-token vocabulary. TV of 2500 exact draws over 6 outcomes has mean
~0.017 and 99.9th percentile ~0.04 (20,000 simulated draws each for a uniform and a skewed distribution), so a
correct sampler passes TV_MAX = 0.05 with a false-alarm rate below 0.1% per marginal (with the fixed seeds here the
test is deterministic); a lossy verifier (Medusa's typical acceptance, below) is > 0.1 away.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from conftest import prompts
from helpers_decoding import PROMPT, SAMPLES, TV_MAX, V, schema, tiny_pair, tv
from specnoise.config import DECODER_SCHEMAS, ARConfig
from specnoise.decoding.base import build_decoder
from specnoise.decoding.kv import DynamicEngine
from specnoise.decoding.sampling import draw, warp
from specnoise.decoding.verifier import Verifier

SAMPLERS = ["ar", "jacobi", "tr_jacobi", "pld", "lookahead", "token_recycling", "sam", "rest", "speculative",
            "ouroboros"]
OPTIONS = dict(temperature=1.0, top_k=5, top_p=0.95, seed=4)


@pytest.fixture(scope="module")
def pair():
    target, drafter = tiny_pair()
    return dataclasses.replace(target, eos_ids=frozenset()), drafter


def exact_marginals(target, cfg, n: int = 3) -> list[torch.Tensor]:
    """The distributions of the first ``n`` generated tokens after PROMPT, by enumerating every prefix."""
    def p(prefix):
        return warp(DynamicEngine(target.model).forward(PROMPT + prefix)[-1], cfg)

    marginals, layer = [], {(): 1.0}  # prefix -> its probability
    for _ in range(n):
        here, nxt = torch.zeros(V), {}
        for prefix, weight in layer.items():
            probs = p(list(prefix))
            here += weight * probs
            nxt.update({prefix + (t,): weight * float(probs[t]) for t in range(V) if probs[t] > 0})
        marginals.append(here)
        layer = nxt
    return marginals


def sampled(decoder, n=SAMPLES) -> list[list[int]]:
    outs = [decoder.generate(PROMPT, 3, seed=i).tokens for i in range(n)]
    assert all(len(o) == 3 for o in outs)
    return [[o[j] for o in outs] for j in range(3)]


@pytest.mark.parametrize("name", [n for n in SAMPLERS if n != "speculative"])
def test_one_seed_gives_ars_sampled_tokens(name, target, draft):
    cfg = dict(temperature=0.9, top_p=0.9, seed=5)
    decoder = build_decoder(schema(name, **cfg), target, draft)
    reference = build_decoder(ARConfig(**cfg), target)
    for prompt in prompts(3, seed=9):
        assert decoder.generate(prompt, 30).tokens == reference.generate(prompt, 30).tokens
    assert reference.generate([5, 6], 30).tokens != reference.generate([5, 6], 30, seed=6).tokens  # seeds matter


@pytest.mark.parametrize("name", SAMPLERS)
def test_every_decoder_samples_the_target_distribution(name, pair):
    target, drafter = pair
    cfg = schema(name, vocab=V, **OPTIONS)
    exact = exact_marginals(target, cfg)
    got = sampled(build_decoder(cfg, target, drafter))
    for j in range(3):
        assert tv(got[j], exact[j]) < TV_MAX, f"{name}: token {j + 1} off the target distribution"


class TypicalAcceptance(Verifier):
    """A lossy verifier: besides the draw, it accepts any draft the target gives probability > 0.2 (Medusa's
    "typical acceptance" in spirit). Chains only."""

    def verify(self, shape, after, logits, nodes, u, v, q):
        n = nodes.numel()
        p = warp(logits[:n + 1], self.sampling)
        picks = draw(p, u.index_select(0, shape.depth))
        right = (nodes == picks[:-1]) | (p[:-1].gather(-1, nodes.view(-1, 1))[:, 0] > 0.2)
        a = right.long().cumprod(0).sum().view(1)
        block = torch.where(torch.arange(n + 1) < a, torch.cat([nodes, picks[-1:]]), picks)
        return self.finish(after, block, logits, logits.argmax(-1), right, a, a, shape.path[0])


def test_a_lossy_verifier_fails_the_distribution_test(pair):
    target, drafter = pair
    cfg = DECODER_SCHEMAS["jacobi"](**OPTIONS)
    exact = exact_marginals(target, cfg)
    decoder = build_decoder(cfg, target, drafter)
    decoder.verifier = TypicalAcceptance(decoder.target, decoder.to_host, cfg)
    got = sampled(decoder)
    assert max(tv(got[j], exact[j]) for j in range(3)) > 2 * TV_MAX


@pytest.mark.parametrize("phrase_drafting", [True, False])
def test_ouroboros_sampled_drafts_sample_the_target_distribution(pair, phrase_drafting):
    """Ouroboros with sampled drafts: each draft is kept by rejection sampling, and the pool phrase after a fully
    kept draft is matched against the target's draws. gamma 1 leaves a 3-token budget room for a phrase token after
    the draft, and phrase_len 1 fills the pool within such budgets, so both tests shape the marginals (the steps that
    rejected a draft and those that accepted a phrase token are counted). Drafts from the draft model's lookahead
    steps (drawn there) and, in the ablation, token by token."""
    target, drafter = pair
    cfg = schema("ouroboros", vocab=V, sampled_drafts=True, gamma=1, phrase_len=1,
                 phrase_drafting=phrase_drafting, **OPTIONS)
    exact = exact_marginals(target, cfg)
    decoder = build_decoder(cfg, target, drafter)
    steps, observe = [], decoder.drafter.observe

    def record(v):
        steps.append((len(decoder.drafter.d), len(decoder.drafter.phrases), v.accepted))
        observe(v)

    decoder.drafter.observe = record
    got = sampled(decoder)
    for j in range(3):
        assert tv(got[j], exact[j]) < TV_MAX, f"token {j + 1} off the target distribution"
    assert sum(a < d for d, _, a in steps) > 100  # drafts rejected (a residual draw)
    assert sum(a > d for d, k, a in steps if k) > 100  # phrase tokens accepted after a kept draft


def test_ouroboros_sampled_drafts_are_draws_not_guesses(pair):
    """With sampled drafts the output's distribution is kept, not AR's tokens: the drafts are the draft model's
    draws, so some seed gives other tokens than AR's; and greedy decoding ignores the key."""
    target, drafter = pair
    cfg = dict(temperature=1.0, seed=0)
    reference = build_decoder(ARConfig(**cfg), target)
    sampled_ = build_decoder(schema("ouroboros", vocab=V, sampled_drafts=True, **cfg), target, drafter)
    assert any(sampled_.generate(PROMPT, 8, seed=s).tokens != reference.generate(PROMPT, 8, seed=s).tokens
               for s in range(10))
    greedy = build_decoder(schema("ouroboros", vocab=V, sampled_drafts=True), target, drafter)
    assert greedy.generate(PROMPT, 8).tokens == build_decoder(ARConfig(), target).generate(PROMPT, 8).tokens
