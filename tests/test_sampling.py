"""Sampling helpers: the warpers, and the speculative acceptance rules that must leave the target distribution exact.

Distribution checks compare an empirical histogram with the exact distribution by total variation (TV). With
fixed seeds they are deterministic; the thresholds sit several standard deviations above the sampling noise
(TV of 4000 draws over <= 6 outcomes is ~0.015) and far below the TV of the deliberately wrong samplers, which
are checked to fail them so the tests can fail.
"""

from __future__ import annotations

import torch

from specnoise.config import ARConfig
from specnoise.decoding.sampling import draw, fit_vocab, greedy, residual, sample, warp

TRIALS = 4000
THRESHOLD = 0.05


def tv(counts: torch.Tensor, p: torch.Tensor) -> float:
    return 0.5 * float((counts / counts.sum() - p).abs().sum())


def dist(seed: int, v: int = 6, sharp: float = 1.5) -> torch.Tensor:
    return torch.softmax(torch.randn(v, generator=torch.Generator().manual_seed(seed)) * sharp, -1)


def test_greedy_is_torch_argmax_first_index_on_ties():
    """The CPU's NumPy argmax (from ``NUMPY_ROWS`` rows on) picks what torch's does: the first maximal index (ties are
    common in low precision), a NaN as the maximum, for rows, a strided slice and float64; fewer rows, one vector, bf16
    and a grad tensor go through torch."""
    gen = torch.Generator().manual_seed(0)
    logits = torch.randint(0, 4, (64, 300), generator=gen).float()  # many ties per row
    logits[3, 7] = float("nan")
    cases = [logits, logits[:3], logits[5], logits[:, 10:200:3], logits.double(), logits.bfloat16(),
             logits.clone().requires_grad_()]
    for x in cases:
        with torch.no_grad():
            got, want = greedy(x), x.argmax(-1)
        assert got.dtype == torch.long and got.shape == want.shape and torch.equal(got, want)
    with torch.inference_mode():  # the verifier's logits are inference tensors
        assert torch.equal(greedy(logits * 1), logits.argmax(-1))


def test_warp_temperature_top_k_top_p():
    logits = torch.tensor([2.0, 1.0, 0.0, -1.0])
    assert torch.allclose(warp(logits, ARConfig(temperature=1.0)), torch.softmax(logits, -1))
    top2 = warp(logits, ARConfig(temperature=1.0, top_k=2))
    assert torch.allclose(top2, torch.cat([torch.softmax(logits[:2], -1), torch.zeros(2)]))
    nucleus = warp(logits, ARConfig(temperature=1.0, top_p=0.5))  # the first token alone holds 0.64
    assert nucleus.tolist() == [1.0, 0.0, 0.0, 0.0]


def test_draw_is_the_inverse_cdf_at_the_uniform():
    weights = torch.tensor([[1.0, 0.0, 3.0], [0.0, 2.0, 2.0]])  # cumulative 1, 1, 4 and 0, 2, 4
    assert draw(weights, torch.tensor([0.0, 0.0])).tolist() == [0, 1]  # zero weights are never drawn
    assert draw(weights, torch.tensor([0.24, 0.49])).tolist() == [0, 1]
    assert draw(weights, torch.tensor([0.26, 0.51])).tolist() == [2, 2]
    assert draw(weights, torch.tensor([1 - 1e-12, 1 - 1e-12])).tolist() == [2, 2]


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
