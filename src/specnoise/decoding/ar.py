"""AR: one token per forward. The exactness oracle of every greedy decoder, and the sampling baseline."""

from __future__ import annotations

from specnoise.decoding.base import Decoder, Output
from specnoise.decoding.sampling import next_token


class AR(Decoder):
    name = "ar"
    supports_sampling = True

    def decode(self, prompt: list[int], out: Output) -> None:
        logits = self.target.forward(prompt, last=1)[-1]  # prefill; its last row predicts the first new token
        while True:
            token = self.to_host(next_token(logits, self.cfg, self.generator))
            out.emit([token])
            if out.done:
                return
            logits = self.target.forward([token])[-1]
