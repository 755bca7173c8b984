"""What a run's own generations take against the cost curve's prices: decoder.auto's calibrations at run time.

The curve (cost.py ``Curve``) times each forward in a tight loop of one model, the fastest of several probes. Inside a
generation a forward follows other work, and a step is more than its forwards. Two corrections, each learnt from the
run itself and used only where the curve was probed on this machine (a pinned curve's study reproduces its choices
from the prices alone):

- ``DraftScale``: what a draft model's forwards take over their price, relative to the same for the target's (after
  each generation, from the engines' per-forward clocks); ``Decoder.draft_scale`` multiplies every draft price.
- ``StepTimes``: at batch 1 on the CPU, each step timed (``StepTimer``): the host work of an AR step and of a drafted
  step, priced on top of their forwards, and an exploration's worth judged by its wall time.
"""

from __future__ import annotations

import time

from specnoise.decoding.cost import Curve, price


def probed_here(curves) -> bool:
    """Whether a run's own times may correct these curves: each a ``Curve`` probed on this machine (not a pinned one,
    whose prices a committed study reproduces as they are; not a test's plain function)."""
    return all(isinstance(curve, Curve) and not curve.pinned for curve in curves)


class DraftScale:
    """What the run's draft forwards take over what the draft's curve prices them at, relative to the same for the
    target's: the factor decoder.auto prices draft forwards by (``Decoder.draft_scale``, one per decoder: its draft
    forwards are mostly of one shape). A curve is timed in a tight loop of one model's forwards; in a generation a
    draft forward follows a target forward, which evicted the small model's weights and working set from the caches.
    On the 2-core CPU (Spec-Bench-10, the shipped pair) speculative decoding's one-token draft forwards took 1.20-1.51x
    their price relative to the target's, and priced by the curves alone it drafted where drafting lost time
    (0.92-0.98x AR, 0.96-1.01x with the scale); Ouroboros' ~61-row lookahead steps took 0.83x (see ``scale``). The two
    ratios are kept per generation with weight ``SCALE_FORGET`` for the past, over the forwards the curves probed (at
    most ``largest`` tokens: not a prefill, which the curves extend beyond their grid, nor a draft's catch-up over a
    long prompt)."""

    def __init__(self, largest: int):
        self.largest = largest
        self.sums = {"target": [0.0, 0.0], "draft": [0.0, 0.0]}  # per role: measured seconds, priced seconds

    def add(self, role: str, forwards: list[tuple], laps: list[float], curve) -> None:
        """One generation's forwards of ``role`` (``Engine.forward_log`` entries) and their measured seconds."""
        kept = [(forward, seconds) for forward, seconds in zip(forwards, laps) if forward[0] <= self.largest]
        sums = self.sums[role]
        sums[0] = sums[0] * SCALE_FORGET + sum(seconds for _, seconds in kept)
        sums[1] = sums[1] * SCALE_FORGET + price([forward for forward, _ in kept], curve)

    @property
    def scale(self) -> float:
        """Measured over priced for the draft, over the same for the target (1 until both have forwards), and 1 at the
        least: a draft's host work outside its forwards (a lookahead step's ~1.4 ms on the CPU) is in no clock, so a
        draft priced below its curve looks cheaper than drafting is (Ouroboros' 61-row steps measured 0.83-0.84x, and
        priced so it drafted more and ran 1.000 -> 0.974x AR on HumanEval-10)."""
        (td, pd), (tt, pt) = self.sums["draft"], self.sums["target"]
        return max(1.0, (td / pd) / (tt / pt)) if pd > 0 and pt > 0 and tt > 0 else 1.0


SCALE_FORGET = 0.9  # weight of the past generations' forwards in ``DraftScale``


class StepTimes:
    """What a run's steps took, for a controller at batch 1 on the CPU with a curve probed on this machine
    (``Controller.times``; ``Decoder.steps`` times each step after the first). Two things the curve does not see:

    - **Host work** per step outside the forwards (the drafter's candidates, the verify ops, the KV commit, the
      controller itself), kept per kind of step, AR and drafted, and priced on top of the forwards. On the shipped
      small-code-msn (one thread, ~4.7 ms AR step) an AR step carries 0.27 ms, a tree drafter's drafted step 0.7-0.8
      ms, speculative decoding's 0.86 ms and an Ouroboros lookahead step 2.8 ms. In curve seconds: divided by what
      the steps' target forwards take over their price (``pace``: the curve is the fastest of several probes).
    - **An exploration's worth**, judged by its own wall time against an AR step's (``ar_seconds``), not by its price:
      on Spec-Bench-10 Ouroboros' explorations took 1.37x their price (a draft model's catch-up over the prompt, its
      host work) and 24 of 45 "paid" by their price against 9 by their time, so its gap never backed off, and its
      ~1 exploration per generation cost 2-3% of the run.

    A step's host work before its controller chose (``before``: the candidates' lookup of a drafter that looks first,
    REST's corpus search) is sunk when the choice is made: the choice prices what comes after it (``after``), and only
    ``Controller.idle``, asked before the lookup, the whole step. Priced whole at the choice, REST's drafted steps
    looked 0.6 ms dearer than its AR steps where 0.3 ms was still to spend, and it ran 3% slower on HumanEval-10 (two
    side-by-side runs). Each mean forgets the past with weight ``STEP_FORGET`` per step of its kind."""

    def __init__(self):
        self.ar_seconds: float | None = None  # an AR step's wall seconds
        self.pace: float | None = None  # the target forwards' seconds over their price
        self.host: list[float | None] = [None, None]  # host seconds of an AR step, of a drafted step (curve units)
        self.after: list[float | None] = [None, None]  # ... of their host seconds, those after the choice

    def add(self, seconds: float, forwards: float, drafted: bool, measured: float, priced: float,
            before: float = 0.0) -> None:
        """One step: its wall ``seconds``, the seconds inside its forwards (the draft's too), whether it drafted, its
        target forwards' seconds and price, and the seconds before its controller chose (no forward runs before)."""
        if not drafted:
            self.ar_seconds = mean(self.ar_seconds, seconds)
        if priced > 0:
            self.pace = mean(self.pace, measured / priced)
        if self.pace:
            host = max(seconds - forwards, 0.0)
            self.host[drafted] = mean(self.host[drafted], host / self.pace)
            self.after[drafted] = mean(self.after[drafted], max(host - before, 0.0) / self.pace)

    def step_host(self, drafted: bool, whole: bool = False) -> float:
        """Host seconds a step of this kind carries after its choice (``whole``: all of them); a drafted step's: an
        AR step's until one was timed."""
        ar, draft = self.host if whole else self.after
        return (draft if drafted and draft is not None else ar) or 0.0

    def key(self) -> tuple:
        """The host work's prices to 0.1 ms: a ranking that rested on them holds while they stay there
        (``Controller.choose``: they move a little at every step)."""
        return tuple(None if h is None else round(h * 1e4) for h in self.after)

    def describe(self) -> dict:
        ar, draft = self.host
        return {"host_ms": {"ar_step": None if ar is None else round(ar * 1e3, 3),
                            "drafted_step": None if draft is None else round(draft * 1e3, 3)},
                "ar_step_ms": None if self.ar_seconds is None else round(self.ar_seconds * 1e3, 3)}


STEP_FORGET = 0.95  # weight of the past per step in ``StepTimes`` (a half-life of ~14 steps of the kind)


def mean(past: float | None, x: float) -> float:
    """``StepTimes``' forgetting mean: ``x`` alone at first."""
    return x if past is None else STEP_FORGET * past + (1 - STEP_FORGET) * x


class StepTimer:
    """decoder.auto at batch 1 on the CPU (auto.py ``StepTimes``): each step after the first (the prefill) timed, its
    wall seconds, the seconds inside its forwards (the engines' clocks) and its target forwards' price, for the
    controller to price host work and judge explorations by."""

    def __init__(self, decoder):  # a base.Decoder (which imports this module)
        self.decoder, self.first = decoder, True
        self.clocks = [kv.clock for kv in (decoder.target, decoder.draft) if kv is not None]

    def start(self) -> None:
        self.marks = [len(clock.host) for clock in self.clocks], len(self.decoder.target.forward_log)
        self.started = time.perf_counter()

    def stop(self, proposed: bool) -> None:
        seconds = time.perf_counter() - self.started
        if self.first:
            self.first = False
            return
        laps, logged = self.marks
        target, *draft = (clock.host[n:] for clock, n in zip(self.clocks, laps))
        drafts = draft[0] if draft else []
        decoder, curve, auto = self.decoder, self.decoder.curves["target"], self.decoder.auto
        priced = price(decoder.target.forward_log[logged:], curve)
        # (a drafter proposes before any of the step's forwards: what it did before the choice is host work)
        before = auto.chose - self.started if auto.chose is not None and auto.chose >= self.started else 0.0
        auto.chose = None
        auto.timed(seconds, sum(target) + sum(drafts), proposed or bool(drafts), sum(target), priced, before)
