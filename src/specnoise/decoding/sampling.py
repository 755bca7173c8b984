"""Sampling utilities: one place that turns logits into the target distribution (temperature, top-k, top-p), and
the speculative acceptance rules, all computed on the logits' device.

Random numbers are drawn on the host from the decoder's CPU generator (reproducible on any device) and sent to the
device; draws are inverse-CDF look-ups there, so sampling never copies a probability vector to the host and a step
reads back only its few tokens (``Decoder.to_host``).
"""

from __future__ import annotations

import torch

from specnoise.config import DecoderConfig
from specnoise.decoding.kv import upload


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


def uniforms(shape, generator: torch.Generator, device) -> torch.Tensor:
    """U[0, 1) draws from the (CPU) generator, moved to ``device``: a host-to-device copy, never a read back."""
    return upload(torch.rand(shape, generator=generator, dtype=torch.float64), device)


def sample(weights: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """One index per row of ``weights`` [..., V] (>= 0, not necessarily normalised), drawn with probability
    proportional to its weight by an inverse-CDF look-up on the device. Returns a long tensor of shape [...]."""
    cdf = weights.double().cumsum(-1)
    total = cdf[..., -1:]
    u = uniforms(total.shape, generator, weights.device)
    # x < total, so the first cdf entry above x exists and has a positive weight (cdf never decreases)
    x = torch.minimum(u * total, torch.nextafter(total, torch.zeros_like(total)))
    return torch.searchsorted(cdf, x, right=True)[..., 0]


def next_token(logits: torch.Tensor, cfg: DecoderConfig, generator: torch.Generator) -> torch.Tensor:
    """argmax under greedy (first maximal index: the tie rule everywhere), else a sample; a device scalar."""
    if cfg.temperature == 0:
        return logits.argmax(-1)
    return sample(warp(logits, cfg), generator)


# ------------------------------------------------------------------- speculative acceptance (Leviathan et al.)
def fit_vocab(logits: torch.Tensor, size: int) -> torch.Tensor:
    """Draft logits over the target's ``size`` rows: the draft's extra padding rows are dropped, rows it lacks
    get -inf (a padded vocabulary never holds a real token there, so the draft never proposes one)."""
    extra = size - logits.shape[-1]
    if extra <= 0:
        return logits[..., :size]
    return torch.cat([logits, logits.new_full((*logits.shape[:-1], extra), float("-inf"))], dim=-1)


def accepts(p: torch.Tensor, q: torch.Tensor, tokens: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Keep each ``tokens[i]``, drawn from ``q[i]``, with probability min(1, p/q): u < p/q without dividing by q."""
    at = tokens.view(-1, 1)
    return u * q.gather(-1, at)[:, 0] < p.gather(-1, at)[:, 0]


def residual(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """norm(max(0, p - q)) per row: what is left of the target after a rejection; p itself when nothing is left
    (p == q numerically), where a rejection had probability ~0 anyway."""
    r = (p - q).clamp_min_(0.0)
    total = r.sum(-1, keepdim=True)
    return torch.where(total > 0, r / total.clamp_min(torch.finfo(r.dtype).tiny), p)


def speculative_sample(p: torch.Tensor, q: torch.Tensor, drafts: torch.Tensor,
                       generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """How many drafts are accepted and the token after them, distributed exactly as sampling the target token by
    token; both device scalars. All drafts are tested at once (one uniform each): the first rejection decides.

    p: [n + 1, V] target probabilities (row i predicts drafts[i]; the last row follows the drafts);
    q: [n, V] the draft distributions the drafts were sampled from, warped the same way; drafts: long [n].
    """
    n = drafts.numel()
    ok = accepts(p[:n], q, drafts, uniforms(n, generator, p.device))
    accepted = ok.long().cumprod(0).sum()
    # row i < n: the residual after rejecting drafts[i]; row n: p's bonus row after accepting them all
    after = torch.cat([residual(p[:n], q), p[n:]]).index_select(0, accepted.view(1))
    return accepted, sample(after, generator)[0]


def multi_candidate_accept(p: torch.Tensor, candidates: list[list[int]],
                           generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """At each row of ``p`` [R, V], try that row's deterministic candidates (q = one-hot) in order: accept
    each with its probability under what is left of p (p renormalised without the candidates rejected before it);
    when all fail, sample p without them. Every token keeps exactly its probability under p. Rows are independent,
    so a walk can decide all its possible branch points at once. Returns (token, whether it was a candidate) per
    row, as device tensors."""
    candidates = [list(dict.fromkeys(c)) for c in candidates]  # a repeated candidate has nothing left to accept
    k = max(1, max(map(len, candidates), default=0))
    cand = upload([c + [-1] * (k - len(c)) for c in candidates], p.device).view(len(candidates), k)
    valid = cand >= 0
    pc = p.gather(-1, cand.clamp_min(0)).masked_fill(~valid, 0.0)
    before = pc.cumsum(-1) - pc  # mass of the candidates tried before this one
    ok = (uniforms(pc.shape, generator, p.device) * (1 - before) < pc) & valid
    hit = ok.any(-1)
    first = cand.gather(-1, ok.long().argmax(-1, keepdim=True))[:, 0]  # argmax: the first accepted candidate
    tried = torch.zeros_like(p).scatter_add_(-1, cand.clamp_min(0), valid.to(p.dtype)) > 0
    rest = p.masked_fill(tried, 0.0)
    rest = torch.where(rest.sum(-1, keepdim=True) > 0, rest, p)
    return torch.where(hit, first, sample(rest, generator)), hit
