"""decoder.auto (decoding/auto.py): the controller's choice, lossless cuts for every drafter on both engines and two
families, the target distribution kept under sampling, and a graph engine's kept picks (the cost curve:
test_cost_curve.py; in a batch: test_auto_batch.py).

The controller is driven here by fixed cost curves, so what it must choose is known whatever the machine: a flat
curve (a forward costs the same for any q) proposes every candidate, even one whose estimated chance is ~0, i.e.
the faithful sizes and forward counts; a steep one (t(q) = q) never pays for a draft, so every step but the
controller's exploration is a plain AR step; a moderate one mixes sizes, the case the lossless tests need."""

from __future__ import annotations

import copy
import dataclasses
import math
from types import SimpleNamespace

import pytest

from helpers_auto import DRAFTERS, NEW_TOKENS, PROMPTS, build, explorations, static, verdict, with_curve
from helpers_decoding import CYCLE, PROMPT, SAMPLES, TV_MAX, V, ar, cycle_successor, map_model, schema, tiny_pair, tv
from specnoise.config import DECODER_SCHEMAS, ConfigError
from specnoise.decoding import acceptance, auto, calibration
from specnoise.decoding.acceptance import EXPLORE, Nodes
from specnoise.decoding.auto import Controller, Stream, chain_parents
from specnoise.decoding.base import build_decoder, decoder_class
from specnoise.decoding.cost import CHAIN, TREE


# ------------------------------------------------------------------------------------------ the controller
def test_the_controller_picks_the_most_tokens_per_second():
    chain = chain_parents(3)
    nodes = Stream()
    for i in range(200):  # depth 1 always accepted, depth 2 a third of the time, depth 3 never
        nodes.observe(chain, [0, 1, 2], {0, 1} if i % 3 == 0 else {0})
    # p ~ 1, 1/3, 0: rates k=0 1/1, k=1 2/1.5 = 1.33, k=2 2.33/2 = 1.17, k=3 2.33/2.5
    for slope, want in ((0.5, 1), (0.1, 2), (1.0, 0)):  # at t(q) = q nothing beats an AR step
        controller = Controller(lambda q, kind=CHAIN, s=slope: 1.0 + s * (q - 1))
        controller.streams["s"] = nodes
        assert controller.size("s", 3) == want, slope
    controller = Controller(lambda q, kind=CHAIN: 1.0 + 0.5 * (q - 1))
    controller.streams["s"] = nodes
    assert controller.size("s", 3, cuts=[0, 2]) == 2 and controller.size("s", 0) == 0


def test_a_step_is_priced_at_its_context():
    """A longer context makes every extra verified token dearer (attention over more cached tokens), so the same
    statistics pick a shorter chain late in a long text than at its start; the controller prices a step at its
    context rounded down to ``CONTEXT_STEP`` (the prices are cached per step of text) and a cost without a context
    (``context`` None) is called without one."""
    chain = chain_parents(3)
    nodes = Stream()
    for i in range(200):  # p ~ 1, 1/3, 0
        nodes.observe(chain, [0, 1, 2], {0, 1} if i % 3 == 0 else {0})
    asked = []

    def cost(q, kind=CHAIN, context=0):
        asked.append(context)
        return 1.0 + (0.1 + context / 1000) * (q - 1)  # per extra token: 0.1 at context 0, ~0.5 at 384, ~1.1 at 1024

    controller = Controller(cost)
    controller.streams["s"] = nodes
    picks = {}
    for context in (0, 384 + auto.CONTEXT_STEP - 1, 1024):
        controller.context = context
        picks[context] = controller.size("s", 3)
    assert list(picks.values()) == [2, 1, 0], picks  # as in the test above at slopes 0.1, 0.5 and 1.0
    assert set(asked) == {0, 384, 1024}
    plain = Controller(lambda q, kind=CHAIN: 1.0 + 0.1 * (q - 1))  # no context set: priced as before
    plain.streams["s"] = nodes
    assert plain.context is None and plain.size("s", 3) == 2


def test_a_draft_models_catch_up_from_an_empty_cache_is_priced_at_its_contexts():
    """A draft model fed 1,200 tokens from an empty cache pays that block at context 0, and saves the one-token
    forward it replaces at the text's end: at one context for both (as before) it priced long prompts' catch-ups
    1.8x what they cost."""
    from specnoise.decoding.speculative import catch_up_cost

    def cost(q, kind=CHAIN, context=None):
        return 1.0 + 0.01 * q + (0.0 if context is None else 0.001 * q * context)

    assert catch_up_cost(cost, 1200, cached=0) == pytest.approx(cost(1200, CHAIN, 0) - cost(1, CHAIN, 1199))
    assert catch_up_cost(cost, 1200, cached=0) < catch_up_cost(cost, 1200, cached=600) == pytest.approx(
        cost(1200, CHAIN, 600) - cost(1, CHAIN, 1799))
    assert catch_up_cost(cost, 1, cached=0) == 0.0


def test_a_template_pick_is_the_likeliest_nodes_and_stays_a_tree():
    parents = [-1, -1, 0, 0, 2]  # root -> 0, 1; 0 -> 2, 3; 2 -> 4
    nodes = Stream()
    for i in range(300):  # node 1 wins 3 steps in 4, else the path 0 -> 2 -> 4
        nodes.observe(parents, [0, 1, 2, 3, 4], {1} if i % 4 else {0, 2, 4})
    controller = Controller(lambda q, kind=CHAIN: 1.0 + 0.2 * (q - 1))
    controller.streams["t"] = nodes
    pick = controller.select("t", parents)
    assert pick[0] in (0, 1) and all(parents[i] < 0 or parents[i] in pick for i in pick)
    assert 1 in pick and 3 not in pick  # node 3 never wins
    without = controller.select("t", parents, allow=[True, False, True, True, True])
    assert 1 not in without and all(parents[i] < 0 or parents[i] in without for i in without)


def test_a_child_never_outranks_its_parent_by_rounding():
    """A node accepted every time its parent was (hits = trials) must score its parent's p, never one ulp above (the
    product taken before the division did, on HumanEval: a pick without the node's parent, which Token Recycling's
    tree builder refused). Over many parents' statistics, and through the pick itself."""
    import random

    rng = random.Random(0)
    for _ in range(2000):
        nodes = Stream()
        t0, t1 = rng.uniform(1, 50), rng.choice([0.98, 1.98, 2.9404, rng.uniform(0, 40)])
        nodes.trials, nodes.hits = [t0, t1], [rng.uniform(0, t0), t1]
        p = nodes.p([-1, 0])
        assert p[1] <= p[0], (nodes.trials, nodes.hits, p)
    controller = Controller(lambda q, kind=CHAIN: 1.0 + 0.01 * q)
    controller.streams["t"] = nodes = Stream()
    nodes.trials, nodes.hits = [3.881592, 1.98], [2.9211919999999996, 1.98]
    assert controller.select("t", [-1, 0]) == [0, 1]  # the parent kept with its child, never the child alone


def test_the_rates_of_a_nodes_children_add_up_to_one_at_most():
    """At most one child of a node is right, so its children's conditional rates add up to 1 at most, the earlier
    (the drafter's likelier) first. Four children of the root, each right a quarter of the time: (hits + 1) / (trials
    + 2) gives each ~0.3, 1.2 in all, and a cost of 0.28 of a step per verified token bought all four; capped, the
    fourth is left what the first three leave, ~0.1, and the pick is three. Untried children share their parent's
    path at even odds, the first one first."""
    parents = [-1, -1, -1, -1]
    nodes = Stream()
    for i in range(8):
        nodes.observe(parents, [0, 1, 2, 3], {i % 4})
    p = nodes.p(parents)
    assert min(p[:3]) > 0.28 and p[3] < 0.15 and sum(p) == pytest.approx(1.0)
    controller = Controller(lambda q, kind=CHAIN: 1.0 + 0.28 * (q - 1))
    controller.streams["t"] = nodes
    assert controller.select("t", parents) == [0, 1, 2]
    assert Nodes().p([-1, -1, 0, 1]) == [0.5, 0.5, 0.25, 0.25]  # nothing seen: even odds, the siblings' sum 1


def test_untried_nodes_take_even_odds_after_their_parent_and_exploration_looks_past_the_pick():
    nodes = Stream()
    assert nodes.p(chain_parents(3)) == [0.5, 0.25, 0.125]  # nothing seen yet: even odds at every depth
    for _ in range(50):
        nodes.observe(chain_parents(1), [0], set())  # depth 1 proposed, never accepted
    p = nodes.p(chain_parents(3))
    assert p[0] < 0.05 and p[1] == pytest.approx(p[0] / 2) and p[2] == pytest.approx(p[0] / 4)
    controller = Controller(lambda q, kind=CHAIN: 1.0 + 0.5 * (q - 1))
    controller.streams["s"] = nodes
    sizes = [controller.size("s", 8) for _ in range(EXPLORE)]
    assert sizes.count(0) == EXPLORE - 1 and sorted(set(sizes)) == [0, auto.PROBE]


def test_exploration_backs_off_while_it_does_not_pay_and_returns_when_it_does():
    """Where the best pick is an AR step, a stream whose explorations do not pay explores at steps 16, 48, 112, 240,
    ... (the gap doubling up to EXPLORE_MAX); one that pays brings the gap back to EXPLORE. A new generation explores
    at its 16th step, then, if that does not pay, goes on at the gap the last one reached."""
    cost = lambda q, kind=CHAIN: 1.0 + 0.5 * (q - 1)  # noqa: E731 - PROBE = 4 drafts cost 2.5 AR steps
    controller = Controller(cost)
    controller.streams["s"] = nodes = Stream()
    nodes.trials, nodes.hits = [100.0] * 8, [1.0] * 8  # never accepted: the best pick is empty
    explored = explorations(controller, 600, accepted=0)
    assert explored[:4] == [EXPLORE, 3 * EXPLORE, 7 * EXPLORE, 15 * EXPLORE], explored
    assert [b - a for a, b in zip(explored[3:], explored[4:])] == [acceptance.EXPLORE_MAX] * (len(explored) - 4)
    controller.begin()  # a new generation: the 16th step explores again, then the gap is EXPLORE_MAX still
    gap = acceptance.EXPLORE_MAX
    assert explorations(controller, EXPLORE + gap, accepted=0) == [EXPLORE, EXPLORE + gap]
    controller.begin()
    # 5 tokens for 2.5 steps' price: each exploration pays
    explored = explorations(controller, 4 * EXPLORE, accepted=auto.PROBE)
    assert explored == [EXPLORE, 2 * EXPLORE, 3 * EXPLORE, 4 * EXPLORE], explored
    # a drafter that explorations feed (Drafter.backoff): every EXPLORE-th step, while an exploration costs at most
    # auto.DEAR AR steps (dearer ones back off: test_an_exploration_dearer_than_two_ar_steps_backs_off_...)
    controller.backoff = False
    controller.cost = lambda q, kind=CHAIN: 1.0 + 0.2 * (q - 1)  # PROBE = 4 drafts cost 1.8 AR steps
    assert explorations(controller, 8 * EXPLORE, accepted=0) == [EXPLORE * i for i in range(1, 9)]


def test_an_exploration_that_loses_much_waits_until_its_loss_is_a_small_share():
    """An exploration that does not pay and loses L AR steps against the AR steps it replaced (by its price, a draft
    model's whole catch-up included) is followed by the next one L / EXPLORE_SHARE steps later where that is longer
    than the doubled gap: explorations that never pay cost EXPLORE_SHARE of the run at most. Where the steps are timed,
    the time judges whether it paid, not how long the gap is (one slow step would set a long one)."""

    def explored(accepted: int, slope: float = 0.5, seconds: float | None = None, catch_up: float = 0.0,
                 steps: int = 600, draft: bool = True) -> list[int]:
        cost = lambda q, kind=CHAIN: 1.0 + slope * (q - 1)  # noqa: E731 - slope 0.5: PROBE = 4 drafts cost 3 AR steps
        controller = (Controller(cost, draft_cost=lambda stream, k: 0.0, catch_up=lambda stream: catch_up) if draft
                      else Controller(cost))
        controller.room = 1000
        controller.streams["s"] = nodes = Stream()
        nodes.trials, nodes.hits = [100.0] * 8, [1.0] * 8  # never accepted: the best pick is empty
        if seconds is not None:
            controller.times = calibration.StepTimes()
            controller.times.add(seconds=1.0, forwards=0.9, drafted=False, measured=0.9, priced=1.0)
        return explorations(controller, steps, accepted, CHAIN, seconds)

    share = acceptance.EXPLORE_SHARE
    assert explored(0) == [EXPLORE + round(i * 2.0 / share) for i in range(3)]  # 3 steps' price, 1 token: 2 lost
    # 2 tokens: 1 step lost, 100 steps on (then the doubled gap, 128, is the longer)
    assert explored(1)[:3] == [EXPLORE, EXPLORE + round(1.0 / share), EXPLORE + round(1.0 / share) + 128]
    # a draft model's catch-up of 2 AR steps, paid whole by the exploration (below its own step's price: it explores)
    assert explored(0, catch_up=2.0, steps=1000) == [EXPLORE + round(i * 4.0 / share) for i in range(3)]
    # timed (an AR step of 1 s, 0.1 of it host work, which the prices now carry): not paid, the gap by price alone
    slow, slower = explored(0, seconds=3.5), explored(0, seconds=7.0)
    assert slow[:2] == slower[:2] and slow[1] - slow[0] > 128
    # a loss below EXPLORE_SHARE of the doubled gap (1.3 steps' price, 0.3 lost) leaves the doubling as it was, and so
    # does any loss of a drafter without a draft model (it explores anew in every generation)
    doubling = [EXPLORE, 3 * EXPLORE, 7 * EXPLORE, 15 * EXPLORE]
    assert explored(0, slope=0.075)[:4] == explored(0, draft=False)[:4] == doubling


def test_an_ar_step_that_nothing_moved_is_not_ranked_again():
    """After an AR step the next one is not ranked and priced again while its statistics, its context step and its
    candidates' tree stay (another tree of as many nodes, as REST's tries change, is ranked); the picks are those of
    a controller that ranks every step."""
    cost = lambda q, kind=CHAIN, context=None: 1.0 + 0.5 * (q - 1) + (context or 0) / 1000  # noqa: E731

    def run(rank_every_step: bool) -> tuple[list[int], int]:
        controller = Controller(cost)
        controller.streams["s"] = nodes = Stream()
        nodes.trials, nodes.hits = [100.0] * 8, [1.0] * 8  # never accepted: the best pick is empty
        ranked, best = [], controller.best
        controller.best = lambda *a: ranked.append(1) or best(*a)
        picks = []
        for step in range(100):
            controller.context = 40 + step  # a new context step (CONTEXT_STEP) at steps 24 and 56
            if rank_every_step:
                nodes.version += 1
            picks.append(controller.size("s", 8 if step < 70 else 6))  # a shorter chain near a budget's end
            if picks[-1]:
                controller.observe(verdict(picks[-1], 0))
        return picks, len(ranked)

    (picks, ranked), (every, all_steps) = run(False), run(True)
    assert picks == every and all_steps == 100 and [i + 1 for i, k in enumerate(picks) if k] == [EXPLORE, 3 * EXPLORE]
    # ranked: the first step, each exploration and the step after it (an observation), each new context step (64, 96,
    # 128 tokens), the shorter chain
    assert ranked == 1 + 2 * 2 + 3 + 1, ranked
    controller = Controller(cost)  # a batch's row re-priced at another batch size ranks again
    controller.streams["s"] = nodes = Stream()
    nodes.trials, nodes.hits = [100.0] * 8, [1.0] * 8
    ranked, best = [], controller.best
    controller.best = lambda *a: ranked.append(1) or best(*a)
    controller.size("s", 8), controller.size("s", 8)
    assert len(ranked) == 1
    controller.size("s", 8, parents=[-1, -1, 0, 1, 2, 3, 4, 5])  # another tree of 8 nodes: ranked
    controller.cost = lambda q, kind=CHAIN, context=None: 1.0  # drafting is free now
    assert controller.size("s", 8) == 8 and len(ranked) == 3


def test_a_draft_models_explorations_count_their_steps_across_generations():
    """An exploration of a drafter with a draft model first catches the draft model up with the whole text: a new
    generation does not explore at its EXPLORE-th step, its streams go on counting where the last generation left off
    (one exploration every EXPLORE_MAX steps of the run while none pays, each losing 0.24 AR steps by its price: less
    than EXPLORE_SHARE of these gaps, test_an_exploration_that_loses_much_waits_until_its_loss_is_a_small_share)."""
    cost = lambda q, kind=CHAIN: 1.0 + 0.05 * (q - 1)  # noqa: E731 - nothing pays: the best pick is empty
    controller = Controller(cost, draft_cost=lambda stream, k: 0.01 * k, catch_up=lambda stream: 0.0)
    controller.streams["s"] = nodes = Stream()
    nodes.trials, nodes.hits = [100.0] * 8, [1.0] * 8
    controller.room = 100
    explored, step = [], 0
    for _ in range(12):  # 50-step generations
        controller.begin()
        for _ in range(50):
            step += 1
            k = controller.size("s", 8, kind=CHAIN)
            if k:
                explored.append(step)
                controller.observe(verdict(k, 0))
    assert explored[:4] == [EXPLORE, 3 * EXPLORE, 7 * EXPLORE, 15 * EXPLORE], explored
    assert [b - a for a, b in zip(explored[3:], explored[4:])] == [acceptance.EXPLORE_MAX] * (len(explored) - 4)


def test_a_draft_models_catch_up_is_shared_by_the_tokens_still_to_come():
    """Drafting 2 tokens, each accepted 9 times in 10, pays at a draft forward of 0.1 AR steps; a catch-up of 2 AR
    steps (the draft model fed a long prompt first) still pays with 100 tokens to come, not with 2 tokens left."""
    cost = lambda q, kind=CHAIN: 1.0 + 0.1 * (q - 1)  # noqa: E731
    nodes = Stream()
    nodes.trials, nodes.hits = [100.0, 100.0], [90.0, 90.0]
    for room, want in ((100, 2), (2, 0)):
        controller = Controller(cost, draft_cost=lambda stream, k: 0.1 * k, catch_up=lambda stream: 2.0)
        controller.streams["s"] = nodes
        controller.room = room
        assert controller.size("s", 2, kind=CHAIN) == want, room


def test_an_exploration_that_would_pay_a_long_catch_up_waits():
    """Where the best pick is an AR step, an exploration drafts (PROBE tokens) unless the draft model's catch-up costs
    more than the exploration's own step (a draft model behind a long prompt): then it waits as one that did not pay
    would, the gap doubling all the same."""
    cost = lambda q, kind=CHAIN: 1.0 + 0.05 * (q - 1)  # noqa: E731 - nothing pays: the best pick is empty
    # the exploration's own step: 1.24 AR steps (with a catch-up of 0.05, 0.29 lost: the doubling stays)
    for catch_up, explored in ((0.05, [EXPLORE, 3 * EXPLORE]), (50.0, [])):
        controller = Controller(cost, draft_cost=lambda stream, k: 0.01 * k, catch_up=lambda stream, c=catch_up: c)
        controller.streams["s"] = nodes = Stream()
        nodes.trials, nodes.hits = [100.0] * 8, [1.0] * 8
        controller.room = 100
        steps = explorations(controller, 4 * EXPLORE, kind=CHAIN)
        assert steps == explored and nodes.explore.gap == 4 * EXPLORE, (catch_up, steps)


def test_rest_skips_its_corpus_lookup_at_steps_that_cannot_draft(family):
    """A model that says 7 after anything finds a run of 7s in REST's corpus at every step; at a curve where no trie
    pays (t(q) = q), after its first trie REST looks the corpus up at one step in IDLE_RUN + 1 only, and its tokens
    stay AR's."""
    target = map_model(family, lambda i: 7)
    decoder = build("rest", target, None, "steep")
    store, looked = decoder.drafter.store, []
    longest = store.longest_suffix
    store.longest_suffix = lambda *a: looked.append(decoder.drafter.steps) or longest(*a)
    try:
        out = decoder.generate(list(range(20, 40)), 64)
    finally:
        del store.longest_suffix
    assert out.tokens == [7] * 64 and decoder.drafter.steps == len(out.accepted)
    # steps 1 and 2 find no match (the text does not end in a run of 7s yet), step 3 the first trie
    assert looked[:3] == [1, 2, 3] and len(looked) < len(out.accepted) / 2, looked
    assert all(b - a <= auto.IDLE_RUN + 1 for a, b in zip(looked, looked[1:])), looked


def test_an_ouroboros_ar_step_is_a_plain_one_token_forward(target, draft):
    """An AR step of Ouroboros with auto is fed as AR's is, without a 4D mask (with one it cost 6-12% more at
    Spec-Bench's 1,200-token contexts on the CPU), and reads back its verdict alone, as AR's (the target's argmax at
    every row feeds the phrase pool, which an AR step does not); its drafting steps keep the phrase tree's mask."""
    decoder = build("ouroboros", target, draft, "steep")
    calls, reads = [], []  # what the model itself is given, not what the engine logs; the target's reads per step
    hook = target.model.register_forward_pre_hook(
        lambda module, args, kwargs: calls.append(kwargs.get("attention_mask") is not None), with_kwargs=True)
    to_host = decoder.to_host
    decoder.to_host = lambda tensor: reads.append((len(calls), tensor.numel())) or to_host(tensor)
    try:
        out = decoder.generate(PROMPTS[0], NEW_TOKENS)
    finally:
        hook.remove()
    sizes = [k for _, k in decoder.auto.sizes]
    assert len(calls) == len(sizes) == out.target_forwards and 0 in sizes[1:] and max(sizes) > 0
    assert calls[1:] == [k > 0 for k in sizes[1:]] == [masked for _, masked, _ in out.forward_log[1:]]
    verdicts: dict[int, int] = {}  # a target step's verdict is the first read after its forward (then the drafts')
    for forwards, n in reads:
        verdicts.setdefault(forwards, n)
    assert all(verdicts[i + 1] == 3 for i, k in enumerate(sizes) if i and not k)  # [accepted, bonus, path]


def test_ouroboros_prices_its_first_draft_token_at_a_whole_lookahead_step(target, draft):
    """The draft model runs whole lookahead steps: k drafts cost k / (tokens per step) steps of the mean block, but
    never less than one step, which even a single draft takes."""
    decoder = build("ouroboros", target, draft, "steep")
    drafter, step = decoder.drafter, lambda block: decoder.curves["draft"](block, TREE, len(drafter.seq))
    decoder.generate(PROMPTS[0], NEW_TOKENS)
    drafter.drafted = [10, 25, 90]  # 2.5 tokens and 9 rows per lookahead step so far
    assert drafter.draft_cost("ouroboros", 0) == 0.0
    assert drafter.draft_cost("ouroboros", 1) == drafter.draft_cost("ouroboros", 2) == pytest.approx(step(9))
    assert drafter.draft_cost("ouroboros", 5) == pytest.approx(2 * step(9))


def test_drafters_fed_by_their_explorations_do_not_back_off(target, draft):
    fed = {name for name in DRAFTERS if not decoder_class(name).drafter_class.backoff}
    assert fed == {"tr_jacobi", "token_recycling", "sam"}


def test_a_real_run_tells_the_controller_whether_to_back_off(target, draft, tmp_path):
    for name, backoff in (("pld", True), ("tr_jacobi", False)):
        decoder = build_decoder(schema(name, auto=True, cost_cache=str(tmp_path)), target, draft)
        decoder.generate(PROMPTS[0], 4)
        assert decoder.auto.backoff is backoff, name


def test_draft_forwards_are_priced_at_what_they_took_over_their_price_relative_to_the_targets():
    """``DraftScale``: the draft's measured over priced seconds, over the target's, from forwards the curves probed
    (a prefill or a catch-up past ``largest`` tokens is left out), the past generations weighing SCALE_FORGET."""
    curve = lambda q, kind=CHAIN, context=None: 0.001 * q * (2 if kind == TREE else 1)  # noqa: E731
    scale = calibration.DraftScale(largest=8)
    assert scale.scale == 1.0
    # the target's forwards took 1.5x their price (a 100-token one, past the grid, 10x: left out)
    scale.add("target", [(1, False, 10)] * 4 + [(100, False, 0)], [0.0015] * 4 + [1.0], curve)
    assert scale.scale == 1.0  # no draft forward yet
    scale.add("draft", [(1, False, 10), (3, True, 11), (50, False, 0)], [0.003, 0.018, 9.0], curve)  # 3x
    assert scale.scale == pytest.approx(2.0)
    scale.add("draft", [(1, False, 10)], [0.0015], curve)  # a generation at 1.5x: the past weighs 0.9
    f = calibration.SCALE_FORGET
    assert scale.scale == pytest.approx((0.021 * f + 0.0015) / (0.007 * f + 0.001) / 1.5)
    # a draft slowed less than the target is priced at its curve still (its host work is in no clock)
    cheaper = calibration.DraftScale(largest=8)
    cheaper.add("target", [(1, False, 10)], [0.0015], curve)
    cheaper.add("draft", [(2, True, 10)], [0.0048], curve)  # 1.2x
    assert cheaper.scale == 1.0


def test_a_run_scales_its_draft_prices_by_its_own_forwards_but_not_a_pinned_curves(target, draft, tmp_path):
    """After each generation with auto, a decoder with a draft model sets ``draft_scale`` from its engines' per-forward
    clocks and logs (recorded in its meta), and its draft prices carry it; on a pinned curve (a committed study's) the
    prices stay as committed."""
    decoder = build_decoder(schema("speculative", auto=True, cost_cache=str(tmp_path)), target, draft)
    out = decoder.generate(PROMPTS[0], 24)
    assert len(decoder.target.clock.laps) == out.target_forwards and len(decoder.draft.clock.laps) == out.draft_forwards
    assert sum(decoder.draft.clock.laps) == pytest.approx(out.draft_seconds)
    scale, sums = decoder.draft_scale, decoder.scales.sums
    assert sums["target"][0] > 0 and sums["draft"][0] > 0 and sums["target"][1] > 0 and sums["draft"][1] > 0
    assert scale == decoder.scales.scale >= 1.0 and decoder.meta["auto"]["draft_scale"] == scale
    assert sums["target"][0] < out.target_seconds  # the prefill left out
    drafter, curve = decoder.drafter, decoder.curves["draft"]
    assert drafter.draft_cost("speculative", 3) == pytest.approx(3 * curve(1, CHAIN, len(drafter.seq)) * scale)
    pinned = build_decoder(schema("speculative", auto=True, cost_cache=str(tmp_path / "pinned.json")), target, draft)
    pinned.generate(PROMPTS[0], 24)
    assert not pinned.curves["target"].pinned  # written by this first run, which probed it: calibrated
    again = build_decoder(schema("speculative", auto=True, cost_cache=str(tmp_path / "pinned.json")), target, draft)
    for prompt in PROMPTS:
        again.generate(prompt, 24)
    assert again.curves["target"].pinned and again.curves["draft"].pinned and again.draft_scale == 1.0
    assert again.scales is None  # nothing kept
    assert again.meta["auto"]["draft_scale"] == 1.0


def test_step_times_price_host_work_in_curve_seconds_and_forget_per_step():
    """``StepTimes``: host work (a step's wall time outside its forwards) per kind of step, in the curve's seconds (over
    what AR steps' forwards take over their price); a drafted step carries an AR step's until one was timed."""
    times = calibration.StepTimes()
    assert times.step_host(False) == times.step_host(True) == 0.0
    times.add(seconds=0.013, forwards=0.012, drafted=False, measured=0.012, priced=0.010)  # 1.2x its price
    assert times.ar_seconds == 0.013 and times.pace == pytest.approx(1.2)
    assert times.step_host(False) == times.step_host(True) == pytest.approx(0.001 / 1.2)
    # a drafted step (a draft model's forwards among its forwards: only the target's set the pace)
    times.add(seconds=0.030, forwards=0.024, drafted=True, measured=0.018, priced=0.015)
    assert times.pace == pytest.approx(1.2) and times.ar_seconds == 0.013
    assert times.step_host(True) == pytest.approx(0.006 / 1.2) and times.step_host(False) == pytest.approx(0.001 / 1.2)
    times.add(seconds=0.011, forwards=0.010, drafted=False, measured=0.010, priced=0.010)
    f = calibration.STEP_FORGET
    assert times.pace == pytest.approx(1.2 * f + 1.0 * (1 - f))
    assert times.ar_seconds == pytest.approx(0.013 * f + 0.011 * (1 - f))
    assert times.step_host(False) == pytest.approx(0.001 / 1.2 * f + 0.001 / times.pace * (1 - f))
    described = times.describe()
    assert described["host_ms"]["drafted_step"] == pytest.approx(5.0, abs=1e-3) and described["ar_step_ms"] > 0
    # what came before the choice (a lookup) is sunk when choosing: the choice prices the rest, ``idle`` the whole
    looked = calibration.StepTimes()
    looked.add(seconds=0.013, forwards=0.010, drafted=True, measured=0.010, priced=0.010, before=0.002)
    assert looked.step_host(True) == pytest.approx(0.001) and looked.step_host(True, whole=True) == pytest.approx(0.003)
    drafting = calibration.StepTimes()  # a run of drafted steps only (TR-Jacobi on code): priced by its own pace
    drafting.add(seconds=0.030, forwards=0.024, drafted=True, measured=0.024, priced=0.020)
    assert drafting.step_host(True) == pytest.approx(0.005) and drafting.ar_seconds is None


def test_host_work_is_priced_on_top_of_the_forwards():
    """A drafted step's host work can make an AR step the better pick, where the forwards alone say draft."""
    chain = chain_parents(3)
    nodes = Stream()
    for _ in range(200):  # depth 1 always accepted, the rest never: k = 1 gives 2 tokens
        nodes.observe(chain, [0, 1, 2], {0})
    picks = {}
    for host in (0.0, 0.5, 2.0):  # seconds of host work per drafted step (an AR step's: 0.1)
        controller = Controller(lambda q, kind=CHAIN: 1.0 + 0.2 * (q - 1))
        controller.streams["s"] = copy.deepcopy(nodes)
        controller.times = calibration.StepTimes()
        controller.times.pace, controller.times.after = 1.0, [0.1, host]
        picks[host] = controller.size("s", 3, CHAIN)
    # k = 1: 2 tokens / (1.2 + host) against 1 / 1.1
    assert picks == {0.0: 1, 0.5: 1, 2.0: 0}
    # asked before its lookup (``idle``), a step is priced with its host work before the choice too
    controller.times.after, controller.times.host = [0.1, 0.5], [0.1, 2.0]
    assert controller.size("s", 3, CHAIN) == 1 and controller.idle("s", chain, CHAIN)
    controller.times = None
    assert controller.size("s", 3, CHAIN) == 1  # priced by the forwards alone


def test_an_exploration_is_judged_by_its_time_when_the_steps_are_timed():
    """Past an AR best pick an exploration drafts; with step times it paid when its tokens per second of wall time beat
    an AR step's, whatever its price said (its gap to the next one doubles when it did not)."""
    chain = chain_parents(2)
    gaps = {}
    for name, seconds in (("priced", None), ("slow", 3.5), ("fast", 2.5)):
        controller = Controller(lambda q, kind=CHAIN: 1.0 + 0.5 * (q - 1))
        nodes = controller.nodes_of("s")
        for _ in range(200):
            nodes.observe(chain, [0, 1], set())  # the statistics: drafting never pays (an AR best pick)
        if seconds is not None:
            controller.times = calibration.StepTimes()
            controller.times.add(seconds=1.0, forwards=0.9, drafted=False, measured=0.9, priced=1.0)
        for _ in range(acceptance.EXPLORE):
            k = controller.size("s", 2, CHAIN)
            tokens = [1] * (k + 1)
            controller.observe(SimpleNamespace(shape=SimpleNamespace(nodes=k), accepted=k, path=list(range(k + 1)),
                                               tokens=tokens))  # (this step every draft is accepted)
            if seconds is not None:
                controller.timed(seconds if k else 1.0, 0.9, bool(k), 0.9, 1.0)
        assert k == 2 and nodes.explore.steps == acceptance.EXPLORE  # the last step explored, past an AR best pick
        gaps[name] = nodes.explore.gap
    # by price: 3 tokens / 2 s > 1 / 1 s; by time: 3 tokens in 3.5 s do not beat 1 a second, in 2.5 s they do
    assert gaps == {"priced": acceptance.EXPLORE, "slow": 2 * acceptance.EXPLORE, "fast": acceptance.EXPLORE}


def test_a_run_times_its_steps_but_not_on_a_pinned_curve(target, draft, tmp_path):
    """With a curve probed on this machine a CPU run times its steps after the prefill: host work per AR and drafted
    step (recorded in meta); on a pinned curve (a committed study's) its choices come from the prices alone."""
    decoder = build_decoder(schema("pld", auto=True, cost_cache=str(tmp_path / "pinned.json")), target, draft)
    timed = []
    decoder.generate(PROMPTS[0], 4)
    decoder.auto.timed = lambda *args, f=decoder.auto.timed: timed.append(args) or f(*args)
    out = decoder.generate(PROMPTS[1], 24)
    times = decoder.auto.times
    assert len(timed) == out.target_forwards - 2  # not the prefill, not the last step
    assert all(seconds > forwards >= measured > 0 and priced > 0 and 0 <= before < seconds - forwards
               for seconds, forwards, _, measured, priced, before in timed)
    assert any(before > 0 for *_, before in timed)  # PLD looks for its match, then asks (a step without one: no ask)
    assert times.ar_seconds > 0 and times.host[0] > 0 and decoder.meta["auto"]["host_ms"]["ar_step"] > 0
    again = build_decoder(schema("pld", auto=True, cost_cache=str(tmp_path / "pinned.json")), target, draft)
    again.generate(PROMPTS[0], 8)
    assert again.curves["target"].pinned and again.auto.times is None and "host_ms" not in again.meta["auto"]


def test_lookaheads_window_backs_off_in_a_run_of_ar_steps(target, draft):
    """Where its n-grams never pay and its window is not nearly free (the steep curve), Lookahead runs the window on
    the steps the backoff explores, not on every EXPLORE-th one: 5 windows in 400 AR steps, not 25."""
    decoder = build("lookahead", dataclasses.replace(target, eos_ids=frozenset()), draft, "steep")
    steps, windowed, propose = [0], [], decoder.drafter.propose

    def spy(room):
        proposal = propose(room)
        steps[0] += 1
        if decoder.drafter.windowed:
            windowed.append(steps[0])
        return proposal

    decoder.drafter.propose = spy
    out = decoder.generate(PROMPTS[0], 400)
    assert len(out.tokens) == steps[0] == 400  # every step a plain AR step
    gap = acceptance.EXPLORE_MAX
    assert windowed == [EXPLORE, 3 * EXPLORE, 7 * EXPLORE, 7 * EXPLORE + gap, 7 * EXPLORE + 2 * gap], windowed


def lookahead_windows(target, over: float, tokens: int = 60) -> tuple[list[bool], int]:
    """Which steps of Lookahead with auto ran its window, where the window's forward costs ``over`` more than an AR
    step's; and the generation's forwards."""
    cost = lambda q, kind=CHAIN, context=None: 1.0 if q <= 1 else 1.0 + over  # noqa: E731
    decoder = build_decoder(schema("lookahead", auto=True), dataclasses.replace(target, eos_ids=frozenset()), None)
    decoder.curves = {"target": cost}
    decoder.auto = Controller(cost, None, decoder.drafter.backoff)
    windowed, propose = [], decoder.drafter.propose

    def spy(room):
        proposal = propose(room)
        windowed.append(decoder.drafter.windowed)
        return proposal

    decoder.drafter.propose = spy
    return windowed, decoder.generate(PROMPTS[0], tokens).target_forwards


@pytest.mark.parametrize("over", [0.10, 0.40])
def test_lookaheads_window_runs_at_every_step_while_its_steps_pay(family, target, over):
    """Where the window's forward costs little more than an AR step's (1.10-1.28x on an H100's CUDA graphs), it runs at
    every step, as the faithful decoder's does, while the steps it ran emit more tokens per second than AR steps: for a
    model that repeats a 5-token cycle (its n-grams always right), all through the generation; for the random tiny
    model (faithful MAT ~1.1) for lookahead.WINDOW_TRIAL steps, then on the steps whose n-grams pay alone."""
    from specnoise.decoding import lookahead

    windowed, forwards = lookahead_windows(map_model(family, cycle_successor), over)
    assert all(windowed) and forwards < 60 / 3, (windowed, forwards)
    windowed, _ = lookahead_windows(target, over)
    assert all(windowed[:lookahead.WINDOW_TRIAL]) and not all(windowed), windowed


def test_lookaheads_window_past_near_free_runs_on_explorations_alone(family):
    """Past lookahead.WINDOW_NEAR (the CPU's 1.7-2.5x) the window runs on the backoff's explorations only, even for
    the cycle model whose n-grams would pay: its worth there is the backoff's to find (the steep-curve test above)."""
    from specnoise.decoding import lookahead

    windowed, _ = lookahead_windows(map_model(family, cycle_successor), lookahead.WINDOW_NEAR + 0.10)
    assert windowed.count(True) < len(windowed) / 4, windowed


def test_auto_is_one_key_on_every_decoder():
    for name, schema_class in DECODER_SCHEMAS.items():
        assert schema_class(auto=True).auto is True, name
    with pytest.raises(ConfigError, match="decoder.tree"):
        DECODER_SCHEMAS["tr_jacobi"](auto=True, tree="auto")


# ------------------------------------------------------------------------------------------ exactness
@pytest.mark.parametrize("curve", ["moderate", "steep"])
@pytest.mark.parametrize("name", DRAFTERS)
def test_auto_stays_lossless(name, curve, target, draft):
    decoder = build(name, target, draft, curve)
    for prompt in PROMPTS:
        out = decoder.generate(prompt, NEW_TOKENS)
        assert out.tokens == ar(target, prompt, NEW_TOKENS), f"{name} auto ({curve} curve) diverges from AR"
        assert sum(out.accepted) == len(out.tokens)
    assert "streams" in decoder.meta["auto"]


@pytest.mark.parametrize("name", DRAFTERS)
def test_auto_stays_lossless_on_the_static_engine(name, target, draft):
    decoder = build(name, static(target), static(draft))
    for prompt in PROMPTS:
        assert decoder.generate(prompt, NEW_TOKENS).tokens == ar(target, prompt, NEW_TOKENS)


@pytest.mark.parametrize("name", DRAFTERS)
def test_a_flat_curve_keeps_the_faithful_sizes(name, target, draft):
    """Extra candidates cost nothing: every step proposes all of them, the faithful decoder's very forwards (Token
    Recycling's with every row of its matrix taken as written: auto drafts nothing from an unwritten one, below)."""
    faithful = build_decoder(schema(name), target, draft)
    auto_on = build(name, target, draft, "flat")
    recycling = getattr(auto_on.drafter, "fallback", auto_on.drafter)
    if hasattr(recycling, "known"):
        recycling.known = Everything()
    for prompt in PROMPTS:
        assert auto_on.generate(prompt, NEW_TOKENS).accepted == faithful.generate(prompt, NEW_TOKENS).accepted


class Everything(set):
    def __contains__(self, item) -> bool:
        return True


def test_token_recycling_drafts_nothing_from_a_row_of_its_matrix_it_has_not_written(family):
    """decoder.auto: at a root whose row of the matrix Token Recycling has not written (no earlier block held the
    token: the block's tokens are read with each verdict), its tree would be drafted from zeros: an AR step instead,
    which writes the row. On a flat curve every other step drafts the whole template, and the tokens stay AR's."""
    target = map_model(family, cycle_successor)
    decoder = build("token_recycling", target, None, "flat")
    drafter, seen = decoder.drafter, []  # per step: whether the root's row was known, the nodes proposed
    propose = drafter.propose

    def spy(room):
        known = drafter.seq[-1] in drafter.known
        proposal = propose(room)
        seen.append((known, proposal.shape.nodes))
        return proposal

    drafter.propose = spy
    prompt = [3, 4, CYCLE[0]]
    out = decoder.generate(prompt, 24)
    assert out.tokens == ar(target, prompt, 24)
    assert seen[0] == (False, 0) and any(known for known, _ in seen)
    assert all(nodes == 0 for known, nodes in seen if not known)
    # (the template cut at the budget near the end)
    assert all(nodes > 0 for known, nodes in seen[:-3] if known) and max(n for _, n in seen) == len(drafter.template)
    decoder.reset_history()  # the matrix and what is known of it go together
    assert not drafter.known and not drafter.M.any()


@pytest.mark.parametrize("name", DRAFTERS)
def test_a_steep_curve_makes_plain_ar_steps(name, target, draft):
    """t(q) = q: no draft can pay, so apart from the exploration steps every step is an AR step (size 0)."""
    decoder = build(name, target, draft, "steep")
    out = decoder.generate(PROMPTS[0], NEW_TOKENS)
    sizes = [k for _, k in decoder.auto.sizes]
    assert sum(k > 0 for k in sizes) <= math.ceil(len(out.accepted) / EXPLORE)
    if name != "lookahead":  # its window, run on exploration steps too, is fed beside an empty tree
        assert sum(a > 1 for a in out.accepted) <= math.ceil(len(out.accepted) / EXPLORE)


# ------------------------------------------------------------------------------------------ sampling
@pytest.mark.parametrize("name", DRAFTERS)
def test_auto_samples_the_target_distribution(name):
    from test_sampling_decoders import OPTIONS, exact_marginals, sampled

    target, drafter = tiny_pair()
    target = dataclasses.replace(target, eos_ids=frozenset())
    cfg = schema(name, vocab=V, auto=True, **OPTIONS)
    exact = exact_marginals(target, cfg)
    got = sampled(with_curve(build_decoder(cfg, target, drafter), "moderate"))
    for j in range(3):
        assert tv(got[j], exact[j]) < TV_MAX, f"{name} auto: token {j + 1} off the target distribution"
    assert PROMPT


@pytest.mark.parametrize("name", [pytest.param(n, marks=() if n in ("tr_jacobi", "speculative") else pytest.mark.slow)
                                  for n in DRAFTERS])
def test_auto_in_a_batch_samples_the_target_distribution(name):
    """The distribution test with the generations run 4 at a time (one seed per row), each row slot sizing its own
    steps at its share of the batched forward: the sizes a row picks never bias what it samples."""
    from test_sampling_decoders import OPTIONS, exact_marginals

    target, drafter = tiny_pair()
    target = dataclasses.replace(target, eos_ids=frozenset())
    cfg = schema(name, vocab=V, auto=True, **OPTIONS)
    exact = exact_marginals(target, cfg)
    decoder = with_curve(build_decoder(cfg, target, drafter), "moderate")
    outs, sizes = [], set()
    for i in range(0, SAMPLES, 4):
        outs += [o.tokens for o in decoder.generate_batch([PROMPT] * 4, 3, seed=list(range(i, i + 4)))]
        sizes |= {k for row in decoder.row_decoders(4) for _, k in row.auto.sizes}
    for j in range(3):
        assert tv([o[j] for o in outs], exact[j]) < TV_MAX, f"{name} auto, B = 4: token {j + 1} off the target"
    assert decoder.meta["auto"]["batch"] == 4
    # the rows' own controllers chose drafts (PLD's and Lookahead's n-grams never occur in 3-token outputs of a
    # 3-token prompt: they have nothing to size here, as in the batch-1 test)
    assert name in ("pld", "lookahead") or sizes - {0}, sizes


def test_a_graph_engines_template_pick_changes_only_for_a_clear_gain():
    """On an engine that records each step shape as a CUDA graph (auto.STICKY), the last template pick stays unless
    the best one is that much better in expected tokens per second: every ranked step's pick is the best or within
    the margin of it, and the picks change far less often (on an H100 TR-Jacobi made 41 distinct picks over 8
    prompts, each a new recording). Between rankings (every auto.RERANK-th step, and explorations) the pick stays."""
    import copy
    import random

    parents = [-1, -1, -1, 0, 0, 1, 3, 3, 6, 6, 8, 8]
    chance = [0.5, 0.3, 0.1, 0.6, 0.3, 0.5, 0.5, 0.4, 0.5, 0.3, 0.5, 0.4]  # of each node, given its parent's
    cost = lambda q, kind=CHAIN: 1.0 + 0.03 * q  # noqa: E731

    def rate(controller, pick):
        p = controller.streams["t"].p(parents)
        return (1 + sum(p[i] for i in pick)) / cost(1 + len(pick))

    picks = {}
    for sticky in (0.0, auto.STICKY):
        rng, controller, seen, reused = random.Random(0), Controller(cost, sticky=sticky), [], 0
        for _ in range(600):
            plain = copy.deepcopy(controller)
            plain.sticky = 0.0
            best = plain.select("t", parents)
            last = controller.streams["t"].last if "t" in controller.streams else None
            explores = "t" in controller.streams and controller.streams["t"].explore.pending()
            pick = controller.select("t", parents)
            if controller.streams["t"].kept and not explores:  # between rankings the last ranked pick stays as it is
                reused += 1
                assert sticky and pick == sorted(last) and controller.streams["t"].last is last
            else:
                assert pick == best or rate(controller, pick) * (1 + sticky) >= rate(controller, best)
            path = [0]  # the accepted path: each kept child of the last accepted node by its chance
            while True:
                children = [i for i in pick if parents[i] == (pick[path[-1] - 1] if len(path) > 1 else -1)]
                won = next((i for i in children if rng.random() < chance[i]), None)
                if won is None:
                    break
                path.append(pick.index(won) + 1)
            controller.observe(SimpleNamespace(accepted=len(path) - 1, shape=SimpleNamespace(nodes=len(pick)),
                                               path=path))
            seen.append(tuple(pick))
        # changes between two steps that do not explore (every EXPLORE-th step looks past the pick, then returns)
        calm = [i for i in range(1, len(seen)) if i % EXPLORE != EXPLORE - 1 and (i - 1) % EXPLORE != EXPLORE - 1]
        picks[sticky] = (sum(seen[i] != seen[i - 1] for i in calm), len(set(seen)))
        assert reused > 600 / 2 if sticky else not reused, reused
    assert 4 * picks[auto.STICKY][0] < picks[0.0][0] and picks[auto.STICKY][1] < picks[0.0][1], picks


def both_roots_right() -> Nodes:
    """Statistics of the template [-1, 0, 1, -1, 3, 0] whose two root children are both right at times (at most one
    child of a node is right: beside a sibling that always is, a node is worth nothing), so that every node pays on a
    flat curve."""
    nodes = Stream()
    nodes.trials, nodes.hits = [10.0] * 6, [5.0, 0.0, 0.0, 4.0, 0.0, 0.0]
    return nodes


def test_a_graph_engines_kept_template_is_ranked_ever_more_rarely():
    """On a graph engine a template whose rankings keep the pick is ranked ever more rarely (the interval doubles from
    auto.RERANK up to auto.RERANK_MAX), and a ranking that changes the pick starts over at RERANK: on an H100's flat
    curve the whole template stays, and ranking it cost host time at every 4th step."""
    parents = [-1, 0, 1, -1, 3, 0]
    flat = lambda q, kind=CHAIN: 1.0  # noqa: E731 - every size costs one AR step: the whole template pays
    controller = Controller(flat, sticky=auto.STICKY)
    controller.streams["t"] = both_roots_right()
    ranked = []
    for step in range(200):
        explores = "t" in controller.streams and controller.streams["t"].explore.pending()
        pick = controller.select("t", parents)
        nodes = controller.streams["t"]
        if not nodes.kept and not explores:
            ranked.append(step)
        assert pick == list(range(len(parents)))
        controller.observe(SimpleNamespace(accepted=1, shape=SimpleNamespace(nodes=len(pick)),
                                           path=[0, 1] if step % 3 else [0, 4]))
    # kept for 4, 8, 16, then 32 steps (explorations rank too, but their picks are not kept: they do not count)
    gaps = [b - a for a, b in zip(ranked, ranked[1:])]
    assert gaps[0] == auto.RERANK + 1 and gaps == sorted(gaps) and gaps[-1] > auto.RERANK_MAX, ranked
    assert nodes.rerank == auto.RERANK_MAX and len(ranked) <= 10, ranked
    # dear drafting: the next ranking drops the template, and the interval starts over
    controller.cost = lambda q, kind=CHAIN: 1.0 * q  # noqa: E731
    for _ in range(auto.RERANK_MAX + 1):
        pick = controller.select("t", parents)
        controller.observe(SimpleNamespace(accepted=0, shape=SimpleNamespace(nodes=len(pick)), path=[0]))
    assert len(nodes.last) < len(parents) and nodes.rerank == auto.RERANK


def test_a_graph_engines_kept_whole_template_is_observed_on_a_sample_and_never_ranked_to_explore(monkeypatch):
    """On a graph engine, while the pick is kept: every auto.OBSERVE_KEPT-th kept step is observed (the statistics
    move on those steps only), an exploration past a pick of the whole template keeps it without ranking (nothing lies
    beyond it), and near the budget the kept pick loses the nodes not allowed, and their descendants, unranked. Ranked
    at each of them, TR-Jacobi with auto ran 9% slower than faithful on an H100 with the same 68-node trees."""
    parents = [-1, 0, 1, -1, 3, 0]
    flat = lambda q, kind=CHAIN: 1.0  # noqa: E731 - every size costs one AR step: the whole template pays
    controller = Controller(flat, sticky=auto.STICKY)
    controller.streams["t"] = both_roots_right()
    ranked, observed, rank = [], [], Nodes.p
    monkeypatch.setattr(Nodes, "p", lambda self, *a: ranked.append(True) or rank(self, *a))  # counts rankings
    for step in range(200):
        nodes = controller.streams.get("t")
        kept, explores = (nodes.kept, nodes.explore.pending()) if nodes else (0, False)
        version = nodes.version if nodes else 0
        ranked.clear()
        pick = controller.select("t", parents)
        assert pick == list(range(len(parents)))
        controller.observe(SimpleNamespace(accepted=1, shape=SimpleNamespace(nodes=len(pick)),
                                           path=[0, 1] if step % 3 else [0, 4]))
        nodes = controller.streams["t"]
        observed.append(nodes.version > version)
        if nodes.kept > kept:  # a kept step: no ranking, observed every OBSERVE_KEPT-th
            assert not ranked and observed[-1] == (nodes.kept % auto.OBSERVE_KEPT == 0), step
        elif explores:
            raise AssertionError(f"step {step}: an exploration past the whole template ranked it")
    assert sum(observed) < 200 / 2 and any(observed[-auto.OBSERVE_KEPT:]), observed
    # near the budget: nodes 1 and 4 may not be chosen, so neither may node 2 (below node 1)
    allow = [True, False, True, True, False, True]
    ranked.clear()
    pick = controller.select("t", parents, allow=allow)
    assert pick == [0, 3, 5] and not ranked


def test_a_graph_engines_kept_prefix_keeps_its_size_up_to_the_steps_candidates(monkeypatch):
    """On a graph engine a prefix's pick (a chain, Lookahead's n-grams) is kept as a size between rankings: up to the
    candidates each step has (their count changes from step to step), all of them where the ranking took all, and an
    exploration past all of them does not rank; a drafter with a draft model ranks at every step (its price moves
    with the text its draft has not seen)."""
    import random

    flat = lambda q, kind=CHAIN: 1.0  # noqa: E731 - every size costs one AR step: all the candidates pay
    rng, ranked, rank = random.Random(1), [], Nodes.p
    monkeypatch.setattr(Nodes, "p", lambda self, *a: ranked.append(True) or rank(self, *a))  # counts rankings
    for draft in (None, lambda stream, k: 0.0):
        controller = Controller(flat, sticky=auto.STICKY, draft_cost=draft)
        counts = []
        for _ in range(120):
            n = rng.randrange(1, 9)  # this step's candidates
            nodes = controller.streams.get("t")
            explores = nodes is not None and nodes.explore.pending()
            ranked.clear()
            k = controller.size("t", n, CHAIN)
            assert k == n  # every size costs the same: all of them, ranked or kept
            counts.append((bool(ranked), explores))
            controller.observe(SimpleNamespace(accepted=min(k, 1), shape=SimpleNamespace(nodes=k),
                                               path=[0, 1][:min(k, 1) + 1]))
        if draft is None:
            assert controller.streams["t"].size == auto.ALL
            assert sum(r for r, _ in counts) <= 10 and not any(r for r, e in counts if e), counts
        else:
            assert all(r for r, _ in counts)
    # a drafter that asks before it looks for candidates (REST: ``idle``) is told to look, unranked, while a size is
    # kept (ranking the last trie there cost REST ~0.1 ms of host time per step on the CPU)
    controller = Controller(flat, sticky=auto.STICKY)
    k = controller.size("t", 8, CHAIN)
    controller.observe(SimpleNamespace(accepted=1, shape=SimpleNamespace(nodes=k), path=[0, 1]))
    ranked.clear()
    assert not controller.idle("t", chain_parents(8)) and not ranked
    # a kept size below all: the step verifies up to it, or as many as it has
    controller = Controller(lambda q, kind=CHAIN: 1.0 + 10.0 * (q > 4), sticky=auto.STICKY)  # noqa: E731
    for n in (8, 8, 2, 8):
        k = controller.size("t", n, CHAIN)
        controller.observe(SimpleNamespace(accepted=0, shape=SimpleNamespace(nodes=k), path=[0]))
        assert k == min(n, 3), (n, k)


def test_observing_a_pick_counts_the_tried_nodes_and_the_accepted_ones():
    """A node is tried when its parent's path was accepted (or it hangs off the root), and hit when it was accepted
    too: the statistics after observing random picks and paths equal that definition, whichever picks repeat (their
    layouts are remembered per pick)."""
    import random

    rng = random.Random(3)
    parents = [-1, -1, 0, 0, 1, 2, 2, 4, -1, 8]
    nodes, trials, hits = Stream(), [0.0] * len(parents), [0.0] * len(parents)
    picks = [[0, 1, 2, 3, 4, 5, 6, 7, 8, 9], [0, 2, 5, 8], [1, 4, 7, 8, 9]]
    for _ in range(300):
        pick = rng.choice(picks)
        accepted, node = set(), -1
        while True:  # a random accepted path through the pick
            children = [i for i in pick if parents[i] == node]
            if not children or rng.random() < 0.3:
                break
            node = rng.choice(children)
            accepted.add(node)
        nodes.observe(parents, pick, accepted)
        for i in pick:
            if parents[i] < 0 or parents[i] in accepted:
                trials[i] = trials[i] * acceptance.FORGET + 1
                hits[i] = hits[i] * acceptance.FORGET + (i in accepted)
    assert nodes.trials == trials and nodes.hits == hits and 0 < sum(hits) < sum(trials)
