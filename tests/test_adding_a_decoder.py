"""The README's "Adding a decoder" example, as written there: a drafter of a few lines over the shared verifier is
lossless under greedy decoding and keeps AR's sampled tokens for a seed, on both engines' default (dynamic)."""

from __future__ import annotations

from dataclasses import dataclass

from conftest import prompts
from helpers_decoding import ar
from specnoise.config import ARConfig, DecoderConfig
from specnoise.decoding.base import Decoder, build_decoder
from specnoise.decoding.drafter import Drafter


class RepeatLast(Drafter):
    name = "repeat_last"

    def propose(self, room):
        return self.chain(self.seq[-self.cfg.k:][:room])  # at most `room` drafts could still be emitted


@dataclass
class RepeatLastConfig(DecoderConfig):
    name: str = "repeat_last"
    k: int = 4


class RepeatLastDecoder(Decoder):
    drafter_class = RepeatLast


def test_a_new_drafter_is_lossless_greedy_and_sampling(target):
    decoder = RepeatLastDecoder(RepeatLastConfig(), target)
    for prompt in prompts(4, seed=2):
        out = decoder.generate(prompt, 30)
        assert out.tokens == ar(target, prompt, 30)
        assert sum(out.accepted) == len(out.tokens) and out.host_reads == out.target_forwards
    sampler = RepeatLastDecoder(RepeatLastConfig(temperature=0.8, seed=3), target)
    reference = build_decoder(ARConfig(temperature=0.8, seed=3), target)
    for prompt in prompts(3, seed=4):
        assert sampler.generate(prompt, 30).tokens == reference.generate(prompt, 30).tokens
