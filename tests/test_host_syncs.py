"""Host-device syncs: every device-to-host read of a decoder goes through ``Decoder.to_host``, and a step reads
once (the draft loop included), so a GPU never idles waiting for the host more than needed. Also: decoders whose
trees or phrases would reach past a learned-position model's context stay lossless there.

``count_reads`` is the measurement behind the figures in issue #10 (run it on any decoder).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import sys

import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel

import specnoise.decoding
from conftest import EOS, VOCAB, make_model, prompts
from helpers_decoding import schema
from specnoise.config import DECODER_SCHEMAS, ARConfig
from specnoise.decoding.base import build_decoder
from specnoise.models import LoadedModel

BUDGET = 100
GREEDY = ["ar", "jacobi", "tr_jacobi", "pld", "lookahead", "token_recycling", "sam", "rest", "speculative", "ouroboros"]
SAMPLING = GREEDY  # every drafter samples through the verifier
PACKAGE = os.path.dirname(specnoise.decoding.__file__)
CONVERSIONS = ("tolist", "item", "__int__", "__float__", "__bool__", "__index__", "cpu", "numpy")
# host memory, never a sync: a CPU generator's draws; the CPU-only NumPy views of CPU tensors: the argmax of logits
# (``greedy``), Token Recycling's tree filled from its matrix (``Plan.fill``) and host ints written into a tensor
# (``kv.write``); on a GPU each is torch ops on the device
HOST_ONLY = {"ahead_noise", "greedy", "fill", "write"}


@pytest.fixture(scope="module")
def models():
    """(target, draft) that never stop early, so every decoder runs the whole budget."""
    target = make_model("llama", layers=2, seed=0)
    draft = make_model("llama", layers=1, seed=1, hidden_size=32, intermediate_size=64)
    return dataclasses.replace(target, eos_ids=frozenset()), dataclasses.replace(draft, eos_ids=frozenset())


@contextlib.contextmanager
def conversions_in_decoders():
    """Every tensor -> Python conversion that code of the decoding package makes, by calling function name."""
    calls: list[str] = []
    originals = {name: getattr(torch.Tensor, name) for name in CONVERSIONS}

    def counted(fn):
        def wrapper(self, *args, **kwargs):
            caller = sys._getframe(1).f_code
            if caller.co_filename.startswith(PACKAGE):
                calls.append(caller.co_name)
            return fn(self, *args, **kwargs)
        return wrapper

    for name, fn in originals.items():
        setattr(torch.Tensor, name, counted(fn))
    try:
        yield calls
    finally:
        for name, fn in originals.items():
            setattr(torch.Tensor, name, fn)


def count_reads(decoder, n_prompts: int = 2) -> tuple[int, int, int, list[str]]:
    """(to_host reads, target forwards, draft forwards, the functions that converted tensors without to_host) over
    ``n_prompts`` generations of BUDGET tokens."""
    reads = forwards = drafts = 0
    with conversions_in_decoders() as calls:
        for prompt in prompts(n_prompts, seed=7):
            out = decoder.generate(prompt, BUDGET)
            assert len(out.tokens) == BUDGET
            reads, forwards = reads + out.host_reads, forwards + out.target_forwards
            drafts += out.draft_forwards
    stray = sorted({name for name in calls if name != "to_host"})
    return reads, forwards, drafts, stray


CASES = [(name, {}) for name in GREEDY] + [("ouroboros", dict(phrase_drafting=False))] + \
        [(name, dict(temperature=1.0, seed=1)) for name in SAMPLING]


@pytest.mark.parametrize("name,options", CASES, ids=[n + "".join(f"-{k}={v}" for k, v in o.items()) for n, o in CASES])
def test_at_most_one_read_per_model_forward(models, name, options):
    decoder = build_decoder(schema(name, **options), *models)
    reads, forwards, drafts, stray = count_reads(decoder)
    assert set(stray) <= HOST_ONLY, f"{name} reads device tensors outside to_host in {stray}"
    if name == "ouroboros" and options.get("phrase_drafting", True):
        # each draft step is a lookahead step whose next input depends on what it accepted: one read per step
        assert reads == forwards + drafts
    elif name == "ouroboros":  # plain drafting: the draft tokens, then the verdict
        assert reads <= 2 * forwards, f"{name}: {reads / forwards:.2f} reads per target forward"
    else:  # the verifier's one read per step, greedy or sampling (the drafter's own needs ride along)
        assert reads == forwards, f"{name}: {reads / forwards:.2f} reads per target forward"


def test_reads_are_counted_per_generation(models):
    decoder = build_decoder(DECODER_SCHEMAS["ar"](), *models)
    assert decoder.generate([5, 6, 7], 9).host_reads == 9  # one argmax per token
    assert decoder.generate([5, 6, 7], 4).host_reads == 4  # reset for each prompt


# ------------------------------------------------------------------------- learned positions at the context's end
CONTEXT = 40


@pytest.fixture(scope="module")
def gpt2():
    """A GPT-2 model with learned absolute positions: a position past the context is an IndexError."""
    torch.manual_seed(0)
    config = GPT2Config(vocab_size=VOCAB, n_positions=CONTEXT, n_embd=64, n_layer=2, n_head=4, initializer_range=0.3,
                        bos_token_id=1, eos_token_id=EOS, pad_token_id=0)
    model = GPT2LMHeadModel(config).eval()
    return LoadedModel("random-gpt2", "", model, None, frozenset({EOS}), "raw")


# the new drafters' default trees (64 and 65 rows) exceed this 40-token context: a ConfigError (test_new_drafters.py)
SMALL = {"token_recycling": dict(tree="2level_12", topk=6), "sam": dict(tree="2level_12", topk=6),
         "rest": dict(num_draft=16)}


@pytest.mark.parametrize("name", ["tr_jacobi", "lookahead", "ouroboros", "jacobi", "pld", "speculative", *SMALL])
@pytest.mark.parametrize("prompt_len,budget", [(38, 2), (39, 1), (35, 5), (30, 10), (20, 20)])
def test_lossless_at_the_end_of_a_learned_position_context(gpt2, name, prompt_len, budget):
    """Trees, windows and phrases hang up to several positions past the newest token: cut or clamped so that
    none reaches past the context, with the tokens still AR's."""
    decoder = build_decoder(schema(name, **SMALL.get(name, {})), gpt2, gpt2)
    reference = build_decoder(ARConfig(), gpt2)
    for prompt in prompts(3, seed=prompt_len, min_len=prompt_len, max_len=prompt_len):
        prompt = prompt[:prompt_len]
        assert decoder.generate(prompt, budget).tokens == reference.generate(prompt, budget).tokens


@pytest.mark.parametrize("name", GREEDY + ["ouroboros-plain"])
def test_a_batch_reads_once_per_step(models, name):
    """B = 3 in lock-step: each row reads as it would alone (one read per target forward, plus Ouroboros' draft
    steps), nothing in decoding/ converts a tensor outside to_host, and the whole batch reads once per step: the
    batch's reads (``decoder.host_reads``) equal its steps, the forwards of its longest-running row."""
    options = dict(phrase_drafting=False) if name == "ouroboros-plain" else {}
    decoder = build_decoder(schema(name.split("-")[0], **options), *models)
    with conversions_in_decoders() as calls:
        outs = decoder.generate_batch(prompts(3, seed=7), 40)
    assert set(calls) <= {"to_host"} | HOST_ONLY, f"{name} reads device tensors outside to_host in {set(calls)}"
    steps = max(o.target_forwards for o in outs)
    for out in outs:
        assert len(out.tokens) == 40
        if name == "ouroboros":
            assert out.host_reads == out.target_forwards + out.draft_forwards
        elif name == "ouroboros-plain":  # the draft tokens, then the verdict
            assert out.host_reads <= 2 * out.target_forwards
        else:
            assert out.host_reads == out.target_forwards
    if name.startswith("ouroboros"):  # draft reads of rows drafting together are one read too
        assert decoder.host_reads < sum(o.host_reads for o in outs)
    else:
        assert decoder.host_reads == steps
