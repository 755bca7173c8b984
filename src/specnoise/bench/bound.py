"""The cost-model bound of each decoder, computed after the timing from the timed runs' own forwards.

A decoder's step verifies q tokens and accepts MAT of them on average, so its steps run at most ``MAT x t(1) / t_step``
times faster than AR's, t_step being what its target forwards cost here. Both come from the run itself: every engine
logs each forward it runs (``Engine.forward_log``: the tokens the model was fed, whether with a mask, i.e. a tree /
window rather than a plain causal chain, and how many tokens its cache held), a generation hands its log over
(``DecodeOutput.forward_log``), and the bound prices the very forwards of the generations whose tokens give the row's
MAT (each prompt's first repeat) by the forward-cost curve of their kind at their own context (``decoding/cost.py``'s
``Curve``, timed on AR's engine at the run's threads and dtype over 16 cached tokens and one of the prompts' typical
length, cached per machine + model + settings under ``decoder.cost_cache``); t_step is their mean, a prefill counted as
the one-token forward AR's first step decodes from, and t(1) AR's mean step over the same tokens: each generation's n
new tokens as n one-token forwards from its own prompt on (``ar_steps``). Not the mean of t(1) at the decoder's own
forwards: in a group that mixes short and long prompts (Spec-Bench's 1,300-token RAG prompts beside 50-token
questions) a decoder saves fewer forwards on the long prompts, so its forwards sit at longer contexts than AR's, and
that mean promised a speedup no step reaches (PLD on Spec-Bench-10: 1.34x where its categories' own bounds add up to
1.25x). This is what tells "TR-Jacobi accepts 2.2 tokens but runs at 0.6x AR" apart from a bug: on a 2-core CPU a
69-token forward costs several one-token forwards, on a GPU about one. A decoder with a draft model (speculative,
Ouroboros) pays its draft forwards too, logged alike and priced by the draft engine's own curve, added to t_step
(``draft_seconds`` per target forward), since a bound without them promises what no step can reach.

The bound itself is the group's priced AR time over its priced time, each generation whole: its prefill as it ran
(``prefill``; AR's the prompt alone), its other forwards, its drafting. Every decoder pays the prompt's prefill as AR
does, which on the CPU is no one-token step: on HumanEval-10 with the shipped model 14% of AR's time. Counted as one
step, PLD's bound was 1.56x (experiments/hardware-aware/full/humaneval-10-repeats-5-6/, measured 1.38x: "89% of it");
priced as it ran, 1.45x (full/humaneval-10-prefill/, measured 1.41x: 97%). ``prefill_share`` says how much of AR's
time the prefills take.
The bound leaves out the host's time (``other_seconds``), so measured / bound is what the host's work and the curve's
error leave of it.

Pricing the timed forwards themselves, not one extra generation per category (as before): a ``decoder.auto`` decoder's
steps depend on the text and on what its controller has learnt so far (an exploration with a draft model's catch-up over
a long prompt in one generation, none in another), so the forwards of one later generation were not the run's (Ouroboros
with auto measured 0.68x, speculative with auto 0.89x such a bound on Spec-Bench-10).

Not computed where the run is compiled (``runner.wants_bounds``), nor at batch size > 1 beyond the verify blocks: a
batched row's step is a share of a forward of B x q tokens, which the batch-1 curve does not price.
"""

from __future__ import annotations

from typing import NamedTuple

from specnoise.decoding.cost import Curve, context, price

# (tokens the model was fed, with a mask, tokens cached before it) per forward: ``Engine.forward_log`` (a log kept
# before the context was logged has pairs: priced at the curve's own context; cost.py ``price``)
Fed = list[tuple]


class Counted(NamedTuple):
    """A decoder's group of generations, as the bound prices them."""

    fed: Fed  # its target forwards, a prefill as AR's first step (``steps``): the verify block and the mean step
    drafted: Fed  # its draft-model forwards
    ar: Fed  # AR's one-token steps for the same new tokens (``ar_steps``)
    whole_ar: Fed  # AR's generations whole: each prompt's prefill alone, then its steps
    whole: Fed  # the decoder's generations whole: each first forward as it ran (``prefill``), then the others
    prefills: Fed  # AR's prefills


def steps(fed: Fed) -> Fed:
    """A generation's target forwards as a verify block counts them: the prefill as the one-token step AR decodes from
    (after the prompt)."""
    if not fed:
        return []
    return [ar_steps(fed, 1)[0]] + list(fed[1:])


def ar_steps(fed: Fed, tokens: int, prompt: int | None = None) -> Fed:
    """The forwards AR runs for a generation of ``tokens`` new tokens whose target forwards were ``fed``, after a
    prompt of ``prompt`` tokens (default: the first forward's, as AR feeds it): one token each, the first after the
    prompt (as ``steps`` counts a prefill), each next one a token further on."""
    first = fed[0]
    if context(first) is None:
        return [(1, False)] * tokens
    start = (first[2] + first[0] if prompt is None else prompt) - 1
    return [(1, False, start + i) for i in range(tokens)]


def prefill(fed: Fed, prompt: int, target) -> Fed:
    """A generation's first target forward as it ran on engine ``target``: the ``prompt`` from an empty cache, with
    the first proposal where one was fed beside it, in one forward or, where the engine feeds a long prompt first
    (``Engine.splits``), in two."""
    first = fed[0]
    q, masked = first[0], first[1]
    if context(first) is None or q <= prompt or not target.splits(prompt, q, masked):
        return [first]
    return [(prompt, False, 0), (q - prompt, masked, prompt)]


def bounds(logs: dict[str, dict[str, list[tuple[Fed | None, Fed | None, int, int]]]], target,
           drafts: dict[str, object], cache_len: int, cache_dir: str | None = None,
           timed: bool = True) -> dict[str, dict[str, dict]]:
    """Per decoder and group (``logs[decoder][group]``: each generation's target and draft forwards, ``None`` where a
    generation was not logged, its new tokens and its prompt's): ``verify_block`` (mean tokens per target forward, a
    prefill as one), ``tree_share`` (forwards fed with a mask) and, on this machine's curve, the steps: ``t1_seconds``
    (AR's mean step over the same new tokens, ``ar_steps``) and ``tq_seconds`` (the mean priced step per target
    forward, its draft forwards included; a prefill as the one-token step AR decodes from) with ``draft_seconds``
    (their part of it; 0 without a draft model); and the whole generations, prefills as they ran (``prefill``):
    ``ar_seconds`` and ``seconds``, AR's priced time for the group's prompts and new tokens and the decoder's, whose
    ratio is the bound (``runner``'s ``cost_bound``), with ``prefill_share`` (of AR's, its prefills). A group with an
    unlogged generation gets none. ``target``: AR's engine, whose curve prices every target forward;
    ``drafts[decoder]``: the decoder's draft engine (None: none). ``timed=False``: the blocks only, no curve probed (a
    batched job)."""
    counted: dict[str, dict[str, Counted]] = {}  # decoder -> group -> its forwards
    for name, groups in logs.items():
        for group, generations in groups.items():
            if not generations or any(fed is None for fed, *_ in generations):
                continue
            fed, ar, whole_ar, whole, prefills = [], [], [], [], []
            for gen, _, n, p in generations:
                if gen:
                    fed += steps(gen)
                    mine = ar_steps(gen, n, p)
                    ar += mine
                    prefills.append((p, False, 0))  # AR's prefill: the prompt alone, in the place of its first step
                    whole_ar += prefills[-1:] + mine[1:]
                    whole += prefill(gen, p, target) + list(gen[1:])
            if fed:
                drafted = [f for _, gen, *_ in generations for f in gen or []]
                counted.setdefault(name, {})[group] = Counted(fed, drafted, ar, whole_ar, whole, prefills)
    out = {name: {group: {"verify_block": sum(f[0] for f in fed) / len(fed),
                          "tree_share": sum(f[1] for f in fed) / len(fed), "t1_seconds": None, "tq_seconds": None}
                  for group, (fed, *_) in groups.items()} for name, groups in counted.items()}
    if not timed or not out:
        return out
    curves: dict[int, Curve] = {}

    def curve_of(engine, largest: int, reach: int = 0) -> Curve:  # one per engine (a draft model shared is probed once)
        if id(engine) not in curves:
            engine.crop(0)  # the timed generations are over: from an empty cache the curve probes a short context too
            curves[id(engine)] = Curve(engine, min(cache_len, engine.max_length - largest - 1), largest, cache_dir,
                                       reach=reach)
        curve = curves[id(engine)]
        curve.ensure(engine, largest, reach)
        return curve

    def widest(names, role: str) -> int:  # the largest forward of ``role`` (a ``Counted`` field) logged
        return max((f[0] for n in names for group in counted[n].values() for f in getattr(group, role)), default=1)

    # the prefills: probed from an empty cache up to the longest prompt with its proposal (a Spec-Bench RAG prompt
    # of 1,300 tokens costs as much as ~70 one-token steps of the shipped model on the CPU)
    curve = curve_of(target, widest(counted, "fed"), widest(counted, "whole"))
    for name, groups in counted.items():
        draft = drafts.get(name)
        draft_curve = curve_of(draft, widest([name], "drafted")) if draft is not None else None
        for group, (fed, drafted, ar, whole_ar, whole, prefills) in groups.items():
            drafting = price(drafted, draft_curve) if drafted else 0.0
            ar_step = price(ar, curve) / max(len(ar), 1)  # AR's own steps for the same tokens
            ar_seconds = price(whole_ar, curve)
            out[name][group].update(
                t1_seconds=ar_step, curve=curve.describe(), draft_seconds=drafting / len(fed),
                tq_seconds=price(fed, curve) / len(fed) + drafting / len(fed), ar_seconds=ar_seconds,
                seconds=price(whole, curve) + drafting, prefill_share=price(prefills, curve) / ar_seconds)
    return out
