"""The measuring loop: every decoder against AR on one group of samples at a time, timed in interleaved repeats.

Nothing here knows about result files, pandas or wandb: the loop hands each finished sample to a callback (the
runner appends it to ``per_prompt.jsonl``) and stops cleanly between two generations once a signal asked it to.

Order (the timing protocol, README "Running experiments"): for prompt i and repeat r, AR runs first when i + r is
even and last when it is odd (ABAB / BABA), so a slow drift of the machine falls on both sides of every pair, and
repeat r of one decoder never always follows the same neighbour. Every repeat of a greedy decoder must give the
same tokens (a decoder whose output depends on the repeat is a bug, or nondeterministic kernels): ``same_tokens``.
Every repeat starts from what the decoder kept across prompts before the first one (``Decoder.history``: Token
Recycling's matrix, Ouroboros' phrase pool, decoder.auto's statistics), and the next prompt sees one pass over this one:
a repeat that drafted from the repeats before it would draft the answer it has already seen, a speedup no workload
gets (SAM with its Token Recycling fallback took 80, 58, 54, 51, 52 forwards in five repeats of one HumanEval problem).

Groups (``benchmark.batch_size`` = B): the samples are taken in order in groups of B (the last may be smaller) and every
decoder, AR included, decodes a group's prompts together (``Decoder.generate_batch``; with ``benchmark.queue`` = Q,
continuous batching, groups of Q prompts, each decoded by B rows refilled as their prompts end); at B = 1 a group is one
sample and each decoder's ``generate`` runs, exactly as before batching existed. At B > 1 the job also times AR at batch
1 (``REFERENCE``, the same AR decoder, one prompt at a time), as one more decoder in the interleaved order: the lossless
reference and the denominator of ``speedup_vs_bs1_ar``. Multi-turn samples: turn k of every row of the group that still
has a turn k (and whose every dialogue still fits) is decoded together, each decoder continuing its own dialogue; rows
without one drop out of the batch, so a later turn's batch can be smaller than B."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from specnoise.bench.datasets import Sample
from specnoise.decoding.base import DecodeOutput, Decoder

REFERENCE = "ar_bs1"  # AR at batch 1, timed beside a batched job (benchmark.batch_size > 1)


@dataclass
class Turn:
    """One decoder on one turn of one sample, over its repeats."""

    prompt: list[int]
    out: DecodeOutput  # the first repeat (tokens, forwards, accepted lengths): the answer the dialogue goes on with
    text: str  # the completion, decoded
    # per repeat; left out (one repeat), they are the first repeat's own
    seconds: list[float] = field(default_factory=list)
    target_seconds: list[float | None] = field(default_factory=list)  # inside target forwards (None: not said)
    draft_seconds: list[float | None] = field(default_factory=list)
    new_tokens: list[int] = field(default_factory=list)  # differs between repeats only when sampling
    same_tokens: bool = True  # every repeat gave the first one's tokens

    def __post_init__(self) -> None:
        self.seconds = self.seconds or [self.out.seconds]
        self.target_seconds = self.target_seconds or [self.out.target_seconds] * len(self.seconds)
        self.draft_seconds = self.draft_seconds or [self.out.draft_seconds] * len(self.seconds)
        self.new_tokens = self.new_tokens or [len(self.out.tokens)] * len(self.seconds)

    def timed(self, stat: str) -> tuple[float, float | None, float | None]:
        """(seconds, target_seconds, draft_seconds) over the repeats by ``stat`` (``benchmark.repeat_stat``): each
        field's mean; the middle repeat by wall time (the mean of the two middle ones for an even count); the fastest
        repeat. The three come from the same repeats, so ``other_seconds`` (the rest) stays a repeat's own."""
        n = len(self.seconds)
        ranked = sorted(range(n), key=self.seconds.__getitem__)
        picked = ranked if stat == "mean" else ranked[:1] if stat == "min" else ranked[(n - 1) // 2:n // 2 + 1]

        def over(values: list[float | None]) -> float | None:
            chosen = [values[i] for i in picked]
            return None if any(v is None for v in chosen) else sum(chosen) / len(chosen)

        return over(self.seconds), over(self.target_seconds), over(self.draft_seconds)


def completion_text(tokenizer, prompt: list[int], new: list[int]) -> str:
    """Decode ``new`` in the context of the prompt, so a tokenizer that drops a leading space when decoding a
    fragment on its own (SentencePiece) cannot break the indentation of generated code."""
    head = tokenizer.decode(prompt, skip_special_tokens=True)
    full = tokenizer.decode(prompt + new, skip_special_tokens=True)
    return full[len(head):] if full.startswith(head) else tokenizer.decode(new, skip_special_tokens=True)


def order(names: list[str], slot: int) -> list[str]:
    """AR (``names[0]``) first in even slots, last in odd ones."""
    return names if slot % 2 == 0 else names[1:] + names[:1]


def refilled(slots: int | None) -> dict:
    """``generate_batch``'s keywords for continuous batching with ``slots`` rows (None: lock-step groups, the only
    kind the generate() peers decode)."""
    return {} if slots is None else {"slots": slots}


def warm_up(decoders: dict[str, Decoder], prompts: list[list[int]], budget: int, times: int,
            sizes: tuple[int, ...] = (), bar=None, stop=None, slots: int | None = None) -> None:
    """Untimed generations of the first prompt (and, per group size in ``sizes`` > 1, of a batch of the first
    prompts of that size, with the whole budget: a static engine's buckets and compiled graphs include the batch
    dimension, and a short warm-up would leave some of a decoder's block sizes to compile in the timed region), then
    ``reset_history()``: nothing the drafters keep of the text (Token Recycling's matrix, Ouroboros' pool) helps the
    measured prompts. Calibrations stay, as documented: decoder.auto's cost curves, step times and acceptance
    statistics, tree=auto's pick (README, "Hardware-aware tree" and "Hardware-aware drafting"). ``bar`` shows which
    decoder warms up (on a fresh GPU machine the compiled engine's warm-up of 19 decoders showed 0 generations for
    over a minute); ``stop.signal`` ends it between two decoders."""
    unique: dict[int, tuple[str, Decoder]] = {}
    for name, decoder in decoders.items():
        unique.setdefault(id(decoder), (name, decoder))  # REFERENCE is AR again
    for _ in range(times):
        for name, decoder in unique.values():
            if stop is not None and stop.signal:
                return
            if bar is not None:
                bar.set_postfix_str(f"warm-up {name}")
            decoder.generate(prompts[0], budget)
            for size in sizes:
                if size > 1:
                    decoder.generate_batch(prompts[:size], budget, **refilled(slots))
    for _, decoder in unique.values():
        decoder.reset_history()  # a batch's row slots' too


def run_group(group: list[Sample], index: int, decoders: dict[str, Decoder], budget: int, limit: int, repeats: int,
              encode: Callable, tokenizer, bar, stop, batch_size: int = 1,
              slots: int | None = None) -> dict[str, dict[str, list[Turn]]] | None:
    """Every decoder on every turn of the group's samples, ``repeats`` times, interleaved: sample id -> decoder ->
    turns; None once ``stop.signal`` is set (the group is then dropped whole: a continued run measures it again).
    At ``batch_size`` 1 (a group of one) every decoder's ``generate`` runs; above, its ``generate_batch`` over the
    group's rows (``REFERENCE`` one prompt at a time)."""
    names = list(decoders)  # "ar" first
    turns: dict[str, dict[str, list[Turn]]] = {s.id: {name: [] for name in names} for s in group}
    active = list(group)
    for k in range(max(len(s.turns) for s in group)):
        rows = []
        prompts: dict[str, dict[str, list[int]]] = {}
        for s in [s for s in active if len(s.turns) > k]:
            # each decoder continues its own dialogue (the same text as AR's whenever the decoder is lossless)
            mine = {n: encode(s, [t.text.strip() for t in turns[s.id][n]]) for n in names}
            if k > 0 and max(map(len, mine.values())) > limit:  # later turns that no longer fit are skipped
                bar.update((len(s.turns) - k) * len(names) * repeats)
                active.remove(s)
                continue
            rows.append(s)
            prompts[s.id] = mine
        if not rows:
            break
        outs: dict[str, dict[str, list[DecodeOutput]]] = {s.id: {name: [] for name in names} for s in rows}
        # per decoder, what it kept across prompts before this turn's first repeat and after it: every repeat starts
        # where the first did, and the next turn goes on from one pass over this one (``Decoder.history``)
        kept: dict[str, list] = {}
        for r in range(repeats):
            for name in order(names, index + r):
                if stop.signal:
                    return None
                if repeats > 1:
                    if r == 0:
                        kept[name] = [decoders[name].history()]
                    else:
                        decoders[name].restore(kept[name][0])
                where = rows[0].id if len(rows) == 1 else f"{rows[0].id}..{rows[-1].id}"
                bar.set_postfix_str(f"{where} {name}" + (f" #{r + 1}" if repeats > 1 else ""), refresh=False)
                batch = [prompts[s.id][name] for s in rows]
                if batch_size == 1 or name == REFERENCE:
                    got = []
                    for p in batch:
                        got.append(decoders[name].generate(p, budget))
                        bar.update(1)
                else:
                    got = decoders[name].generate_batch(batch, budget, **refilled(slots))
                    bar.update(len(rows))
                for s, out in zip(rows, got, strict=True):
                    outs[s.id][name].append(out)
                if repeats > 1 and r == 0:
                    kept[name].append(decoders[name].history())
        for name, (_, after_first) in kept.items():
            decoders[name].restore(after_first)
        for s in rows:
            for name in names:
                done = outs[s.id][name]
                first = done[0]
                turns[s.id][name].append(Turn(
                    prompts[s.id][name], first, completion_text(tokenizer, prompts[s.id][name], first.tokens),
                    seconds=[o.seconds for o in done],
                    # DecodeOutput gains these fields; an engine that cannot attribute its time leaves them out
                    target_seconds=[o.target_seconds for o in done],
                    draft_seconds=[o.draft_seconds for o in done],
                    new_tokens=[len(o.tokens) for o in done],
                    same_tokens=all(o.tokens == first.tokens for o in done)))
    return turns


def measure(todo: list[tuple[int, list[Sample]]], decoders: dict[str, Decoder], budget: int, limit: int,
            repeats: int, warmup: int, encode: Callable, tokenizer,
            finished: Callable[[list[tuple[Sample, dict[str, list[Turn]]]]], None], bar, stop,
            batch_size: int = 1, slots: int | None = None) -> None:
    """Warm up on the first group to run, then each ``(index, group)`` of ``todo`` in turn; ``finished`` gets every
    whole group (its samples with their turns) as soon as it is done. Returns early, between two generations, once
    ``stop.signal`` is set."""
    if not todo or stop.signal:
        return
    first = [encode(s, []) for s in todo[0][1]]
    sizes = tuple(sorted({len(g) for _, g in todo} - {1})) if batch_size > 1 else ()
    while len(first) < max(sizes, default=1):  # a later group larger than the first (a resumed run)
        first.append(first[-1])
    warm_up(decoders, first, budget, warmup, sizes, bar, stop, slots)
    for index, group in todo:
        turns = run_group(group, index, decoders, budget, limit, repeats, encode, tokenizer, bar, stop, batch_size,
                          slots)
        if turns is None:
            return
        finished([(s, turns[s.id]) for s in group])
