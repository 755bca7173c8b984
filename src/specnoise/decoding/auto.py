"""Hardware-aware drafting (``decoder.auto=true``): what the decoder's forwards cost here, and one controller that sizes
every step's proposal from it.

The cost curve. A verify step is one target forward of q tokens; what it costs depends on the machine, the engine,
the threads, the dtype, the context length, and on the *kind* of forward: a chain is fed as a plain causal block
(SDPA's causal fast path), a tree with positions and a 4D mask. ``Curve`` times both kinds on the decoder's own
engine at the run's settings, over a representative context (the first prompt plus half the budget), on a grid of
sizes, and interpolates in between. The timings are cached in a small JSON file per machine + model + settings
(``decoder.cost_cache``, default ``outputs/cost_cache``), so a run pays the probe once and a second run reuses it.

The controller. Every drafter ranks its candidates (a chain by depth, a tree by its template order or frequency,
parents first) and asks ``Drafter.cut(n)`` how many of the first n to propose; 0 is a plain AR step with no draft
work at all. The controller keeps, per stream of candidates (a drafter may have two: SAM's matched chain and its
tree fallback) and per rank, how often the rank's whole path was accepted when it was verified, and proposes the
prefix k that maximises expected accepted tokens per second,

    (1 + p_1 + ... + p_k) / (t(1 + extra + k) + draft_cost(k)),

with t the target curve (``extra``: rows fed beside the tree, Lookahead's window) and ``draft_cost`` what drafting
k tokens costs a draft model. Acceptance statistics are kept across prompts (the benchmark's warm-up teaches them)
with exponential forgetting (weight 0.98 per observation, a half-life of ~35 steps), so they follow the current
text. An unseen rank is scored like the rank before it (optimism: the cut grows until it learns better), and every
``EXPLORE``-th step verifies ``PROBE`` more candidates than the best cut, so ranks beyond it keep being observed.

A cost function is all the controller takes: the batched path can pass t(B x q) for B rows verified together.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import platform
from collections.abc import Callable
from pathlib import Path

import torch

from specnoise.decoding.cost import interpolate, measure_forward_costs

log = logging.getLogger("specnoise")

CHAIN, TREE = "chain", "tree"  # a causal block without a mask; a block with positions and a 4D mask
GRID = (1, 2, 3, 4, 5, 6, 8, 10, 12, 16, 20, 24, 32, 40, 48, 64, 80, 96, 128)
FORGET = 0.98  # weight of the past per observation of a rank
EXPLORE, PROBE = 16, 4  # every EXPLORE-th step of a stream verifies PROBE candidates beyond the best cut
REPEATS, WARMUP = 7, 2  # per probed size and kind: the median of REPEATS timings after WARMUP


# ---------------------------------------------------------------------------------------------- the cost curve
def machine_key(engine, context: int) -> dict:
    """What a forward's cost depends on, besides q and its kind: the run's machine, model and settings."""
    model = engine.model
    return {
        "host": platform.node(), "machine": platform.machine(), "processor": platform.processor(),
        "cpus": os.cpu_count(), "torch": torch.__version__, "threads": torch.get_num_threads(),
        "device": str(engine.device), "dtype": str(engine.dtype).removeprefix("torch."),
        "model": getattr(model.config, "_name_or_path", "") or model.config.model_type,
        "parameters": sum(p.numel() for p in model.parameters()),
        "attn_implementation": getattr(model.config, "_attn_implementation", "?"),
        "engine": type(engine).__name__, "compiled": bool(getattr(engine, "compiled", False)), "context": context,
    }


class Curve:
    """t(q, kind) in seconds on ``engine`` over a cache of ``context`` tokens (the engine's own cache, topped up with
    random tokens): measured for the sizes a run needs (at least up to ``largest``), read from / written to
    ``cache_dir`` when given. The probe leaves the engine as it found it."""

    def __init__(self, engine, context: int, largest: int, cache_dir: str | None):
        context = min(context, engine.max_length - largest - 1)
        self.key = machine_key(engine, max(context, 0))
        digest = hashlib.sha1(json.dumps(self.key, sort_keys=True).encode()).hexdigest()[:16]
        self.path = Path(cache_dir) / f"forward-cost-{digest}.json" if cache_dir else None
        self.times: dict[str, dict[int, float]] = {CHAIN: {}, TREE: {}}
        if self.path is not None and self.path.exists():
            saved = json.loads(self.path.read_text())
            self.times = {kind: {int(q): t for q, t in saved["seconds"][kind].items()} for kind in (CHAIN, TREE)}
        self.cached = bool(self.times[CHAIN])
        self.ensure(engine, largest)

    def ensure(self, engine, largest: int) -> None:
        """Probe the grid sizes up to ``largest`` that are not measured yet (both kinds), and save."""
        qs = [q for q in GRID if q <= largest] + ([largest] if largest not in GRID else [])
        todo = sorted({q for q in qs if q not in self.times[CHAIN]} | {1, 2})
        todo = [q for q in todo if q not in self.times[CHAIN] or q not in self.times[TREE]]
        if not todo:
            return
        clock = engine.clock  # the probe leaves the engine as found: cache, forward count and clock
        saved = clock.host, list(clock.events)
        for kind in (CHAIN, TREE):
            got = measure_forward_costs(engine, todo, cache_len=self.key["context"], repeats=REPEATS,
                                        warmup=WARMUP, causal=kind == CHAIN)
            self.times[kind].update(got)
        clock.host, clock.events = saved
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.path.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(json.dumps({"key": self.key, "seconds": self.times}, indent=1, sort_keys=True))
            tmp.replace(self.path)  # atomic: a reader never sees half a file
        self.fits = None

    def __call__(self, q: float, kind: str = CHAIN) -> float:
        if getattr(self, "fits", None) is None:
            self.fits = {k: interpolate(v) for k, v in self.times.items()}
        return self.fits[CHAIN if q <= 1 else kind](q)

    def ratios(self, kind: str) -> dict[int, float]:
        """t(q) / t(1) at the measured sizes (results.json meta)."""
        return {q: round(t / self.times[CHAIN][1], 3) for q, t in sorted(self.times[kind].items())}

    def describe(self) -> dict:
        return {"cache_file": str(self.path) if self.path else None, "from_cache": self.cached,
                "context": self.key["context"], "threads": self.key["threads"], "engine": self.key["engine"],
                "t1_ms": round(self.times[CHAIN][1] * 1e3, 3),
                "chain_ratio": self.ratios(CHAIN), "tree_ratio": self.ratios(TREE)}


# ---------------------------------------------------------------------------------------------- the controller
class Ranks:
    """One stream of ranked candidates: per rank, the forgetting sums of trials and of whole-path acceptances."""

    def __init__(self):
        self.trials: list[float] = []
        self.hits: list[float] = []
        self.steps = 0

    def p(self, n: int) -> list[float]:
        """Each of the first ``n`` ranks' chance of being accepted: (hits + prior) / (trials + 1), the prior the rank
        before's estimate (rank 1's: 1), so an unseen rank looks as good as the one before it."""
        out, prior = [], 1.0
        for i in range(n):
            t, h = (self.trials[i], self.hits[i]) if i < len(self.trials) else (0.0, 0.0)
            prior = (h + prior) / (t + 1)
            out.append(prior)
        return out

    def observe(self, proposed: int, accepted: list[int]) -> None:
        """``proposed`` ranks were verified; ranks ``accepted`` (0-based) were on the accepted path."""
        grow = proposed - len(self.trials)
        if grow > 0:
            self.trials += [0.0] * grow
            self.hits += [0.0] * grow
        won = set(accepted)
        for i in range(proposed):
            self.trials[i] = self.trials[i] * FORGET + 1
            self.hits[i] = self.hits[i] * FORGET + (i in won)


class Controller:
    """Chooses each step's proposal size (see the module docstring). ``cost(q, kind)``: seconds of a target forward
    of q tokens; ``draft_cost(stream, k)``: seconds a drafter spends on a draft model to draft k tokens."""

    def __init__(self, cost: Callable[[float, str], float],
                 draft_cost: Callable[[str, int], float] | None = None):
        self.cost, self.draft_cost = cost, draft_cost
        self.streams: dict[str, Ranks] = {}
        self.asked: tuple[str, int] | None = None  # this step's stream and cut, until the verdict
        self.sizes: list[tuple[str, int]] = []  # (stream, cut) per step of the current generation

    def begin(self) -> None:
        self.sizes = []
        self.asked = None

    def size(self, stream: str, n: int, kind: str = TREE, extra: int = 0, cuts: list[int] | None = None) -> int:
        """How many of ``n`` ranked candidates to verify: a cut in ``cuts`` (default 0..n) maximising expected
        accepted tokens per second. ``extra``: rows fed beside the candidates whenever k > 0."""
        ranks = self.streams.setdefault(stream, Ranks())
        cuts = list(range(n + 1)) if cuts is None else [c for c in cuts if c <= n]
        if n <= 0 or len(cuts) <= 1:
            self.asked = None
            return 0
        p = ranks.p(n)
        gain, best, best_rate, k_prev = 1.0, 0, 1.0 / self.cost(1, CHAIN), 0
        for c in cuts[1:]:
            gain += sum(p[k_prev:c])
            k_prev = c
            spend = self.cost(1 + extra + c, kind) + (self.draft_cost(stream, c) if self.draft_cost else 0.0)
            if gain / spend > best_rate:
                best, best_rate = c, gain / spend
        ranks.steps += 1
        if ranks.steps % EXPLORE == 0:  # look past the best cut now and then
            best = cuts[min(cuts.index(best) + PROBE, len(cuts) - 1)]
        self.asked = (stream, best) if best else None
        self.sizes.append((stream, best))
        return best

    def observe(self, v) -> None:
        """The verdict of the step whose size was asked: tree inputs 1..nodes are ranks 0..nodes-1."""
        if self.asked is None:
            return
        stream, _ = self.asked
        self.asked = None
        nodes = v.shape.nodes
        if nodes:
            self.streams[stream].observe(nodes, [i - 1 for i in v.path[1:v.accepted + 1]])

    def describe(self) -> dict:
        """What a run records: per stream, the mean chosen size, the last generation's sizes, the first ranks' p."""
        out = {}
        for stream, ranks in self.streams.items():
            chosen = [k for s, k in self.sizes if s == stream]
            out[stream] = {"mean_size": round(sum(chosen) / len(chosen), 3) if chosen else None,
                           "zero_share": round(chosen.count(0) / len(chosen), 3) if chosen else None,
                           "sizes": chosen[:256], "p": [round(x, 3) for x in ranks.p(min(len(ranks.trials), 16))]}
        return out
