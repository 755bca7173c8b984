"""SAM-Decoding (Hu et al., 2024): draft what followed the longest earlier match of the text's suffix.

Two sources, the longer match wins (the dynamic one on a tie):
  * a suffix automaton over prompt + accepted tokens, extended per accepted token (``SuffixAutomaton``). The state of
    the longest suffix that occurred before is the suffix link of the whole text's state; the ``max_draft`` tokens
    after its first occurrence are the draft;
  * optionally a static corpus (``decoder.corpus``, tokenized and cached on disk, corpus.py): the longest suffix of
    the text occurring in it, tracked across steps (the match can only grow by the tokens a step adds), and the
    tokens after its first occurrence in the corpus.
A match shorter than ``min_match`` drafts with the fallback instead: Token Recycling's tree (SAM-Decoding[T]; its
matrix is fed by every step, matched chains included), or nothing (an AR step).

Departures from the paper's code: the static side is a suffix array searched by binary search, not a suffix
automaton (the same answer, the longest suffix that occurs and the tokens after its first occurrence, at O(log n)
per token of match instead of O(1), and a structure numpy can sort and cache); when fewer than ``max_draft`` tokens
follow the dynamic match (a repeat overlapping itself, as in a run of one token) it backs off to shorter suffixes
whose first occurrence has more text after it; the paper's EAGLE fallback is not offered, Token Recycling is; and
the match threshold and draft length are plain config values, not tuned per model.
"""

from __future__ import annotations

from specnoise.decoding.corpus import open_datastore
from specnoise.decoding.cost import CHAIN
from specnoise.decoding.drafter import Drafter
from specnoise.decoding.token_recycling import TokenRecycling


class SuffixAutomaton:
    """The suffix automaton of a growing token list: per state its transitions, suffix link, longest string length and
    the end of its first occurrence (Blumer et al.; states are list indices, 0 the empty string)."""

    def __init__(self, tokens: list[int]):
        self.next: list[dict[int, int]] = [{}]
        self.link, self.length, self.first = [-1], [0], [-1]
        self.last, self.size = 0, 0
        for token in tokens:
            self.extend(token)

    def state(self, length: int, link: int, first: int, nxt: dict) -> int:
        self.next.append(nxt)
        self.link.append(link)
        self.length.append(length)
        self.first.append(first)
        return len(self.next) - 1

    def extend(self, token: int) -> None:
        cur = self.state(self.length[self.last] + 1, 0, self.size, {})
        self.size += 1
        p = self.last
        while p != -1 and token not in self.next[p]:
            self.next[p][token] = cur
            p = self.link[p]
        if p != -1:
            q = self.next[p][token]
            if self.length[p] + 1 == self.length[q]:
                self.link[cur] = q
            else:  # split q: its strings of length <= length[p] + 1 now also end here
                clone = self.state(self.length[p] + 1, self.link[q], self.first[q], dict(self.next[q]))
                while p != -1 and self.next[p].get(token) == q:
                    self.next[p][token] = clone
                    p = self.link[p]
                self.link[q] = self.link[cur] = clone
        self.last = cur

    def match(self, room: int, shortest: int) -> tuple[int, int]:
        """(length, end): the longest suffix that occurred earlier and where its first occurrence ends, backing off
        to shorter suffixes (at least ``shortest`` long) while fewer than ``room`` tokens follow that occurrence."""
        s = self.link[self.last]
        while self.size - 1 - self.first[s] < room and self.length[self.link[s]] >= shortest:
            s = self.link[s]  # a shorter suffix may first occur earlier, with more text after it (a run of one token)
        return self.length[s], self.first[s]


class SAM(Drafter):
    name = "sam"
    backoff = False  # its explorations feed its next candidates (auto.py)

    def setup(self):
        cfg = self.cfg
        self.fallback = TokenRecycling(cfg, self.decoder) if cfg.fallback == "token_recycling" else None
        if self.fallback is not None:
            self.fallback.setup()
            self.meta = dict(self.fallback.meta)
        self.meta["fallback"] = cfg.fallback
        self.store = None
        if cfg.corpus is not None:
            self.store, info = open_datastore(cfg.corpus, self.decoder.target_model.tokenizer,
                                              self.target.vocab_size, cfg.cache_dir)
            self.meta.update(info)
        self.steps = {"dynamic": 0, "static": 0, "fallback": 0}

    def begin(self, prompt, budget, seed):
        super().begin(prompt, budget, seed)
        if self.fallback is not None:
            self.fallback.begin(prompt, budget, seed)
        self.automaton = SuffixAutomaton(self.seq)
        self.static_match = None  # the static corpus's last match: the next look-up extends it by the tokens since

    def propose(self, room):
        cfg, length = self.cfg, min(self.cfg.max_draft, room)
        n, end = self.automaton.match(length, cfg.min_match)
        draft, source = self.seq[end + 1:end + 1 + length], "dynamic"
        if self.store is not None:
            self.static_match = self.store.longest_suffix(self.seq, len(self.seq), self.static_match)
            m, lo, hi, _ = self.static_match
            if m > n:
                draft, n, source = self.store.first(m, lo, hi, length), m, "static"
        if n < cfg.min_match or not draft:
            draft, source = [], "fallback"
        self.steps[source] += 1
        if source != "fallback":  # decoder.auto: maybe a shorter prefix (the fallback's tree is cut by its own ranks)
            draft = draft[:self.cut(len(draft), "sam", CHAIN)]
        if self.fallback is None:
            return self.chain(draft)
        return self.fallback.propose(room) if source == "fallback" else self.fallback.recycled(draft)

    def observe(self, v):
        super().observe(v)
        if self.fallback is not None:
            self.fallback.observe(v)
        for token in v.tokens:
            self.automaton.extend(token)

    def after_generation(self):
        total = max(sum(self.steps.values()), 1)
        self.meta["draft_sources"] = {k: round(n / total, 3) for k, n in self.steps.items()}  # shares of steps

    def reset_history(self):
        if self.fallback is not None:
            self.fallback.reset_history()

    def history(self):
        return {} if self.fallback is None else {"fallback": self.fallback.history()}

    def restore(self, saved):
        if self.fallback is not None:
            self.fallback.restore(saved["fallback"])

    def fork(self, decoder):
        clone = super().fork(decoder)
        clone.steps = dict(self.steps)
        if self.fallback is not None:
            clone.fallback = self.fallback.fork(decoder)
        return clone
