"""THE exactness test: under greedy decoding every decoder's tokens equal AR's, on two model families.

Every decoder option in ``DECODER_MODULES`` runs on the random tiny models of conftest.py (many prompts)
and on "map models", whose greedy next token is a fixed function of the current token: their outputs are
known in advance and lookup drafts get accepted, so budgets and EOS ids fall inside accepted drafts.
"""

from __future__ import annotations

import pytest

from conftest import prompts
from helpers_decoding import CYCLE, ar, cycle_successor, map_model, schema
from specnoise.config import DECODER_SCHEMAS, UserError
from specnoise.decoding.base import DECODER_MODULES, build_decoder

ALL = list(DECODER_MODULES)
NEW_TOKENS = 40
PROMPTS = prompts(6, seed=1)


def build(name: str, target, draft, **overrides):
    return build_decoder(schema(name, **overrides), target, draft)


def check_output(out, max_new_tokens: int) -> None:
    """Bookkeeping every runner number relies on."""
    assert len(out.tokens) <= max_new_tokens
    assert sum(out.accepted) == len(out.tokens)
    assert out.target_forwards >= len(out.accepted) >= 1


@pytest.fixture(scope="module")
def cycle(family):
    """(target, draft): the cycle model twice, so draft-model decoders get a perfect drafter."""
    return map_model(family, cycle_successor), map_model(family, cycle_successor)


@pytest.fixture(scope="module")
def expected(target):
    return [ar(target, prompt, NEW_TOKENS) for prompt in PROMPTS]


# ------------------------------------------------------------------------------------------ exactness
@pytest.mark.parametrize("name", ALL)
def test_greedy_tokens_equal_ar(name, target, draft, expected):
    decoder = build(name, target, draft)
    for prompt, tokens in zip(PROMPTS, expected):
        out = decoder.generate(prompt, NEW_TOKENS)
        assert out.tokens == tokens, f"{name} diverges from AR on prompt {prompt}"
        check_output(out, NEW_TOKENS)


@pytest.mark.parametrize("name", ALL)
def test_one_token_prompt(name, target, draft):
    decoder = build(name, target, draft)
    for prompt in ([7], [95]):
        assert decoder.generate(prompt, 12).tokens == ar(target, prompt, 12)


@pytest.mark.parametrize("name", ALL)
def test_one_new_token(name, target, draft):
    decoder = build(name, target, draft)
    for prompt in prompts(3, seed=2):
        out = decoder.generate(prompt, 1)
        assert out.tokens == ar(target, prompt, 1)
        assert len(out.tokens) == 1


@pytest.mark.parametrize("name", ALL)
def test_budget_ending_inside_an_accepted_draft(name, cycle):
    target, draft = cycle
    decoder = build(name, target, draft)
    prompt = CYCLE * 3
    for budget in range(1, 13):
        out = decoder.generate(prompt, budget)
        assert out.tokens == ar(target, prompt, budget) == (CYCLE * 3)[:budget]
        check_output(out, budget)


@pytest.mark.parametrize("name", ALL)
@pytest.mark.parametrize("eos", [{12}, {2, 13}], ids=["one-eos", "two-eos"])
def test_stops_right_after_the_first_eos(name, eos, family):
    """EOS ids in the middle of the cycle: lookup drafts run through them, the output must stop there."""
    target = map_model(family, cycle_successor, eos)
    draft = map_model(family, cycle_successor, eos)
    prompt = CYCLE * 3
    out = build(name, target, draft).generate(prompt, 30)
    expected = CYCLE[:CYCLE.index(max(eos & set(CYCLE))) + 1]
    assert out.tokens == ar(target, prompt, 30) == expected
    check_output(out, 30)
    if name in ("pld", "tr_jacobi"):  # their lookup drafts are accepted: the EOS fell inside one
        assert out.accepted[-1] > 1


# ------------------------------------------------------------------------------------------ bad input
@pytest.mark.parametrize("name", ALL)
def test_prompt_longer_than_context_is_a_user_error(name, target, draft):
    decoder = build(name, target, draft)
    with pytest.raises(UserError, match="context"):
        decoder.generate([5] * (target.max_length - 4), 8)


@pytest.mark.parametrize("name", ALL)
def test_empty_prompt_is_a_user_error(name, target, draft):
    with pytest.raises(UserError, match="empty prompt"):
        build(name, target, draft).generate([], 8)


@pytest.mark.parametrize("name", ALL)
def test_sampling_only_where_supported(name, target, draft):
    if DECODER_SCHEMAS[name].samples:
        out = build(name, target, draft, temperature=0.8, seed=3).generate([5, 6, 7], 8)
        check_output(out, 8)
    else:
        with pytest.raises(UserError, match="greedy-only"):
            build(name, target, draft, temperature=0.8)


# ----------------------------------------------------------------------------------- drafting helps
@pytest.mark.parametrize("name", ["jacobi", "tr_jacobi", "pld"])
def test_drafts_are_accepted_where_they_must_be(name, family):
    """A model that says 7 after anything: after one step Jacobi's refreshed slots hold its predictions
    (all 7), TR-Jacobi's top-1 rows too, and PLD finds the run of 7s in the context."""
    target = map_model(family, lambda i: 7)
    prompt = list(range(20, 40))
    out = build(name, target, None).generate(prompt, 48)
    assert out.tokens == [7] * 48
    assert out.mean_accepted > 2.0, out.accepted


# ------------------------------------------------------------------------------- options of our decoders
VARIANTS = [
    ("jacobi", dict(draft_len=1)),
    ("jacobi", dict(draft_len=7)),
    ("tr_jacobi", dict(retrieval=False)),
    ("tr_jacobi", dict(faithful=True)),
    ("tr_jacobi", dict(tree="2level_12", topk=6, retrieval_len=2)),
    ("tr_jacobi", dict(tree="chain_4", topk=1, retrieval_ngram=1)),
    ("pld", dict(max_ngram_size=1, num_pred_tokens=3)),
    ("hf_pld", dict(prompt_lookup_num_tokens=3, max_matching_ngram_size=1)),
    ("hf_assisted", dict(num_assistant_tokens=2, schedule="heuristic")),
    ("ouroboros", dict(sampled_drafts=True)),  # a sampling-only key: greedy decoding ignores it
]


@pytest.mark.parametrize("name,options", VARIANTS, ids=[f"{n}-{'-'.join(map(str, o.values()))}" for n, o in VARIANTS])
def test_options_stay_lossless(name, options, target, draft, expected):
    decoder = build(name, target, draft, **options)
    for prompt, tokens in list(zip(PROMPTS, expected))[:3]:
        assert decoder.generate(prompt, NEW_TOKENS).tokens == tokens


def test_forward_counts_of_the_hf_peers(cycle):
    target, draft = cycle
    prompt = CYCLE * 3
    out = build("hf_greedy", target, draft).generate(prompt, 20)
    assert out.target_forwards == 20 and out.accepted == [1] * 20 and out.draft_forwards == 0
    out = build("hf_pld", target, draft).generate(prompt, 20)
    assert out.target_forwards == len(out.accepted) < 20  # lookup drafts accepted
    before = draft.model.generation_config.to_dict()
    for schedule, accepted in (("constant", [5, 5, 5, 5]), ("heuristic", [5, 7, 8])):  # heuristic: +2 per full accept
        decoder = build("hf_assisted", target, draft, num_assistant_tokens=4, schedule=schedule)
        for _ in range(2):  # the schedule restarts with every call
            out = decoder.generate(prompt, 20)
            assert out.tokens == (CYCLE * 4)[:20]
            assert out.accepted == accepted and out.target_forwards == len(accepted) and out.draft_forwards > 0
    assert draft.model.generation_config.to_dict() == before  # the draft's own config is left as it was


@pytest.mark.parametrize("name", ["lookahead", "pld", "speculative", "ouroboros", "token_recycling", "sam", "rest"])
def test_a_prompts_steps_do_not_depend_on_the_prompts_before_it(name, target, draft):
    """Noise is seeded per prompt: the same prompt takes the same steps first or after others (Ouroboros, Token
    Recycling and SAM's fallback: with their cross-prompt pool / matrix switched off). Jacobi and TR-Jacobi keep one
    generator per decoder (README)."""
    options = {"reuse_history": False} if name in ("ouroboros", "token_recycling", "sam") else {}
    prompt, other = PROMPTS[0], PROMPTS[1]
    first = build(name, target, draft, **options).generate(prompt, NEW_TOKENS)
    decoder = build(name, target, draft, **options)
    decoder.generate(other, NEW_TOKENS)
    later = decoder.generate(prompt, NEW_TOKENS)
    assert (later.tokens, later.accepted, later.target_forwards) == (first.tokens, first.accepted,
                                                                     first.target_forwards)
