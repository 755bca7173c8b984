"""What the decoder.auto tests share: fixed cost curves (whatever the machine, what the controller must choose is
known), decoders built on them, and a stream driven through steps."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

from conftest import prompts
from helpers_decoding import schema
from specnoise.decoding.auto import Controller
from specnoise.decoding.base import build_decoder
from specnoise.decoding.cost import CHAIN, TREE

DRAFTERS = ["jacobi", "tr_jacobi", "pld", "lookahead", "token_recycling", "sam", "rest", "speculative", "ouroboros"]
NEW_TOKENS = 40
PROMPTS = prompts(3, seed=1)
CURVES = {
    "flat": lambda q, kind=CHAIN, context=None: 1.0 - 1e-9 * q,  # never dearer for more tokens (ties go larger)
    "steep": lambda q, kind=CHAIN, context=None: float(q),
    "moderate": lambda q, kind=CHAIN, context=None: 1.0 + (0.06 if kind == TREE else 0.04) * (q - 1),
}


def with_curve(decoder, name: str):
    """``decoder`` with its controller on a fixed cost curve (and a draft model that costs nothing, but at the
    steep curve: then drafting costs what verifying does)."""
    cost = CURVES[name]
    decoder.curves = {"target": cost, "draft": cost if name == "steep" else lambda q, kind=CHAIN, context=None: 0.0}
    decoder.auto = Controller(cost, backoff=decoder.drafter.backoff, **decoder.drafter.priced_drafting())
    return decoder


def build(name, target, draft, curve="moderate", **options):
    return with_curve(build_decoder(schema(name, auto=True, **options), target, draft), curve)


def static(loaded):
    return dataclasses.replace(loaded, static_cache=True, engines={})


def verdict(proposed: int, accepted: int):
    """What the controller reads of a step's verdict: nodes verified, nodes accepted, the accepted path (a chain)."""
    return SimpleNamespace(accepted=accepted, shape=SimpleNamespace(nodes=proposed), path=list(range(accepted + 1)))


def explorations(controller: Controller, steps: int, accepted: int = 0, kind: str = TREE,
                 seconds: float | None = None) -> list[int]:
    """The steps (from 1) at which stream "s" of ``controller``, offered 8 candidates at each of ``steps`` steps,
    drafted, each drafted step accepting ``accepted`` of them. ``seconds``: the steps are timed, a drafted one that
    long, an AR step 1 s."""
    drafted = []
    for i in range(steps):
        k = controller.size("s", 8, kind=kind)
        if k:
            drafted.append(i + 1)
            controller.observe(verdict(k, accepted))
        if seconds is not None:
            controller.timed(seconds if k else 1.0, 0.9, bool(k), 0.9, 1.0)
    return drafted
