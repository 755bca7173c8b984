"""The verifier: one target forward over a drafter's proposal, the accepted path, the KV commit and the bonus token.

A proposal (proposal.py) is a tree of candidate tokens hanging after the root, the newest accepted token (a chain is a
tree), and its ``Shape``: who sees whom in the block, where each row sits, and which rows form the tree.

Acceptance is one rule for every decoder. At each tree input the verifier draws the target's next token: the argmax
under greedy decoding; under sampling, a draw from the warped target distribution by inverse CDF with the uniform
``u[t]`` of the output position t that the input predicts (per-position randomness, seeded per prompt). A node is
accepted when its token is the draw at its parent and its parent is accepted; the deepest accepted input wins (on
a tie the earliest path in the drafter's order) and the step emits the path's tokens plus the draw after it, the
bonus. The accepted tokens are then exactly AR's draws with the same uniforms, whatever was proposed: a
deterministic proposal changes speed, never the output or its distribution, and with one seed every decoder
samples AR's very tokens. A *sampled* draft chain (speculative decoding with draft distributions q) is verified by
rejection sampling instead: each draft kept with probability min(1, p/q), the first rejected one replaced by a draw
from norm(max(0, p - q)); that keeps the distribution, not the tokens. Deterministic nodes may hang after a sampled
chain (Ouroboros' phrases with sampled drafts): past the chain they are matched as above.

A step stays on the device from the logits to one host read (accepted count, block, path and whatever the drafter's
``after`` hook asks for); on an engine that replays CUDA graphs the whole device function is recorded once per shape.
In a batch (batch.py) the rows' greedy steps are one device function: their proposals padded to the step's largest
shape, judged by the same ops a row alone runs on a batch of one (``judge_rows``).
"""

from __future__ import annotations

import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch
from torch.nn.utils.rnn import pad_sequence

from specnoise.decoding.kv import Forward, Read, as_ids, drive, upload
from specnoise.decoding.proposal import Proposal, Rules, Shape, Step, rules_of
from specnoise.decoding.sampling import draw, greedy, residual, warp
from specnoise.decoding.trees import with_prefix


@dataclass
class Verdict:
    """One step's outcome on the host (and the device tensors a drafter may feed on)."""

    tokens: list[int]  # accepted drafts + the bonus token
    path: list[int]  # tree inputs root -> accepted node, -1 padded to span
    extra: list  # what ``after`` asked to read
    kept: Any  # what ``after`` kept on the device
    y: torch.Tensor  # device argmax per block row
    bonus: torch.Tensor  # [1] the bonus token: the next root, without KV yet
    root: int  # the root's slot
    shape: Shape
    device_path: torch.Tensor
    done: bool = False  # the output is complete: nothing more is decoded (set by the decoder)

    @property
    def accepted(self) -> int:
        return len(self.tokens) - 1  # the bonus token is the target's own


def prompt_seed(seed: int, prompt: list[int]) -> int:
    """A generator seed per (seed, prompt): a prompt draws the same numbers in AR and every decoder, whatever order
    the prompts come in, and different prompts draw different ones."""
    return (seed * 0x9E3779B1 + zlib.crc32(b",".join(b"%d" % t for t in prompt))) % (1 << 62)


def prompt_generator(seed: int, prompt: list[int]) -> torch.Generator:
    return torch.Generator().manual_seed(prompt_seed(seed, prompt))


# step functions kept per verifier (each a recorded CUDA graph on a graph engine): a drafter with a few fixed shapes
# keeps all of its own, one whose shapes vary almost every step (REST's tries) stops recording at this many and runs
# its rarer shapes eagerly, instead of holding a graph (and its memory) per step
MAX_FUNCTIONS = 64
# a shape is kept (recorded) at its second step, its first runs eagerly: recording costs several eager runs (two
# warm-up calls and the capture), which a shape seen once (most of REST's tries, a decoder.auto pick in flux) never
# earns back; measured on an H100, recording every new shape made REST 3x slower per step than AR
RECORD_AT = 2
SEEN_MAX = 256  # shapes counted towards RECORD_AT at most (then the count starts over): a shape holds device tensors


class Verifier:
    """Verifies proposals on ``engine``. ``sampling`` (temperature > 0): draws by ``warp(logits, sampling)``;
    ``vocab``: only the first ``vocab`` logits count (a draft model verifying its own guesses in the target's
    vocabulary); ``read``: the decoder's one way to read the device (counted)."""

    def __init__(self, engine, read: Callable[[torch.Tensor], list], sampling=None, vocab: int | None = None):
        self.engine, self.read, self.sampling, self.vocab = engine, read, sampling, vocab
        self.functions: dict[tuple, Callable] = {}
        self.seen: dict[tuple, int] = {}  # steps of each shape not kept yet

    def begin(self, prompt: list[int], seed: int) -> None:
        """A generation starts: the uniforms of its output positions (token draws ``u``, rejection tests ``v``)."""
        if self.sampling is not None:
            self.generator = prompt_generator(seed, prompt)
            self.u = self.v = torch.empty(0, dtype=torch.float64)

    def uniforms(self, base: int, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``u[base:base + n]`` and ``v[base:base + n]`` on the device. The tables grow in a fixed order, so position t
        gets the same numbers however the steps cut the output."""
        while self.u.numel() < base + n:
            grow = max(256, base + n - self.u.numel())
            pair = torch.rand(2, grow, generator=self.generator, dtype=torch.float64)
            self.u, self.v = torch.cat([self.u, pair[0]]), torch.cat([self.v, pair[1]])
        return (upload(self.u[base:base + n], self.engine.device), upload(self.v[base:base + n], self.engine.device))

    # ------------------------------------------------------------------------------------------ one step
    def step(self, pending: torch.Tensor | list[int], proposal: Proposal, base: int) -> Verdict:
        """Verify ``proposal`` after ``pending`` (tokens without KV yet, the root last) in one forward; ``base``:
        tokens emitted before this step. The KV is committed by ``commit`` once the verdict is taken."""
        return drive(self.steps(pending, proposal, base), self.read)

    def steps(self, pending: torch.Tensor | list[int], proposal: Proposal, base: int):
        """``step`` as a generator of its two requests, the forward and the read (kv.py): alone ``drive`` serves them
        at once; in a batch (batch.py) every row's forward is one batched forward and every row's read one read."""
        engine, shape = self.engine, proposal.shape
        pending, tokens = as_ids(pending, engine.device), as_ids(proposal.tokens, engine.device)
        P, m = engine.length, pending.numel()
        root = P + m - 1
        block = torch.cat([pending, tokens]) if tokens.numel() else pending
        if shape.causal:
            logits = yield Forward(engine, block, last=shape.last)
        else:
            positions = (shape.offsets + root).clamp_(max=engine.max_length - 1)  # guesses may reach past the context
            if m > 1:
                positions = torch.cat([torch.arange(P, root, device=engine.device), positions])
            # (the pending tokens, the prompt at a first step, are a causal run: an engine may feed them on their own)
            logits = yield Forward(engine, block, positions, with_prefix(shape.mask, m - 1), shape.last, prefix=m)
        if self.vocab is not None:
            logits = logits[:, :self.vocab]
        nodes = tokens[:shape.nodes] if shape.prefix else tokens.index_select(0, shape.at[1:] - 1)
        rejection = proposal.q is not None and self.sampling is not None
        args = (logits, nodes)
        if self.sampling is not None:
            args += self.uniforms(base, shape.span)
        if rejection:
            args += (proposal.q,)
        read, kept, y, bonus, path = yield Check(self, shape, proposal.after, rejection, args)
        values = yield Read(read)
        a, span = values[0], path.shape[-1]  # the shape's span, or a batch's largest (-1 padded)
        return Verdict(tokens=values[1:a + 2], path=values[1 + span:1 + 2 * span], extra=values[1 + 2 * span:],
                       kept=kept, y=y, bonus=bonus, root=root, shape=shape, device_path=path)

    def commit(self, v: Verdict) -> None:
        """Keep the accepted path's KV next to the cache (a chain prefix is there already) and forget the rest. The
        bonus token has no KV yet: it is the next step's root."""
        a, shape = v.accepted, v.shape
        src = v.device_path[:a + 1]
        if not shape.prefix:  # tree inputs sit at other block rows
            src = shape.at.index_select(0, src)
        self.engine.compact(v.root, [v.root + shape.at_host[i] for i in v.path[:a + 1]], v.root + src)

    # ------------------------------------------------------------------------------------------ on the device
    def function(self, shape: Shape, after, rejection: bool) -> Callable:
        """The step's device function for this shape and hook: eager at the shape's first step, then built (and on a
        graph engine recorded) once and kept (``RECORD_AT``); past ``MAX_FUNCTIONS`` kept shapes a new one stays
        eager."""
        key = (shape, after, rejection)
        kept = self.functions.get(key)
        if kept is not None:
            return kept

        def fn(logits, nodes, u=None, v=None, q=None):
            return self.verify(shape, after, logits, nodes, u, v, q)
        if len(self.functions) >= MAX_FUNCTIONS:
            return fn
        seen = self.seen.pop(key, 0) + 1
        if seen < RECORD_AT:
            if len(self.seen) >= SEEN_MAX:
                self.seen.clear()
            self.seen[key] = seen
            return fn
        fn = self.functions[key] = self.engine.graph(fn)
        return fn

    def verify(self, shape: Shape, after, logits, nodes, u, v, q):
        """Returns (what the host reads: [a, block padded to span, path, after's read], after's kept tensors, the
        argmax per row, the bonus token, the path)."""
        y = greedy(logits)
        tree = logits[:shape.nodes + 1] if shape.prefix else logits.index_select(0, shape.at)
        if q is not None:
            return self.reject(shape, after, logits, y, tree, nodes, u, v, q)
        # a chain, or the root alone (a tree drafter's AR step under decoder.auto, a masked block of extra rows): the
        # chain's few ops; the tree's path search costs ~5 more kinds of op, each ~10-50 us right after a forward on
        # the CPU, for the same verdict
        chain = shape.causal or not shape.nodes
        if self.sampling is None:
            picks = y[:shape.nodes + 1] if shape.prefix else y.index_select(0, shape.at)
        elif chain:  # input i predicts output position base + depth[i]: its uniform
            picks = self.draws(tree, u, shape.depth)
        if chain:  # the accepted drafts are the matching prefix
            right = nodes == picks[:-1]
            a = right.long().cumprod(0).sum().view(1)
            path, best, block = shape.path[0], a, picks
        else:
            if self.sampling is None:
                right = nodes == picks.index_select(0, shape.parent)
            else:  # the draws a node is tested against: its parent's; the leaves' are not needed yet
                inner = self.draws(tree, u, shape.depth, shape.inner)
                right = nodes == inner.index_select(0, shape.slot)
            # the whole path root -> input i is right; two kinds of op, not four: each costs ~10-50 us on the CPU
            # right after a forward (experiments/hardware-aware/cold_ops.py)
            ok = (shape.sees <= right).all(-1)
            # the deepest accepted input, on the earliest path (index_select, not [best]: a 0-dim index reads)
            best = torch.where(ok, shape.rank, -1).argmax().view(1)
            path, a = shape.path.index_select(0, best)[0], shape.depth.index_select(0, best)
            if self.sampling is not None:  # every input's draw: the inner ones, then the best one's (the bonus)
                picks = torch.zeros(shape.nodes + 1, dtype=torch.long, device=tree.device).index_copy(
                    0, shape.inner, inner).index_copy(0, best, self.draws(tree, u, shape.depth, best))
            block = picks.index_select(0, path.clamp(min=0))  # [:a + 1]: the accepted nodes (= draws at their parents)
        return self.finish(after, block, logits, y, right, best, a, path)

    def draws(self, tree, u, depth, inputs=None):
        """The target's draws at tree ``inputs`` (all when None): each warped alone, with its position's uniform."""
        if inputs is not None:
            tree, depth = tree.index_select(0, inputs), depth.index_select(0, inputs)
        return draw(warp(tree, self.sampling), u.index_select(0, depth))

    def reject(self, shape, after, logits, y, tree, nodes, u, v, q):
        """Rejection sampling of a sampled chain: draft j kept with probability min(1, p/q) (u < p/q without dividing),
        the first rejected one replaced by a draw of the residual, and after a full acceptance by a draw of p.

        The chain is the first ``len(q)`` nodes; more nodes may hang after its last one (Ouroboros' pool phrases,
        deterministic guesses): once the chain is kept whole they are matched against the draws at their parents, as
        any deterministic proposal, so the tokens after the chain are the target's draws with their own uniforms."""
        n = q.shape[0]
        p = warp(tree, self.sampling)
        at = nodes[:n].view(-1, 1)
        ok = v[:n] * q.gather(-1, at)[:, 0] < p[:n].gather(-1, at)[:, 0]
        if n < shape.nodes:
            return self.reject_then_match(shape, after, logits, y, p, nodes, u, q, ok)
        a = ok.long().cumprod(0).sum().view(1)
        rest = torch.cat([residual(p[:n], q), p[n:n + 1]]).index_select(0, a)
        token = draw(rest, u.index_select(0, a))
        block = torch.cat([nodes, token]).scatter(0, a, token)  # [:a + 1]: the kept drafts, then the new token
        right = ok  # what the drafter may learn: which drafts passed their test
        return self.finish(after, block, logits, y, right, a, a, shape.path[0])

    def reject_then_match(self, shape, after, logits, y, p, nodes, u, q, ok):
        """``reject`` of a chain of ``len(q)`` sampled drafts with deterministic nodes after its last one."""
        n = q.shape[0]
        picks = draw(p, u.index_select(0, shape.depth))  # the target's draw at every input (used past the chain)
        right = torch.cat([ok, nodes[n:] == picks.index_select(0, shape.parent[n:])])
        accepted = (shape.sees <= right).all(-1)
        best = torch.where(accepted, shape.rank, -1).argmax().view(1)
        path, a = shape.path.index_select(0, best)[0], shape.depth.index_select(0, best)
        # inside the chain (a < n) the rejected draft's replacement, past it the draw at the accepted input
        fix = draw(residual(p[:n], q), u[:n]).index_select(0, a.clamp(max=n - 1))
        bonus = torch.where(a < n, fix, picks.index_select(0, best))
        block = torch.cat([nodes.index_select(0, path[1:].clamp(min=1) - 1), bonus]).scatter(0, a, bonus)
        return self.finish(after, block, logits, y, right, best, a, path)

    @staticmethod
    def finish(after, block, logits, y, right, best, a, path):
        """The reply of one row's step (``best``, ``a``: [1]; the rest the row's own). Its hook sees the step as a
        batch of one (hooks serve ``judge_rows`` too); alone, the batch's functions would cost 15-65 us more per step
        on the CPU in views and gathers (``finish_rows``), so one row keeps its own ops, which
        ``test_rows_judged_together_equal_each_judged_alone`` holds to the batch's."""
        extra = kept = None
        if after is not None:
            extra, kept = after(Step(logits[None], y[None], right[None], best, a, path[None]))
            kept = None if kept is None else kept[0]
        parts = [a, block, path] + ([extra.view(-1).long()] if extra is not None else [])
        return torch.cat(parts), kept, y, block.index_select(0, a), path


# ------------------------------------------------------------------------------------------ B rows at once
# A batch's greedy rows judged together (``judge_rows``): their shapes padded to the largest of the step, every
# function below takes B rows on a leading dimension. The rule is ``Verifier.verify``'s (a row alone keeps its own
# unbatched ops, ``Verifier.finish``; test_rows_judged_together_equal_each_judged_alone holds the two equal).


def picks_at(rules: Rules, y: torch.Tensor) -> torch.Tensor:
    """The target's token at each tree input, [B, N + 1], from its argmax at every block row ``y`` [B, 1 + Q]."""
    return y[:, :rules.at.shape[1]] if rules.prefix else y.gather(1, rules.at.expand(len(y), -1))


def accept(rules: Rules, picks: torch.Tensor, nodes: torch.Tensor):
    """B rows' verdicts from the target's token at each tree input, ``picks`` [B, N + 1], and the proposed ``nodes``
    [B, N]. Returns (right [B, N], best [B], a [B], path [B, span], block [B, span])."""
    if rules.chain:  # chains and roots alone: the matching prefix, in the chain's few ops (as ``Verifier.verify``)
        right = nodes == picks[:, :-1]
        a = right.long().cumprod(1).sum(1)
        return right, a, a, rules.path[:, 0].expand(len(a), -1), picks
    right = nodes == picks.gather(1, rules.parent.expand(len(picks), -1))
    best, a, path = best_path(rules, right)
    return right, best, a, path, picks.gather(1, path.clamp(min=0))  # [:, :a + 1]: the accepted nodes


def best_path(rules: Rules, right: torch.Tensor):
    """The deepest input whose whole path from the root is right (``right`` [B, N]: node i's token equals the draw at
    its parent), on the earliest path: (best [B], its depth a [B], its path [B, span])."""
    B, span = len(right), rules.path.shape[-1]
    # two kinds of op, not four: each costs ~10-50 us on the CPU right after a forward (hardware-aware/cold_ops.py)
    ok = (rules.sees <= right[:, None]).all(-1)
    best = torch.where(ok, rules.rank, -1).argmax(-1)
    a = rules.depth.expand(B, -1).gather(1, best[:, None])[:, 0]
    return best, a, rules.path.expand(B, -1, -1).gather(1, best[:, None, None].expand(-1, 1, span))[:, 0]


def finish_rows(hooks: list[tuple], logits, y, right, best, a, path, block) -> list[tuple]:
    """Each row's (what the host reads, its hook's kept, y, the bonus token, the path) from B rows' verdicts, padded
    to the largest shape: a row reads [a, block, path] at the padded span (the reply's path says which) and its hook's
    read after them. ``hooks``: (hook, shape, rows) in row order, the rows that share a hook and a shape consecutive:
    one call of the hook on its rows' slice, cut to their shape (``Step``)."""
    head = torch.cat([a[:, None], block, path], 1)
    reads = list(head.unbind(0))
    kept: list = [None] * len(a)
    start = 0
    for after, shape, n in hooks:
        rows = slice(start, start + n)
        start += n
        if after is None:
            continue
        extra, keep = after(Step(logits[rows, :shape.last], y[rows, :shape.last], right[rows, :shape.nodes], best[rows],
                                 a[rows], path[rows, :shape.span]))
        if extra is not None:
            reads[rows] = torch.cat([head[rows], extra.flatten(1).long()], 1).unbind(0)
        if keep is not None:
            kept[rows] = keep.unbind(0)
    return list(zip(reads, kept, y.unbind(0), block.gather(1, a[:, None]).unbind(0), path.unbind(0)))


class Check(NamedTuple):
    """A request that ``Verifier.steps`` yields once the forward's logits are in: run the step's device function on
    ``args`` (logits, the proposed nodes[, uniforms][, q]); the reply is (read, kept, y, bonus, path). Alone, ``run``
    serves it (``drive``); a batch judges its greedy rows together (``judge_rows``)."""

    verifier: Verifier
    shape: Shape
    after: Callable | None
    rejection: bool
    args: tuple

    def run(self):
        return self.verifier.function(self.shape, self.after, self.rejection)(*self.args)

    @property
    def together(self) -> tuple | None:
        """What rows judged together share (None: this row is judged alone): greedy rows whose logits stack (a draft
        model's verifier and the target's rows are judged apart), verified by the rule ``judge_rows`` runs (a
        subclass with its own ``verify``, a lossy one under test, judges its rows alone)."""
        if self.verifier.sampling is not None or type(self.verifier).verify is not Verifier.verify:
            return None
        logits = self.args[0]
        return logits.shape[-1], logits.dtype, logits.device


# the fewest greedy rows judged together on the CPU. Right after a forward every kind of op runs cold there (~10-50
# us: hardware-aware/cold_ops.py) and the batch's function runs more kinds than a row's own (the padding, the tables'
# gathers), so it pays from ~8 rows on: the verifications of a HumanEval batch step took 0.36 ms row by row against
# 0.46 together at B = 4, 1.00 against 0.81 at B = 16 (batch-scaling/verify_rows.py). A GPU's ops are launches, as
# many per row as the function has: there two rows are judged together
TOGETHER_CPU = 8


def judge_rows(checks: list[Check]) -> list[tuple]:
    """Each check's reply, a batch's greedy rows judged together: their logits and proposals padded to the step's
    largest shape, one argmax, one verdict and one read tensor for all of them instead of a dozen small ops per row
    (a hook runs once per group of rows that share it). A batch's rows run eagerly (``batch.RowEngine.graphs``);
    sampled rows are judged one by one."""
    groups: dict[tuple | None, list[int]] = {}
    for i, check in enumerate(checks):
        groups.setdefault(check.together, []).append(i)
    out: list = [None] * len(checks)
    for key, rows in groups.items():
        if key is None or len(rows) < (TOGETHER_CPU if key[2].type == "cpu" else 2):
            for i in rows:
                out[i] = checks[i].run()
            continue
        hooks: dict = {}  # the rows that share a hook and a shape, consecutive: each hook's rows are one slice
        for i in rows:
            hooks.setdefault((checks[i].after, checks[i].shape), []).append(i)
        order = [i for same in hooks.values() for i in same]
        # one copy of the rows' logits (on a GPU with a large vocabulary the only cost that grows with the batch)
        logits = pad_sequence([checks[i].args[0] for i in order], batch_first=True)
        y = greedy(logits.flatten(0, 1)).view(logits.shape[:2])
        nodes = pad_sequence([checks[i].args[1] for i in order], batch_first=True, padding_value=-1)
        rules = rules_of([checks[i].shape for i in order])
        verdicts = accept(rules, picks_at(rules, y), nodes)
        replies = finish_rows([(after, shape, len(same)) for (after, shape), same in hooks.items()], logits, y,
                              *verdicts)
        for i, reply in zip(order, replies):
            out[i] = reply
    return out
