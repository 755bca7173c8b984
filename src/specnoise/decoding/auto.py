"""Hardware-aware drafting (``decoder.auto=true``): one controller that sizes every step's proposal from what this
machine's forwards cost (the curve t(q) of decoding/cost.py, ``Curve``) and what the drafter's candidates were worth.

The controller. Every drafter lists its candidates as a tree (parents first; a chain is a tree) and asks which to
propose: ``Drafter.cut(n)`` for a prefix of its own order (a chain by depth, REST's trie by frequency, Lookahead's
n-grams, Ouroboros' drafts then phrases), ``Drafter.select(parents)`` for a template whose nodes keep their identity
from step to step (TR-Jacobi's, Token Recycling's and SAM's fallback trees): there the controller ranks the nodes
itself. An empty pick is a plain AR step with no draft work at all. Per stream of candidates (a drafter may have
two: SAM's matched chain and its tree fallback) and per node, it keeps how often the node was accepted when its
parent's path was, p(node) = p(parent) x that rate (a node's children's rates add up to 1 at most: one of them at
most is right), and verifies the k nodes (or the prefix of k) that maximise
expected accepted tokens per second,

    (1 + p_1 + ... + p_k) / (t(1 + extra + k) + h + draft_cost(k) + (1 + p_1 + ... + p_k) x catch_up / room),

with t the target curve at the step's context (``extra``: rows fed beside the tree, Lookahead's window), h the host work
a step of its kind (AR, k = 0, or drafted) carried in this run (``calibration.StepTimes``; 0 without step times),
``draft_cost`` what drafting k tokens costs a draft model (its curve times what the run's draft forwards take over their
price, relative to the target's: ``calibration.DraftScale``), and ``catch_up`` what it costs, beyond that, to feed the
draft model first the text it has not seen (a prompt, or the tokens of a run of AR steps): paid once, after which the
draft keeps up, so each of the ``room`` tokens still to come in the generation carries its share. Statistics are kept
across prompts (the benchmark's warm-up teaches them) with exponential forgetting (weight 0.98 per observation, a
half-life of ~35), so they follow the current text (the statistics and the exploration schedule: acceptance.py). A node
never tried has even odds given its parent's path (a uniform prior: ``Nodes.p``), and every ``EXPLORE``-th step verifies
``PROBE`` more nodes than the best pick, so nodes beyond it keep being observed. Where the best pick is an AR step
(Jacobi on a model that was not trained to denoise, a draft model dearer than what it saves), an exploration is an AR
step turned into a draft: when its accepted tokens per second fall short of an AR step's (by their wall time where the
steps are timed, ``calibration.StepTimes``; else by their prices), the gap to the next one doubles, up to
``EXPLORE_MAX`` (a draft model's: or as long as keeps what its explorations lose to ``EXPLORE_SHARE`` of the run, where
that is longer: fed a whole prompt first, one loses several AR steps); an exploration that pays, or a non-empty best
pick, brings it back to ``EXPLORE``. An exploration whose draft model would first catch up with more text than the
exploration itself costs (a long prompt) waits, as one that did not pay would. A new generation (a new text, where
drafting may pay again) explores at its ``EXPLORE``-th step, and if that does not pay either the gap goes on doubling
from where the last generation left it (restarting the doubling per prompt made 2-3 explorations per 128-token
generation); a drafter with a draft model, whose exploration is first a catch-up over the whole text, does not restart:
its explorations come every ``gap`` steps of the run, across generations. Drafters whose next candidates are made from
what the target predicts at the verified nodes (TR-Jacobi's candidate matrix, Token Recycling's adjacency matrix, SAM's
fallback) do not back off (``Drafter.backoff``): an exploration feeds them candidates, a value that its own accepted
tokens do not show, and backing off cost them forwards in the miniature; except where an exploration costs more than
``DEAR`` AR steps (a 16-row batch's padded block on the CPU), which no fed candidate pays back. A drafter whose
candidates cost host work to find (REST's corpus lookup) asks first whether the step could draft at all
(``Controller.idle``) and skips the work where it could not.

A cost function is all the controller takes. In a lock-step batch each row slot has its own controller, pricing its
share of the batched forward, and the rows verify one size per step chosen for the whole batch (decoding/plan.py).

On an engine that replays CUDA graphs (the compiled static engine) a step is short (0.66 ms for the shipped model on
an H100) and every new step shape is a recording, so there the controller keeps a template's pick unless a new one
gains ``STICKY``, ranks every ``RERANK``-th step only (less often while the rankings keep the pick: ``RERANK_MAX``;
between rankings a template keeps its nodes, a prefix its size: ``Controller.kept_pick``), observes every
``OBSERVE_KEPT``-th of the steps that keep it, and lets an exploration past a pick of every candidate keep it
unranked; the static engine pads a block to its bucket,
so its curve prices the bucket (``Curve.padded``). CPU engines rank every step and price every size as probed.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from specnoise.decoding.acceptance import Backoff, Nodes, expected
from specnoise.decoding.cost import CHAIN, TREE

log = logging.getLogger("specnoise")

# the controller prices a step at its context rounded down to a multiple of this: a step prices every candidate
# size, so the prices are computed once per CONTEXT_STEP tokens of text rather than at every step
CONTEXT_STEP = 32
PROBE = 4  # an exploring step (acceptance.EXPLORE) verifies PROBE candidates beyond the best cut
DEAR = 2.0  # an exploration dearer than this many AR steps backs off, whatever the drafter (``Controller.choose``)
# on an engine that records each step shape as a CUDA graph: how much better (in expected tokens per second) a new
# template pick must be than the last one to replace it. Without it TR-Jacobi made 41 distinct picks over 8
# HumanEval prompts on an H100, each new one built its tables and recorded its verify graph inside the timed region
STICKY = 0.02
# a drafter that asks ``Controller.idle`` before it looks for candidates looks anyway after this many steps in a row
# without: the last step's candidates stand in for this step's, and while the statistics do not move (nothing is
# proposed) a stand-in that does not pay would skip every lookup until the next exploration, up to EXPLORE_MAX steps
# (REST on the Spec-Bench miniature: 10% more forwards than looking at every step)
IDLE_RUN = 3
RERANK = 4  # ... and where that is on, a pick (a template's nodes; a prefix's size, for drafters without a draft
# model) is ranked anew every RERANK-th step (and at explorations that can look past it) only,
# the interval doubling up to RERANK_MAX while rankings keep the last pick (a pick that changes starts over at RERANK):
# on an H100's flat curve TR-Jacobi and Token Recycling keep their whole template, and auto ran 9% slower than faithful
# there, 0.15-0.19 ms more host time per step (h100/checks3), about half of the controller's Python in rankings
RERANK_MAX = 32
# ... and of the steps that keep the pick between rankings, every OBSERVE_KEPT-th is observed: the statistics come from
# a fixed sample of the steps (whatever their outcome: unbiased), forgetting per observation as ever, so over more
# steps. Observing a 68-node pick at every step was ~40% of the controller's host time per step there
OBSERVE_KEPT = 4
ALL = 1 << 30  # a kept prefix of every candidate, however many the next steps have (``Controller.kept_pick``)


# ---------------------------------------------------------------------------------------------- the controller
AR_GAINS = [1.0]  # a row's offer at a step without candidates (one list, never changed: ``Plan.best`` compares it)


def chain_parents(n: int) -> list[int]:
    return list(range(-1, n - 1))  # node i's parent is node i - 1, node 0's the root (-1)


CHAINS: dict[int, tuple[list[int], list[int]]] = {}  # n -> a chain's parents and its sizes 0..n (``Controller.size``)
PREFIXES: dict[int, list[int]] = {}  # k -> the first k nodes, 0..k-1 (``Controller.kept_pick``)


def prefix(k: int) -> list[int]:
    """[0, ..., k - 1], one list per k (never changed: picks are read, not written)."""
    got = PREFIXES.get(k)
    if got is None:
        got = PREFIXES[k] = list(range(k))
    return got


class Stream(Nodes):
    """A stream's statistics (``Nodes``) and what the controller keeps of its choices on it: when it explores, its
    last pick and how long that pick may stand unranked, and what the last AR step or batch ranking rested on."""

    def __init__(self):
        super().__init__()
        self.explore = Backoff()
        self.last: list[int] | None = None  # the last pick that was not an exploration, ascending (Controller.sticky)
        self.size = 0  # ... of a prefix: its size (ALL: every candidate), on a graph engine (Controller.kept_pick)
        self.kept = 0  # steps that reused the last pick (``last``, ``size``) unranked since the last ranking
        self.rerank = RERANK  # ... and how many may (up to RERANK_MAX while the rankings keep the pick)
        self.idled = 0  # steps in a row that ``Controller.idle`` made AR steps (IDLE_RUN)
        self.still: tuple | None = None  # what the last pick, an AR step, rested on (``Controller.choose``)
        self.ranked: tuple | None = None  # in a batch: the last ranking, and what it rested on (``Controller.choose``)


class Controller:
    """Chooses each step's proposal (see the module docstring). ``cost(q, kind[, context])``: seconds of a target
    forward of q tokens (after ``context`` cached ones: ``context``, set by ``Decoder.steps`` every step, as ``room``;
    None: a cost without one); ``draft_cost(stream, k)``: seconds a drafter spends on a draft model to draft k tokens;
    ``catch_up(stream)``: seconds its draft model needs beyond that to catch up with the text first (``room``: tokens
    still to come)."""

    def __init__(self, cost: Callable[[float, str], float],
                 draft_cost: Callable[[str, int], float] | None = None, backoff: bool = True, sticky: float = 0.0,
                 catch_up: Callable[[str], float] | None = None):
        self.streams: dict[str, Stream] = {}
        self.cost, self.draft_cost = cost, draft_cost  # (draft_cost None: drafting costs no draft model)
        self.catch_up, self.room = catch_up, 1
        self.context: int | None = None
        self.backoff = backoff  # False: every EXPLORE-th step explores, whatever it paid (Drafter.backoff)
        self.sticky = sticky  # > 0: a template's last pick stays unless the best is that much better (STICKY)
        self.asked: tuple[Stream, list[int], list[int], str] | None = None  # this step's nodes, parents, kept, stream
        self.probe: float | None = None  # an exploration past an empty best pick: its step's price (seconds)
        self.probe_cost = 0.0  # ... and what it costs whole, the draft model's catch-up included (seconds)
        self.sizes: list[tuple[str, int]] = []  # (stream, nodes proposed) per step of the current generation
        self.plan = None  # in a lock-step batch: the rows' shared sizes (plan.py ``Plan``, set by start_auto_rows)
        self.entered: tuple[str, bool] | None = None  # in a batch: ``idle`` entered this step's plan (stream, explore)
        # at batch 1 on the CPU with a curve probed here (``Decoder.start_auto``): the run's step times, which price
        # host work and judge explorations (None: prices alone, as a pinned curve's study reproduces them)
        self.times = None  # a calibration.StepTimes (set by the decoder: this module does not import that one)
        # an exploration waiting for its step's time: (nodes, stream, tokens, size, AR steps lost by its price)
        self.judging: tuple | None = None
        self.chose: float | None = None  # with ``times``: when this step's choice began (``time.perf_counter``)

    @property
    def cost(self) -> Callable[[float, str], float]:
        return self._cost

    @cost.setter
    def cost(self, cost: Callable[[float, str], float]) -> None:  # a batch's rows are re-priced per batch size
        self._cost, self.prices = cost, {}
        for nodes in self.streams.values():  # (an AR step at one batch size says nothing of another's)
            nodes.still = None

    def at(self) -> int | None:
        """The context this step is priced at: its own, rounded down to a multiple of ``CONTEXT_STEP``."""
        return None if self.context is None else self.context // CONTEXT_STEP * CONTEXT_STEP

    def t(self, q: float, kind: str) -> float:
        """Seconds of a target forward of q tokens of this kind at this step's context."""
        at = self.at()
        return self._cost(q, kind) if at is None else self._cost(q, kind, at)

    def price_list(self, kind: str, extra: int, n: int) -> list[float]:
        """The target forward's seconds for 0..n candidates (and ``extra`` rows) of this kind: every step prices every
        size, so they are looked up once per curve and context (``at``; a curve that probes more sizes, ``version``, is
        priced anew)."""
        key = (kind, extra, n, getattr(self._cost, "version", 0), self.at())
        got = self.prices.get(key)
        if got is None:
            got = self.prices[key] = [self.t(1 + extra + k, kind) for k in range(n + 1)]
        return got

    def split_list(self, extra: int, n: int) -> tuple[list[float], list[float]]:
        """In a batch: the fixed part and the part per live row of the batched forward for 0..n candidates (and
        ``extra`` rows) at this step's context (``Batched.split_list``; of either kind: every forward of a batch carries
        a mask)."""
        return self._cost.split_list(extra, n, self.at())

    def nodes_of(self, stream: str) -> Stream:
        """The statistics of ``stream``, new on its first step (looked up before made: this runs at every step)."""
        nodes = self.streams.get(stream)
        if nodes is None:
            nodes = self.streams[stream] = Stream()
        return nodes

    def step(self, stream: str, nodes: Stream) -> bool:
        """Count a step of ``stream``; whether it explores: the stream's own schedule, or in a batch the plan's,
        entered once per step (``batch_idle`` may have entered it already and let the row look)."""
        if self.plan is None:
            return nodes.explore.due()
        if self.entered is not None and self.entered[0] == stream:
            explore, self.entered = self.entered[1], None
            return explore
        return self.plan.enter(self, nodes.explore)

    def begin(self) -> None:
        """A generation starts: a new text, where drafting may pay as it did not in the last one, so every stream
        explores at its ``EXPLORE``-th step again (its statistics and its gap stay: ``Backoff.restart``). Not a draft
        model's (``catch_up``): its exploration first feeds the draft model the whole prompt, so its streams count their
        steps on across generations, an exploration every ``gap`` steps of the run. Restarted per generation,
        speculative decoding and Ouroboros with auto explored in 16 of 20 HumanEval generations where drafting never
        paid (~300-token prompts, ~66 tokens each), at about 6% and 11% of their time."""
        self.sizes = []
        self.asked = self.probe = self.judging = None
        for nodes in self.streams.values() if self.backoff and self.catch_up is None else ():
            nodes.explore.restart()

    def host(self, drafted: bool, whole: bool = False) -> float:
        """Host seconds of a step of this kind outside its forwards, after its choice (``whole``: all of them;
        ``calibration.StepTimes``; 0 without step times)."""
        return self.times.step_host(drafted, whole) if self.times is not None else 0.0

    def ar_price(self, kind: str = CHAIN, extra: int = 0, whole: bool = False) -> float:
        """Seconds of an AR step: its forward and its host work (after the choice; ``whole``: all of it)."""
        return self.t(1 + extra, kind) + self.host(False, whole)

    def spend(self, stream: str, k: int, kind: str, extra: int, tokens: float) -> float:
        """Seconds of a step that verifies ``k`` candidates and is expected to emit ``tokens``: the target's forward,
        its host work, the drafting of them and the tokens' share of the draft model's catch-up."""
        if not k:
            return self.ar_price(kind, extra)
        spent = self.t(1 + extra + k, kind) + self.host(True)
        return spent + self.draft_cost(stream, k) + tokens * self.share(stream) if self.draft_cost else spent

    def behind(self, stream: str) -> float:
        """Seconds of the draft model's catch-up before this step could draft (0 without a draft model)."""
        return self.catch_up(stream) if self.catch_up else 0.0

    def share(self, stream: str) -> float:
        """The catch-up's share per token still to come in the generation."""
        return self.behind(stream) / max(self.room, 1)

    def choose(self, stream: str, parents: list[int], kind: str, extra: int, cuts: list[int] | None,
               allow: list[bool] | None) -> list[int]:
        """The kept nodes (ascending). ``cuts``: prefixes of the given order only, of these sizes; else the k nodes of
        highest p for the best k (with p(child) <= p(parent) and ties to the earlier node, always a tree)."""
        if self.times is not None:
            self.chose = time.perf_counter()
        nodes = self.nodes_of(stream)
        nodes.idled = 0
        explore = self.step(stream, nodes)
        keep = self.kept_pick(nodes, parents, cuts, allow, explore) if self.sticky else None
        if keep is not None:
            # a graph engine's last ranked pick, kept (``kept_pick``): the ranking (every node's p, every size priced)
            # is Python work that costs ~15% of a graphed step on an H100; the statistics move slowly (FORGET).
            # First: this path is most of such a run's steps, and on it nothing else is needed
            if explore:  # (nothing beyond the pick to look at)
                self.result(nodes, stream, paid=True)
            nodes.kept += 1
            self.probe = None
            self.picked(nodes, parents, keep, stream)
            if nodes.kept % OBSERVE_KEPT:  # not observed (``OBSERVE_KEPT``)
                self.asked = None
            return keep
        # the last pick was an AR step and nothing it rested on has moved (the statistics: nothing was proposed since;
        # the prices: the same context step and curve; the candidates' tree): this one is an AR step too, without
        # ranking and pricing every size again, ~0.1 ms of Python per step (~1% of an AR step of the shipped model on
        # the CPU). With a draft model the price of drafting only grows meanwhile (the draft falls further behind,
        # fewer tokens are left to share its catch-up), so an AR step stays the best pick
        still = (nodes.version, self.at(), getattr(self._cost, "version", 0), kind, extra, tuple(parents),
                 None if cuts is None else tuple(cuts),  # (the tree itself: REST's changes from step to step)
                 self.times.key() if self.times is not None else None)
        if not explore and allow is None and nodes.still == still and self.plan is None:
            self.probe = None
            return self.picked(nodes, parents, [], stream)
        if (self.plan is not None and not explore and allow is None and nodes.ranked is not None
                and self.plan.size is not None and (nodes.ranked[0] == still or (
                    nodes.ranked[0][1:] == still[1:] and not self.plan.ranks()))):
            # in a batch, nothing the last ranking rested on has moved (its rows' AR steps propose nothing, so the
            # statistics stay), or only the statistics did and the batch does not rank at this step (``Plan.ranks``):
            # its order and gains are offered again, the batch's size taken from them (at B = 16 on the CPU the rows
            # mostly take AR steps, and ranking a 68-node template anyway cost ~70 us per row-step)
            _, order, sizes, gains = nodes.ranked  # (no prices in them: the batch's size is priced by ``Plan``)
            self.probe = None
            size = self.planned(stream, order, sizes, kind, extra, gains)
            return self.picked(nodes, parents, sorted(order[:size]), stream)
        if not explore:  # (an exploration's pick is not kept: the count to the next ranking goes on)
            nodes.kept = 0
        p = nodes.p(parents, allow)
        if cuts is None:
            # highest p first; reverse keeps a sort stable: ties keep their order
            order = sorted([i for i, x in enumerate(p) if x >= 0], key=p.__getitem__, reverse=True)
            sizes = range(len(order) + 1)
        else:
            order, sizes = list(range(len(p))), [c for c in cuts if c <= len(p)]
        if self.plan is None:
            best, best_rate = self.best(stream, p, order, sizes, kind, extra)
        else:  # in a batch the size is the plan's, priced for the whole batch (``Plan.best``)
            gains = expected(p, order)
            nodes.ranked = (still, order, sizes, gains) if not (explore or allow) else None
            best, best_rate = self.planned(stream, order, sizes, kind, extra, gains), None
        chosen = order[:best]
        if (self.sticky and best_rate is not None and cuts is None and nodes.last
                and all(p[i] >= 0 for i in nodes.last)):
            # a template pick on a graph engine: the last pick stays unless the best beats it by ``sticky``: a new pick
            # costs its tables and a recorded verify graph, which a pick that changes every step never earns back
            gain = 1.0 + sum(max(p[i], 0.0) for i in nodes.last)
            if gain / self.spend(stream, len(nodes.last), kind, extra, gain) * (1 + self.sticky) >= best_rate:
                chosen = nodes.last
        self.probe = None
        if explore:  # look past the best cut now and then
            sizes = list(sizes)
            probe = sizes[min(sizes.index(best) + PROBE, len(sizes) - 1)] if best in sizes else best
            # a drafter that does not back off (its explorations feed its next candidates) does where an exploration
            # costs more than ``DEAR`` AR steps: at B = 16 on the CPU TR-Jacobi's 5-token blocks cost 2.8 AR steps, and
            # its two explorations per 64-token batch cost ~4% of the batch without a step drafted after them
            price = self.spend(stream, probe, kind, extra, 0.0) if probe else 0.0
            dear = price > DEAR * self.ar_price(kind, extra)
            if best or not (self.backoff or dear):  # drafting pays here: looking a little further is cheap
                self.result(nodes, stream, paid=True)
            elif probe and self.behind(stream) > price:
                # a draft model far behind the text (a long prompt): an exploration would pay its catch-up, more than
                # the exploration itself, at once; it waits as one that did not pay would (the statistics come from
                # steps where the draft keeps up). On Spec-Bench's 1,200-token prompts such an exploration cost ~6%
                # of a generation for speculative decoding
                self.result(nodes, stream, paid=False)
                probe = 0
            elif probe:  # an AR step drafts instead: ``observe`` tells whether that paid
                self.probe = self.spend(stream, probe, kind, extra, 1 + sum(max(p[i], 0.0) for i in order[:probe]))
                self.probe_cost = price + self.behind(stream)  # the step's price, the whole catch-up with it
            chosen = order[:probe]
        elif cuts is None:
            if self.sticky:
                same = nodes.last is not None and set(chosen) == set(nodes.last)
                nodes.rerank = min(2 * nodes.rerank, RERANK_MAX) if same else RERANK
            nodes.last = sorted(chosen)
        elif self.sticky:  # a prefix's size; all of the candidates: as many as the next steps have (``kept_pick``)
            size = best if best < len(order) else ALL
            nodes.rerank = min(2 * nodes.rerank, RERANK_MAX) if size == nodes.size else RERANK
            nodes.size = size
        nodes.still = still if not (explore or chosen or allow) else None
        return self.picked(nodes, parents, sorted(chosen), stream)

    def kept_pick(self, nodes: Stream, parents: list[int], cuts: list[int] | None, allow: list[bool] | None,
                  explore: bool) -> list[int] | None:
        """On a graph engine (``sticky``, at batch 1 only: a batch's rows are not sticky): this step's pick if it keeps
        the last ranked one, else None (rank). A pick is kept for ``nodes.rerank`` steps (``RERANK``, doubling up to
        ``RERANK_MAX`` while the rankings keep it), and at an exploration that has nothing beyond it to look at: a pick
        of the whole template, or of all the candidates (on an H100's flat curve TR-Jacobi keeps its 68 nodes, and its
        explorations, every EXPLORE-th step, ranked them all). A template's pick is its nodes (ascending, the list
        itself); near the budget (``allow``) the ones that may be chosen with their whole path, as the faithful tree
        is cut (ranked anew, each of a generation's last steps cost a whole ranking). A prefix's is its size, up to
        the candidates this step has (Lookahead's n-grams, PLD's match: their counts change from step to step), for
        drafters without a draft model (whose price moves with the text the draft has not seen)."""
        if cuts is None:
            last = nodes.last
            if not last or not (len(last) == len(parents) if explore else nodes.kept < nodes.rerank):
                return None
            if allow is None:
                return last
            keep: set[int] = set()
            for i in last:
                if allow[i] and (parents[i] < 0 or parents[i] in keep):
                    keep.add(i)
            return sorted(keep)
        if allow is not None or not self.keeps_size(nodes, len(parents), explore):
            return None
        return prefix(max((c for c in cuts if c <= min(nodes.size, len(parents))), default=0))

    def keeps_size(self, nodes: Stream, n: int, explore: bool) -> bool:
        """Whether this step keeps the last ranked size of a prefix of ``n`` candidates (``kept_pick``)."""
        size = nodes.size
        return bool(self.sticky and size and self.draft_cost is None
                    and (size >= n if explore else nodes.kept < nodes.rerank))

    def best(self, stream: str, p: list[float], order: list[int], sizes, kind: str, extra: int,
             whole: bool = False) -> tuple[int, float]:
        """(k, rate): of ``sizes``, the one whose first k nodes of ``order`` give the most expected accepted tokens per
        second (0: the AR step, unless another rates strictly higher), and its rate. ``whole``: steps priced with all
        their host work (before the candidates are looked for: ``idle``), else with what comes after the choice."""
        # the gain adds the nodes since the last size, the prices come from the cached list (this runs for every size
        # at every step)
        price = self.price_list(kind, extra, max(sizes, default=0))
        draft = self.draft_cost
        share = self.share(stream)
        host = self.host(True, whole)
        best, best_rate, gain, done = 0, 1.0 / self.ar_price(whole=whole), 1.0, 0
        for k in sizes:
            if k == 0:
                continue
            if k == done + 1:  # one node (every size of a template pick): adding it alone, as sum() of it would
                gain += p[order[done]] if p[order[done]] > 0.0 else 0.0
            else:
                gain += sum(max(p[i], 0.0) for i in order[done:k])
            done = k
            rate = gain / (price[k] + host + draft(stream, k) + gain * share) if draft else gain / (price[k] + host)
            if rate > best_rate:
                best, best_rate = k, rate
        return best, best_rate

    def planned(self, stream: str, order: list[int], sizes, kind: str, extra: int, gains: list[float]) -> int:
        """In a batch (``Plan``): offer this row's gain at every size, the most of ``sizes`` up to each (``gains``:
        ``expected``'s for every prefix of ``order``), and take the most of them up to the batch's size for this
        step."""
        if isinstance(sizes, range):  # a template's: every size from 0 to all of ``order``
            return min(self.plan.pick(self, stream, gains, kind, extra), len(order))
        allowed, gain, offered = set(sizes), 1.0, []
        for k, run in enumerate(gains):
            if k in allowed:
                gain = run
            offered.append(gain)
        size = self.plan.pick(self, stream, offered, kind, extra)
        return max((k for k in sizes if k <= size), default=0)

    def idle(self, stream: str, parents: list[int] | None, kind: str = TREE, extra: int = 0) -> bool:
        """Whether this step is an AR step before its candidates are looked for: it does not explore, a prefix of the
        stream's last candidates (``parents``: their tree, standing in for this step's) would not pay at the current
        statistics, and fewer than ``IDLE_RUN`` steps in a row were idle. For a drafter whose candidates cost host
        work to find (REST's corpus lookup, ~8% of an AR step on the CPU, at steps that were nearly all AR steps on
        Spec-Bench's summarization and RAG). The step is counted then, as ``choose`` counts it. In a batch
        (``batch_idle``) the batch's size decides."""
        nodes = self.streams.get(stream)
        if self.plan is not None:
            return self.batch_idle(nodes, stream, parents, kind, extra)
        if nodes is None or not parents or nodes.explore.pending() or nodes.idled >= IDLE_RUN:
            return False
        if self.keeps_size(nodes, len(parents), explore=False):
            return False  # a graph engine's kept size drafts (``kept_pick``): no ranking to tell
        if self.best(stream, nodes.p(parents), list(range(len(parents))), range(len(parents) + 1), kind, extra,
                     whole=True)[0]:
            return False
        nodes.idled += 1
        nodes.explore.due()  # (not due: checked above)
        self.probe = None
        self.picked(nodes, parents, [], stream)
        return True

    def batch_idle(self, nodes: Stream | None, stream: str, parents: list[int] | None, kind: str, extra: int) -> bool:
        """``idle`` in a batch: an AR step without a lookup when the batch's size for this step is 0 and it does not
        explore (and fewer than ``IDLE_RUN`` steps in a row were idle), offering the last candidates' gains for the
        next step's size instead of this step's. Looking at every step, REST's rows paid their corpus lookup (~1 ms
        of host work per row on the CPU) at steps the batch then took as AR steps. Else the row looks, and ``choose``
        takes the step this call entered."""
        self.entered = None
        if nodes is None or not parents or nodes.idled >= IDLE_RUN:
            return False
        explore = self.plan.enter(self, nodes.explore)
        if explore or self.plan.size != 0:
            self.entered = (stream, explore)
            return False
        order = list(range(len(parents)))
        self.plan.pick(self, stream, expected(nodes.p(parents), order), kind, extra)
        nodes.idled += 1
        self.probe = None
        self.picked(nodes, parents, [], stream)
        return True

    def result(self, nodes: Stream, stream: str, paid: bool, tokens: float = 0.0, size: int = 0,
               lost: float = 0.0) -> None:
        """What this step's exploration was worth, to the schedule it came from: the stream's own (``lost``: AR steps'
        time it cost beyond the tokens it emitted, ``Backoff.result``), or the batch's (``tokens`` emitted by an AR step
        turned into a draft of ``size`` candidates: ``Plan.worth``)."""
        if self.plan is None:
            nodes.explore.result(paid, lost)
        else:
            self.plan.result(self, paid, tokens, size)

    def picked(self, nodes: Stream, parents: list[int], keep: list[int], stream: str) -> list[int]:
        """Record this step's pick (for ``observe`` and ``describe``) and return it."""
        self.asked = (nodes, parents, keep, stream) if keep else None
        self.sizes.append((stream, len(keep)))
        return keep

    def size(self, stream: str, n: int, kind: str = TREE, extra: int = 0, cuts: list[int] | None = None,
             parents: list[int] | None = None) -> int:
        """How many of ``n`` candidates to verify, a prefix of their order: a size in ``cuts`` (default 0..n)
        maximising expected accepted tokens per second. ``parents``: the candidates' tree (default a chain)."""
        if n <= 0:
            self.asked = None
            self.ar_step(stream, kind, extra)
            return 0
        chain = CHAINS.get(n)
        if chain is None:  # (built once per n: a chain drafter asks at every step)
            chain = CHAINS[n] = (chain_parents(n), list(range(n + 1)))
        return len(self.choose(stream, parents or chain[0], kind, extra, chain[1] if cuts is None else cuts, None))

    def select(self, stream: str, parents: list[int], kind: str = TREE, extra: int = 0,
               allow: list[bool] | None = None) -> list[int]:
        """Which nodes of a tree whose nodes keep their identity from step to step (a template) to verify: the k
        most likely ones (``allow``: those that may be chosen), for the best k."""
        if not parents:
            self.asked = None
            self.ar_step(stream, kind, extra)
            return []
        return self.choose(stream, parents, kind, extra, None, allow)

    def ar_step(self, stream: str, kind: str, extra: int) -> None:
        """A step without candidates: in a batch the row still counts (``Plan``): it pays for the batch's padded block
        and gains one token whatever the size (PLD's rows without a match; offered by the rows with one alone, the
        batch drafted at B = 4 on Spec-Bench where most rows had none, at 0.87x batched AR)."""
        if self.plan is not None:
            self.step(stream, self.nodes_of(stream))
            self.plan.pick(self, stream, AR_GAINS, kind, extra)

    def observe(self, v) -> None:
        """The verdict of the step that asked: tree input i is kept node ``keep[i - 1]``."""
        if self.asked is None:
            return
        nodes, parents, keep, stream = self.asked
        self.asked = None
        # a drafter may propose fewer than it was allowed (a shorter match)
        proposed = keep if v.shape.nodes >= len(keep) else keep[:v.shape.nodes]
        if self.probe is not None:  # paid: more accepted tokens per second than the AR step it replaced
            # what it lost (``Backoff.result``), in AR steps, by its price (one step's time, a hiccup of the machine
            # included, would set a long gap); a draft model's only: other drafters explore anew in every generation
            # (``begin``), at the cost of an AR step turned into a draft, ~0.3-1.5 AR steps on the CPU
            lost = self.probe_cost / self.ar_price() - 1 - v.accepted if self.catch_up is not None else 0.0
            if self.times is not None and self.times.ar_seconds:  # judged by its time, once the step is done
                self.judging = (nodes, stream, 1 + v.accepted, len(proposed), lost)
            else:
                self.result(nodes, stream, (1 + v.accepted) / self.probe > 1 / self.ar_price(), 1 + v.accepted,
                            len(proposed), lost)
            self.probe = None
        nodes.observe(parents, proposed, {keep[i - 1] for i in v.path[1:v.accepted + 1]})

    def timed(self, seconds: float, forwards: float, drafted: bool, measured: float, priced: float,
              before: float = 0.0) -> None:
        """A step is done (batch 1, with ``times``): ``StepTimes.add``'s figures. Judges the step's exploration by its
        time against an AR step's."""
        self.times.add(seconds, forwards, drafted, measured, priced, before)
        if self.judging is not None and self.times.ar_seconds:
            nodes, stream, tokens, size, lost = self.judging
            self.judging = None
            self.result(nodes, stream, tokens / seconds > 1 / self.times.ar_seconds, tokens, size, lost)

    def describe(self) -> dict:
        """What a run records: per stream, the mean chosen size, the last generation's sizes, the first nodes' p."""
        out = {}
        for stream, nodes in self.streams.items():
            chosen = [k for s, k in self.sizes if s == stream]
            rates = [round((h + 1) / (t + 2), 3) for h, t in zip(nodes.hits[:16], nodes.trials[:16])]
            out[stream] = {"mean_size": round(sum(chosen) / len(chosen), 3) if chosen else None,
                           "zero_share": round(chosen.count(0) / len(chosen), 3) if chosen else None,
                           "sizes": chosen[:256], "conditional_rates": rates}
        return out
