"""Ouroboros (ALGORITHMS.md §9): speculative decoding whose draft model drafts in phrases, and whose drafts are
lengthened by phrases the target has already produced.

One target step:
  1. phrase drafting: Lookahead on the DRAFT model (its window and KV persist within a prompt) until gamma
     tokens are drafted;
  2. lengthening: the K newest pool phrases keyed by the draft's last token hang after the draft;
  3. one target forward over [uncached context] + draft + phrases with the phrase tree mask;
  4. acceptance along draft-then-phrases (greedy: longest match; sampling: sequential multi-candidate
     rejection with one-hot drafts, so the target distribution is kept exactly), KV compaction, and harvest:
     the target's predictions over discarded drafts become new phrases, tried phrases their verified versions.
The phrase pool lives on the decoder and, with ``reuse_history``, across prompts. Correctness depends only on
the target's verification: every draft-side choice changes speed, never tokens.
"""

from __future__ import annotations

import torch

from specnoise.decoding.base import Decoder, Output
from specnoise.decoding.lookahead import LookaheadWindow, Pick, branch_points, greedy_pick, layout, walk
from specnoise.decoding.ngram import NGramPool
from specnoise.decoding.sampling import multi_candidate_accept, warp
from specnoise.decoding.speculative import check_draft_context, draft_tokens, draft_vocab, rewind


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


class Ouroboros(Decoder):
    name = "ouroboros"
    needs_draft = True
    supports_sampling = True

    def __init__(self, cfg, target, draft=None):
        super().__init__(cfg, target, draft)
        self.vocab = draft_vocab(target, draft, self.target, self.draft)
        self.pool = NGramPool(cfg.W)  # G = W (OUR-R asserts it)

    def reset_history(self) -> None:
        self.pool.clear()

    def decide(self, logits: torch.Tensor, paths: list, nodes: list[list[int]]) -> tuple[Pick, list[int]]:
        """The walk's decisions and the argmax of every row (the harvest's predictions), from one read. Sampling
        draws the decision at every branch point the walk may reach at once (sequential multi-candidate rejection
        per point, independent draws), then the walk only looks them up."""
        y = logits.argmax(-1)
        if self.cfg.temperature == 0:
            y = self.to_host(y)
            return greedy_pick(y), y
        points = branch_points(paths, nodes, 0)
        tokens, hits = multi_candidate_accept(warp(logits[list(points)], self.cfg), list(points.values()),
                                              self.generator)
        read = self.to_host(torch.cat([y, tokens, hits.long()]))
        y, tokens, hits = read[:len(y)], read[len(y):len(y) + len(points)], read[len(y) + len(points):]
        decided = {at: (token, bool(hit)) for at, token, hit in zip(points, tokens, hits)}
        return (lambda at, candidates: decided[at]), y

    def decode(self, prompt: list[int], out: Output) -> None:
        cfg, M = self.cfg, self.cfg.phrase_len
        check_draft_context(self.draft, prompt, out)
        if not cfg.reuse_history:
            self.pool.clear()
        noise = torch.Generator().manual_seed(cfg.seed)  # per prompt: speed independent of prompt order
        window = LookaheadWindow(M + 1, cfg.W, self.pool, prompt, noise, self.to_host, cfg.faithful)
        seq = list(prompt)
        while True:
            # 1. draft; drafts past the budget could never be emitted
            room = out.budget - len(out.tokens) - 1
            d, fed = self.make_draft(window, seq, min(cfg.gamma, room))
            # 2. lengthen with the newest phrases for the draft's last token, cut to what could still be emitted
            # (which also keeps their positions inside the context)
            key, m = d[-1] if d else seq[-1], min(M, room - len(d))
            phrases = [g[:m] for g in self.pool.newest(key, cfg.K)] if cfg.lengthening and m > 0 else []
            # 3. one target forward; the first step's is the target's prefill
            P, trunk = self.target.length, seq[self.target.length:] + d
            lay = layout(len(trunk), (), len(phrases), m, self.target.device)
            # logits from seq[-1] (row 0, predicting d[0]) on: d[j] is row 1+j, the phrases hang after d[-1]
            logits = self.target.forward(trunk + [t for g in phrases for t in g], lay.offsets + P, lay.tree,
                                         last=len(d) + 1 + len(phrases) * m)
            # 4. accept along draft-then-phrase paths (phrases share the draft as their prefix)
            d_nodes, phrase_nodes = list(range(1, len(d) + 1)), [[len(d) + i for i in g] for g in lay.ngrams]
            paths = [d + list(g[:M - 1] if cfg.faithful else g) for g in phrases] or [d]
            nodes = [d_nodes + g for g in phrase_nodes] or [d_nodes]
            pick, y = self.decide(logits, paths, nodes)
            block, kept = walk(paths, nodes, 0, pick)
            start = len(seq)
            seq += out.emit(block)
            if out.done:
                return
            self.target.compact(start, [start - 1 + i for i in kept])
            rewind(self.draft, fed, seq)
            if m == M:  # phrases cut short near the budget are no pool material
                self.harvest(key, d, phrases, y, d_nodes, phrase_nodes, len(block) - 1)

    def make_draft(self, window: LookaheadWindow, seq: list[int], want: int) -> tuple[list[int], list[int]]:
        """Up to ``want`` draft tokens after ``seq`` (cut after an EOS), and all the tokens the draft model has seen."""
        if want <= 0:
            return [], list(seq)
        if not self.cfg.phrase_drafting:  # ablation: plain token-by-token drafting
            d = self.to_host(draft_tokens(self.draft, seq, want, self.vocab)[0])
            return d, seq + d
        d: list[int] = []
        while len(d) < want and not self.eos_ids.intersection(d):
            d += window.step(self.draft, seq + d, self.vocab)
        fed = seq + d
        for i, t in enumerate(d):
            if t in self.eos_ids:
                d = d[:i + 1]
                break
        return d[:want], fed

    def harvest(self, key: int, d: list[int], phrases: list, y: list[int], d_nodes: list[int],
                phrase_nodes: list[list[int]], accepted: int) -> None:
        """Feed the pool from verification (greedy predictions, also under sampling: the pool only guesses).

        y: argmax per logits row (row 0 predicts d[0]); d_nodes / phrase_nodes: their rows; accepted: tokens kept."""
        M, how = self.cfg.phrase_len, self.cfg.harvest
        phrase_preds = [[y[i] for i in nodes] for nodes in phrase_nodes]
        if accepted < len(d):  # draft rejected: its tail still shows what the target continues with
            if how == "paper":
                harvest_discarded(self.pool, d[accepted:], [y[i] for i in d_nodes[accepted:]], M)
            elif how == "specbench":
                harvest_specbench(self.pool, y[accepted:len(d) + 1], phrase_preds, M)
        elif how == "paper":  # draft accepted: each tried phrase becomes what the target made of it
            u0 = y[len(d)]
            for g, preds in zip(phrases, phrase_preds):
                self.pool.replace(key, g, [u0] + preds[:M - 1])
