"""decoder.auto in a lock-step batch (decoding/plan.py): each row priced at its share of the batched forward, one
size per step for the rows, the batch's explorations, lossless at B > 1."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from helpers_auto import DRAFTERS, NEW_TOKENS, PROMPTS, build, static
from helpers_decoding import ar, schema
from specnoise.decoding import auto
from specnoise.decoding.acceptance import EXPLORE, Backoff, Nodes
from specnoise.decoding.auto import Controller, Stream, chain_parents
from specnoise.decoding.base import build_decoder
from specnoise.decoding.cost import CHAIN, TREE, Curve
from specnoise.decoding.kv import DynamicEngine
from specnoise.decoding.plan import Batched, Plan


def test_a_batch_prices_a_rows_share_of_the_batched_forward():
    """At B rows a step costs t(B x q) / B per row: a forward's fixed cost is shared, so an AR step is cheaper per row
    and the same statistics buy a shorter draft than alone (the batch's baseline is batched AR)."""
    curve = lambda q, kind=CHAIN: 1.0 + 0.05 * q  # noqa: E731 - a fixed cost plus a per-token one
    assert Batched(curve, 4)(3, TREE) == pytest.approx(curve(12) / 4)
    picks = {}
    for rows in (1, 8):
        controller = Controller(Batched(curve, rows))
        nodes = controller.streams.setdefault("s", Stream())
        nodes.trials, nodes.hits = [100.0] * 8, [60.0] * 8  # every depth accepted 60% of the time
        picks[rows] = controller.size("s", 8, CHAIN)
    assert 0 < picks[8] < picks[1], picks


def test_a_batchs_curve_is_probed_on_the_batched_forward(target, tmp_path, monkeypatch):
    """A batch of B rows is priced by a curve of its own, timed on the lock-step forward of B rows of q tokens each
    (one forward of B x q tokens is no stand-in: on the CPU 4 rows of 8 cost 1.6x a 32-token forward). Every batched
    forward is masked, so a chain costs what a tree does; it is cached beside the batch-1 curve, in a file of its
    own, and a pinned curve file gets a sibling per batch size."""
    from specnoise.decoding import batch

    seen, forward = [], batch.BatchKV.forward  # (a spy: the rows of every batched forward, run as they are)
    monkeypatch.setattr(batch.BatchKV, "forward", lambda kv, asked: seen.append(len(asked)) or forward(kv, asked))
    kv = DynamicEngine(target.model)
    alone = Curve(kv, context=20, largest=4, cache_dir=str(tmp_path))
    assert not seen
    rows = Curve(kv, context=20, largest=4, cache_dir=str(tmp_path), rows=3)
    assert seen and set(seen) == {3}  # every probe a forward of 3 rows
    assert rows.key["rows"] == 3 and "rows" not in alone.key and rows.path != alone.path and rows.path.is_file()
    assert rows.times[CHAIN] == rows.times[TREE] and set(rows.times[TREE]) >= {1, 2, 3, 4}
    assert Batched(rows, 3)(2, TREE) == rows(2, TREE) / 3 == Batched(rows, 3)(2, CHAIN)
    with pytest.raises(ValueError, match="curve of 3 rows"):
        Batched(alone, 3)
    seen.clear()
    again = Curve(kv, context=20, largest=4, cache_dir=str(tmp_path), rows=3)
    assert again.cached and not seen and again.times == rows.times  # read back, not probed
    pinned = tmp_path / "pinned" / "curve.json"
    Curve(kv, context=20, largest=4, cache_dir=str(pinned))
    assert Curve(kv, context=20, largest=4, cache_dir=str(pinned), rows=2).path == pinned.with_name("curve.rows2.json")


def test_a_batchs_rows_verify_one_size_per_step(monkeypatch):
    """The batch pays for its largest block, so its rows share one size per step (``Plan``), from what every row
    offered at the step before: the size that saves the batch the most time per second it costs, each row's tokens
    saving its part of a step and the fixed part saved as far as the last rows (most tokens to come) all gain; a row
    with fewer candidates verifies them all. The first step is an AR step. A row whose statistics, candidates and
    prices did not move since its last ranking offers that ranking again without ranking anew (``Nodes.ranked``)."""
    ranked = []
    p = Nodes.p
    monkeypatch.setattr(Nodes, "p", lambda self, *a, **k: ranked.append(self) or p(self, *a, **k))
    cost = lambda q, kind=CHAIN: 1.0 + 0.02 * q  # noqa: E731 - split: a fixed 1.0, 0.02 per token per row
    plan, controllers = Plan(), []
    for rate, room in zip((0.9, 0.5, 0.05), (40, 40, 30)):  # drafts pass 90% of the time, 50%, 5%; the last row ahead
        controller = Controller(Batched(cost, 3), backoff=False)
        controller.plan, controller.room = plan, room
        nodes = controller.streams.setdefault("s", Stream())
        nodes.trials, nodes.hits = [1000.0] * 12, [1000.0 * rate] * 12
        controllers.append(controller)
    n = [12, 12, 2]  # the third row has only two candidates
    first = [c.size("s", k, CHAIN) for c, k in zip(controllers, n)]
    assert first == [0, 0, 0]  # nothing offered yet: an AR step
    alone = []
    for rate in (0.9, 0.5, 0.05):  # each row's own pick, outside a batch, at its share of the batch's forward
        row = Controller(lambda q, kind=CHAIN: cost(3 * q) / 3, backoff=False)
        row.streams["s"] = Stream()
        row.streams["s"].trials, row.streams["s"].hits = [1000.0] * 12, [1000.0 * rate] * 12
        alone.append(row.size("s", 12, CHAIN))
    assert alone[0] > alone[1] > alone[2] == 0
    del ranked[3:]  # (the rows alone ranked too)

    def planned(gains, last):  # what a step of size k saves per second: rows' parts, the fixed part by the last rows
        saved = [sum(0.02 * g[k] for g in gains) + min(gains[r][k] for r in last) for k in range(13)]
        return max(range(13), key=lambda k: (saved[k] / (1.0 + 3 * 0.02 * (1 + k)), -k))

    gains = [[1 + sum(rate ** d for d in range(1, min(k, m) + 1)) for k in range(13)] for rate, m in
             zip((0.9, 0.5, 0.05), n)]
    best = planned(gains, last=[0, 1])
    second = [c.size("s", k, CHAIN) for c, k in zip(controllers, n)]
    assert second == [best, best, min(best, 2)] and 2 < best < alone[0], (first, second, best, alone)
    for c in controllers:  # the statistics are the rows' own: nothing observed moves them here
        c.asked = None
    assert len(ranked) == 3  # the first step's rankings stand for the second's
    assert [c.size("s", k, CHAIN) for c, k in zip(controllers, n)] == second and len(ranked) == 3
    controllers[1].streams["s"].version += 1  # an observation: that row ranks anew, the same statistics the same
    assert [c.size("s", k, CHAIN) for c, k in zip(controllers, n)] == second and len(ranked) == 4
    # the last rows' weakest holds the batch back: with the 50% row ahead, the 90% row last alone, the batch drafts more
    controllers[1].room = 30
    [c.size("s", k, CHAIN) for c, k in zip(controllers, n)]
    more = planned(gains, last=[0])
    assert [c.size("s", k, CHAIN) for c, k in zip(controllers, n)][0] == more > best, (more, best)
    # rows without candidates this step (PLD's without a match) pay for the padded block too, and gain one token: a
    # last row among them holds the batch to AR steps
    controllers[1].room = 40
    n = [12, 0, 0]
    [c.size("s", k, CHAIN) for c, k in zip(controllers, n)]
    assert controllers[0].size("s", 12, CHAIN) == 0 == planned([gains[0], [1.0] * 13, [1.0] * 13], last=[0, 1])


def test_a_batchs_streams_share_one_size_per_step():
    """Every row's block is padded to the batch's largest, whichever stream its candidates came from (SAM: matched
    chains, its fallback's trees), so the batch sizes all of a decoder's streams at once: rows on two streams verify
    the size planned over both, as rows on one stream do. A row planned alone (as a stream with one row was) prices
    only its own share of the padded forward and buys a larger block."""
    cost = lambda q, kind=CHAIN: 1.0 + 0.02 * q  # noqa: E731 - split: a fixed 1.0, 0.02 per token per row

    def sizes(streams, rates=(0.9, 0.3)):
        plan, rows = Plan(), []
        for rate, stream in zip(rates, streams):
            row = Controller(Batched(cost, 2), backoff=False)
            row.plan, row.room = plan, 40
            nodes = row.streams.setdefault(stream, Stream())
            nodes.trials, nodes.hits = [1000.0] * 12, [1000.0 * rate] * 12
            rows.append(row)
        assert [row.size(s, 12, CHAIN) for row, s in zip(rows, streams)] == [0] * len(rows)  # the first step: AR
        return [row.size(s, 12, CHAIN) for row, s in zip(rows, streams)]

    one = sizes(["s", "s"])
    assert one[0] == one[1] > 0
    assert sizes(["sam", "token_recycling"]) == one
    alone = sizes(["sam"], rates=(0.9,))[0]
    assert alone > one[0], (alone, one)


def test_a_batch_drafts_for_the_rows_it_waits_for():
    """A lock-step batch ends with its last row, and its forward costs a fixed part plus a part per live row
    (``Batched.split``): drafting pays where it speeds up the rows with the most tokens still to come, all of them.
    Rows ahead that would gain do not buy drafts while the last one would not, nor do rows level with one that would
    not; the same rows with the last one gaining do. A row
    left alone in the batch is priced as at batch 1: it picks what it would alone, more than a share of the whole
    batch's forward would buy."""
    cost = lambda q, kind=CHAIN: 1.0 + 0.1 * q  # noqa: E731 - a fixed cost plus a per-token one
    assert Batched(cost, 4).split(3) == pytest.approx((1.0, 0.3))  # a + 4m = cost(12), a + m = cost(3)

    def sizes(rates, rooms, steps=2):
        plan, rows = Plan(), []
        for rate, room in zip(rates, rooms):
            row = Controller(Batched(cost, 4), backoff=False)
            row.plan, row.room = plan, room
            nodes = row.streams.setdefault("s", Stream())
            nodes.trials, nodes.hits = [1000.0] * 8, [1000.0 * rate] * 8
            rows.append(row)
        for _ in range(steps):  # the first step is an AR step, the second the plan's
            picks = [row.size("s", 8, CHAIN) for row in rows]
            for row in rows:
                row.asked = None  # (nothing verified: the statistics stay)
        return picks

    ahead = sizes([0.9, 0.9, 0.9, 0.05], [30, 30, 30, 40])  # the last row's drafts fail
    assert ahead == [0, 0, 0, 0], ahead
    level = sizes([0.9, 0.9, 0.9, 0.05], [40, 40, 40, 40])  # all four last: the batch waits for the one that fails
    assert level == [0, 0, 0, 0], level
    level = sizes([0.9, 0.9, 0.9, 0.9], [40, 40, 40, 40])  # all four last, all gaining
    assert level[0] > 0 and len(set(level)) == 1, level
    behind = sizes([0.9, 0.9, 0.9, 0.05], [40, 30, 30, 30])  # the last row's drafts pass
    assert behind[0] > 0 and len(set(behind)) == 1, behind
    alone = Controller(cost)
    alone.streams["s"] = Stream()
    alone.streams["s"].trials, alone.streams["s"].hits = [1000.0] * 8, [500.0] * 8
    tail = sizes([0.5], [40])
    assert tail == [alone.size("s", 8, CHAIN)] and tail[0] > 0 == sizes([0.5], [40], steps=1)[0], tail


def test_a_batchs_rows_skip_their_lookup_while_the_batch_takes_ar_steps():
    """A drafter whose lookup is host work (REST) asks ``idle`` first: in a batch a row skips it while the batch's
    size for the step is 0 and the step does not explore, offering its last candidates for the next step's size, and
    looks anyway after auto.IDLE_RUN such steps; where drafting pays the rows look at every step."""
    def run(cost, steps=40):
        plan, rows = Plan(), [Controller(Batched(cost, 2)) for _ in range(2)]
        looked = {0: [], 1: []}
        for c in rows:
            c.plan = plan
        for step in range(steps):
            for i, c in enumerate(rows):
                if not c.idle("s", chain_parents(3) if step else None):
                    looked[i].append(step)
                    c.size("s", 3, CHAIN, parents=chain_parents(3))  # its lookup found 3 candidates
                    c.asked = None  # (nothing verified: the statistics stay)
        return looked

    looked = run(lambda q, kind=CHAIN: 1.0 * q)  # every token costs an AR step: drafting never pays
    assert looked[0] == looked[1] and looked[0][0] == 0, looked  # the rows agree on the steps (one plan)
    assert max(b - a for a, b in zip(looked[0], looked[0][1:])) <= auto.IDLE_RUN + 1, looked
    assert len(looked[0]) <= 40 // (auto.IDLE_RUN + 1) + 3, looked  # + the explorations
    looked = run(lambda q, kind=CHAIN: 1.0)  # every size costs one AR step: drafting pays, the rows look every step
    assert looked[0] == looked[1] == list(range(40)), looked


def test_a_batchs_exploration_pays_when_the_batch_gains():
    """The batch explores on one schedule (``Plan``), so an AR step turned into a draft paid if the batch saved more
    time than the step cost, priced as ``Plan.best`` prices a size: not if one row gained, nor if rows ahead of or
    level with a last row that did not gain gained what their shares of the padded forward cost (a row that
    reported nothing emitted one token)."""
    cost = lambda q, kind=CHAIN: 1.0 + 0.1 * q  # noqa: E731 - split: 1.0 fixed, 0.1 per token per row

    def worth(rooms, tokens, size=4):
        plan, rows = Plan(), []
        for room in rooms:
            row = Controller(Batched(cost, len(rooms)))
            row.plan, row.room = plan, room
            plan.pick(row, "s", [1.0] * (size + 1), CHAIN, 0)  # the rows offered at the exploring step
            rows.append(row)
        paid = [(id(row), False, t, size if t else 0) for row, t in zip(rows, tokens)]
        return plan.worth(paid, plan.offers)

    # a step of 5 tokens per row costs 1 + 4 x 0.5 = 3.0 against an AR step's 1 + 4 x 0.1 = 1.4; a row's token saves
    # 0.1, and the fixed 1.0 is saved per token that every last row gained
    assert worth([40, 40, 40, 40], [3, 3, 3, 3])  # 1.2 + 3.0 = 4.2 saved in 3.0
    assert not worth([40, 40, 40, 40], [3, 1, 1, 1])  # 0.6 + 1.0 = 1.6 in 3.0
    assert not worth([40, 40, 40, 40], [5, 5, 5, 1])  # 1.6 + 1.0: the rows level with the one that did not gain
    assert not worth([30, 30, 30, 40], [5, 5, 5, 1])  # the same with the rows ahead
    assert worth([30, 30, 30, 40], [2, 2, 2, 3])  # the last row gained: 0.9 + 3.0 = 3.9 in 3.0
    assert worth([40, 40, 40, 30], [3, 3, 3, 0])  # a row ahead drafted nothing: its one token counts, 1.0 + 3.0
    plan, row = Plan(), Controller(Batched(cost, 2))  # sizes > 0, all rows alike: whether any row paid
    assert plan.worth([(id(row), True, 0.0, 0)], {}) and not plan.worth([(id(row), False, 0.0, 0)], {})


def test_a_batchs_exploration_is_judged_once_on_every_rows_report():
    """Rows report an exploration in turn, after their verdicts, and the first to start the next step does so before
    the others have reported: the batch judges the exploration once, on every row's report, when the step after starts
    (judged at the next step, it was judged on the first row's report and again on the others', the gap doubling
    twice)."""
    cost = lambda q, kind=CHAIN: 1.0 + 0.1 * q  # noqa: E731
    plan, rows = Plan(), [Controller(Batched(cost, 4)) for _ in range(4)]
    for row in rows:
        row.plan, row.room = plan, 40
    own = Backoff()
    own.at = 1  # the batch's first step explores
    assert [plan.enter(row, own) for row in rows] == [True] * 4
    for row in rows:
        plan.pick(row, "s", [1.0] * 5, CHAIN, 0)  # the rows' offers at the exploring step
    for row in rows:  # each drafted 4 candidates and emitted one token (did not pay), then starts the next step
        plan.result(row, False, 1.0, 4)
        assert not plan.enter(row, own)
    assert plan.schedule.gap == EXPLORE  # not judged yet: a row may still report it
    for row in rows:
        plan.enter(row, own)
    assert plan.schedule.gap == 2 * EXPLORE  # judged once: it did not pay


def test_auto_is_accepted_at_batch_size_above_one():
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from specnoise.config import config_dir

    with initialize_config_dir(config_dir=str(config_dir()), version_base="1.3"):
        conf = compose("config", overrides=["decoder=pld", "decoder.auto=true", "benchmark=humaneval",
                                            "benchmark.batch_size=4"])
    assert OmegaConf.to_object(conf).decoder.auto


@pytest.mark.parametrize("engines", ["dynamic", "static"])
@pytest.mark.parametrize("name", DRAFTERS)
def test_auto_in_a_batch_stays_lossless(name, engines, target, draft):
    """Each row slot sizes its own steps (its own controller, priced at t(3 x q) / 3), twice over, on both engines."""
    t, d = (static(target), static(draft)) if engines == "static" else (target, draft)
    decoder = build(name, t, d)
    for _ in range(2):
        outs = decoder.generate_batch(PROMPTS, NEW_TOKENS)
        assert [o.tokens for o in outs] == [ar(target, p, NEW_TOKENS) for p in PROMPTS], f"{name} auto in a batch"
        assert all(sum(o.accepted) == len(o.tokens) for o in outs)
    rows = decoder.row_decoders(3)
    assert len({id(r.auto) for r in rows} | {id(decoder.auto)}) == 4  # a controller per row slot, not shared
    assert all(r.auto.cost.rows == 3 for r in rows) and len({id(r.auto.plan) for r in rows}) == 1
    if name == "tr_jacobi":  # a template every row ranks at every step: after the first, the rows' sizes agree
        sizes = [[k for _, k in r.auto.sizes] for r in rows]  # (but at a row's last step: its budget may allow fewer)
        assert all(len({s[i] for s in sizes}) == 1 for i in range(1, min(map(len, sizes)) - 1)), sizes
    assert name == "lookahead" or any(r.auto.sizes for r in rows)  # (its pool has no n-gram yet this early)
    assert decoder.meta["auto"]["batch"] == 3 and "streams" in decoder.meta["auto"]


def test_a_batch_row_prices_its_steps_at_the_batchs_longest_row(target, draft, monkeypatch):
    """A batch's cache is one rectangle: every row's forward attends over the longest row's slots, so a short row
    beside a long one is priced at the long one's context (``Engine.attended``), and alone at its own."""
    seen: dict[int, list[int]] = {}
    at = Controller.at
    monkeypatch.setattr(Controller, "at", lambda self: seen.setdefault(id(self), []).append(self.context) or at(self))
    decoder = build("pld", target, draft)
    short, long = PROMPTS[0], PROMPTS[1] * 6
    decoder.generate(short, 8)
    assert max(seen.pop(id(decoder.auto))) < len(long) - 1  # alone: its own context
    outs = decoder.generate_batch([short, long], 8)
    assert [o.tokens for o in outs] == [ar(target, p, 8) for p in (short, long)]
    row = decoder.row_decoders(2)[0]
    first, *later = seen[id(row.auto)]  # the first step, the prefill, finds no cache yet: its own prompt
    assert first == len(short) - 1 and min(c for c in later if c != first) >= len(long) - 1, seen[id(row.auto)]


def test_a_real_batch_probes_its_curve_up_to_the_batched_sizes(target, draft, tmp_path):
    """After a batch-1 generation left a long cache on the engine (the benchmark's warm-up does), a batch of 4 probes
    its curve up to 4 x the batch-1 sizes, as far as the context allows (the probe once ran past it: a UserError)."""
    decoder = build_decoder(schema("pld", auto=True, cost_cache=str(tmp_path)), target, draft)
    long = PROMPTS[0] * 8
    decoder.generate(long, 60)
    assert decoder.target.length > len(PROMPTS[0]) + 20
    ps = [PROMPTS[0], PROMPTS[1], PROMPTS[2], PROMPTS[0]]
    outs = decoder.generate_batch(ps, 6)
    assert [o.tokens for o in outs] == [ar(target, p, 6) for p in ps]
    curve, ml = decoder.curves["target"], decoder.target.max_length
    assert max(curve.times[CHAIN]) == min(4 * min(128, ml // 2), ml - curve.key["context"] - 1)  # 4 rows' sizes
    assert decoder.meta["auto"]["batch"] == 4 and decoder.meta["auto"]["cache_file"].startswith(str(tmp_path))


def test_a_batch_reaching_past_the_curves_context_probes_one_of_its_own(target, draft, tmp_path, monkeypatch):
    """A batch's curve is probed at the batch-1 curve's context, and again over a longer one (rounded up to a multiple
    of ``BATCH_REACH``) for a batch whose longest prompt plus budget reaches past it, not extended by a line beyond:
    batches alike share one probe, and a batch within the context keeps the first."""
    from specnoise.decoding import base

    monkeypatch.setattr(base, "LONG_CONTEXT", 32)
    monkeypatch.setattr(base, "BATCH_REACH", 16)
    decoder = build_decoder(schema("pld", auto=True, cost_cache=str(tmp_path)), target, draft)
    short = [PROMPTS[0][:10], PROMPTS[1][:12]]
    decoder.generate_batch(short, 6)
    context = decoder.curves["target"].key["context"]
    assert context == 32 and list(decoder.batch_curves) == [("target", 2, 32)]
    long = [PROMPTS[0][:10], (PROMPTS[1] * 8)[:40]]  # reaches 40 + 6 = 46 tokens: probed over 48
    outs = decoder.generate_batch(long, 6)
    assert [o.tokens for o in outs] == [ar(target, p, 6) for p in long]
    assert list(decoder.batch_curves) == [("target", 2, 32), ("target", 2, 48)]
    assert decoder.row_decoders(2)[0].auto.cost.curve is decoder.batch_curves["target", 2, 48]
    decoder.generate_batch([PROMPTS[2][:10], (PROMPTS[0] * 8)[:38]], 6)  # alike: the same probe
    decoder.generate_batch(short, 6)  # within the first context: the first curve
    assert len(decoder.batch_curves) == 2
    assert decoder.row_decoders(2)[0].auto.cost.curve is decoder.batch_curves["target", 2, 32]


def test_a_batch_prices_its_sizes_again_only_when_an_offer_moved(monkeypatch):
    """``Plan.best`` keeps the last step's size while every row offers the same ranking at the same prices from the
    same place (last or not); an offer that moved is priced anew, and gives what pricing from scratch gives."""
    priced = []
    rates = Plan.rates
    monkeypatch.setattr(Plan, "rates", staticmethod(lambda *a: priced.append(1) or rates(*a)))
    cost = lambda q, kind=CHAIN: 1.0 + 0.02 * q  # noqa: E731
    plan, rows = Plan(), []
    for rate in (0.9, 0.8):
        row = Controller(Batched(cost, 2), backoff=False)
        row.plan, row.room = plan, 40
        row.streams["s"] = Stream()
        row.streams["s"].trials, row.streams["s"].hits = [1000.0] * 8, [1000.0 * rate] * 8
        rows.append(row)

    def step():
        sizes = [row.select("s", chain_parents(8)) for row in rows]
        for row in rows:
            row.asked = None  # (nothing verified: the statistics stay)
        return [len(s) for s in sizes]

    first, second = step(), step()
    assert first == [0, 0] and second[0] > 0 and len(priced) == 1
    assert step() == second and step() == second and len(priced) == 1  # the same offers: not priced again
    rows[1].streams["s"].hits = [100.0] * 8  # the second row's drafts now fail: it ranks anew at the batch's next
    rows[1].streams["s"].version += 1  # ranking step (``Plan.ranks``: within RERANK steps), the batch prices anew
    held = [step() for _ in range(auto.RERANK)]
    moved = step()
    assert held[0] == second and moved[0] < second[0] and len(priced) == 2, (held, moved)
    fresh = Plan()
    for row in rows:
        row.plan = fresh
    step()
    assert step() == moved  # from scratch: the same


def test_a_batchs_drafting_rows_rank_every_rerank_th_step(monkeypatch):
    """In a batch whose rows draft at every step (their statistics move at every step), the rows rank their template
    at the batch's ranking steps only (every ``RERANK``-th, and explorations: ``Plan.ranks``), all at the same steps,
    and offer their last rankings between them: ranked at every step, 16 rows' 68-node templates cost ~0.3 ms of
    Python per batched step on an H100."""
    ranked, rank = [], Nodes.p
    monkeypatch.setattr(Nodes, "p", lambda self, *a: ranked.append(id(self)) or rank(self, *a))  # counts rankings
    flat = lambda q, kind=CHAIN: 1.0  # noqa: E731 - every size costs one AR step: the rows draft at every step
    parents = [-1, 0, 1, -1, 3, 0]
    plan, rows = Plan(), []
    for _ in range(3):
        row = Controller(Batched(flat, 3), backoff=False)
        row.plan, row.room = plan, 100
        rows.append(row)
    steps, ranking_steps = 64, []
    for step in range(steps):
        ranked.clear()
        picks = [row.select("s", parents) for row in rows]
        for row, pick in zip(rows, picks):
            row.observe(SimpleNamespace(accepted=1 if pick else 0, shape=SimpleNamespace(nodes=len(pick)),
                                        path=[0, 1] if pick else [0]))
        assert len(ranked) in (0, len(rows)), (step, ranked)  # all rows rank at the same steps, or none
        if ranked:
            ranking_steps.append(step)
        assert all(pick == picks[0] for pick in picks)  # one size per step
    assert max(map(len, picks)) == len(parents)  # the whole template: it pays on a flat curve
    gaps = [b - a for a, b in zip(ranking_steps, ranking_steps[1:])]
    assert steps / auto.RERANK <= len(ranking_steps) <= steps / auto.RERANK + steps / EXPLORE + 2, ranking_steps
    assert max(gaps) <= auto.RERANK, gaps


def test_an_exploration_dearer_than_two_ar_steps_backs_off_whatever_the_drafter():
    """A drafter that does not back off (``Drafter.backoff`` False: TR-Jacobi, whose explorations feed its next
    candidates) explores every ``EXPLORE``-th step while an exploration is cheap, and backs off like any other where
    one costs more than ``DEAR`` AR steps and does not pay (a 16-row batch's padded block on the CPU)."""
    def explorations(cost, steps=200):
        plan, rows = Plan(), [Controller(Batched(cost, 2), backoff=False) for _ in range(2)]
        for row in rows:
            row.plan, row.room = plan, 1000
            row.streams["s"] = Stream()
            row.streams["s"].trials, row.streams["s"].hits = [1000.0] * 8, [0.0] * 8  # drafts never pass
        drafted = []
        for step in range(steps):
            sizes = [row.size("s", 8, CHAIN) for row in rows]
            if sizes[0]:
                drafted.append(step)
            for row, k in zip(rows, sizes):
                row.observe(SimpleNamespace(accepted=0, shape=SimpleNamespace(nodes=k), path=[0]))
        return drafted

    cheap = explorations(lambda q, kind=CHAIN: 1.0 + 0.1 * q)  # 5 tokens a row: 1.36 AR steps
    assert len(cheap) >= 200 // EXPLORE - 1 and max(b - a for a, b in zip(cheap, cheap[1:])) == EXPLORE, cheap
    dear = explorations(lambda q, kind=CHAIN: 1.0 * q)  # 5 tokens a row: 5 AR steps
    assert 1 <= len(dear) <= 4 and dear[1] - dear[0] == 2 * EXPLORE, dear
