"""What a forward of q new tokens costs on this engine, t(q): the curve behind ``tree=auto`` (TR-Jacobi picks the
sub-tree with the most expected tokens per second) and the benchmark's cost-model bounds (``task=forward_cost``)."""

from __future__ import annotations

import time
from statistics import median

import torch

from specnoise.decoding.batch import BatchKV, Scheduler
from specnoise.decoding.kv import Engine, causal_block, sync
from specnoise.errors import UserError


def measure_forward_costs(kv: Engine, qs: list[int], cache_len: int | None = None, repeats: int = 5,
                          warmup: int = 2, seed: int = 0, reduce=median, rows: int = 1) -> dict[int, float]:
    """Seconds of one ``kv.forward`` of q new tokens for each q: the median over ``repeats`` (``reduce=min``: the
    uncontended cost, steadier on a machine shared with other jobs). See :func:`measure_forward_times`."""
    if rows > 1:
        times = batched_forward_times(kv, qs, rows, cache_len or kv.length, repeats, warmup, seed)
    else:
        times = measure_forward_times(kv, qs, cache_len, repeats, warmup, seed)
    return {q: reduce(t) for q, t in times.items()}


def batched_forward_times(kv: Engine, qs: list[int], rows: int, cache_len: int, repeats: int = 5, warmup: int = 2,
                          seed: int = 0) -> dict[int, list[float]]:
    """Like :func:`measure_forward_times` for ``rows`` rows verified together (a batch's forward of rows x q tokens
    after ``cache_len`` cached ones each), on a batched cache of ``kv``'s model; ``kv`` itself is untouched."""
    qs = sorted(set(qs))
    if cache_len + qs[-1] > kv.max_length:
        raise UserError(f"a cache of {cache_len} tokens plus q={qs[-1]} new ones exceeds the model's context of "
                        f"{kv.max_length}: lower the cache length or the largest q")
    gen = torch.Generator().manual_seed(seed)
    vocab = min(kv.vocab_size, kv.model.config.vocab_size)
    batch = BatchKV(kv, rows, Scheduler(), need=cache_len + qs[-1], priority=0)
    if cache_len:
        batch.forward({r: (torch.randint(0, vocab, (cache_len,), generator=gen), None, None, 1) for r in range(rows)})
    tokens = torch.randint(0, vocab, (qs[-1],), generator=gen)
    masks = {q: causal_block(q) for q in qs}
    times: dict[int, list[float]] = {q: [] for q in qs}
    for r in range(warmup + repeats):
        for q in qs:
            sync(kv.device)
            t0 = time.perf_counter()
            batch.forward({row: (tokens[:q], None, masks[q], None) for row in range(rows)})
            sync(kv.device)
            if r >= warmup:
                times[q].append(time.perf_counter() - t0)
            for row in range(rows):
                batch.remap(row, cache_len, [])
    return times


def measure_forward_times(kv: Engine, qs: list[int], cache_len: int | None = None, repeats: int = 5,
                          warmup: int = 2, seed: int = 0) -> dict[int, list[float]]:
    """``repeats`` timings (seconds) of one ``kv.forward`` of q new tokens (a causal block as a 4D mask, every
    logit row, as a tree verify) for each q.

    The block goes after the current cache, topped up with random tokens to ``cache_len`` first when given; the
    sizes take turns within each round so a machine's drift spreads over all of them. The cache is cropped back
    to its length on entry and ``kv.forwards`` restored, so a decoder can probe its own engine between generations.
    """
    qs = sorted(set(qs))
    start, forwards = kv.length, kv.forwards
    fill = max(0, (cache_len or 0) - start)
    if start + fill + qs[-1] > kv.max_length:
        raise UserError(f"a cache of {start + fill} tokens plus q={qs[-1]} new ones exceeds the model's context of "
                        f"{kv.max_length}: lower forward_cost.cache_len or the largest forward_cost.q")
    gen = torch.Generator().manual_seed(seed)
    vocab = min(kv.vocab_size, kv.model.config.vocab_size)
    if fill:
        kv.forward(torch.randint(0, vocab, (fill,), generator=gen).tolist(), last=1)
    base = kv.length
    tokens = torch.randint(0, vocab, (qs[-1],), generator=gen).tolist()
    masks = {q: causal_block(q, kv.device) for q in qs}
    times: dict[int, list[float]] = {q: [] for q in qs}
    for r in range(warmup + repeats):
        for q in qs:
            sync(kv.device)
            t0 = time.perf_counter()
            kv.forward(tokens[:q], tree=masks[q])
            sync(kv.device)
            if r >= warmup:
                times[q].append(time.perf_counter() - t0)
            kv.crop(base)
    kv.crop(start)
    kv.forwards = forwards
    return times


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
