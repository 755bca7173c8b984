"""The cost-model bound of each decoder, measured after the timing on this machine.

A decoder's step verifies q tokens and accepts MAT of them on average, so it runs at most ``MAT x t(1) / t_step`` times
faster than AR, t_step being what its target forwards cost here. Both come from the run itself: a hook on the target
model logs every forward (its size q and its kind: a chain fed as a plain causal block, or a tree / window fed with a 4D
mask) of one untimed generation per decoder of the longest measured prompt of each category (a decoder.auto decoder
sizes its blocks by the text: on Spec-Bench the longest prompt alone once gave 1.1-1.3-token blocks to rows whose MAT
was 1.4-1.9); each forward is priced by the forward-cost curve of that kind (``decoding/auto.py``'s ``Curve``, timed on
AR's engine at the run's threads and dtype over a cache of the prompts' typical length, cached per machine + model +
settings under ``decoder.cost_cache``), and t_step is their mean (the prefill priced as the one-token forward AR's first
step decodes from). This is what tells "TR-Jacobi accepts 2.2 tokens but runs at 0.6x AR" apart from a bug: on a 2-core
CPU a 69-token forward costs several one-token forwards, on a GPU about one. A decoder with a draft model (speculative,
Ouroboros) pays its draft forwards too: they are logged by the same hook on the draft model, priced by the draft
engine's own curve and added to t_step (``draft_seconds`` per target forward), since a bound without them promises what
no step can reach. The bound leaves out the host's time (``other_seconds``).

Not measured (None) where the target's forwards cannot be seen from Python: compiled engines replay graphs.
"""

from __future__ import annotations

import logging

from specnoise.decoding.auto import CHAIN, TREE, Curve
from specnoise.decoding.base import Decoder

log = logging.getLogger("specnoise")


def forward_log(decoder: Decoder, model, prompt: list[int], budget: int, draft_model=None):
    """(the generation's output, [(q, kind)] of every target forward it ran, the prefill first, and the same of the
    draft model's forwards: empty without ``draft_model``)."""
    fed: dict[str, list[tuple[int, str]]] = {"target": [], "draft": []}

    def counter(role):
        def count(module, args, kwargs):
            ids = kwargs.get("input_ids", args[0] if args else None)
            if ids is None:
                ids = kwargs.get("inputs_embeds")
            if ids is not None:
                q = int(ids.shape[1]) if ids.dim() > 1 else int(ids.shape[0])
                fed[role].append((q, CHAIN if kwargs.get("attention_mask") is None else TREE))
        return count

    handles = [m.register_forward_pre_hook(counter(role), with_kwargs=True)
               for role, m in (("target", model), ("draft", draft_model)) if m is not None]
    try:
        out = decoder.generate(prompt, budget)
    finally:
        for handle in handles:
            handle.remove()
    return out, fed["target"], fed["draft"]


def price(forwards: list[tuple[int, str]], curve) -> float:
    """Seconds the curve gives these forwards."""
    return sum(curve(q, kind) for q, kind in forwards)


def bounds(decoders: dict[str, Decoder], model, prompts: list[list[int]], budget: int, cache_len: int,
           cache_dir: str | None = None, timed: bool = True) -> dict[str, dict[str, float | None]]:
    """Per decoder: ``verify_block`` (mean q per target forward), ``tree_share`` (forwards fed with a mask) and this
    machine's ``t1_seconds`` / ``tq_seconds`` (the mean priced step per target forward, its draft forwards included)
    and ``draft_seconds`` (their part of it; 0 without a draft model); the bound itself needs each row's MAT and is
    computed with it (``timing.cost_bound``). Empty when no forward could be counted. ``timed=False``: the blocks
    only, no curve probed (a batched job, whose rows a batch-1 curve does not price)."""
    logs: dict[str, list] = {name: [] for name in decoders}
    drafts: dict[str, list] = {name: [] for name in decoders}
    for name, decoder in decoders.items():
        draft = getattr(decoder, "draft", None)
        for prompt in prompts:
            _, fed, drafted = forward_log(decoder, model, prompt, budget, draft.model if draft else None)
            logs[name] += [(1, CHAIN)] + fed[1:] if fed else fed  # the prefill as the one-token step AR decodes from
            drafts[name] += drafted
    for decoder in decoders.values():
        decoder.reset_history()
    if not any(logs.values()):
        return {}
    blocks = {name: {"verify_block": sum(q for q, _ in fed) / len(fed) if fed else None,
                     "tree_share": sum(kind == TREE for _, kind in fed) / len(fed) if fed else None}
              for name, fed in logs.items()}
    if not timed:
        return {name: {**b, "t1_seconds": None, "tq_seconds": None} for name, b in blocks.items()}
    curves: dict[int, Curve] = {}

    def curve_of(engine, fed):  # one per engine (a draft model shared by decoders is probed once)
        largest = max(q for q, _ in fed)
        if id(engine) not in curves:
            curves[id(engine)] = Curve(engine, min(cache_len, engine.max_length - largest - 1), largest, cache_dir)
        curve = curves[id(engine)]
        curve.ensure(engine, largest)
        return curve

    curve = curve_of(decoders["ar"].target, [f for fed in logs.values() for f in fed])
    out = {}
    for name, fed in logs.items():
        draft = price(drafts[name], curve_of(decoders[name].draft, drafts[name])) if drafts[name] else 0.0
        per = draft / len(fed) if fed else 0.0
        out[name] = {**blocks[name], "t1_seconds": curve(1), "curve": curve.describe(), "draft_seconds": per,
                     "tq_seconds": price(fed, curve) / len(fed) + per if fed else None}
    return out
