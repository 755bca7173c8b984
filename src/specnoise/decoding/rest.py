"""REST, retrieval-based speculative decoding (He et al., 2024): draft a trie of what followed the context in a corpus.

The datastore is a suffix array over a tokenized corpus (``decoder.corpus``, tokenized and sorted once and cached on
disk, corpus.py). Each step looks up the longest suffix of the context (``min_suffix`` .. ``max_suffix`` tokens)
that occurs in it, takes the ``max_depth`` tokens after up to ``matches`` of its occurrences, counts every prefix of
these continuations, and verifies the ``num_draft`` most frequent prefixes as one trie: a prefix is at least as
frequent as its extensions, so the pick is a tree, most frequent branches first (the verifier's tie-break). No match
of ``min_suffix`` tokens: an AR step.

Departures from the paper's code: the datastore is a numpy suffix array, not its Rust ``DraftRetriever``; occurrences
beyond ``matches`` are sampled evenly over the suffix interval, not taken in index order; the trie is picked by
prefix frequency alone (ties: shorter, then token order); and tries vary per step, so on an engine that records CUDA
graphs each new trie shape is recorded once (lookahead's window has the same cost).
"""

from __future__ import annotations

from collections import Counter
from functools import lru_cache

from specnoise.decoding.base import Drafter
from specnoise.decoding.corpus import open_datastore
from specnoise.decoding.verifier import Proposal, tree_shape
from specnoise.errors import ConfigError


@lru_cache(maxsize=1024)
def trie_shape(parents: tuple[int, ...], device=None):
    return tree_shape(list(parents), device=device)


def trie(continuations: list[list[int]], size: int) -> tuple[list[int], list[int]]:
    """(tokens, parents) of the ``size`` most frequent prefixes of ``continuations`` (-1 ends one), parents first;
    ``parents[i]`` is node i + 1's parent input (0 = the root)."""
    counts = Counter(tuple(row[:d]) for row in continuations for d in range(1, len(row) + 1) if row[d - 1] >= 0)
    picked = sorted(counts, key=lambda p: (-counts[p], len(p), p))[:size]  # a prefix sorts before its extensions
    index = {p: i for i, p in enumerate(picked, start=1)}
    return [p[-1] for p in picked], [index[p[:-1]] if len(p) > 1 else 0 for p in picked]


class REST(Drafter):
    name = "rest"

    def setup(self):
        cfg = self.cfg
        if cfg.num_draft + 1 > self.target.max_length:
            raise ConfigError(f"decoder.num_draft={cfg.num_draft}: a trie of that many nodes exceeds the model's "
                              f"context of {self.target.max_length}: lower it")
        self.store, info = open_datastore(cfg.corpus, self.decoder.target_model.tokenizer, self.target.vocab_size,
                                          cfg.cache_dir)
        self.meta = {"num_draft": cfg.num_draft, "max_depth": cfg.max_depth, **info}
        self.hits = self.steps = 0
        self.parents: list[int] | None = None  # the last trie's tree (decoder.auto's ``idle``)

    def propose(self, room):
        cfg, depth = self.cfg, min(self.cfg.max_depth, room)
        self.steps += 1
        if self.idle(self.parents):  # decoder.auto: an AR step whatever the lookup finds (the lookup is host work)
            return self.chain([])
        n, lo, hi = self.store.longest_suffix(self.seq, cfg.max_suffix)
        if n < cfg.min_suffix or depth == 0:
            return self.chain([])
        self.hits += 1
        rows = self.store.continuations(n, lo, hi, depth, cfg.matches).tolist()
        tokens, parents = trie(rows, cfg.num_draft)
        # decoder.auto: the k most frequent prefixes (a prefix of the pick is a tree)
        self.parents = [p - 1 for p in parents]
        k = self.cut(len(tokens), parents=self.parents)
        tokens, parents = tokens[:k], parents[:k]
        return Proposal(tokens, trie_shape(tuple(parents), self.target.device))

    def after_generation(self):
        self.meta["retrieval_hit_rate"] = round(self.hits / max(self.steps, 1), 3)  # steps with a trie, so far
