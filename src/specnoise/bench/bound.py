"""The cost-model bound of each decoder, measured after the timing on this machine.

A decoder's step verifies q tokens and accepts MAT of them on average, so it runs at most ``MAT x t(1) / t_step``
times faster than AR, t_step being what its target forwards cost here. Both come from the run itself: a hook on the
target model logs every forward of one untimed generation of the longest measured prompt per decoder (its size q
and its kind: a chain fed as a plain causal block, or a tree / window fed with a 4D mask); each forward is priced by
the forward-cost curve of that kind (``decoding/auto.py``'s ``Curve``, timed on AR's engine at the run's threads and
dtype over a cache of the prompts' typical length, cached per machine + model + settings under
``decoder.cost_cache``), and t_step is their mean (the prefill priced as the one-token forward AR's first step
decodes from). This is what tells "TR-Jacobi accepts 2.2 tokens but runs at 0.6x AR" apart from a bug: on a 2-core CPU
a 69-token forward costs several one-token forwards, on a GPU about one. The bound leaves out the draft model's time
(speculative, Ouroboros) and the host's (``other_seconds``).

Not measured (None) where the target's forwards cannot be seen from Python: compiled engines replay graphs.
"""

from __future__ import annotations

import logging

from specnoise.decoding.auto import CHAIN, TREE, Curve
from specnoise.decoding.base import Decoder

log = logging.getLogger("specnoise")


def forward_log(decoder: Decoder, model, prompt: list[int], budget: int):
    """(the generation's output, [(q, kind)] of every target forward it ran, the prefill first)."""
    fed: list[tuple[int, str]] = []

    def count(module, args, kwargs):
        ids = kwargs.get("input_ids", args[0] if args else None)
        if ids is None:
            ids = kwargs.get("inputs_embeds")
        if ids is not None:
            q = int(ids.shape[1]) if ids.dim() > 1 else int(ids.shape[0])
            fed.append((q, CHAIN if kwargs.get("attention_mask") is None else TREE))

    handle = model.register_forward_pre_hook(count, with_kwargs=True)
    try:
        out = decoder.generate(prompt, budget)
    finally:
        handle.remove()
    return out, fed


def price(forwards: list[tuple[int, str]], curve) -> float:
    """Seconds the curve gives these forwards."""
    return sum(curve(q, kind) for q, kind in forwards)


def bounds(decoders: dict[str, Decoder], model, prompt: list[int], budget: int, cache_len: int,
           cache_dir: str | None = None, timed: bool = True) -> dict[str, dict[str, float | None]]:
    """Per decoder: ``verify_block`` (mean q per target forward), ``tree_share`` (forwards fed with a mask) and this
    machine's ``t1_seconds`` / ``tq_seconds`` (the mean priced forward); the bound itself needs each row's MAT and is
    computed with it (``timing.cost_bound``). Empty when no forward could be counted. ``timed=False``: the blocks
    only, no curve probed (a batched job, whose rows a batch-1 curve does not price)."""
    logs = {}
    for name, decoder in decoders.items():
        fed = forward_log(decoder, model, prompt, budget)[1]
        logs[name] = [(1, CHAIN)] + fed[1:] if fed else fed  # the prefill as the one-token step AR decodes from
    for decoder in decoders.values():
        decoder.reset_history()
    if not any(logs.values()):
        return {}
    blocks = {name: {"verify_block": sum(q for q, _ in fed) / len(fed) if fed else None,
                     "tree_share": sum(kind == TREE for _, kind in fed) / len(fed) if fed else None}
              for name, fed in logs.items()}
    if not timed:
        return {name: {**b, "t1_seconds": None, "tq_seconds": None} for name, b in blocks.items()}
    ar = decoders["ar"].target
    largest = max(q for fed in logs.values() for q, _ in fed)
    curve = Curve(ar, min(cache_len, ar.max_length - largest - 1), largest, cache_dir)
    return {name: {**blocks[name], "t1_seconds": curve(1), "curve": curve.describe(),
                   "tq_seconds": price(fed, curve) / len(fed) if fed else None} for name, fed in logs.items()}
