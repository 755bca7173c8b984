"""Token-sequence primitives shared by the drafters: ahead noise, prompt lookup, and the n-gram pool."""

from __future__ import annotations

from collections import OrderedDict

import torch


def ahead_noise(context: list[int], n: int, generator: torch.Generator) -> list[int]:
    """``n`` tokens drawn uniformly from the *positions* of ``context`` (MSN's ahead noise).

    Noise only decides how fast drafts converge, never what is emitted; a per-request generator keeps
    speed numbers reproducible.
    """
    if n <= 0 or not context:
        return []
    idx = torch.randint(0, len(context), (n,), generator=generator).tolist()
    return [context[i] for i in idx]


def suffix_continuation(seq: list[int], n: int, length: int, first_end: int, end_stop: int) -> list[int] | None:
    """The one suffix lookup (PLD and TR-Jacobi's retrieval): the ``length`` tokens after the earliest earlier
    occurrence of ``seq``'s last ``n`` tokens that ends at an index in [first_end, end_stop), or None.
    ``first_end`` must be at least n - 1."""
    suffix, last, end = seq[-n:], seq[-1], first_end
    while end < end_stop:
        try:
            end = seq.index(last, end, end_stop)  # jump between candidate ends in C, not per token in Python
        except ValueError:
            return None
        if seq[end - n + 1:end + 1] == suffix:
            return seq[end + 1:end + 1 + length]
        end += 1
    return None


def prompt_lookup(seq: list[int], max_ngram: int, num_pred: int) -> list[int]:
    """PLD: the continuation of the earliest earlier occurrence of the longest matching suffix n-gram.

    For n = max_ngram .. 1, the ``num_pred`` tokens after the first occurrence of the last n tokens whose whole
    continuation lies inside ``seq`` and that ends before the suffix starts (Spec-Bench's PLD rule). [] when
    nothing qualifies.
    """
    L = len(seq)
    for n in range(min(max_ngram, L), 0, -1):
        found = suffix_continuation(seq, n, num_pred, first_end=n - 1, end_stop=min(L - n - 1, L - num_pred))
        if found is not None:
            return found
    return []


class NGramPool:
    """key token -> up to ``capacity`` phrases (tuples), least recently inserted first (LRU)."""

    def __init__(self, capacity: int):
        self.capacity = capacity
        self.table: dict[int, OrderedDict[tuple[int, ...], None]] = {}

    def insert(self, key: int, phrase) -> None:
        if self.capacity <= 0:
            return
        phrase = tuple(int(t) for t in phrase)
        entries = self.table.setdefault(int(key), OrderedDict())
        if phrase in entries:
            entries.move_to_end(phrase)
            return
        if len(entries) >= self.capacity:
            entries.popitem(last=False)
        entries[phrase] = None

    def get(self, key: int) -> list[tuple[int, ...]]:
        """All phrases for ``key``, oldest first."""
        entries = self.table.get(int(key))
        return list(entries) if entries else []

    def newest(self, key: int, k: int) -> list[tuple[int, ...]]:
        """Up to ``k`` most recent phrases for ``key``, newest first."""
        return self.get(key)[::-1][:k]

    def replace(self, key: int, old, new) -> None:
        """Overwrite phrase ``old`` with its verified version ``new`` (keeping its recency)."""
        entries = self.table.get(int(key))
        old, new = tuple(old), tuple(int(t) for t in new)
        if not entries or old not in entries or old == new:
            return
        items = [(new if p == old else p) for p in entries if p != new or p == old]
        self.table[int(key)] = OrderedDict.fromkeys(items)

    def clear(self) -> None:
        self.table.clear()

    def __len__(self) -> int:
        return sum(len(v) for v in self.table.values())
