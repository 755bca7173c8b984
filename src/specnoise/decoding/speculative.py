"""Speculative decoding with a draft model (ALGORITHMS.md §8): the draft proposes gamma tokens one by one, the target
verifies [root] + drafts in one forward.

Greedy keeps the matching prefix plus the target's token; sampling keeps each draft with probability
min(1, p/q) and replaces the first rejected one by a sample of norm(max(0, p - q)), which leaves the output
distributed exactly as the target's. Both caches are cut back to the accepted tokens after every step, so the
draft is only ever fed tokens it has not seen. The helpers above the class are shared with Ouroboros.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import torch

from specnoise.config import UserError
from specnoise.decoding.base import Decoder, Output, greedy_accept
from specnoise.decoding.kv import KVModel, upload
from specnoise.decoding.sampling import fit_vocab, sample, speculative_sample, warp
from specnoise.models import check_same_tokenizer


def draft_vocab(target, draft, target_kv: KVModel, draft_kv: KVModel) -> int:
    """Rows of the target's output layer, after checking that the draft can name every real target token.

    Vocabularies may differ by padding rows only; a draft with fewer rows than the target has real tokens
    cannot be the target's drafter.
    """
    if target.tokenizer is not None and draft.tokenizer is not None:
        check_same_tokenizer(target, draft)
    real = len(target.tokenizer) if target.tokenizer is not None else target.model.config.vocab_size
    real = min(real, target_kv.vocab_size)
    if draft_kv.vocab_size < real:
        raise UserError(
            f"draft {draft.name!r} has {draft_kv.vocab_size} output rows but target {target.name!r} has {real} "
            "tokens: the draft must share the target's vocabulary (padding rows may differ); choose another draft"
        )
    return target_kv.vocab_size


def check_draft_context(draft: KVModel, prompt: list[int], out: Output) -> None:
    if len(prompt) + out.budget > draft.max_length:
        raise UserError(
            f"prompt of {len(prompt)} tokens + max_new_tokens={out.budget} exceeds the draft model's context of "
            f"{draft.max_length}: shorten the prompt or lower max_new_tokens"
        )


def draft_tokens(draft: KVModel, seq: list[int], n: int, vocab: int,
                 probs: Callable[[torch.Tensor], torch.Tensor] | None = None,
                 generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``n`` tokens from the draft after ``seq``, feeding it only what its cache lacks; the last one is not fed.

    Greedy when ``probs`` is None; else each token is sampled from ``probs(logits)``. The tokens (long [n]) and,
    when sampling, their distributions q ([n, vocab]) stay on the device: each is fed back without a read, and the
    caller reads them together with the target's verdict.
    """
    tokens = torch.empty(n, dtype=torch.long, device=draft.device)
    q = None if probs is None else torch.empty(n, vocab, device=draft.device)
    if n <= 0:
        return tokens, q
    logits = draft.forward(seq[draft.length:], last=1)[-1]
    for i in range(n):
        logits = fit_vocab(logits, vocab)
        if probs is None:
            tokens[i] = logits.argmax(-1)
        else:
            q[i] = probs(logits)
            tokens[i] = sample(q[i], generator)
        if i + 1 < n:
            logits = draft.forward(tokens[i:i + 1])[-1]
    return tokens, q


def rewind(model: KVModel, fed: list[int], seq: list[int]) -> None:
    """Cut a cache holding the KV of ``fed[:model.length]`` back to its longest prefix that agrees with ``seq``,
    leaving at least the last token of ``seq`` (the next root) uncached."""
    n, limit = 0, min(model.length, len(seq) - 1)
    while n < limit and fed[n] == seq[n]:
        n += 1
    model.crop(n)


class Speculative(Decoder):
    name = "speculative"
    needs_draft = True
    supports_sampling = True

    def __init__(self, cfg, target, draft=None):
        super().__init__(cfg, target, draft)
        self.vocab = draft_vocab(target, draft, self.target, self.draft)

    def decode(self, prompt: list[int], out: Output) -> None:
        check_draft_context(self.draft, prompt, out)
        q_of = partial(warp, cfg=self.cfg) if self.cfg.temperature > 0 else None
        seq, gamma, device = list(prompt), self.cfg.gamma, self.target.device
        while True:
            n = min(gamma, out.budget - len(out.tokens) - 1)  # drafts past the budget could never be emitted
            drafts, q = draft_tokens(self.draft, seq, n, self.vocab, q_of, self.generator)
            # the first step's forward is the target's prefill
            drafts = drafts.to(device)
            logits = self.target.forward(torch.cat([upload(seq[self.target.length:], device), drafts]), last=n + 1)
            block, drafts = self.verify(logits, drafts, q)
            fed = seq + drafts
            seq += out.emit(block)
            if out.done:
                return
            self.target.crop(len(seq) - 1)
            rewind(self.draft, fed, seq)
            if self.cfg.schedule == "heuristic":  # HF assisted generation's schedule
                gamma = gamma + 2 if len(block) > n else max(1, gamma - 1)

    def verify(self, logits: torch.Tensor, drafts: torch.Tensor, q: torch.Tensor | None) -> tuple[list[int], list[int]]:
        """Accepted drafts plus the target's token (matching prefix, or min(1, p/q) acceptance), and the drafts:
        both from one read."""
        n = drafts.numel()
        if self.cfg.temperature == 0:
            read = self.to_host(torch.cat([drafts, logits.argmax(-1)]))
            drafts, y = read[:n], read[n:]
            return greedy_accept(drafts, y), drafts
        accepted, token = speculative_sample(warp(logits, self.cfg), q.to(logits.device), drafts, self.generator)
        *drafts, a, token = self.to_host(torch.cat([drafts, accepted.view(1), token.view(1)]))
        return drafts[:a] + [token], drafts
