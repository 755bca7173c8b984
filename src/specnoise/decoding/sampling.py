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


# ------------------------------------------------------------------- speculative acceptance (Leviathan et al.)
def fit_vocab(logits: torch.Tensor, size: int) -> torch.Tensor:
    """Draft logits over the target's ``size`` rows: the draft's extra padding rows are dropped, rows it lacks
    get -inf (a padded vocabulary never holds a real token there, so the draft never proposes one)."""
    extra = size - logits.shape[-1]
    if extra <= 0:
        return logits[..., :size]
    return torch.cat([logits, logits.new_full((*logits.shape[:-1], extra), float("-inf"))], dim=-1)


def accepts(p: torch.Tensor, q: torch.Tensor, token: int, generator: torch.Generator) -> bool:
    """Keep ``token``, drawn from ``q``, with probability min(1, p/q)."""
    u = float(torch.rand((), generator=generator))
    return u * float(q[token]) < float(p[token])  # u < p/q without dividing by q


def residual(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """norm(max(0, p - q)): what is left of the target after a rejection; p itself when nothing is left
    (p == q numerically), where a rejection had probability ~0 anyway."""
    r = (p - q).clamp_min_(0.0)
    total = r.sum()
    return r / total if total > 0 else p


def speculative_sample(p: torch.Tensor, q: torch.Tensor, drafts: list[int], generator: torch.Generator) -> list[int]:
    """Accepted drafts plus one token, distributed exactly as sampling the target token by token.

    p: [len(drafts) + 1, V] target probabilities (row i predicts drafts[i]; the last row follows the drafts);
    q: [len(drafts), V] the draft distributions the drafts were sampled from, warped the same way.
    """
    for i, token in enumerate(drafts):
        if not accepts(p[i], q[i], token, generator):
            return drafts[:i] + [sample(residual(p[i], q[i]), generator)]
    return drafts + [sample(p[len(drafts)], generator)]


def multi_candidate_accept(p: torch.Tensor, candidates: list[int], generator: torch.Generator) -> tuple[int, bool]:
    """Try deterministic candidates (q = one-hot) in order at one position: accept each with its probability
    under what is left of ``p``, zeroing it on rejection; when all fail, sample the rest. Returns (token,
    whether it was a candidate). Every token keeps exactly its probability under ``p``."""
    for token in candidates:
        onehot = torch.zeros_like(p)
        onehot[token] = 1.0
        if accepts(p, onehot, token, generator):
            return token, True
        p = residual(p, onehot)
    return sample(p, generator), False
