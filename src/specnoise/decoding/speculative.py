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
from specnoise.decoding.kv import KVModel
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
                 generator: torch.Generator | None = None) -> tuple[list[int], list[torch.Tensor]]:
    """``n`` tokens from the draft after ``seq``, feeding it only what its cache lacks; the last one is not fed.

    Greedy when ``probs`` is None; else each token is sampled from ``probs(logits)``, returned as q per token.
    """
    tokens: list[int] = []
    qs: list[torch.Tensor] = []
    if n <= 0:
        return tokens, qs
    logits = draft.forward(seq[draft.length:], last=1)[-1]
    while True:
        logits = fit_vocab(logits, vocab)
        if probs is None:
            tokens.append(int(logits.argmax(-1)))
        else:
            qs.append(probs(logits))
            tokens.append(sample(qs[-1], generator))
        if len(tokens) == n:
            return tokens, qs
        logits = draft.forward(tokens[-1:])[-1]


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
        seq, gamma = list(prompt), self.cfg.gamma
        while True:
            n = min(gamma, out.budget - len(out.tokens) - 1)  # drafts past the budget could never be emitted
            drafts, q = draft_tokens(self.draft, seq, n, self.vocab, q_of, self.generator)
            # the first step's forward is the target's prefill
            logits = self.target.forward(seq[self.target.length:] + drafts, last=n + 1)
            block = self.verify(logits, drafts, torch.stack(q) if q else None)
            fed = seq + drafts
            seq += out.emit(block)
            if out.done:
                return
            self.target.crop(len(seq) - 1)
            rewind(self.draft, fed, seq)
            if self.cfg.schedule == "heuristic":  # HF assisted generation's schedule
                gamma = gamma + 2 if len(block) > n else max(1, gamma - 1)

    def verify(self, logits: torch.Tensor, drafts: list[int], q: torch.Tensor | None) -> list[int]:
        """Accepted drafts plus the target's token: matching prefix (greedy) or min(1, p/q) acceptance."""
        if self.cfg.temperature == 0:
            return greedy_accept(drafts, logits.argmax(-1).tolist())
        return speculative_sample(warp(logits, self.cfg), q, drafts, self.generator)
