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

from functools import lru_cache

import numpy as np

from specnoise.decoding.corpus import open_datastore
from specnoise.decoding.drafter import Drafter
from specnoise.decoding.proposal import Proposal, tree_shape
from specnoise.errors import ConfigError


@lru_cache(maxsize=1024)
def trie_shape(parents: tuple[int, ...], device=None):
    return tree_shape(list(parents), device=device)


def trie(continuations: np.ndarray, size: int) -> tuple[list[int], list[int]]:
    """(tokens, parents) of the ``size`` most frequent prefixes of ``continuations`` ([m, depth], -1 ends a row; the
    rows in lexicographic order, -1 first, as a suffix array's continuations come), parents first; ``parents[i]`` is
    node i + 1's parent input (0 = the root). Ties: the shorter prefix first, then the lexicographically smaller one;
    a prefix is at least as frequent as its extensions, so it sorts before them.

    In numpy: the sorted rows hold every prefix's rows in one run, so a prefix is a run start and its count the run's
    length (a Counter of prefix tuples took 1.8 ms for 500 rows, a quarter of an AR step)."""
    rows = np.asarray(continuations).reshape(len(continuations), -1)
    m, depth = rows.shape
    start = np.ones((m, depth), dtype=bool)  # start[r, d]: row r starts a run of equal length-(d + 1) prefixes
    start[1:] = np.logical_or.accumulate(rows[1:] != rows[:-1], axis=1)
    run = np.cumsum(start, axis=0) - 1 + np.arange(depth) * m  # each row's run per length, numbered apart
    counts = np.bincount(run.ravel(), minlength=m * depth)
    r, d = np.nonzero(start & (rows >= 0))  # one (row, length - 1) per prefix, lexicographic within a length
    runs = run[r, d]
    key = (m - counts[runs]) * (m * depth) + d * m + r  # the order: most frequent, shorter, smaller
    top = np.argpartition(key, size - 1)[:size] if len(key) > size else np.arange(len(key))
    order = top[np.argsort(key[top])]
    r, d = r[order], d[order]
    # each pick's parent: the run of its prefix one shorter (read for every pick, used where d > 0), as host ints
    index = {run: k for k, run in enumerate(runs[order].tolist(), start=1)}
    above = run[r, d - 1].tolist()
    return rows[r, d].tolist(), [index[a] if j else 0 for a, j in zip(above, d.tolist())]


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
        self.match = self.store.longest_suffix(self.seq, cfg.max_suffix, self.match)
        n, lo, hi, _ = self.match
        if n < cfg.min_suffix or depth == 0:
            self.cut(0)  # decoder.auto: an AR step, which a batch's plan counts (Controller.ar_step)
            return self.chain([])
        self.hits += 1
        key = (n, lo, hi, depth)
        found = self.tries.get(key)
        if found is None:
            rows = self.store.continuations(n, lo, hi, depth, cfg.matches)
            found = self.tries[key] = trie(rows, cfg.num_draft)
        tokens, parents = found
        # decoder.auto: the k most frequent prefixes (a prefix of the pick is a tree)
        self.parents = [p - 1 for p in parents]
        k = self.cut(len(tokens), parents=self.parents)
        tokens, parents = tokens[:k], parents[:k]
        return Proposal(tokens, trie_shape(tuple(parents), self.target.device))

    def begin(self, prompt, budget, seed):
        super().begin(prompt, budget, seed)
        self.match = None  # the last look-up's: the next one extends it by the tokens accepted since (as SAM's)
        # each match's trie this generation, (tokens, parents): a text meets the same suffix interval again (of three
        # HumanEval-style prompts over 256 tokens, 70% and 81% of two's look-ups, none of the third's), and a trie
        # costs ~0.22 ms of host work on the CPU. Per generation: a benchmark's repeats of a prompt pay what its
        # first run paid
        self.tries: dict[tuple[int, int, int, int], tuple[list[int], list[int]]] = {}

    def after_generation(self):
        self.meta["retrieval_hit_rate"] = round(self.hits / max(self.steps, 1), 3)  # steps with a trie, so far
