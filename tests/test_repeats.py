"""A benchmark's repeats of one prompt: each starts from what the decoder kept across prompts before the first one.

Token Recycling keeps its adjacency matrix across prompts (as SAM's fallback does, and Ouroboros its phrase pool); a
second repeat of the same prompt would draft from the first one's answer. On the cycle model (10 11 12 13 14 10 ...)
the matrix learns the cycle in one pass, so a repeat that kept it needs fewer forwards than the first.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from helpers_decoding import cycle_successor, map_model, schema
from specnoise.bench.datasets import Sample
from specnoise.bench.measure import run_group
from specnoise.decoding.base import build_decoder
from test_auto import DRAFTERS, NEW_TOKENS, PROMPTS, build

TEXTS = {"a": [20, 21, 22], "b": [23, 24, 25, 26], "c": [27, 28]}
BUDGET = 24


class Tokens:
    """Token ids as text: what ``completion_text`` needs of a tokenizer."""

    @staticmethod
    def decode(ids, skip_special_tokens=True):
        return " ".join(map(str, ids))


def forwards_per_call(target, name: str, repeats: int, keep: bool = True) -> dict[str, list[int]]:
    """Every prompt through ``run_group`` one after the other: the target forwards of each of ``name``'s generations
    per prompt, in order. ``keep=False``: the decoder's history is never restored (what the loop did before)."""
    decoders = {"ar": build_decoder(schema("ar"), target, None), name: build_decoder(schema(name), target, None)}
    calls: dict[str, list[int]] = {}
    generate, decoder = decoders[name].generate, decoders[name]

    def counted(prompt, budget):
        out = generate(prompt, budget)
        calls.setdefault(next(k for k, v in TEXTS.items() if v == prompt), []).append(out.target_forwards)
        return out

    decoder.generate = counted
    if not keep:
        decoder.restore = lambda saved: None
    bar = SimpleNamespace(update=lambda n: None, set_postfix_str=lambda *a, **k: None)
    stop = SimpleNamespace(signal=False)
    for i, key in enumerate(TEXTS):
        sample = Sample(id=key, category="c", turns=[key])
        run_group([sample], i, decoders, BUDGET, 1000, repeats, lambda s, answers: TEXTS[s.id], Tokens(), bar, stop)
    return calls


def test_every_repeat_starts_where_the_first_did_and_the_next_prompt_after_one_pass(family):
    target = map_model(family, cycle_successor)
    once = forwards_per_call(target, "token_recycling", repeats=1)
    thrice = forwards_per_call(target, "token_recycling", repeats=3)
    assert all(len(set(v)) == 1 for v in thrice.values()), thrice  # the same forwards in every repeat
    assert {k: v[0] for k, v in thrice.items()} == {k: v[0] for k, v in once.items()}  # after one pass each
    leaky = forwards_per_call(target, "token_recycling", repeats=3, keep=False)
    assert leaky["a"][1] < leaky["a"][0], leaky  # (a repeat that kept the matrix drafts from the first repeat)


def test_a_decoders_history_is_restored_to_a_copy_that_serves_again(family):
    """``history`` is a copy: generating after it changes the decoder, not the copy, and one copy restores twice. (On a
    fixed cost curve: on the curve the machine measures, a loaded machine's prices changed the sizes, and with them
    the forwards, between the two passes.)"""
    target = map_model(family, cycle_successor)
    decoder = build("token_recycling", target, None)
    decoder.generate(TEXTS["a"], BUDGET)  # (decoder.auto's controller exists from the first generation on)
    saved = decoder.history()
    first = decoder.generate(TEXTS["b"], BUDGET).target_forwards
    assert decoder.generate(TEXTS["b"], BUDGET).target_forwards < first  # it learnt from the pass over b
    for _ in range(2):
        decoder.restore(saved)
        assert decoder.generate(TEXTS["b"], BUDGET).target_forwards == first


@pytest.mark.parametrize("curve", ["flat", "moderate"])
@pytest.mark.parametrize("name", DRAFTERS)
def test_history_holds_everything_a_decoder_keeps_across_prompts(name, curve, target, draft):
    """Every drafter with decoder.auto (its controller learns across prompts too) on a fixed cost curve: after a
    restore, a prompt decodes with the very forwards it had from that state, whatever ran in between. On the flat
    curve every candidate is verified (the drafter's own state shows), on the moderate one the statistics choose."""
    decoder = build(name, target, draft, curve=curve)
    decoder.generate(PROMPTS[0], NEW_TOKENS)
    saved = decoder.history()
    first = decoder.generate(PROMPTS[1], NEW_TOKENS)
    for p in (PROMPTS[2], PROMPTS[1], PROMPTS[0]):
        decoder.generate(p, NEW_TOKENS)
    decoder.restore(saved)
    again = decoder.generate(PROMPTS[1], NEW_TOKENS)
    assert (again.forward_log, again.draft_forward_log) == (first.forward_log, first.draft_forward_log), name


def test_tree_auto_restores_its_statistics_and_pick(target):
    decoder = build_decoder(schema("tr_jacobi", tree="auto", calibrate=1), target, None)
    decoder.generate(PROMPTS[0], NEW_TOKENS)
    saved, tree = decoder.history(), decoder.drafter.tree
    first = decoder.generate(PROMPTS[1], NEW_TOKENS)
    decoder.generate(PROMPTS[2], NEW_TOKENS)
    decoder.restore(saved)
    assert decoder.drafter.tree is tree  # the pick itself, not a copy (its verify shapes keep their functions)
    assert decoder.generate(PROMPTS[1], NEW_TOKENS).forward_log == first.forward_log
