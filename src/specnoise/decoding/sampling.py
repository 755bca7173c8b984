"""Sampling utilities: one place that turns logits into the target distribution (temperature, top-k, top-p)."""

from __future__ import annotations

import torch

from specnoise.config import DecoderConfig


def warp(logits: torch.Tensor, cfg: DecoderConfig) -> torch.Tensor:
    """Probabilities (float32) after temperature, top-k and top-p, the same for draft and target."""
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


def sample(probs: torch.Tensor, generator: torch.Generator) -> int:
    return int(torch.multinomial(probs.cpu(), 1, generator=generator))


def next_token(logits: torch.Tensor, cfg: DecoderConfig, generator: torch.Generator) -> int:
    """argmax under greedy (first maximal index: the tie rule everywhere), else a sample."""
    if cfg.temperature == 0:
        return int(logits.argmax(-1))
    return sample(warp(logits, cfg), generator)
