"""Jacobi decoding, MSN style: verify a chain of ``draft_len`` noisy slots after the newest token, keep the
model's own predictions for the slots it did not accept, and top the chain up with fresh ahead noise.

A model trained with MSN denoises such slots: its prediction after a noisy slot is a good guess for the
token two places after the last accepted one, so the refreshed chain converges over a few steps.
"""

from __future__ import annotations

from specnoise.decoding.base import Decoder, Output
from specnoise.decoding.ngram import ahead_noise


class Jacobi(Decoder):
    name = "jacobi"

    def decode(self, prompt: list[int], out: Output) -> None:
        L = self.cfg.draft_len
        seq = list(prompt)  # accepted context: noise is drawn from it
        pending = list(prompt)  # accepted tokens without KV yet; the first step is fused with prefill
        draft = ahead_noise(seq, L, self.generator)
        while True:
            draft = draft[: out.budget - len(out.tokens) - 1]  # a step emits at most len(draft) + 1 tokens
            block, y = self.verify_chain(pending, draft)
            out.emit(block)
            if out.done:
                return
            a = len(block) - 1  # accepted slots
            seq += block
            pending = block[-1:]
            # Jacobi refresh: the prediction after rejected slot a + j becomes the new slot j
            draft = y[a + 1:] + ahead_noise(seq, L - len(y[a + 1:]), self.generator)
