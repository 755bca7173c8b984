"""AR: one token per forward, nothing drafted. The exactness oracle of every decoder, greedy or sampling: the
verifier's draw at the root is the next token."""

from __future__ import annotations

from specnoise.decoding.drafter import Drafter


class AR(Drafter):
    name = "ar"

    def propose(self, room: int):
        return self.chain([])
