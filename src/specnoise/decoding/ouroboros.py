"""Ouroboros (ALGORITHMS.md §9): speculative decoding whose draft model drafts in phrases, and whose drafts are
lengthened by phrases the target has already produced.

One target step:
  1. phrase drafting: Lookahead on the DRAFT model (its window and KV persist within a prompt) until gamma
     tokens are drafted;
  2. lengthening: the K newest pool phrases keyed by the draft's last token hang after the draft;
  3. one target forward over [uncached context] + draft + phrases with the phrase tree mask;
  4. acceptance along draft-then-phrases by the verifier (the drafts are deterministic guesses, so sampling is the
     verifier's per-position draw and keeps the target distribution exactly), KV compaction, and harvest: the
     target's predictions over discarded drafts become new phrases, tried phrases their verified versions.
The phrase pool lives on the decoder and, with ``reuse_history``, across prompts. Correctness depends only on
the target's verification: every draft-side choice changes speed, never tokens.
"""

from __future__ import annotations

import copy
from functools import lru_cache

import torch

from specnoise.decoding.auto import TREE
from specnoise.decoding.base import Drafter
from specnoise.decoding.lookahead import Window
from specnoise.decoding.ngram import NGramPool
from specnoise.decoding.speculative import check_draft_context, draft_tokens, draft_vocab, rewind
from specnoise.decoding.verifier import Proposal, Shape, Verifier, read_argmax, tree_shape


def harvest_discarded(pool: NGramPool, rejected: list[int], preds: list[int], M: int) -> None:
    """Paper §3.3 / OUR-R ``add_extra_ngram``: after each rejected draft token, the target's predictions form a
    phrase for as long as the draft agreed with them (so each prediction saw the phrase before it)."""
    for t, key in enumerate(rejected):
        body = [preds[t]]
        while len(body) < M and t + len(body) < len(rejected) and rejected[t + len(body)] == body[-1]:
            body.append(preds[t + len(body)])
        if len(body) == M:
            pool.insert(key, body)


def harvest_specbench(pool: NGramPool, chain: list[int], phrase_preds: list[list[int]], M: int) -> None:
    """OUR-SB: each token of [correction, predictions after each rejected draft token] keys the tokens after it,
    topped up to M with each tried phrase's predictions when too short."""
    for s, key in enumerate(chain):
        body = chain[s + 1:]
        if len(body) >= M:
            pool.insert(key, body[:M])
            continue
        for preds in phrase_preds:
            pool.insert(key, body + preds[:M - len(body)])


@lru_cache(maxsize=256)
def phrase_shape(nd: int, k: int, m: int, faithful: bool, device=None) -> Shape:
    """[root | nd drafts | k phrases of m tokens]: the drafts a chain, each phrase a chain hanging after the last
    draft (seeing every draft). The tree's paths are draft-then-phrase, in pool order; faithful (OUR-R) feeds each
    phrase's last token but never accepts it."""
    q = 1 + nd + k * m
    mask = torch.zeros(q, q, dtype=torch.bool)
    mask[:nd + 1, :nd + 1] = torch.ones(nd + 1, nd + 1, dtype=torch.bool).tril_()
    mask[nd + 1:, :nd + 1] = True  # phrases see the root and every draft
    offsets = list(range(nd + 1))
    rows, parents, paths = list(range(nd + 1)), list(range(nd)), []
    for g in range(k):
        first = nd + 1 + g * m
        mask[first:first + m, first:first + m] = torch.ones(m, m, dtype=torch.bool).tril_()
        offsets += [nd + 1 + j for j in range(m)]
        path = list(range(nd + 1))
        for j in range(m - 1 if faithful else m):
            parents.append(path[-1])
            rows.append(first + j)
            path.append(len(rows) - 1)
        paths.append(path)
    return tree_shape(parents, paths or None, mask=mask, offsets=torch.tensor(offsets), rows=rows, masked=True,
                      device=device)


class Ouroboros(Drafter):
    name = "ouroboros"
    needs_draft = True

    def setup(self):
        self.vocab = draft_vocab(self.decoder.target_model, self.decoder.draft_model, self.target, self.draft)
        self.pool = NGramPool(self.cfg.W)  # G = W (OUR-R asserts it)
        self.drafted = [0, 0, 0]  # draft lookahead steps, tokens they gave, rows they fed (decoder.auto's draft cost)

    def reset_history(self):
        self.pool.clear()

    def fork(self, decoder):
        """A row's own phrase pool (from a copy of this one): rows share no pool, so a row's drafts, and its forward
        counts, depend on its own prompts only, not on which prompts share its batch or the order rows run in."""
        clone = super().fork(decoder)
        clone.pool = copy.deepcopy(self.pool)
        return clone

    def begin(self, prompt, budget, seed):
        super().begin(prompt, budget, seed)
        check_draft_context(self.draft, prompt, budget)
        if not self.cfg.reuse_history:
            self.pool.clear()
        noise = torch.Generator().manual_seed(seed)  # per prompt: speed independent of prompt order
        self.window = Window(self.cfg.phrase_len + 1, self.cfg.W, self.pool, prompt, noise, self.cfg.faithful)
        # the draft's lookahead steps: greedy, in the target's vocabulary, each one read
        self.drafting = Verifier(self.draft, self.read, vocab=self.vocab)

    def propose(self, room):
        cfg, M = self.cfg, self.cfg.phrase_len
        # decoder.auto ranks the drafts, then whole phrases, and may cut both (0: an AR step, no draft forward)
        want, K = min(cfg.gamma, room), cfg.K if cfg.lengthening else 0
        parents = [*range(-1, want - 1), *(want - 1 if j % M == 0 else want + j - 1 for j in range(K * M))]
        k = self.cut(want + K * M, cuts=[*range(want + 1), *(want + M * j for j in range(1, K + 1))], parents=parents)
        # 1. draft; drafts past the budget could never be emitted
        self.d, self.fed = self.make_draft(min(want, k))
        # 2. lengthen with the newest phrases for the draft's last token, cut to what could still be emitted
        # (which also keeps their positions inside the context)
        self.key, self.m = self.d[-1] if self.d else self.seq[-1], min(M, room - len(self.d))
        K = (k - want) // M if k > want else 0
        self.phrases = [g[:self.m] for g in self.pool.newest(self.key, K)] if K and self.m > 0 else []
        # 3. one target forward over drafts and phrases (the first step's is the target's prefill)
        shape = phrase_shape(len(self.d), len(self.phrases), self.m, cfg.faithful, self.target.device)
        return Proposal(self.d + [t for g in self.phrases for t in g], shape, after=read_argmax)

    def draft_cost(self, stream, k):
        """k drafted tokens take k / (tokens per lookahead step) draft forwards of the mean block (counted so far)."""
        steps, tokens, rows = self.drafted
        per_step, block = (tokens / steps, rows / steps) if steps else (1.0, 1 + self.cfg.W * self.cfg.phrase_len)
        return min(k, self.cfg.gamma) / per_step * self.decoder.curves["draft"](block, TREE)

    def observe(self, v):
        super().observe(v)
        if v.done:
            return
        rewind(self.draft, self.fed, self.seq)
        if self.m == self.cfg.phrase_len:  # phrases cut short near the budget are no pool material
            self.harvest(v.extra, v.accepted)

    def make_draft(self, want: int) -> tuple[list[int], list[int]]:
        """Up to ``want`` draft tokens after ``seq`` (cut after an EOS), and all the tokens the draft model has seen."""
        seq = self.seq
        if want <= 0:
            return [], list(seq)
        if not self.cfg.phrase_drafting:  # ablation: plain token-by-token drafting
            d = self.read(draft_tokens(self.draft, seq, want, self.vocab)[0])
            return d, seq + d
        d: list[int] = []
        while len(d) < want and not self.decoder.eos_ids.intersection(d):
            d += self.draft_step(seq + d)
        fed = seq + d
        for i, t in enumerate(d):
            if t in self.decoder.eos_ids:
                d = d[:i + 1]
                break
        return d[:want], fed

    def draft_step(self, tokens: list[int]) -> list[int]:
        """One lookahead step of the draft model after ``tokens`` (the uncached ones fed): its accepted tokens."""
        v = self.drafting.step(tokens[self.draft.length:], self.window.propose(tokens[-1], self.draft.device), base=0)
        self.drafted[0] += 1
        self.drafted[1] += len(v.tokens)
        self.drafted[2] += v.shape.last
        self.drafting.commit(v)
        self.window.advance(tokens[-1], v.extra)
        return v.tokens

    def harvest(self, y: list[int], accepted: int) -> None:
        """Feed the pool from verification (greedy predictions, also under sampling: the pool only guesses).

        y: argmax per block row (row 0, the root, predicts d[0]); accepted: draft and phrase tokens kept."""
        d, M, how = self.d, self.cfg.phrase_len, self.cfg.harvest
        d_rows = range(1, len(d) + 1)
        phrase_preds = [y[len(d) + 1 + g * M:len(d) + 1 + (g + 1) * M] for g in range(len(self.phrases))]
        if accepted < len(d):  # draft rejected: its tail still shows what the target continues with
            if how == "paper":
                harvest_discarded(self.pool, d[accepted:], [y[i] for i in d_rows[accepted:]], M)
            elif how == "specbench":
                harvest_specbench(self.pool, y[accepted:len(d) + 1], phrase_preds, M)
        elif how == "paper":  # draft accepted: each tried phrase becomes what the target made of it
            u0 = y[len(d)]
            for g, preds in zip(self.phrases, phrase_preds):
                self.pool.replace(self.key, g, [u0] + preds[:M - 1])
