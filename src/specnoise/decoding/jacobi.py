"""Jacobi decoding, MSN style: verify a chain of ``draft_len`` noisy slots after the newest token, keep the
model's own predictions for the slots it did not accept, and top the chain up with fresh ahead noise.

A model trained with MSN denoises such slots: its prediction after a noisy slot is a good guess for the
token two places after the last accepted one, so the refreshed chain converges over a few steps.
"""

from __future__ import annotations

from specnoise.decoding.cost import CHAIN
from specnoise.decoding.drafter import Drafter
from specnoise.decoding.ngram import ahead_noise
from specnoise.decoding.proposal import Proposal, read_argmax


class Jacobi(Drafter):
    name = "jacobi"

    def begin(self, prompt, budget, seed):
        super().begin(prompt, budget, seed)
        self.guess = ahead_noise(self.seq, self.cfg.draft_len, self.noise)

    def propose(self, room):
        # a step emits at most len(draft) + 1 tokens; decoder.auto may verify fewer slots (the rest is refreshed)
        draft = self.guess[:self.cut(min(room, len(self.guess)), kind=CHAIN)]
        return Proposal(draft, self.chain(draft).shape, after=read_argmax)  # the predictions are the next guesses

    def observe(self, v):
        super().observe(v)
        if v.done:
            return
        # Jacobi refresh: the prediction after rejected slot a + j becomes the new slot j
        y = v.extra[v.accepted + 1:]
        self.guess = y + ahead_noise(self.seq, self.cfg.draft_len - len(y), self.noise)
