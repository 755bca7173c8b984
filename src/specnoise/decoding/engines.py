"""The engine interface as a protocol, and the one factory that builds an engine for a loaded model.

Lifetime rule (one for both engines): an engine belongs to its loaded model and role ("target" or "draft"), and
every decoder built on that model shares it. A job runs one generation at a time, and each generation starts with
``reset()``, so sharing is safe; it lets the static engine allocate and compile its cache once per job, and a
dynamic engine costs nothing to share. Decoders never ask which engine they drive.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import torch

from specnoise.decoding.kv import DynamicEngine
from specnoise.decoding.static_kv import BUCKETS, StaticEngine


@runtime_checkable
class EngineProtocol(Protocol):
    """What drafters and the verifier may use of an engine: ``DynamicEngine``, ``StaticEngine`` and a batch row's
    ``RowEngine`` (batch.py) implement it (tests/test_batch.py checks)."""

    device: torch.device
    dtype: torch.dtype
    vocab_size: int
    max_length: int
    forwards: int
    forward_log: list[tuple[int, bool, int]]  # per forward since reset: (tokens fed, with a mask, cached before it)
    can_keep_last: bool  # the model's forward takes ``logits_to_keep``

    @property
    def length(self) -> int: ...
    @property
    def seconds(self) -> float: ...
    @property
    def attended(self) -> int: ...
    def forward(self, tokens, positions=None, tree: torch.Tensor | None = None,
                last: int | None = None, prefix: int = 0) -> torch.Tensor: ...
    def crop(self, n: int) -> None: ...
    def move(self, start: int, src) -> None: ...
    def compact(self, start: int, keep: list[int], src: torch.Tensor | None = None) -> None: ...
    def reserve(self, n: int) -> None: ...
    def reset(self) -> None: ...
    def graph(self, fn): ...


def engine_for(loaded, role: str = "target") -> DynamicEngine | StaticEngine:
    """The engine of a ``LoadedModel`` in ``role``, built on first use (``model.static_cache`` picks the kind)."""
    key = (role, bool(loaded.static_cache), bool(loaded.compile))  # copies of a LoadedModel share its engines dict
    if key not in loaded.engines:
        if loaded.static_cache:
            loaded.engines[key] = StaticEngine(loaded.model, compile=loaded.compile, buckets=loaded.buckets or BUCKETS)
        else:
            loaded.engines[key] = DynamicEngine(loaded.model)
    return loaded.engines[key]
