"""What a forward of q new tokens costs on this engine, t(q): the probe (``measure_forward_costs``), and the curve
that prices every forward of a run (``Curve``): behind ``decoder.auto`` (decoding/auto.py), ``tree=auto`` (TR-Jacobi
picks the sub-tree with the most expected tokens per second), the cost-model bounds of a run (bench/bound.py) and
``task=forward_cost``.

The cost curve. A verify step is one target forward of q tokens; what it costs depends on the machine, the engine, the
threads, the dtype, the context length, and on the *kind* of forward: a chain is fed as a plain causal block (SDPA's
causal fast path), a tree with positions and a 4D mask. ``Curve`` times both kinds on the decoder's own engine at the
run's settings, over a long context (the first prompt plus half the budget, at least 1,024 tokens), on a grid of sizes,
and interpolates in between; and again over a short context (16 tokens, just above the empty cache a run starts from)
on a sparser grid, so a forward is priced at its own context, linearly between the two and extended beyond. On the
2-core CPU the shipped small-code-msn's 64-token tree costs 19 ms after 16 cached tokens and 35 ms after 1,264, a
one-token forward 6.8 and 7.9 ms: priced at one context, Spec-Bench's short prompts' trees looked 1.3-1.5x dearer
than they ran and a draft model's catch-up from an empty cache 1.8x dearer. The timings are cached in a small JSON
file per machine + model + settings (``decoder.cost_cache``, default ``outputs/cost_cache``), so a run pays the probe
once and a second run reuses it.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import re
import time
from collections.abc import Iterable
from pathlib import Path
from statistics import median

import torch

from specnoise.decoding.batch import BatchKV
from specnoise.decoding.kv import Engine, causal_block, sync
from specnoise.errors import UserError

CHAIN, TREE = "chain", "tree"  # a causal block without a mask; a block with positions and a 4D mask
GRID = (1, 2, 3, 4, 5, 6, 8, 10, 12, 16, 20, 24, 32, 40, 48, 64, 80, 96, 128)
# the sizes probed over the short context too: what a longer context adds to a forward grows smoothly with q
NEAR_GRID = (1, 2, 4, 8, 16, 32, 64, 128)
# ... and, up to a curve's ``reach`` (a draft model's catch-up, a prompt's prefill in the cost bound), these longer
# ones, so that a prompt between 128 tokens and the reach is priced from sizes near its own, not on one line between
REACH_GRID = (256, 512, 1024, 2048, 4096, 8192)
# a curve gets a context dimension only where its context is this much longer than the short one: below it the two
# probes' difference is timing noise
NEAR_SPAN = 128
# the short context sits this many tokens above the cache the probe starts from (an empty one in a run): over an empty
# cache a block of q > 1 tokens takes the attention's maskless causal path, which no forward of a run after its
# prefill does. Probed there, t(2) / t(1) came out 1.05-1.31 (mean 1.17) on the CPU against 1.19-1.33 (mean 1.25)
# over 16 cached tokens (small-code-msn, 8 probes each), and a curve probed at 1.05 made Jacobi with decoder.auto
# verify a draft at nearly every step where AR steps paid (15% slower than AR over three prompts)
NEAR_FLOOR = 16
REPEATS, WARMUP = 9, 2  # per probed size and kind: the fastest of REPEATS timings after WARMUP
RETIME = 3  # a one-token forward probed dearer than a two-token one is timed again up to this many times


def measure_forward_costs(kv: Engine, qs: list[int], cache_len: int | None = None, repeats: int = 5,
                          warmup: int = 2, seed: int = 0, reduce=median, rows: int = 1,
                          causal: bool | tuple[bool, ...] = False, clock=time.perf_counter) -> dict:
    """Seconds of one ``kv.forward`` of q new tokens for each q: the median over ``repeats`` (``reduce=min``: the
    uncontended cost, steadier on a machine shared with other jobs). See :func:`measure_forward_times`."""
    times = measure_forward_times(kv, qs, cache_len, repeats, warmup, seed, rows, causal, clock)
    return {q: reduce(t) for q, t in times.items()}


def measure_forward_times(kv: Engine, qs: list[int], cache_len: int | None = None, repeats: int = 5,
                          warmup: int = 2, seed: int = 0, rows: int = 1,
                          causal: bool | tuple[bool, ...] = False, clock=time.perf_counter) -> dict:
    """``repeats`` timings (seconds) of one ``kv.forward`` of q new tokens for each q, every logit row: by default a
    causal block passed as a 4D mask, as a tree verify feeds it; ``causal``: without a mask, as a chain verify feeds
    it (SDPA's causal path, which on a CPU costs less). A tuple of both, ``(True, False)``: both kinds, in turn at
    every size of every round, keyed ``(q, causal)``: probed one kind after the other, a drift of the machine between
    the two phases moved one kind's prices against the other's (a Spec-Bench-10 job's curve priced a masked one-token
    forward at 1.33x an unmasked one, its trees ~30% dear, where other probes of the same key gave 0.98-1.04x).
    ``clock``: wall time by default; ``time.process_time`` times the CPU work alone, which a machine shared with other
    jobs does not inflate (on the CPU only).

    The block goes after the current cache, topped up with random tokens to ``cache_len`` first when given; the
    sizes take turns within each round so a machine's drift spreads over all of them, ascending in one round and
    descending in the next, so that each forward follows one of a neighbouring size, as in a decode. In ascending
    rounds alone the smallest size followed the largest, whose activations had left the CPU's caches cold: q = 1
    timed 5-9% dearer than probed on its own while q >= 2 did not move (small-code-msn, one thread, 150 cached
    tokens, 1 and 4 rows), and every t(q) / t(1) of a curve came out that much low, so decoder.auto drafted where
    it did not pay. The cache is cropped back
    to its length on entry and ``kv.forwards`` restored, so a decoder can probe its own engine between generations.
    ``rows`` > 1: the forward of that many rows verified together (a batch: rows x q tokens after ``cache_len``, by
    default ``kv.length``, cached ones each), on a batched cache of ``kv``'s model (batch.py); ``kv`` is untouched.
    """
    qs = sorted(set(qs))
    start, forwards = kv.length, kv.forwards
    fill = max(0, (cache_len or 0) - start) if rows == 1 else (kv.length if cache_len is None else cache_len)
    cached = start + fill if rows == 1 else fill  # a row's cache before the block
    if cached + qs[-1] > kv.max_length:
        raise UserError(f"a cache of {cached} tokens plus q={qs[-1]} new ones exceeds the model's context of "
                        f"{kv.max_length}: lower forward_cost.cache_len or the largest forward_cost.q")
    gen = torch.Generator().manual_seed(seed)
    vocab = min(kv.vocab_size, kv.model.config.vocab_size)
    prefix = torch.randint(0, vocab, (fill,), generator=gen).tolist() if fill else []
    if rows == 1:
        if prefix:
            kv.forward(prefix, last=1)
        base = kv.length

        def forward(block, mask, causal):
            kv.forward(block, tree=None if causal else mask)

        def back():
            kv.crop(base)
    else:
        batch = BatchKV(kv, rows, need=fill + qs[-1])
        if prefix:
            batch.forward({r: (prefix, None, None, 1) for r in range(rows)})

        def forward(block, mask, causal):  # (a batch's forward always carries its mask)
            batch.forward({r: (block, None, mask, None) for r in range(rows)})

        def back():
            for r in range(rows):
                batch.remap(r, fill, [])
    tokens = torch.randint(0, vocab, (qs[-1],), generator=gen).tolist()
    masks = {q: causal_block(q, kv.device) for q in qs}
    kinds = causal if isinstance(causal, tuple) else (causal,)
    times: dict[tuple[int, bool], list[float]] = {(q, c): [] for q in qs for c in kinds}
    for r in range(warmup + repeats):
        for q in (qs if r % 2 == 0 else qs[::-1]):
            for c in (kinds if r % 2 == 0 else kinds[::-1]):
                sync(kv.device)
                t0 = clock()
                forward(tokens[:q], masks[q], c)
                sync(kv.device)
                if r >= warmup:
                    times[q, c].append(clock() - t0)
                back()
    kv.crop(start)
    kv.forwards = forwards
    return times if isinstance(causal, tuple) else {q: t for (q, _), t in times.items()}


def interpolate(costs: dict[int, float]):
    """t(q) for any q from measured sizes: a non-decreasing fit of the medians (pool-adjacent-violators: on a busy
    machine a larger forward can time faster), piecewise linear between sizes, extended linearly beyond them."""
    qs = sorted(costs)
    blocks: list[list[float]] = []  # [mean, count] of pooled neighbours
    for q in qs:
        blocks.append([costs[q], 1])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            (m1, n1), (m2, n2) = blocks.pop(-2), blocks.pop()
            blocks.append([(m1 * n1 + m2 * n2) / (n1 + n2), n1 + n2])
    fit = [m for m, n in blocks for _ in range(n)]

    def cost(q: float) -> float:
        if len(qs) == 1:
            return fit[0]
        i = next((j for j in range(1, len(qs) - 1) if q <= qs[j]), len(qs) - 1)
        return fit[i - 1] + (fit[i] - fit[i - 1]) * (q - qs[i - 1]) / (qs[i] - qs[i - 1])

    return cost


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
        "near_floor": NEAR_FLOOR,  # (curves cached before it was there were probed over an empty cache: probed anew)
        "order": "zigzag",  # (curves cached before were probed in ascending rounds, t(1) too dear: probed anew)
    }


def pinned_file(path: Path, key: dict) -> Path:
    """A pinned curve file belongs to the model it was probed on: another model (a draft beside its target) is
    priced by a file of its own beside it, ``<stem>.<model>-<parameters>.json``, pinned alike (so a draft model's
    forwards are never priced by its target's curve). A batch's curve (``rows``) is ``<stem>.rows<B>.json``."""
    if key.get("rows", 1) > 1:
        path = path.with_name(f"{path.stem}.rows{key['rows']}.json")
    if not path.exists():
        return path
    saved = json.loads(path.read_text())["key"]
    if (saved.get("parameters"), Path(saved.get("model", "")).name) == (key["parameters"], Path(key["model"]).name):
        return path
    name = re.sub(r"[^A-Za-z0-9_.-]+", "_", Path(key["model"]).name) or "model"
    return path.with_name(f"{path.stem}.{name}-{key['parameters']}.json")


class Curve:
    """t(q, kind, context) in seconds on ``engine``: measured for the sizes a run needs (at least up to ``largest``)
    over a cache of ``context`` tokens (the engine's own cache, topped up with random tokens) and, where the engine's
    cache is short enough, over a cache ``NEAR_FLOOR`` tokens longer than it too (``near``); read from / written to
    ``cache_dir`` when given (a path ending in .json: that one file, whatever the machine and settings, so a committed
    curve makes a run's choices reproducible anywhere; one written before the short context was probed prices every
    context alike). The probe leaves the engine as it found it. ``rows`` > 1: the lock-step batch's forward of that
    many rows, each over a cache of the context, probed on a batched cache of the engine's model (``Batched``)."""

    def __init__(self, engine, context: int, largest: int, cache_dir: str | None, reach: int = 0, rows: int = 1):
        context = min(context, engine.max_length - largest - 1)
        # the longest forward probed over the short context: a draft model's catch-up feeds a whole prompt from an
        # empty cache, which a linear extension past ``largest`` priced at 0.7x (small-code-draft, 1,200 tokens)
        self.reach = reach
        # rows > 1: the lock-step batch's forward of that many rows, q tokens each (batch.py), a curve of its own
        self.rows = rows
        self.key = machine_key(engine, max(context, 0)) | ({"rows": rows} if rows > 1 else {})
        digest = hashlib.sha1(json.dumps(self.key, sort_keys=True).encode()).hexdigest()[:16]
        self.path = Path(cache_dir) / f"forward-cost-{digest}.json" if cache_dir else None
        if cache_dir and cache_dir.endswith(".json"):  # a pinned curve: this file whatever the machine (reproducible)
            self.path = pinned_file(Path(cache_dir), self.key)
        self.times: dict[str, dict[int, float]] = {CHAIN: {}, TREE: {}}
        self.near: dict[str, dict[int, float]] = {CHAIN: {}, TREE: {}}  # over ``near_context`` cached tokens
        self.near_context: int | None = None
        if self.path is not None and self.path.exists():
            saved = json.loads(self.path.read_text())
            self.times = {kind: {int(q): t for q, t in saved["seconds"][kind].items()} for kind in (CHAIN, TREE)}
            if "near" in saved:
                self.near_context = saved["near"]["context"]
                self.near = {kind: {int(q): t for q, t in saved["near"]["seconds"][kind].items()}
                             for kind in (CHAIN, TREE)}
        self.cached = bool(self.times[CHAIN])
        self.version = 0
        # a static engine pads a block to its bucket (static_kv.py): a forward of q tokens costs t(bucket >= q), a
        # step function that interpolating between probed sizes misses (on a GPU's CUDA graphs t is flat up to the
        # largest bucket, then an eager forward costs several times more)
        self.buckets: tuple[int, ...] = tuple(sorted(getattr(engine, "buckets", ()) or ()))
        # a pinned curve that exists is read, never probed or written: a size it lacks is interpolated (beyond its
        # largest, extended linearly), so every run prices every size alike (a probe would time this machine, and
        # writing it back would change the next run's prices)
        self.pinned = bool(cache_dir and cache_dir.endswith(".json") and self.cached)
        self.ensure(engine, largest)

    def ensure(self, engine, largest: int, reach: int = 0) -> None:
        """Probe the grid sizes up to ``largest`` that are not measured yet (both kinds, both contexts; over the short
        one up to ``reach`` too, where longer), and save; nothing for a pinned curve."""
        self.reach = max(self.reach, reach)
        if self.pinned:
            return
        # no larger than fits after the curve's context, or after the engine's cache where that is longer (the probe
        # goes after it; sizes beyond are extended linearly): the bound probes a draft engine that still holds a
        # 1,329-token generation for its 1,292-token catch-up
        context = self.key["context"]
        largest = min(largest, engine.max_length - max(context, engine.length) - 1)
        qs = [q for q in GRID if q <= largest] + ([largest] if largest not in GRID else [])
        qs += [b for b in self.buckets if b <= largest] + [b for b in self.buckets if b >= largest][:1]
        todo = sorted({q for q in qs if q not in self.times[CHAIN]} | {1, 2})
        todo = [q for q in todo if q not in self.times[CHAIN] or q not in self.times[TREE]]
        # the short context: a little above the engine's own cache (NEAR_FLOOR), where that is much shorter than the
        # curve's context (a run probes before its first generation, from an empty cache); once chosen, probed again
        # only over a cache as short
        near = self.near_context
        if near is None and engine.length + NEAR_FLOOR + NEAR_SPAN <= context:
            near = engine.length + NEAR_FLOOR
        near_todo: list[int] = []
        if near is not None and engine.length <= near:
            wide = {1, 2, max(qs), *(q for q in qs if q in NEAR_GRID or q in self.buckets)}
            if self.reach > max(qs):
                top = min(self.reach, engine.max_length - near - 1)
                wide |= {q for q in NEAR_GRID + REACH_GRID if max(qs) < q < top} | {top}
            near_todo = sorted(q for q in wide if q not in self.near[CHAIN] or q not in self.near[TREE])
        if not todo and not near_todo:
            return
        # on the CPU the process's CPU time: what a forward costs, which other jobs on the machine do not inflate
        # (they do inflate wall time, the more the longer the forward); on a GPU wall time, synchronised
        clock = time.process_time if engine.device.type == "cpu" else time.perf_counter
        saved = list(engine.clock.host), list(engine.clock.events)  # the probe leaves the engine as found
        for times, sizes, cache_len in ((self.times, todo, context), (self.near, near_todo, near)):
            if not sizes:
                continue
            if self.rows > 1:  # a batch's forward always has the 4D mask: there a chain costs what a tree does
                times[TREE].update(measure_forward_costs(engine, sizes, cache_len=cache_len, repeats=REPEATS,
                                                         warmup=WARMUP, reduce=min, clock=clock, rows=self.rows))
            else:  # both kinds in turn at every size of every round (``measure_forward_times``)
                got = measure_forward_costs(engine, sizes, cache_len=cache_len, repeats=REPEATS, warmup=WARMUP,
                                            reduce=min, causal=(True, False), clock=clock)
                for (q, causal), t in got.items():
                    times[CHAIN if causal else TREE][q] = t
            self.retime_one(engine, times, cache_len, clock)  # (probed just now: the cache is still short enough)
        if self.rows > 1:
            self.times[CHAIN], self.near[CHAIN] = dict(self.times[TREE]), dict(self.near[TREE])
        if near_todo:
            self.near_context = near
        self.version += 1  # prices derived from the old fit are stale (Controller.price_list)
        engine.clock.host, engine.clock.events = saved
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.path.with_suffix(f".{os.getpid()}.tmp")
            record = {"key": self.key, "seconds": self.times}
            if self.near_context is not None:
                record["near"] = {"context": self.near_context, "seconds": self.near}
            tmp.write_text(json.dumps(record, indent=1, sort_keys=True))
            tmp.replace(self.path)  # atomic: a reader never sees half a file
        self.fits = None

    def retime_one(self, engine, times: dict[str, dict[int, float]], cache_len: int | None, clock) -> None:
        """A one-token forward probed dearer than a two-token one (no forward costs less for more tokens) is the
        probe's noise: timed again, up to ``RETIME`` times, the cheaper kept. A HumanEval-10 job's curve gave t(1)
        1.34x what the next probe of the same key did, its trees t(2) / t(1) = 0.91, and the tree drafters with auto
        verified 9-10-node trees at every step (their bound, from that curve, 1.30-1.64x AR; measured 1.00-1.23x)."""
        kind = TREE if self.rows > 1 else CHAIN  # (a batch's forward is probed with its mask only)
        for _ in range(RETIME):
            one, two = times[kind].get(1), min((times[k][2] for k in (CHAIN, TREE) if 2 in times[k]), default=None)
            if one is None or two is None or one <= two:
                return
            again = measure_forward_costs(engine, [1], cache_len=cache_len, repeats=REPEATS, warmup=WARMUP,
                                          reduce=min, causal=kind == CHAIN, clock=clock, rows=self.rows)[1]
            times[kind][1] = min(one, again)

    def __call__(self, q: float, kind: str = CHAIN, context: float | None = None) -> float:
        # remembered per call as well (a drafter pricing its own steps, Lookahead's window, asks at every step)
        called = self.called if getattr(self, "fits", None) is not None else None
        got = None if called is None else called.get((q, kind, context))
        if got is None:
            got = self.fit(self.padded(q), kind, context)
            self.called[q, kind, context] = got
        return got

    def padded(self, q: float) -> float:
        """The block a forward of q new tokens runs: a static engine's bucket for q, where q fits one."""
        return next(b for b in self.buckets if b >= q) if self.buckets and q <= self.buckets[-1] else q

    def fit(self, q: float, kind: str = CHAIN, context: float | None = None) -> float:
        """t(q) from the probed sizes, for a block of q tokens as it runs (``padded``) after ``context`` cached
        tokens: linear in the context from the short one's price to the curve's own (a longer one: extended; a shorter
        one: the short one's price; None: the curve's own context)."""
        if getattr(self, "fits", None) is None:
            self.fits = {k: interpolate(v) for k, v in self.times.items()}
            self.near_fits = {k: interpolate(v) for k, v in self.near.items() if v}
            self.priced: dict[tuple[float, str], tuple[float, float]] = {}
            self.called: dict[tuple[float, str, float | None], float] = {}  # (``__call__``)
        # remembered: the controller prices every candidate size at every step, a fit walks the grid
        key = (q, CHAIN if q <= 1 else kind)
        got = self.priced.get(key)
        if got is None:
            far = self.fits[key[1]](q)
            if key[1] in self.near_fits and self.key["context"] > self.near_context:
                # from the short context's price, which probes the longest forward from there (a draft model's
                # catch-up over a prompt); a noisy probe that timed the short context dearer: no slope
                near = self.near_fits[key[1]](q)
                got = near, max(0.0, (far - near) / (self.key["context"] - self.near_context))
            else:
                got = far, 0.0
            self.priced[key] = got
        t, slope = got
        if not slope:
            return t
        return t + (max(self.key["context"] if context is None else context, self.near_context)
                    - self.near_context) * slope

    def ratios(self, kind: str) -> dict[int, float]:
        """t(q) / t(1) at the measured sizes (results.json meta)."""
        return {q: round(t / self.times[CHAIN][1], 3) for q, t in sorted(self.times[kind].items())}

    def describe(self) -> dict:
        near = self.near[CHAIN].get(1)
        return {"cache_file": str(self.path) if self.path else None, "from_cache": self.cached,
                "context": self.key["context"], "threads": self.key["threads"], "engine": self.key["engine"],
                "t1_ms": round(self.times[CHAIN][1] * 1e3, 3),
                "near_context": self.near_context, "near_t1_ms": None if near is None else round(near * 1e3, 3),
                "chain_ratio": self.ratios(CHAIN), "tree_ratio": self.ratios(TREE), "rows": self.rows}


def context(forward: tuple) -> int | None:
    """The tokens cached before a logged forward (``Engine.forward_log``: tokens fed, with a mask, tokens cached
    before it; a log kept before the context was logged has pairs: None, the curve's own context)."""
    return forward[2] if len(forward) > 2 else None


def price(forwards: Iterable[tuple], curve) -> float:
    """Seconds ``curve`` gives these logged forwards, each of its kind at its context: the cost bound's
    (bench/bound.py), the draft scale's and a timed step's (calibration.py)."""
    return sum(curve(f[0], TREE if f[1] else CHAIN, context(f)) for f in forwards)
