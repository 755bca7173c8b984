"""What a drafter's candidates were worth, for decoder.auto's controller (auto.py): per stream of candidates and per
node, how often the node was accepted when its parent's path was, and when to look past the best pick.

``Nodes`` keeps, per node index, forgetting sums of trials (its parent's path was accepted, or it hangs off the root)
and hits (it was accepted too), weighing the past by ``FORGET`` per observation (a half-life of ~35), so they follow
the current text. p(node) = p(parent) x its rate, the rate's posterior mean under a uniform prior, and a node's
children's rates add up to 1 at most (one of them at most is right). ``expected`` turns the p of a pick's nodes into
its expected accepted tokens.

``Backoff`` is a stream's exploration schedule: every ``EXPLORE``-th step verifies candidates beyond the best pick, so
nodes beyond it keep being observed; an exploration that does not pay doubles the gap, up to ``EXPLORE_MAX`` (or as
long as keeps what explorations lose to ``EXPLORE_SHARE`` of the run); one that pays brings it back to ``EXPLORE``.
"""

from __future__ import annotations

import math
from itertools import accumulate

FORGET = 0.98  # weight of the past per observation of a rank
PRIOR = 0.5  # a node's rate before it was ever tried: (hits + 1) / (trials + 2) at 0 trials (``Nodes.p``)
EXPLORE = 16  # every EXPLORE-th step of a stream explores (verifies candidates beyond the best pick: auto.PROBE)
EXPLORE_MAX = 128  # ... every EXPLORE_MAX-th at the least often, while the best cut stays empty (backing off)
# ... or, for a drafter with a draft model (whose explorations count across generations), after an exploration that
# lost L AR steps against the AR steps it replaced (by its price, the draft model's whole catch-up included),
# L / EXPLORE_SHARE steps later, if that is longer: explorations that do not pay cost this share of its run at most.
# Ouroboros' explorations on the CPU (its draft model first fed a ~300-token HumanEval prompt, then 2-4 lookahead
# forwards of 34-91 rows) took 4.6-8.5 AR steps each for 1-5 tokens: every EXPLORE_MAX steps that was ~4% of its time
# (16 explorations over HumanEval-10 x 3)
EXPLORE_SHARE = 0.01


def expected(p: list[float], order: list[int]) -> list[float]:
    """Expected accepted tokens of verifying the first k nodes of ``order``, for k = 0..len(order): 1 (the bonus
    token) plus their p (those below 0: not allowed, 0), added one by one in order."""
    return list(accumulate([x if x > 0.0 else 0.0 for x in map(p.__getitem__, order)], initial=1.0))


class Backoff:
    """Which steps explore: the ``EXPLORE``-th, then every ``EXPLORE``-th while exploring pays; after an exploration
    that did not pay (``result``) the gap doubles, up to ``EXPLORE_MAX``, and is at least what the exploration lost
    over ``EXPLORE_SHARE``. ``unpaid``: explorations whose worth shows only in later steps (Lookahead's window filling
    its pool) each count as not paid, so the gaps double from the first one on."""

    def __init__(self, unpaid: bool = False):
        self.steps, self.unpaid = 0, unpaid
        self.gap = self.at = EXPLORE  # the gap after the last exploration, the step of the next one

    def due(self) -> bool:
        """Count a step; whether it explores."""
        self.steps += 1
        if self.steps < self.at:
            return False
        self.at = self.steps + self.gap  # until ``result`` says otherwise
        if self.unpaid:
            self.result(paid=False)
        return True

    def pending(self) -> bool:
        """Whether the next step explores (what ``due`` will say, without counting a step)."""
        return self.steps + 1 >= self.at

    def restart(self) -> None:
        """A new generation: explore at its ``EXPLORE``-th step, the gap kept (``result`` doubles it from there)."""
        self.steps, self.at = 0, EXPLORE

    def result(self, paid: bool, lost: float = 0.0) -> None:
        """What the last exploration was worth: the next one comes ``EXPLORE`` steps after it if it paid, else after
        twice the last gap (up to ``EXPLORE_MAX``) or, for one that ``lost`` more AR steps' time than that allows,
        after lost / ``EXPLORE_SHARE`` steps."""
        self.at -= self.gap
        self.gap = EXPLORE if paid else max(min(2 * self.gap, EXPLORE_MAX), math.ceil(lost / EXPLORE_SHARE))
        self.at += self.gap


class Nodes:
    """One stream of candidates: per node index, the forgetting sums of trials (its parent's path was accepted, or
    it hangs off the root) and hits (it was accepted too)."""

    def __init__(self):
        self.trials: list[float] = []
        self.hits: list[float] = []
        self.layout: tuple | None = None  # the last observed pick: who of it hangs off the root, or off whom (observe)
        self.version = 0  # observations so far: the statistics changed since a pick rested on them

    def p(self, parents: list[int], allow: list[bool] | None = None) -> list[float]:
        """Each node's chance that its whole path is accepted: its parent's times its own conditional rate, the
        posterior mean under a uniform prior (hits + 1) / (trials + 2) (even odds for a node never tried, as tree=auto's
        own statistics, trees.py), and no more than its earlier siblings leave: at most one child of a node can be
        right (``observe``), so the siblings' rates add up to 1 at most, taken in the drafter's order (likeliest
        first). Uncapped, a node's K children added up to (hits + K) / (trials + 1), and K untried ones to K: REST's
        rarely tried root children each scored 0.25-1.0 and it verified 39-64-node tries for one token each. Capped,
        the prior (hits + 1) / (trials + 1) made a node never tried look sure: the drafter's first child took its
        siblings' whole share until it had failed many times, so the second-likeliest candidates were never verified
        (HumanEval-10 with ``auto``: TR-Jacobi accepted 1.72 tokens per step, 2.11 under this prior; Token Recycling
        1.36 and 1.70, REST 1.26 and 1.66). Nodes not allowed (and so their descendants) get -1. Parents come before
        their children."""
        out: list[float] = []
        append, tried, trials, hits = out.append, len(self.trials), self.trials, self.hits
        left = [1.0] * (len(parents) + 1)  # per input (the root first): the rate its children may still take
        for i, parent in enumerate(parents):  # runs for every node at every step: kept to plain list work
            above = 1.0 if parent < 0 else out[parent]
            if above < 0 or (allow is not None and not allow[i]):
                append(-1.0)
                continue
            rate = (hits[i] + 1) / (trials[i] + 2) if i < tried else PRIOR
            room = left[parent + 1]
            if rate > room:
                rate = room
            left[parent + 1] = room - rate
            # the rate first, then the product, capped at the parent's: (above * (h + 1)) / (t + 1) can round one ulp
            # above ``above`` when h = t, and a child ranked before its parent breaks the pick's tree
            product = above * rate
            append(product if product < above else above)
        return out

    def observe(self, parents: list[int], proposed: list[int], accepted: set[int]) -> None:
        """Nodes ``proposed`` were verified, nodes ``accepted`` were on the accepted path (indices into ``parents``).
        Under greedy decoding (and the per-position draw) at most one child of a node can be right, so the accepted
        path holds every node that was right with its whole path: a tried node is right iff it is on the path."""
        self.version += 1
        grow = max(proposed, default=-1) + 1 - len(self.trials)
        if grow > 0:
            self.trials += [0.0] * grow
            self.hits += [0.0] * grow
        # the tried nodes: those hanging off the root, and the children of accepted nodes. Per pick, once: a graph
        # engine keeps its template's pick for up to RERANK_MAX steps, and walking its 68 nodes at every step was
        # a third of decoder.auto's host time per step there
        layout = self.layout
        if layout is None or layout[0] != proposed or layout[1] != parents:
            roots = [i for i in proposed if parents[i] < 0]
            children: dict[int, list[int]] = {}
            for i in proposed:
                if parents[i] >= 0:
                    children.setdefault(parents[i], []).append(i)
            layout = self.layout = (list(proposed), list(parents), roots, children)
        trials, hits, children = self.trials, self.hits, layout[3]
        for i in layout[2]:
            trials[i] = trials[i] * FORGET + 1
            hits[i] = hits[i] * FORGET + (i in accepted)
        for a in accepted:
            for i in children.get(a, ()):
                trials[i] = trials[i] * FORGET + 1
                hits[i] = hits[i] * FORGET + (i in accepted)
