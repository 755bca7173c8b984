"""Where a decode step's time goes on the CPU: inside the model forwards vs the host work around them, piece by piece.

For AR and each drafter on the shipped small-code-msn (small-code-draft for the draft-model decoders; fp32, one
thread), three prompts x 3 of 64 new tokens after one warm-up generation. Per target step: the wall time, the time
inside target and draft forwards (the engines' clocks) and the rest, ``other`` (the results' ``other_seconds``), split
into the step's pieces by wrapping them with timers here (the library carries no instrumentation): the drafter's
``propose`` (drafters without a draft model), the engines' forward bookkeeping outside their clocks (ids, positions,
masks, the numerics context, the logits' slice), the verify device function, the host read, the KV commit, the
drafter's ``observe``, and the rest (the step loop, a draft model's drafting loop); each piece in ms, and ``other``
relative to one AR step (issue #27's bound: 0.10). ``--auto``: decoder.auto=true. ``--ops``: one generation per
decoder under torch.profiler, its top ops outside the model forwards.

Usage: python experiments/hardware-aware/profile_step.py [decoder ...] [--auto] [--ops]
"""

from __future__ import annotations

import collections
import functools
import sys
import time

import torch
from torch.profiler import ProfilerActivity, profile, record_function

from specnoise.config import ASSETS_DIR, DECODER_SCHEMAS, ModelConfig
from specnoise.decoding import base, kv, static_kv, verifier
from specnoise.decoding.base import build_decoder, decoder_class
from specnoise.models import load_model

TEXTS = ["def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
         "def is_palindrome(s: str) -> bool:\n    \"\"\"Check whether s reads the same backwards.\"\"\"\n",
         "def sort_by_length(words):\n    \"\"\"Sort words by length, shortest first.\"\"\"\n"]
PIECES = ("propose", "forward", "verify", "read", "commit", "observe")
SPENT: collections.Counter = collections.Counter()  # seconds per piece since the last clear
OPEN: set[str] = set()  # pieces being timed now


def timed(owner, attr: str, piece: str) -> None:
    """Wrap ``owner.attr`` so that its calls add their wall time to ``SPENT[piece]`` (the outermost call only: SAM's
    ``propose`` calls Token Recycling's)."""
    fn = getattr(owner, attr)

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        if piece in OPEN:
            return fn(*args, **kwargs)
        OPEN.add(piece)
        start = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            SPENT[piece] += time.perf_counter() - start
            OPEN.discard(piece)

    setattr(owner, attr, wrapper)


def instrument(names: list[str]) -> None:
    timed(verifier.Verifier, "verify", "verify")
    timed(verifier.Verifier, "commit", "commit")
    timed(base.Decoder, "to_host", "read")
    for engine in (kv.DynamicEngine, static_kv.StaticEngine):
        timed(engine, "forward", "forward")
    for drafter in {decoder_class(name).drafter_class for name in names}:
        if "propose" in vars(drafter):
            timed(drafter, "propose", "propose")
        if "observe" in vars(drafter):
            timed(drafter, "observe", "observe")


def ops_outside_forwards(decoder, prompt: list[int]) -> str:
    """One generation under torch.profiler: the top aten ops by self CPU time, outside the model forwards."""
    forward = kv.DynamicEngine.forward

    def marked(self, *args, **kwargs):
        with record_function("FORWARD"):
            return forward(self, *args, **kwargs)

    kv.DynamicEngine.forward = marked
    try:
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            decoder.generate(prompt, 64)
    finally:
        kv.DynamicEngine.forward = forward
    spent, calls = collections.Counter(), collections.Counter()

    def walk(event, inside: bool) -> None:
        inside = inside or event.name == "FORWARD"
        if not inside and event.name.startswith("aten::"):
            spent[event.name] += event.self_cpu_time_total
            calls[event.name] += 1
        for child in event.cpu_children:
            walk(child, inside)

    for event in prof.events():
        if event.cpu_parent is None:
            walk(event, False)
    return "\n".join(f"    {name:36s} {us / 1e3:7.2f} ms {calls[name]:5d} calls" for name, us in spent.most_common(10))


def main(names: list[str], auto: bool, ops: bool) -> None:
    torch.set_num_threads(1)
    models = ASSETS_DIR / "models"
    target = load_model(ModelConfig(name="small-code-msn", path=str(models / "small-code-msn")))
    draft = load_model(ModelConfig(name="small-code-draft", path=str(models / "small-code-draft")))
    prompts = [target.tokenizer(t)["input_ids"] for t in TEXTS]
    names = ["ar", *[n for n in names if n != "ar"]]
    instrument(names)
    ar_step = None
    print(f"ms per target step{' (decoder.auto=true)' if auto else ''}")
    print(f"{'decoder':16s} {'steps':>5s} {'wall':>7s} {'target':>7s} {'draft':>6s} {'other':>6s} | "
          + " ".join(f"{p:>7s}" for p in (*PIECES, "rest")) + " | other/AR step")
    for name in names:
        cls = decoder_class(name)
        decoder = build_decoder(DECODER_SCHEMAS[name](auto=auto), target, draft if cls.needs_draft else None)
        decoder.generate(prompts[0], 64)  # warm-up (and decoder.auto's curve)
        SPENT.clear()
        steps = wall = inside_target = inside_draft = 0.0
        for _ in range(3):
            for p in prompts:
                out = decoder.generate(p, 64)
                steps += out.target_forwards
                wall += out.seconds
                inside_target += out.target_seconds
                inside_draft += out.draft_seconds or 0.0
        other = wall - inside_target - inside_draft
        pieces = {p: SPENT[p] for p in PIECES}
        pieces["forward"] -= inside_target + inside_draft  # the bookkeeping around the clocked model calls
        pieces["rest"] = other - sum(pieces.values())
        ar_step = ar_step or wall / steps
        wall, inside_target, inside_draft, other = (x * 1e3 / steps for x in (wall, inside_target, inside_draft, other))
        print(f"{name:16s} {steps / 9:5.1f} {wall:7.3f} {inside_target:7.3f} {inside_draft:6.3f} "
              f"{other:6.3f} | " + " ".join(f"{v * 1e3 / steps:7.3f}" for v in pieces.values())
              + f" | {other / 1e3 / ar_step:.3f}")
        if ops:
            print(ops_outside_forwards(decoder, prompts[1]))


if __name__ == "__main__":
    args = sys.argv[1:]
    main([a for a in args if not a.startswith("--")], "--auto" in args, "--ops" in args)
