"""Ouroboros (docs/algorithms.md §9): speculative decoding whose draft model drafts in phrases, and whose drafts are
lengthened by phrases the target has already produced.

One target step:
  1. phrase drafting: Lookahead on the DRAFT model (its window and KV persist within a prompt) until gamma
     tokens are drafted;
  2. lengthening: the K newest pool phrases keyed by the draft's last token hang after the draft;
  3. one target forward over [uncached context] + draft + phrases with the phrase tree mask;
  4. acceptance along draft-then-phrases by the verifier, KV compaction, and harvest: the target's predictions
     over discarded drafts become new phrases, tried phrases their verified versions.
Under sampling the drafts are by default the draft model's greedy guesses, so acceptance is the verifier's
per-position draw. With ``sampled_drafts`` they are sampled from the draft model (its lookahead steps draw instead
of taking the argmax; their distributions q ride along) and the verifier keeps them by rejection sampling, as for
speculative decoding; the pool phrases after them stay deterministic guesses, matched against the target's draws.
Both keep the target distribution exactly. The phrase pool lives on the decoder and, with ``reuse_history``, across
prompts. Correctness depends only on the target's verification: every draft-side choice changes speed, never the
output's distribution (under greedy decoding, never its tokens).
"""

from __future__ import annotations

import copy
from functools import lru_cache, partial

import torch

from specnoise.decoding.cost import TREE
from specnoise.decoding.drafter import Drafter
from specnoise.decoding.kv import Read
from specnoise.decoding.lookahead import Window
from specnoise.decoding.ngram import NGramPool
from specnoise.decoding.proposal import Proposal, Shape, read_argmax, tree_shape
from specnoise.decoding.sampling import fit_vocab, warp
from specnoise.decoding.speculative import catch_up_cost, check_draft_context, draft_tokens, draft_vocab, rewind
from specnoise.decoding.verifier import Verifier, prompt_generator


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
    return tree_shape(parents, paths or None, mask=mask, offsets=torch.tensor(offsets), at=rows, masked=True,
                      device=device)


@lru_cache(maxsize=64)
def candidates(want: int, K: int, M: int) -> tuple[list[int], list[int]]:
    """decoder.auto's view of a step's candidates, ``want`` drafts and then K phrases of M tokens: each node's parent
    (the drafts a chain, each phrase a chain after the last draft) and the sizes it may cut to (a prefix of the drafts,
    or all of them and whole phrases). One pair per shape, built once and never changed (the controller only reads
    them), not at every step."""
    parents = [*range(-1, want - 1), *(want - 1 if j % M == 0 else want + j - 1 for j in range(K * M))]
    return parents, [*range(want + 1), *(want + M * j for j in range(1, K + 1))]


class KeepDraws:
    """An ``after`` hook of the draft model's sampled lookahead step: the wrapped hook's read, and the distributions
    q each emitted token was drawn from (the warped draft logits at the inputs along the accepted path) kept on the
    device for the target's rejection test."""

    def __init__(self, inner, at: torch.Tensor, cfg, vocab: int):
        self.inner, self.at, self.cfg, self.vocab = inner, at, cfg, vocab

    def __call__(self, step):
        read, _ = self.inner(step)
        at = self.at[step.path.clamp(min=0)]  # block row of each path input (padding: the root's), [B, span]
        return read, warp(fit_vocab(step.logits_at(at), self.vocab), self.cfg)


class Ouroboros(Drafter):
    name = "ouroboros"
    needs_draft = True
    kept = ("pool", "drafted")  # the phrase pool and decoder.auto's draft cost, across prompts (``Decoder.history``)

    @classmethod
    def draws_drafts(cls, cfg) -> bool:
        return cfg.sampled_drafts  # decoder=ouroboros_sampled; else its drafts are the draft model's greedy guesses

    def setup(self):
        self.vocab = draft_vocab(self.decoder.target_model, self.decoder.draft_model, self.target, self.draft)
        self.pool = NGramPool(self.cfg.W)  # G = W (OUR-R asserts it)
        self.sampled = self.cfg.sampled_drafts and self.cfg.temperature > 0
        self.hooks: dict = {}  # one KeepDraws per window shape: the verifier keeps one device function per hook
        self.drafting = self.draft_verifier()
        self.drafted = [0, 0, 0]  # draft lookahead steps, tokens they gave, rows they fed (decoder.auto's draft cost)

    def draft_verifier(self) -> Verifier:
        """The draft's lookahead steps, in the target's vocabulary, on the decoder's draft engine: greedy, or with
        sampled drafts drawn from the draft's warped distributions with its own uniforms (never the target's). One
        per decoder and engine, so its per-shape device functions (CUDA graphs on a graph engine) are built once, not
        inside each prompt's timed region."""
        return Verifier(self.draft, self.read, sampling=self.cfg if self.sampled else None, vocab=self.vocab)

    def reset_history(self):
        self.pool.clear()

    def fork(self, decoder):
        """A row's own phrase pool (from a copy of this one): rows share no pool, so a row's drafts, and its forward
        counts, depend on its own prompts only, not on which prompts share its batch or the order rows run in."""
        clone = super().fork(decoder)
        clone.pool = copy.deepcopy(self.pool)
        clone.drafted = list(self.drafted)  # decoder.auto's draft cost: the row's own lookahead steps
        return clone

    def begin(self, prompt, budget, seed):
        super().begin(prompt, budget, seed)
        check_draft_context(self.draft, prompt, budget)
        if not self.cfg.reuse_history:
            self.pool.clear()
        self.window = Window(self.cfg.phrase_len + 1, self.cfg.W, self.pool, prompt, self.noise, self.cfg.faithful)
        if self.drafting.engine is not self.draft:  # a batch row's engine, or back from one
            self.drafting = self.draft_verifier()
        if self.sampled:
            self.drafting.begin(prompt, seed + 1)
            self.generator = prompt_generator(seed + 1, prompt)  # the token-by-token ablation's draws
            self.drawn = 0  # uniforms the draft steps have used: each step takes fresh ones

    def propose_steps(self, room):
        cfg, M = self.cfg, self.cfg.phrase_len
        # decoder.auto ranks the drafts, then whole phrases, and may cut both (0: an AR step, no draft forward)
        want, K = min(cfg.gamma, room), cfg.K if cfg.lengthening else 0
        parents, cuts = candidates(want, K, M)
        k = self.cut(want + K * M, cuts=cuts, parents=parents)
        # 1. draft; drafts past the budget could never be emitted
        self.d, self.fed, q = yield from self.make_draft(min(want, k))
        # 2. lengthen with the newest phrases for the draft's last token, cut to what could still be emitted
        # (which also keeps their positions inside the context)
        self.key, self.m = self.d[-1] if self.d else self.seq[-1], min(M, room - len(self.d))
        K = (k - want) // M if k > want else 0
        self.phrases = [g[:self.m] for g in self.pool.newest(self.key, K)] if K and self.m > 0 else []
        # 3. one target forward over drafts and phrases (the first step's is the target's prefill); nothing to verify
        # (decoder.auto's AR step, or the budget's last token): a plain one-token forward, as AR's (fed with a 4D mask
        # it cost 6-12% more on Spec-Bench's 1,200-token prompts on the CPU)
        # (and without the target's argmax at every row read back: it feeds the pool, which an AR step never does)
        if not (self.d or self.phrases):
            return self.chain([])
        shape = phrase_shape(len(self.d), len(self.phrases), self.m, cfg.faithful, self.target.device)
        q = q.to(self.target.device) if q is not None and self.d else None  # sampled drafts: rejection sampling
        return Proposal(self.d + [t for g in self.phrases for t in g], shape, q=q, after=read_argmax)

    def draft_cost(self, stream, k):
        """k drafted tokens take k / (tokens per lookahead step) draft forwards of the mean block (counted so far), and
        at least one: the draft runs whole lookahead steps, so a first token costs a whole step whatever the step would
        give. Priced at k / per-step alone, decoder.auto drafted 1-2 tokens a step at a fraction of a step's price and
        ran 0.82-0.85x AR on Spec-Bench-10's QA and math questions (MAT 1.5-1.7), where speculative decoding gained."""
        per_step, block = self.draft_steps()
        steps = max(1.0, min(k, self.cfg.gamma) / per_step) if k > 0 else 0.0
        return steps * self.draft_price(block, TREE, len(self.seq))

    def catch_up(self, stream):
        """The first lookahead step is fed every token the draft has not seen beside its block: beyond the block,
        that."""
        return catch_up_cost(self.draft_price, len(self.seq) - self.draft.length, self.draft_steps()[1],
                             TREE, self.draft.length)

    def draft_steps(self) -> tuple[float, float]:
        """(tokens a lookahead step of the draft gives, rows it feeds): the means so far."""
        steps, tokens, rows = self.drafted
        return (tokens / steps, rows / steps) if steps else (1.0, 1 + self.cfg.W * self.cfg.phrase_len)

    def observe(self, v):
        before = len(self.seq)  # the draft was fed seq then (and its drafts after it)
        super().observe(v)
        if v.done:
            return
        rewind(self.draft, self.fed, self.seq, before)
        # phrases cut short near the budget are no pool material; an AR step (decoder.auto) has nothing to harvest
        if self.m == self.cfg.phrase_len and (self.d or self.phrases):
            self.harvest(v.extra, v.accepted)

    def make_draft(self, want: int):
        """Up to ``want`` draft tokens after ``seq`` (cut after an EOS), all the tokens the draft model has seen, and
        with sampled drafts the distributions they were drawn from ([len(d), vocab] on the draft's device); a
        generator of the draft's forwards and reads (kv.py)."""
        seq = self.seq
        if want <= 0:
            return [], list(seq), None
        if not self.cfg.phrase_drafting:  # ablation: plain token-by-token drafting
            probs = partial(warp, cfg=self.cfg) if self.sampled else None
            tokens, q = yield from draft_tokens(self.draft, seq, want, self.vocab, probs,
                                                self.generator if self.sampled else None)
            d = yield Read(tokens)
            return d, seq + d, q
        d: list[int] = []
        qs: list[torch.Tensor] = []
        while len(d) < want and not self.decoder.eos_ids.intersection(d):
            tokens, q = yield from self.draft_step(seq + d)
            d += tokens
            qs.append(q)
        fed = seq + d
        for i, t in enumerate(d):
            if t in self.decoder.eos_ids:
                d = d[:i + 1]
                break
        d = d[:want]
        return d, fed, torch.cat(qs)[:len(d)] if self.sampled else None

    def draft_step(self, tokens: list[int]):
        """One lookahead step of the draft model after ``tokens`` (the uncached ones fed): its accepted tokens (and,
        sampled, their distributions); a generator of the step's forward and read."""
        proposal = self.window.propose(tokens[-1], self.draft.device)
        base = 0
        if self.sampled:
            shape = proposal.shape
            if shape not in self.hooks:
                self.hooks[shape] = KeepDraws(proposal.after, shape.at, self.cfg, self.vocab)
            proposal.after, base = self.hooks[shape], self.drawn
            self.drawn += shape.span  # fresh uniforms every step: a redrafted position never reuses a draw
        v = yield from self.drafting.steps(tokens[self.draft.length:], proposal, base=base)
        self.drafted[0] += 1
        self.drafted[1] += len(v.tokens)
        self.drafted[2] += v.shape.last
        self.drafting.commit(v)
        self.window.advance(tokens[-1], v.extra)
        return v.tokens, v.kept[:len(v.tokens)] if self.sampled else None

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
