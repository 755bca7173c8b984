"""The cost-model bound of each decoder, measured after the timing on this machine.

A step that verifies q tokens and accepts MAT of them on average runs at most ``MAT x t(1) / t(q)`` times faster
than AR, t(q) being what one target forward of q new tokens costs here (``forward_cost.py``). The row's q is the
decoder's *mean verify block*: the tokens it fed to the target per forward, counted (prefill excluded) by a hook
on the target model over one untimed generation of the first measured prompt; t(1) and t(q) are then timed on AR's
engine over a cache of the prompts' typical length, the fastest of a few rounds (a busy machine cannot inflate a
minimum the way it inflates a median). This is what tells "TR-Jacobi accepts 2.2 tokens but runs at 0.6x AR" apart
from a bug: on a 2-core CPU a 69-token forward costs several one-token forwards, on a GPU about one.

Not measured (None) where the target's forwards cannot be seen from Python: compiled engines replay graphs.
"""

from __future__ import annotations

import logging
import math

from specnoise.decoding.base import Decoder
from specnoise.decoding.cost import interpolate, measure_forward_costs

log = logging.getLogger("specnoise")


def verify_blocks(decoders: dict[str, Decoder], model, prompt: list[int], budget: int) -> dict[str, float | None]:
    """Mean tokens per target forward, per decoder, over one generation of ``prompt`` (the prompt itself counts as
    one token: the one AR's first forward decodes from)."""
    fed: list[int] = []

    def count(module, args, kwargs):
        ids = kwargs.get("input_ids", args[0] if args else None)
        if ids is None:
            ids = kwargs.get("inputs_embeds")
        if ids is not None:
            fed.append(int(ids.shape[1]) if ids.dim() > 1 else int(ids.shape[0]))

    blocks: dict[str, float | None] = {}
    handle = model.register_forward_pre_hook(count, with_kwargs=True)
    try:
        for name, decoder in decoders.items():
            fed.clear()
            decoder.generate(prompt, budget)
            blocks[name] = (sum(fed) - len(prompt) + 1) / len(fed) if fed else None
    finally:
        handle.remove()
    for decoder in decoders.values():
        decoder.reset_history()
    return blocks


def forward_costs(kv, blocks: dict[str, float | None], cache_len: int) -> dict[int, float]:
    """t(q) in seconds for 1 and the sizes around every mean block (the fastest of 5 rounds each)."""
    qs = {1} | {q for b in blocks.values() if b for q in (math.floor(b), math.ceil(b))}
    cache_len = min(cache_len, kv.max_length - max(qs) - kv.length)
    return measure_forward_costs(kv, sorted(qs), cache_len=max(cache_len, 0), repeats=5, warmup=1, reduce=min)


def bounds(decoders: dict[str, Decoder], model, prompt: list[int], budget: int, cache_len: int, timed: bool = True
           ) -> dict[str, dict[str, float | None]]:
    """Per decoder: ``verify_block`` (q) and this machine's ``t1_seconds`` / ``tq_seconds``; the bound itself needs
    each row's MAT and is computed with it (``timing.cost_bound``). Empty when no forward could be counted.
    ``timed=False``: the blocks only (a batched job, whose rows t(q) at batch 1 does not price)."""
    blocks = verify_blocks(decoders, model, prompt, budget)
    if not any(blocks.values()):
        return {}
    if not timed:
        return {name: {"verify_block": q, "t1_seconds": None, "tq_seconds": None} for name, q in blocks.items()}
    t = interpolate(forward_costs(decoders["ar"].target, blocks, cache_len))
    return {name: {"verify_block": q, "t1_seconds": t(1), "tq_seconds": t(q) if q else None}
            for name, q in blocks.items()}
