"""Sampling helpers: the warpers, and the speculative acceptance rules that must leave the target distribution exact.

Distribution checks compare an empirical histogram with the exact distribution by total variation (TV). With
fixed seeds they are deterministic; the thresholds sit several standard deviations above the sampling noise
(TV of 4000 draws over <= 6 outcomes is ~0.015) and far below the TV of the deliberately wrong samplers, which
are checked to fail them so the tests can fail.
"""

from __future__ import annotations

import pytest
import torch

from specnoise.config import ARConfig
from specnoise.decoding.sampling import (
    accepts,
    fit_vocab,
    multi_candidate_accept,
    next_token,
    residual,
    sample,
    speculative_sample,
    warp,
)

TRIALS = 4000
THRESHOLD = 0.05


def tv(counts: torch.Tensor, p: torch.Tensor) -> float:
    return 0.5 * float((counts / counts.sum() - p).abs().sum())


def dist(seed: int, v: int = 6, sharp: float = 1.5) -> torch.Tensor:
    return torch.softmax(torch.randn(v, generator=torch.Generator().manual_seed(seed)) * sharp, -1)


def test_warp_temperature_top_k_top_p():
    logits = torch.tensor([2.0, 1.0, 0.0, -1.0])
    assert torch.allclose(warp(logits, ARConfig(temperature=1.0)), torch.softmax(logits, -1))
    top2 = warp(logits, ARConfig(temperature=1.0, top_k=2))
    assert torch.allclose(top2, torch.cat([torch.softmax(logits[:2], -1), torch.zeros(2)]))
    nucleus = warp(logits, ARConfig(temperature=1.0, top_p=0.5))  # the first token alone holds 0.64
    assert nucleus.tolist() == [1.0, 0.0, 0.0, 0.0]
    assert int(next_token(logits, ARConfig(), torch.Generator())) == 0


def test_sample_draws_rows_in_proportion_to_unnormalised_weights():
    gen = torch.Generator().manual_seed(0)
    weights = torch.tensor([[0.0, 2.0, 0.0, 6.0], [1.0, 0.0, 0.0, 0.0]])  # rows need not sum to 1
    draws = torch.stack([sample(weights, gen) for _ in range(TRIALS)])
    assert draws.shape == (TRIALS, 2) and (draws[:, 1] == 0).all()
    assert set(draws[:, 0].tolist()) == {1, 3}  # zero weights are never drawn
    assert tv(torch.bincount(draws[:, 0], minlength=4).float(), weights[0] / 8) < THRESHOLD


def test_fit_vocab_slices_padding_rows_and_never_picks_missing_rows():
    logits = torch.tensor([[0.0, 3.0, 1.0, 9.0]])
    assert fit_vocab(logits, 3).tolist() == [[0.0, 3.0, 1.0]]  # the draft's extra (padding) row is dropped
    padded = fit_vocab(logits, 6)
    assert padded.shape == (1, 6) and torch.isinf(padded[0, 4:]).all()
    assert warp(padded[0], ARConfig(temperature=1.0))[4:].sum() == 0


def test_residual_and_its_guard():
    p, q = torch.tensor([0.5, 0.3, 0.2]), torch.tensor([0.2, 0.5, 0.3])
    assert torch.allclose(residual(p, q), torch.tensor([1.0, 0.0, 0.0]))
    assert torch.equal(residual(p, p.clone()), p)  # p == q: nothing left to correct, sample p itself
    rows = residual(torch.stack([p, p]), torch.stack([q, p]))  # row by row
    assert torch.allclose(rows, torch.stack([torch.tensor([1.0, 0.0, 0.0]), p]))


def test_accepts_is_min_one_p_over_q():
    """All drafts at once, one uniform each."""
    u = torch.rand(TRIALS, generator=torch.Generator().manual_seed(0))
    p, q = torch.tensor([[0.2, 0.8]]).expand(TRIALS, 2), torch.tensor([[0.8, 0.2]]).expand(TRIALS, 2)
    zeros, ones = torch.zeros(TRIALS, dtype=torch.long), torch.ones(TRIALS, dtype=torch.long)
    assert abs(float(accepts(p, q, zeros, u).float().mean()) - 0.25) < 0.03
    assert accepts(p, q, ones, u).all()  # p >= q: always kept
    assert not accepts(torch.tensor([[0.0, 1.0]]).expand(TRIALS, 2), q, zeros, u).any()


def first_token_counts(fn, v: int) -> torch.Tensor:
    counts = torch.zeros(v)
    for _ in range(TRIALS):
        counts[int(fn())] += 1
    return counts


@pytest.mark.parametrize("seed", [0, 1])
def test_speculative_sample_keeps_the_target_distribution(seed):
    v, gen = 6, torch.Generator().manual_seed(seed)
    p, q = torch.stack([dist(seed), dist(seed + 10)]), dist(seed + 20).view(1, -1)

    def once():
        d = sample(q[0], gen).view(1)
        accepted, token = speculative_sample(p, q, d, gen)
        return d[0] if accepted else token

    assert tv(first_token_counts(once, v), p[0]) < THRESHOLD
    # the sampler that trusts the draft (accepts every draft) is wrong, and the test can see it
    assert tv(first_token_counts(lambda: sample(q[0], gen), v), p[0]) > 2 * THRESHOLD


def test_speculative_sample_second_token_after_full_acceptance():
    """The joint of (first, second) tokens: the bonus row is sampled only after an acceptance."""
    v, gen = 4, torch.Generator().manual_seed(3)
    p = torch.stack([dist(1, v), dist(2, v)])  # the target's second row is the same whatever the first token
    q = dist(3, v).view(1, -1)

    def once():
        accepted, token = speculative_sample(p, q, sample(q[0], gen).view(1), gen)
        return token if accepted else sample(p[1], gen)  # after a rejection the next step samples p

    assert tv(first_token_counts(once, v), p[1]) < THRESHOLD


@pytest.mark.parametrize("candidates", [[2], [0, 3, 1], [1, 1, 4], []])
def test_multi_candidate_accept_keeps_the_target_distribution(candidates):
    v, gen = 6, torch.Generator().manual_seed(5)
    p = dist(7, v)
    tokens, hits = multi_candidate_accept(p.expand(TRIALS, v), [candidates] * TRIALS, gen)  # rows are independent
    assert tv(torch.bincount(tokens, minlength=v).float(), p) < THRESHOLD
    assert torch.equal(hits, torch.isin(tokens, torch.tensor(candidates, dtype=torch.long)))
    certain = torch.tensor([[0.0, 1.0, 0.0]] * 3)
    tokens, hits = multi_candidate_accept(certain, [[1], [0, 2], []], gen)
    assert tokens.tolist() == [1, 1, 1] and hits.tolist() == [True, False, False]


def test_accepting_candidates_without_renormalising_fails_the_same_threshold():
    """Trying each candidate with its raw p(c) and sampling p (not the residual) after rejections is wrong."""
    v, gen = 6, torch.Generator().manual_seed(5)
    p, candidates = dist(7, v), [int(dist(7, v).argmax()), 0, 3]

    def wrong():
        for c in candidates:
            if torch.rand((), generator=gen) < p[c]:
                return c
        return sample(p, gen)

    assert tv(first_token_counts(wrong, v), p) > THRESHOLD


def test_multi_candidate_accept_rows_see_only_their_own_candidates():
    """Different candidates per row (padded inside): the second token of each row keeps p too."""
    v, gen = 6, torch.Generator().manual_seed(8)
    p = torch.stack([dist(9, v), dist(10, v)]).repeat(TRIALS // 2, 1)
    tokens, _ = multi_candidate_accept(p, [[4, 0, 5], [2]] * (TRIALS // 2), gen)
    for row in (0, 1):
        assert tv(torch.bincount(tokens[row::2], minlength=v).float(), p[row]) < THRESHOLD
