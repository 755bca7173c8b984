"""What a forward of q new tokens costs on this engine, t(q): the curve behind ``tree=auto`` (TR-Jacobi picks the
sub-tree with the most expected tokens per second) and the benchmark's cost-model bounds (``task=forward_cost``)."""

from __future__ import annotations

import time
from statistics import median

import torch

from specnoise.decoding.batch import BatchKV
from specnoise.decoding.kv import Engine, causal_block, sync
from specnoise.errors import UserError


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
