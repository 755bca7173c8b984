"""Sampling utilities: one place that turns logits into the target distribution (temperature, top-k, top-p), draws
by inverse CDF, and the pieces of speculative rejection sampling, all computed on the logits' device.

Random numbers are drawn on the host from CPU generators (reproducible on any device) and sent to the device;
draws are inverse-CDF look-ups there, so sampling never copies a probability vector to the host and a step reads
back only its few tokens (``Decoder.to_host``). The verifier's uniforms are per output position (verifier.py).
"""

from __future__ import annotations

import torch

from specnoise.decoding.kv import upload

NUMPY_ROWS = 8  # from this many rows on the CPU's greedy picks go through NumPy (``greedy``)


def greedy(logits: torch.Tensor) -> torch.Tensor:
    """``logits.argmax(-1)``, the greedy pick per row. On the CPU, for ``NUMPY_ROWS`` rows or more, through NumPy:
    torch's CPU argmax reduction is not vectorised (torch 2.13: ~5 us a row of 4096 logits, ~290 us for 64 rows, 4.8 ms
    for 64 x 32000, one thread) while NumPy's SIMD one takes ~0.4 us a row; a tree verify step takes the argmax of every
    block row. For fewer rows torch's: right after a model forward (where every verify step runs) NumPy's first call
    costs ~50 us more than warm, torch's ~20 (measured on the 2-core CPU: 1 row 26 vs 54 us, 10 rows 73 vs 66), so an AR
    step or a short chain picks ~30 us sooner. Both return the first maximal index (a NaN counts as the maximum in
    both), so the picks, and the tokens, are the same."""
    if (logits.device.type == "cpu" and logits.dtype in (torch.float32, torch.float64) and not logits.requires_grad
            and logits.dim() == 2 and logits.shape[0] >= NUMPY_ROWS):
        return torch.from_numpy(logits.numpy().argmax(-1))
    return logits.argmax(-1)


def warp(logits: torch.Tensor, cfg) -> torch.Tensor:
    """Probabilities (float32) after temperature, top-k and top-p (``cfg``'s keys), the same for draft and target."""
    logits = logits.float() / max(cfg.temperature, 1e-5)
    if cfg.top_k > 0:
        kth = torch.topk(logits, min(cfg.top_k, logits.shape[-1]), dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    if cfg.top_p < 1.0:
        sorted_p, order = probs.sort(dim=-1, descending=True)
        drop = sorted_p.cumsum(-1) - sorted_p > cfg.top_p  # keep the smallest prefix reaching top_p
        sorted_p = sorted_p.masked_fill(drop, 0.0)
        probs = torch.zeros_like(probs).scatter(-1, order, sorted_p)
        probs = probs / probs.sum(-1, keepdim=True)
    return probs


def uniforms(shape, generator: torch.Generator, device) -> torch.Tensor:
    """U[0, 1) draws from the (CPU) generator, moved to ``device``: a host-to-device copy, never a read back."""
    return upload(torch.rand(shape, generator=generator, dtype=torch.float64), device)


def draw(weights: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """One index per row of ``weights`` [..., V] (>= 0, not necessarily normalised) for the uniforms ``u`` [...]: the
    first index whose cumulative weight exceeds u * total. Returns a long tensor of shape [...]."""
    cdf = weights.double().cumsum(-1)
    total = cdf[..., -1:]
    # x < total, so the first cdf entry above x exists and has a positive weight (cdf never decreases)
    x = torch.minimum(u.view(total.shape).to(cdf.dtype) * total, torch.nextafter(total, torch.zeros_like(total)))
    return torch.searchsorted(cdf, x, right=True)[..., 0]


def sample(weights: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """``draw`` with fresh uniforms from ``generator``."""
    return draw(weights, uniforms(weights.shape[:-1], generator, weights.device))


# ------------------------------------------------------------------- speculative acceptance (Leviathan et al.)
def fit_vocab(logits: torch.Tensor, size: int) -> torch.Tensor:
    """Draft logits over the target's ``size`` rows: the draft's extra padding rows are dropped, rows it lacks
    get -inf (a padded vocabulary never holds a real token there, so the draft never proposes one)."""
    extra = size - logits.shape[-1]
    if extra <= 0:
        return logits[..., :size]
    return torch.cat([logits, logits.new_full((*logits.shape[:-1], extra), float("-inf"))], dim=-1)


def residual(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """norm(max(0, p - q)) per row: what is left of the target after a rejection; p itself when nothing is left
    (p == q numerically), where a rejection had probability ~0 anyway."""
    r = (p - q).clamp_min_(0.0)
    total = r.sum(-1, keepdim=True)
    return torch.where(total > 0, r / total.clamp_min(torch.finfo(r.dtype).tiny), p)
