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


def prompt_lookup(seq: list[int], max_ngram: int, num_pred: int) -> list[int]:
    """PLD: the continuation of the earliest earlier occurrence of the longest matching suffix n-gram.

    For n = max_ngram .. 1, scan occurrences of the last n tokens left to right and return the
    ``num_pred`` tokens that follow the first one whose whole continuation lies inside ``seq`` and that
    ends before the suffix starts (Spec-Bench's PLD rule). [] when nothing qualifies.
    """
    L = len(seq)
    for n in range(min(max_ngram, L), 0, -1):
        suffix, first = seq[L - n:], seq[L - n]
        stop = min(L - 2 * n, L - n - num_pred + 1)  # starts s < stop qualify
        s = 0
        while s < stop:
            try:
                s = seq.index(first, s, stop)  # jump between candidate starts in C, not per token in Python
            except ValueError:
                break
            if seq[s:s + n] == suffix:
                return seq[s + n:s + n + num_pred]
            s += 1
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
