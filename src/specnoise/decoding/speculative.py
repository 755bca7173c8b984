"""Speculative decoding with a draft model (docs/algorithms.md §8): the draft proposes gamma tokens one by one, the
target verifies [root] + drafts in one forward.

Greedy: the draft's argmaxes, verified by the target's. Sampling: the drafts are sampled from the draft model's
(warped) distributions q, and the verifier keeps each with probability min(1, p/q), replacing the first rejected one
by a sample of norm(max(0, p - q)): the output is distributed exactly as the target's. The draft's cache is cut back
to the accepted tokens after every step, so it is only ever fed tokens it has not seen. The helpers above the class
are shared with Ouroboros.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import torch

from specnoise.decoding.cost import CHAIN
from specnoise.decoding.drafter import Drafter
from specnoise.decoding.kv import Engine, Forward
from specnoise.decoding.proposal import Proposal
from specnoise.decoding.sampling import fit_vocab, greedy, sample, warp
from specnoise.decoding.verifier import prompt_generator
from specnoise.errors import UserError
from specnoise.models import check_same_tokenizer


def draft_vocab(target, draft, target_kv: Engine, draft_kv: Engine) -> int:
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


def check_draft_context(draft: Engine, prompt: list[int], budget: int) -> None:
    if len(prompt) + budget > draft.max_length:
        raise UserError(
            f"prompt of {len(prompt)} tokens + max_new_tokens={budget} exceeds the draft model's context of "
            f"{draft.max_length}: shorten the prompt or lower max_new_tokens"
        )


def draft_tokens(draft: Engine, seq: list[int], n: int, vocab: int,
                 probs: Callable[[torch.Tensor], torch.Tensor] | None = None,
                 generator: torch.Generator | None = None):
    """``n`` tokens from the draft after ``seq``, feeding it only what its cache lacks; the last one is not fed. A
    generator of the draft forwards (kv.py ``Forward``; a batch runs every drafting row's together) whose value is
    (tokens, q).

    Greedy when ``probs`` is None; else each token is sampled from ``probs(logits)``. The tokens (long [n]) and,
    when sampling, their distributions q ([n, vocab]) stay on the device: each is fed back without a read, and the
    caller reads them together with the target's verdict.
    """
    tokens = torch.empty(n, dtype=torch.long, device=draft.device)
    q = None if probs is None else torch.empty(n, vocab, device=draft.device)
    if n <= 0:
        return tokens, q
    logits = (yield Forward(draft, seq[draft.length:], last=1))[-1]
    for i in range(n):
        logits = fit_vocab(logits, vocab)
        if probs is None:
            tokens[i] = greedy(logits)
        else:
            q[i] = probs(logits)
            tokens[i] = sample(q[i], generator)
        if i + 1 < n:
            logits = (yield Forward(draft, tokens[i:i + 1]))[-1]
    return tokens, q


def catch_up_cost(curve, behind: int, block: float = 1, kind: str = CHAIN, cached: int = 0) -> float:
    """What a draft forward of ``block`` rows costs beyond itself when it first feeds the ``behind`` tokens the draft
    model has not seen (the last of them its root) after the ``cached`` ones it holds: decoder.auto's
    ``Drafter.catch_up``. Each forward priced at its own context (a catch-up from an empty cache attends to less than
    the drafting forward it replaces)."""
    if behind <= 1:
        return 0.0
    return max(0.0, curve(behind - 1 + block, kind, cached) - curve(block, kind, cached + behind - 1))


def rewind(model: Engine, fed: list[int], seq: list[int], agreed: int = 0) -> None:
    """Cut a cache holding the KV of ``fed[:model.length]`` back to its longest prefix that agrees with ``seq``,
    leaving at least the last token of ``seq`` (the next root) uncached. ``agreed``: a length known to agree (the
    text the drafts were fed after): compared from there, a step costs the drafts, not the whole text, in Python
    (an AR step of Ouroboros with decoder.auto after a 1,300-token prompt compared every token of it: 43 us on the
    2-core CPU, ~1% of the step)."""
    limit = min(model.length, len(seq) - 1)
    n = min(agreed, limit)
    while n < limit and fed[n] == seq[n]:
        n += 1
    model.crop(n)


class Speculative(Drafter):
    name = "speculative"
    needs_draft = True
    sampled_drafts = True  # under sampling: rejection sampling, AR's distribution rather than AR's tokens

    def setup(self):
        self.vocab = draft_vocab(self.decoder.target_model, self.decoder.draft_model, self.target, self.draft)
        self.q_of = partial(warp, cfg=self.cfg) if self.cfg.temperature > 0 else None

    def begin(self, prompt, budget, seed):
        super().begin(prompt, budget, seed)
        check_draft_context(self.draft, prompt, budget)
        self.generator = prompt_generator(seed + 1, prompt)  # the draft's own draws, per prompt
        self.gamma = self.cfg.gamma

    def propose_steps(self, room):
        # drafts past the budget could never be emitted; decoder.auto may draft fewer, or none (an AR step)
        self.n = self.cut(min(self.gamma, room), kind=CHAIN)
        drafts, q = yield from draft_tokens(self.draft, self.seq, self.n, self.vocab, self.q_of, self.generator)
        drafts = drafts.to(self.target.device)
        return Proposal(drafts, self.chain(drafts).shape, q=None if q is None else q.to(self.target.device))

    def draft_cost(self, stream, k):
        return k * self.draft_price(1, CHAIN, len(self.seq))  # one one-token draft forward per token

    def catch_up(self, stream):
        """The first draft forward is fed every token the draft has not seen: beyond a one-token forward, that."""
        return catch_up_cost(self.draft_price, len(self.seq) - self.draft.length, cached=self.draft.length)

    def observe(self, v):
        before = len(self.seq)
        super().observe(v)
        if v.done:
            return
        # the draft's cache holds seq + drafts[:n - 1]; it agrees with the new seq up to the accepted drafts
        self.draft.crop(min(self.draft.length, before + v.accepted, len(self.seq) - 1))
        if self.cfg.schedule == "heuristic":  # HF assisted generation's schedule
            self.gamma = self.gamma + 2 if v.accepted == self.n else max(1, self.gamma - 1)
