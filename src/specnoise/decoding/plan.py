"""A lock-step batch's proposal sizes under ``decoder.auto``: what a row's share of a batched forward costs
(``Batched``) and one size per step for every row (``Plan``), from the offers of the rows' own controllers
(decoding/auto.py).

In a batch of B rows (``Batched``) each row slot has its own controller (its statistics its own, like its drafter's
state) and prices a step at its share of the lock-step forward, t_B(q) / B, from a curve of its own probed on that
forward: B rows of q tokens, each row over its own cache, with the batch's 4D mask (``Curve`` with ``rows``), over the
batch-1 curve's contexts or, for a batch whose longest prompt plus budget reaches past them, a longer one
(``Decoder.start_auto_rows``). One forward of B x q tokens is no stand-in for it: on the 2-core CPU a batch of 4 rows
of 8 tokens costs 1.6x a 32-token forward (16 rows of 4: 2.2x a 64-token one), and priced that way PLD with auto at
B = 4 verified 9-10 drafts per row, as many as its faithful setting. An AR step is cheaper per row in a batch
(t_B(1) / B), so drafting must beat batched AR, not AR at batch 1. The batch pays for its largest block, so its rows
verify one size per step, whatever stream their candidates come from, and explore at the same steps (``Plan``): the
size that saves the batch the most time per second it costs, where a step costs a fixed part and a part per live row
(``Batched.split``) and the batch runs until its last rows are done. Every row's attention spans the batch's longest
row (one rectangular cache), so a row prices its step at that context (``Engine.attended``).
"""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING

from specnoise.decoding.auto import RERANK
from specnoise.decoding.cost import CHAIN, TREE, Curve

if TYPE_CHECKING:
    from specnoise.decoding.acceptance import Backoff
    from specnoise.decoding.auto import Controller

# in a lock-step batch, the rows within this many tokens of the most still to come are the batch's last to finish
# (``Plan.best``): their steps are the batch's steps
LAST_LAG = 2


class Batched:
    """A row's share of a lock-step forward over ``rows`` rows, q tokens each: ``curve`` (a ``Curve`` probed on that
    forward, ``Curve.rows`` = rows) over rows. The batch pays for its largest block (pads fill the others), so this is
    exact for rows proposing alike and optimistic for a row proposing more than its neighbours."""

    def __init__(self, curve: Curve, rows: int, single: Curve | None = None):
        if isinstance(curve, Curve) and curve.rows != rows:
            raise ValueError(f"a batch of {rows} rows is priced by a curve of {rows} rows, not {curve.rows}")
        self.curve, self.rows = curve, rows
        self.single = single  # the batch-1 curve of the same model (``split``); None: every cost is per row
        self.splits: dict[tuple, tuple[list[float], list[float]]] = {}  # (``split_list``)

    def __call__(self, q: float, kind: str = CHAIN, context: float | None = None) -> float:
        curve = self.curve
        if not isinstance(curve, Curve):  # (tests price with plain functions of the tokens fed: rows x q)
            return curve(q * self.rows, kind) / self.rows
        # every row's block padded to the step's bucket, at this row's context (as if its neighbours' were alike)
        return curve(q, kind, context) / self.rows

    def split(self, q: float, context: float | None = None) -> tuple[float, float]:
        """The batched forward of q tokens per row as a fixed cost and a cost per live row, (a, m) with a + rows x m =
        t_rows(q) and a + m = t_1(q) (the batch-1 curve's masked forward: a batch's forwards carry a mask). On the
        shipped model on the CPU an AR step of 16 rows costs 8.4 ms and of one row 4.9: a row that leaves the batch
        saves 0.23 ms a step, not its 0.53 ms share. Without a batch-1 curve: (0, t_rows(q) / rows). Between its ends
        the line is no measurement: timed, a 3-token step of 2-4 live rows of 16 cost 1.08-1.14x their one-token step,
        where it says 1.41-1.45x (a row alone in a batch still pays for the batch's padding and gathers:
        batch-scaling/split_prices.py). A line through a probed 2-row curve priced them as timed, made PLD draft less
        at the start and ran no faster: not kept (batch-scaling README)."""
        curve = self.curve
        if not isinstance(curve, Curve):  # (tests: a plain function of the tokens fed, batch 1 included)
            full, single = curve(q * self.rows, TREE), curve(q, TREE)
        elif self.single is None or self.rows == 1:
            return 0.0, curve(q, TREE, context) / self.rows
        else:
            full, single = curve(q, TREE, context), self.single(q, TREE, context)
        fixed = max(0.0, (self.rows * single - full) / (self.rows - 1)) if self.rows > 1 else 0.0
        return fixed, (full - fixed) / self.rows

    def split_list(self, extra: int, n: int, context: float | None) -> tuple[list[float], list[float]]:
        """``split`` for 0..n candidates (and ``extra`` rows) at ``context``: its fixed parts and parts per live row,
        one pair of lists per key for every row of a batch (the rows' controllers share this object: ``Plan.best``
        asks every row at every step, and with a list per row each of 16 rows priced up to 69 sizes again whenever
        the batch's context moved on: 0.24 ms of Python per batched step of TR-Jacobi on the CPU, 0.08 ms shared)."""
        key = (extra, n, self.version, context)
        got = self.splits.get(key)
        if got is None:
            pairs = [self.split(1 + extra + k, context) for k in range(n + 1)]
            got = self.splits[key] = ([a for a, _ in pairs], [m for _, m in pairs])
        return got

    @property
    def version(self) -> int:
        return getattr(self.curve, "version", 0)

    def describe(self) -> dict:
        return {**(self.curve.describe() if hasattr(self.curve, "describe") else {}), "batch": self.rows}


class Plan:
    """One proposal size for every row of a lock-step batch at each step, and one exploration schedule. The batch pays
    for its largest block (pads fill the others' blocks, and a draft model drafts as far for every row), so rows that
    size their steps alone waste it: at B = 4 on the CPU, priced by the batched forward, PLD with auto had rows
    verifying 10 drafts beside rows verifying none, whose padded blocks bought nothing; and rows exploring at steps of
    their own (their counts differ with their generations' lengths) padded a block every few steps at B = 16. Each
    row's controller offers what its candidates would gain at every size (its ranking) and what it would spend; a
    step's size is the one that saves the batch the most time per second it costs (``best``: the batch ends with its
    last row) over the rows that offered at the step before (one step late: a row proposes before its neighbours
    have ranked), and each row verifies the most of its
    candidates it may up to it. The first step of a batch, with nothing offered yet, is an AR step (``pick``). The
    batch explores at the steps its schedule says (``Backoff``, counted once per step, starting where the first row's
    stood; what an exploration was worth to the whole batch: ``worth``).

    One size for all of a decoder's streams: a row's block is padded to the batch's largest whichever stream its
    candidates came from. Planned per stream, SAM's fallback trees were sized by the rows in fallback alone, which
    priced only their own share of the padded forward: at B = 4 on 18 Spec-Bench questions its fallback rows verified
    11-18-node trees beside matched rows' 5-8-token chains in 23 of 92 drafted steps, padding the chains."""

    def __init__(self):
        self.offers: dict[int, tuple] = {}  # row controller id -> its offer at this step
        self.size: int | None = None  # this step's size, from the last step's offers (None: no offer yet)
        self.schedule: Backoff | None = None  # the batch's explorations
        self.exploring = False  # whether this step explores
        self.entered: set[int] = set()  # the rows that started this step
        self.step = 0  # the batch's steps so far (the one under way)
        # per exploring step: the offers its rows made at it and what its rows reported of it (``result``), judged
        # once every row has reported (``enter``)
        self.explored: dict[int, list] = {}  # step -> [offers, reports]
        self.memo: tuple[list, int] | None = None  # the last step's offers and the size they gave
        self.unranked = 0  # steps since the rows last ranked their candidates (``ranks``)

    def enter(self, controller: Controller, own: Backoff) -> bool:
        """``controller``'s row starts a step (its exploration schedule alone: ``own``); whether the step explores. The
        first row to start a new step (a row that started the last one starts again) sizes it from the last step's
        offers and counts it in the schedule."""
        if self.schedule is None:
            self.schedule = copy.deepcopy(own)
        elif id(controller) not in self.entered:
            self.entered.add(id(controller))
            return self.exploring
        if self.exploring:  # the step ending here explored: the offers its rows made at it, for its worth
            self.explored.setdefault(self.step, [{}, []])[0] = self.offers
        self.step += 1
        # an exploration is judged once, when every row has reported it: a row reports at the step or after its
        # verdict, before it starts the next step, so by the time a step starts the one before last is complete.
        # Judged at the next step, the batch's first row to start it judged the exploration on its own report, and
        # the rest at the step after: two judgements, the gap doubling twice after one that did not pay
        for step in [step for step in self.explored if step < self.step - 1]:
            offers, paid = self.explored.pop(step)
            if paid:
                self.schedule.result(self.worth(paid, offers))
        self.exploring = self.schedule.due()
        count = self.unranked + 1
        self.unranked = 0 if self.exploring or count >= RERANK else count
        if self.offers:
            self.size = self.best(self.offers.values())
            self.offers = {}
        self.entered = {id(controller)}
        return self.exploring

    def ranks(self) -> bool:
        """Whether this step's rows rank their candidates anew (every ``RERANK``-th step of the batch, and its
        explorations), or offer their last rankings again where their candidates' tree is the same (``Controller
        .choose``). Ranked at every step where the rows draft, a 68-node template cost 16 rows ~0.3 ms of Python per
        batched step on an H100 (h100/checks4: TR-Jacobi with auto at 1.30x faithful's time at B = 16); offered again,
        the rows' lists are the same objects and the plan's size is not priced anew either (``best``)."""
        return self.unranked == 0

    def result(self, controller: Controller, paid: bool, tokens: float = 0.0, size: int = 0) -> None:
        """What a row's exploration was worth (applied once every row has reported it, ``enter``): ``paid`` by the
        row's own pricing, and for an AR step turned into a draft the tokens it emitted and the candidates it verified.
        The row's step: the one under way if the row has started it, else the one before (its verdict's)."""
        step = self.step if id(controller) in self.entered else self.step - 1
        self.explored.setdefault(step, [{}, []])[1].append((id(controller), paid, tokens, size))

    def worth(self, paid: list[tuple], offers: dict) -> bool:
        """Whether the batch's last step, an exploration, paid. Where rows turned an AR step into a draft: whether the
        batch saved more time than the step cost, priced as ``best`` prices a size (the rows that offered at the step,
        the tokens each emitted; a row that reported none emitted one). Judged by the rows' shares of the padded
        forward, t_B(q) / B, an exploration of PLD at B = 16 on HumanEval paid at every ``EXPLORE``-th step (its rows
        ahead gained tokens) while ``best`` never bought that size, each costing 1.5 AR steps. Else (a non-empty
        size, all rows alike) whether it paid for any row. ``offers``: what the rows offered at the step."""
        drafts = {row: (tokens, size) for row, _, tokens, size in paid if size}
        if not drafts or not offers:
            return any(p for _, p, *_ in paid)
        largest = max(size for _, size in drafts.values())
        tokens = [[1.0] * largest + [drafts.get(row, (1.0, 0))[0]] for row in offers]
        offers = list(offers.values())
        return self.rates(offers, tokens, largest, *self.terms(offers, largest))[largest] > 1.0

    def pick(self, controller: Controller, stream: str, gains: list[float], kind: str, extra: int) -> int:
        """Record ``controller``'s offer (``gains[k]``: expected tokens verifying its first k candidates of ``stream``,
        priced by its own ``spend``) and return this step's size: 0 (an AR step) on the batch's first step, before
        any row offered. Each row's own pick there, priced by its share of the padded forward, made PLD's rows at
        B = 16 verify 7-token blocks at the first step, 2.9x an AR step."""
        self.offers[id(controller)] = (controller, stream, gains, kind, extra)
        return self.size or 0

    def best(self, offers) -> int:
        """The size that saves the batch the most time per second it costs (ties: the smaller), of sizes 0 up to the
        most candidates a row offered (a row with fewer: its block is padded, its tokens stay)."""
        offers = list(offers)
        largest = max(len(gains) - 1 for _, _, gains, _, _ in offers)
        # the same offers as at the last step (the same lists: rows whose rankings did not move offer them again, and
        # ``split_list`` keeps its prices per context step) from the same last rows, without a draft model (whose
        # catch-up is priced per token to come): the same size, without pricing every size again. At B = 16 with a
        # 68-node template the pricing cost 0.32 ms of Python per step, at steps that were nearly all AR steps
        splits, lasts = self.terms(offers, largest)
        signature = list(zip((gains for _, _, gains, _, _ in offers), splits, lasts))
        last = self.memo
        if (last is not None and len(last[0]) == len(signature) and not any(c.draft_cost for c, *_ in offers)
                and all(a is x and b is y and c == z for (a, b, c), (x, y, z) in zip(last[0], signature))):
            return last[1]
        tokens = [gains + [gains[-1]] * (largest + 1 - len(gains)) for _, _, gains, _, _ in offers]
        rates = self.rates(offers, tokens, largest, splits, lasts)
        size = rates.index(max(rates))  # the first of the highest: ties to the smaller size
        self.memo = (signature, size)
        return size

    @staticmethod
    def terms(offers: list, largest: int) -> tuple[list[tuple[list[float], list[float]]], list[bool]]:
        """Per row that offered: its forward's fixed part and part per live row for sizes 0..largest
        (``Controller.split_list``), and whether it is among the last to finish (``LAST_LAG``)."""
        top = max(controller.room for controller, *_ in offers)
        return ([controller.split_list(extra, largest) for controller, *_, extra in offers],
                [controller.room >= top - LAST_LAG for controller, *_ in offers])

    @staticmethod
    def rates(offers: list, tokens: list[list[float]], largest: int, splits: list, lasts: list[bool]) -> list[float]:
        """Per size k = 0..largest, the time the batch saves per second a step of size k costs, ``tokens[r][k]`` the
        tokens row r emits at it (1.0 at k = 0: an AR step saves what it costs, exactly; ``splits`` and ``lasts``:
        ``terms``). A lock-step batch runs until its last row is done, and a step costs a fixed part and a part per live
        row (``Batched.split``). A token a row gains saves the batch that row's part of a later step; the fixed part is
        saved per token that every one of the last rows to finish gains (``LAST_LAG``: most tokens still to come,
        ``Controller.room``), the least of their gains, as the batch's steps are its slowest last row's. A step of size
        k costs the fixed part, each row's part of the padded block and its drafting.
        Priced as a sum of row shares, t_B(q) / B each, drafting bought tokens for rows that finished early and then
        left one or two rows decoding alone: TR-Jacobi with auto at B = 16 ran as many batched steps as AR on
        HumanEval (63 against 64), their forwards 5-9% dearer; the same sum priced a tail of two live rows at 2 / 16
        of a 16-row forward, where drafting pays as at batch 1. With the fixed part shared among the last rows (their
        mean gain), the 16 rows of a batch's first steps, all last, bought 5-8-token blocks (2.4-3.2x an AR step) for
        PLD on HumanEval and the batch still ran as many steps as AR: 0.92x batched AR, against 0.97x with the least
        gain (scratch A/B, 16 prompts, 64 tokens, 3 rounds)."""
        fixed, seconds = [], []
        for (controller, stream, *_), got, (whole, part) in zip(offers, tokens, splits):
            if controller.draft_cost:
                share = controller.share(stream)
                part = [part[0]] + [part[k] + (controller.draft_cost(stream, k) + got[k] * share)
                                    for k in range(1, largest + 1)]
            fixed.append(whole)
            seconds.append(part)
        # per size, summed over the rows in one pass (a loop over sizes x rows cost ~0.5 ms of Python per step at
        # B = 16 with a 68-node template); the fixed part is the batch's, once (the rows' mean: their contexts differ)
        n = len(offers)
        fixed = [f / n for f in map(sum, zip(*fixed))]
        cost = [f + s for f, s in zip(fixed, map(sum, zip(*seconds)))]
        # what a token of a row saves: its part of an AR step; the fixed part is saved as far as the last rows all gain
        own = map(sum, zip(*[[part[0] * g for g in got] for part, got in zip(seconds, tokens)]))
        least = map(min, zip(*[got for got, is_last in zip(tokens, lasts) if is_last]))
        rates = [(value + fixed[0] * gain) / c for value, gain, c in zip(own, least, cost)]
        rates[0] = 1.0  # (an AR step saves what it costs: exactly, not up to rounding)
        return rates
