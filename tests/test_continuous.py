"""Continuous batching (``Decoder.generate_batch(..., slots=B)``, ``benchmark.queue``): B rows decode a queue of
prompts, a row taking the next prompt as soon as its own ends. Every prompt's tokens are what AR gives it alone (every
drafter, two families, a draft model's too); a refilled row's prompt is fed alone, not padded beside the other rows'
blocks; a prompt's forwards and reads are its own; and the settings that cannot refill say so before a model loads."""

from __future__ import annotations

import dataclasses
import random

import pytest
import torch

from conftest import VOCAB
from helpers_decoding import ar, schema
from specnoise.bench.runner import batch_skips
from specnoise.config import BenchmarkConfig, ConfigError
from specnoise.decoding.base import DECODER_MODULES, build_decoder
from specnoise.decoding.static_kv import StaticEngine
from specnoise.errors import UserError

DRAFTERS = [n for n in DECODER_MODULES if not n.startswith("hf_")]
NEW_TOKENS = 30
LENGTHS = (5, 17, 2, 11, 23, 8)  # more prompts than rows, of different lengths


def queue(seed: int = 3) -> list[list[int]]:
    gen = random.Random(seed)
    return [[gen.randrange(3, VOCAB) for _ in range(n)] for n in LENGTHS]


@pytest.fixture(scope="module")
def early_eos(target):
    """The target with an EOS that ends the third prompt after 3 tokens, so its row is refilled early."""
    ps = queue()
    return dataclasses.replace(target, eos_ids=frozenset({ar(target, ps[2], NEW_TOKENS)[2]})), ps


@pytest.mark.parametrize("name", DRAFTERS)
def test_every_refilled_prompt_equals_ar_alone(name, early_eos, draft):
    target, ps = early_eos
    decoder = build_decoder(schema(name), target, draft)
    outs = decoder.generate_batch(ps, NEW_TOKENS, slots=2)
    assert len(outs) == len(ps)
    for out, prompt in zip(outs, ps):
        assert out.tokens == ar(target, prompt, NEW_TOKENS), f"{name}: a refilled prompt differs from AR alone"
        assert sum(out.accepted) == len(out.tokens) and out.batch_size == 2
        assert out.target_forwards >= len(out.accepted) >= 1 and out.seconds > 0
    assert len(outs[2].tokens) <= 3 < len(outs[3].tokens)  # (its row refilled early)


# nothing kept across prompts (SAM keeps its fallback's matrix, Token Recycling its own, Ouroboros its phrases)
STATELESS = ["jacobi", "tr_jacobi", "pld", "lookahead", "rest", "speculative"]


@pytest.mark.parametrize("name", STATELESS)
def test_a_refilled_prompt_takes_the_forwards_it_takes_alone(name, target, draft):
    """A prompt's forwards (target and draft), accepted counts and host reads are its own, whichever row and
    neighbours it had, as alone: a drafter that keeps nothing across prompts drafts from its prompt only."""
    ps = queue(5)
    outs = build_decoder(schema(name), target, draft).generate_batch(ps, NEW_TOKENS, slots=3)
    for prompt, out in zip(ps, outs):
        alone = build_decoder(schema(name), target, draft).generate(prompt, NEW_TOKENS)
        assert (out.tokens, out.target_forwards, out.draft_forwards, out.accepted) == \
            (alone.tokens, alone.target_forwards, alone.draft_forwards, alone.accepted), name
        if name != "speculative":  # (a draft model's drafting reads too)
            assert out.host_reads == out.target_forwards  # one read per step, shared with the rows beside it


def test_a_refilled_rows_prompt_is_fed_alone_and_the_batch_reads_once_per_step(target):
    """The queue's later prompts start while other rows decode: each is fed alone (one forward of one row and its
    own length), not padded beside the other rows' one-token blocks, and a step of the batch reads the host once."""
    ps = queue(7)
    decoder = build_decoder(schema("pld"), target)
    fed: list[tuple[int, int]] = []
    hook = target.model.register_forward_pre_hook(
        lambda module, args, kwargs: fed.append(tuple(kwargs["input_ids"].shape)), with_kwargs=True)
    try:
        outs = decoder.generate_batch(ps, NEW_TOKENS, slots=2)
    finally:
        hook.remove()
    for prompt in ps[2:]:  # (the first two start the group together, fed row by row: ``prefill_rows``)
        assert (1, len(prompt)) in fed
    widest = max(len(p) for p in ps[2:])
    assert not [shape for shape in fed if shape[0] > 1 and shape[1] >= widest], fed  # no padded prompt
    assert decoder.host_reads < sum(o.host_reads for o in outs)  # rows beside each other read together


def test_sampled_refilled_prompts_equal_their_tokens_alone(target, draft):
    cfg = dict(temperature=0.9, top_p=0.9, seed=5)
    for name in ("pld", "speculative"):
        decoder = build_decoder(schema(name, **cfg), target, draft)
        ps, seeds = queue(9), [5, 6, 7, 8, 9, 10]
        alone = [decoder.generate(p, 20, seed=s).tokens for p, s in zip(ps, seeds)]
        assert [o.tokens for o in decoder.generate_batch(ps, 20, seed=seeds, slots=2)] == alone, name


def test_continuous_batching_says_what_it_cannot_do(target):
    """A queue no longer than the batch, or a batch of one, is refused by the config; the static engine and the
    generate() peers cannot refill a row: the job says so before it loads a model, a decoder when it is asked."""
    with pytest.raises(ConfigError, match="benchmark.queue"):
        BenchmarkConfig(name="humaneval", batch_size=4, queue=4)
    with pytest.raises(ConfigError, match="benchmark.queue"):
        BenchmarkConfig(name="humaneval", batch_size=1, queue=8)
    conf = lambda **model: type("Conf", (), {  # noqa: E731 - the fields batch_skips reads
        "benchmark": BenchmarkConfig(name="humaneval", batch_size=2, queue=6),
        "model": type("Model", (), {"compile": False, "static_cache": "auto", **model})(),
        "decoder": schema("pld"), "decoders": ["tr_jacobi", "hf_greedy"]})()
    assert list(batch_skips(conf())) == ["hf_greedy"]
    with pytest.raises(UserError, match="model.static_cache=false"):
        batch_skips(conf(static_cache=True))
    decoder = build_decoder(schema("pld"), target)
    decoder.bind(StaticEngine(target.model), None)
    with pytest.raises(UserError, match="dynamic engine"), torch.inference_mode():
        decoder.generate_batch(queue(), NEW_TOKENS, slots=2)
