"""The measuring loop: every decoder against AR on one sample at a time, timed in interleaved repeats.

Nothing here knows about result files, pandas or wandb: the loop hands each finished sample to a callback (the
runner appends it to ``per_prompt.jsonl``) and stops cleanly between two generations once a signal asked it to.

Order (the timing protocol, README "Running experiments"): for prompt i and repeat r, AR runs first when i + r is
even and last when it is odd (ABAB / BABA), so a slow drift of the machine falls on both sides of every pair, and
repeat r of one decoder never always follows the same neighbour. Every repeat of a greedy decoder must give the
same tokens (a decoder whose output depends on the repeat is a bug, or nondeterministic kernels): ``same_tokens``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from specnoise.bench.datasets import Sample
from specnoise.decoding.base import DecodeOutput, Decoder


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

    @property
    def mean_seconds(self) -> float:
        return sum(self.seconds) / len(self.seconds)


def completion_text(tokenizer, prompt: list[int], new: list[int]) -> str:
    """Decode ``new`` in the context of the prompt, so a tokenizer that drops a leading space when decoding a
    fragment on its own (SentencePiece) cannot break the indentation of generated code."""
    head = tokenizer.decode(prompt, skip_special_tokens=True)
    full = tokenizer.decode(prompt + new, skip_special_tokens=True)
    return full[len(head):] if full.startswith(head) else tokenizer.decode(new, skip_special_tokens=True)


def order(names: list[str], slot: int) -> list[str]:
    """AR (``names[0]``) first in even slots, last in odd ones."""
    return names if slot % 2 == 0 else names[1:] + names[:1]


def warm_up(decoders: dict[str, Decoder], prompt: list[int], budget: int, times: int) -> None:
    """Untimed generations, then ``reset_history()`` so nothing learnt here helps the measured prompts."""
    for _ in range(times):
        for decoder in decoders.values():
            decoder.generate(prompt, budget)
    for decoder in decoders.values():
        decoder.reset_history()


def run_sample(sample: Sample, index: int, decoders: dict[str, Decoder], budget: int, limit: int, repeats: int,
               encode: Callable, tokenizer, bar, stop) -> dict[str, list[Turn]] | None:
    """Every decoder on every turn of ``sample``, ``repeats`` times, interleaved; None once ``stop.signal`` is set
    (the sample is then dropped whole: a continued run measures it again)."""
    names = list(decoders)  # "ar" first
    turns: dict[str, list[Turn]] = {name: [] for name in names}
    for k in range(len(sample.turns)):
        # each decoder continues its own dialogue (the same text as AR's whenever the decoder is lossless)
        prompts = {n: encode(sample, [t.text.strip() for t in turns[n]]) for n in names}
        if k > 0 and max(map(len, prompts.values())) > limit:  # later turns that no longer fit are skipped
            bar.update((len(sample.turns) - k) * len(names) * repeats)
            break
        outs: dict[str, list[DecodeOutput]] = {name: [] for name in names}
        for r in range(repeats):
            for name in order(names, index + r):
                if stop.signal:
                    return None
                bar.set_postfix_str(f"{sample.id} {name}" + (f" #{r + 1}" if repeats > 1 else ""), refresh=False)
                outs[name].append(decoders[name].generate(prompts[name], budget))
                bar.update(1)
        for name in names:
            first = outs[name][0]
            turns[name].append(Turn(
                prompts[name], first, completion_text(tokenizer, prompts[name], first.tokens),
                seconds=[o.seconds for o in outs[name]],
                # DecodeOutput gains these fields; an engine that cannot attribute its time leaves them out
                target_seconds=[o.target_seconds for o in outs[name]],
                draft_seconds=[o.draft_seconds for o in outs[name]],
                new_tokens=[len(o.tokens) for o in outs[name]],
                same_tokens=all(o.tokens == first.tokens for o in outs[name])))
    return turns


def measure(todo: list[tuple[int, Sample]], decoders: dict[str, Decoder], budget: int, limit: int, repeats: int,
            warmup: int, encode: Callable, tokenizer, finished: Callable[[Sample, dict[str, list[Turn]]], None],
            bar, stop) -> None:
    """Warm up on the first prompt to run, then each ``(index, sample)`` of ``todo`` in turn; ``finished`` gets
    every whole sample as soon as it is done. Returns early, between two generations, once ``stop.signal`` is set."""
    if not todo or stop.signal:
        return
    warm_up(decoders, encode(todo[0][1], []), budget, warmup)
    for index, sample in todo:
        turns = run_sample(sample, index, decoders, budget, limit, repeats, encode, tokenizer, bar, stop)
        if turns is None:
            return
        finished(sample, turns)
