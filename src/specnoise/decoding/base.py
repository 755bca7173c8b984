"""The decoder interface and the output contract shared by every decoder.

A decoder turns prompt token ids into new token ids. Each one is a small class over ``KVModel`` (or the
static-cache engine with the same interface, ``model.static_cache``) whose ``decode`` reads like its
pseudocode: prefill, then steps that each call ``out.emit(block)`` once per target forward. ``Output``
enforces the canonical greedy contract so no decoder re-implements it: tokens up to and including the first
EOS-set token, or ``max_new_tokens`` tokens, whichever comes first, even when either falls inside an
accepted draft.
"""

from __future__ import annotations

import importlib
import time
from dataclasses import dataclass, field
from typing import ClassVar

import torch

from specnoise.config import DecoderConfig, UserError
from specnoise.decoding.kv import sync
from specnoise.decoding.static_kv import kv_model


@dataclass
class DecodeOutput:
    tokens: list[int]  # new tokens after the canonical cut
    target_forwards: int
    draft_forwards: int = 0
    accepted: list[int] = field(default_factory=list)  # tokens emitted by each target forward that emitted
    seconds: float = 0.0
    host_reads: int = 0  # device-to-host reads (``Decoder.to_host``), draft loop included

    @property
    def mean_accepted(self) -> float:
        return len(self.tokens) / max(self.target_forwards, 1)


class Output:
    """Collects emitted tokens under the canonical cut; ``done`` turns True at EOS or budget."""

    def __init__(self, eos_ids: frozenset[int], max_new_tokens: int):
        self.eos_ids, self.budget = eos_ids, max_new_tokens
        self.tokens: list[int] = []
        self.accepted: list[int] = []
        self.done = max_new_tokens <= 0

    def emit(self, block: list[int]) -> list[int]:
        """Append one step's accepted tokens (drafts + bonus); returns what was actually kept."""
        kept = []
        for tok in block:
            if self.done:
                break
            kept.append(int(tok))
            self.done = tok in self.eos_ids or len(self.tokens) + len(kept) >= self.budget
        self.tokens.extend(kept)
        self.accepted.append(len(kept))
        return kept


def greedy_accept(drafts: list[int], y: list[int]) -> list[int]:
    """Verify a chain greedily: ``y[j]`` is the target's argmax at the slot before ``drafts[j]``.

    Returns the accepted drafts plus the target's own next token (the bonus), the block a step emits."""
    a = 0
    while a < len(drafts) and drafts[a] == y[a]:
        a += 1
    return drafts[:a] + [y[a]]


class Decoder:
    """Base class: subclasses set ``name`` and implement ``decode(prompt, out)``."""

    name: ClassVar[str]
    supports_sampling: ClassVar[bool] = False  # greedy-only decoders refuse temperature > 0
    needs_draft: ClassVar[bool] = False

    def __init__(self, cfg: DecoderConfig, target, draft=None):
        """target / draft: ``specnoise.models.LoadedModel`` (model + tokenizer + EOS set)."""
        self.cfg, self.target_model, self.draft_model = cfg, target, draft
        if cfg.temperature > 0 and not self.supports_sampling:
            raise UserError(f"decoder={self.name} is greedy-only: set decoder.temperature=0 "
                            "(sampling: ar, speculative, ouroboros)")
        if self.needs_draft and draft is None:
            raise UserError(f"decoder={self.name} needs a draft model: set draft=NAME or pair=NAME")
        self.eos_ids = target.eos_ids
        self.target = kv_model(target)  # the dynamic or the static-cache engine (model.static_cache)
        self.draft = kv_model(draft) if draft is not None and self.needs_draft else None
        self.generator = torch.Generator().manual_seed(cfg.seed)
        self.host_reads = 0

    def to_host(self, tensor: torch.Tensor) -> list | int | float:
        """The one way a decoder reads device values: each call is a host-device sync on a GPU, so a step
        gathers what it needs (argmaxes, top-k, sampled tokens) into one tensor and reads it once."""
        self.host_reads += 1
        return tensor.tolist()

    def decode(self, prompt: list[int], out: Output) -> None:
        raise NotImplementedError

    def verify_chain(self, pending: list[int], draft: list[int]) -> tuple[list[int], list[int]]:
        """Greedy verification of a causal chain: one forward of the accepted tokens that have no KV yet
        (``pending``) followed by ``draft``. Returns the block to emit (accepted drafts + the target's own token)
        and the predictions ``y`` (``y[j]`` follows draft slot j-1). Only accepted slots stay cached: the bonus
        token's KV is not computed yet, so it is the next step's ``pending``."""
        start = self.target.length + len(pending)
        y = self.to_host(self.target.forward(pending + draft, last=len(draft) + 1).argmax(-1))
        block = greedy_accept(draft, y)
        self.target.crop(start + len(block) - 1)
        return block, y

    def reserve(self, n: int) -> None:
        """Generations of up to ``n`` tokens (prompt + new) follow: size static caches now, untimed."""
        for kv in filter(None, (self.target, self.draft)):
            kv.reserve(n)

    def reset_history(self) -> None:
        """Forget state kept across prompts (Ouroboros' phrase pool); no-op for the others."""

    def generate(self, prompt: list[int], max_new_tokens: int) -> DecodeOutput:
        prompt = [int(t) for t in prompt]
        if not prompt:
            raise UserError("empty prompt: a prompt needs at least one token")
        if len(prompt) + max_new_tokens > self.target.max_length:
            raise UserError(
                f"prompt of {len(prompt)} tokens + max_new_tokens={max_new_tokens} exceeds the model's context "
                f"of {self.target.max_length}: shorten the prompt or lower max_new_tokens"
            )
        out = Output(self.eos_ids, max_new_tokens)
        for kv in filter(None, (self.target, self.draft)):
            kv.reset()
        self.reserve(len(prompt) + max_new_tokens)  # a static cache is sized (and compiled) before the clock
        self.host_reads = 0
        sync(self.target.device)
        start = time.perf_counter()
        if not out.done:
            with torch.inference_mode():  # no autograd bookkeeping; compiled forwards were traced on inference tensors
                self.decode(prompt, out)
        sync(self.target.device)
        seconds = time.perf_counter() - start
        return DecodeOutput(
            tokens=out.tokens,
            target_forwards=self.target.forwards,
            draft_forwards=self.draft.forwards if self.draft is not None else 0,
            accepted=out.accepted,
            seconds=seconds,
            host_reads=self.host_reads,
        )


# decoder option -> module defining it (one decoder per file); imported on first use
DECODER_MODULES = {
    "ar": "specnoise.decoding.ar",
    "jacobi": "specnoise.decoding.jacobi",
    "tr_jacobi": "specnoise.decoding.tr_jacobi",
    "pld": "specnoise.decoding.pld",
    "lookahead": "specnoise.decoding.lookahead",
    "speculative": "specnoise.decoding.speculative",
    "ouroboros": "specnoise.decoding.ouroboros",
    "hf_greedy": "specnoise.decoding.hf",
    "hf_pld": "specnoise.decoding.hf",
    "hf_assisted": "specnoise.decoding.hf",
    "hf_static": "specnoise.decoding.hf",
}


def decoder_class(name: str) -> type[Decoder]:
    if name not in DECODER_MODULES:
        raise UserError(f"unknown decoder {name!r}: choose one of {', '.join(DECODER_MODULES)}")
    module = importlib.import_module(DECODER_MODULES[name])
    return next(c for c in vars(module).values()
                if isinstance(c, type) and issubclass(c, Decoder) and getattr(c, "name", None) == name)


def build_decoder(cfg: DecoderConfig, target, draft=None) -> Decoder:
    return decoder_class(cfg.name)(cfg, target, draft)
