"""TR-Jacobi (MSN §3.3): verify a token tree of Jacobi candidates plus a retrieval chain in one forward.

Candidates live in a matrix ``C`` (one row per depth): columns 0..topk-1 hold the top-k predictions the
previous step made at the first rejected slots of its best path (Jacobi refresh, now with alternatives),
the last column the continuation of an earlier occurrence of the newest n-gram. Empty cells get ahead
noise. The tree template (trees.py) picks which cells are verified; the path with the most accepted
tokens wins, the first one on ties, and its KV is compacted next to the cache. A step stays on the device from
its candidates to one host read (``Tables.verify``; on a CUDA-graph engine recorded as one graph): the host keeps
only the accepted text, for retrieval and noise.

Unlike MSN's reference code, paths are compared only within their true length (its padding lets the root
match itself: wrong tokens), and the output is cut at the first EOS and at the budget (``Output``).
``faithful=True`` reproduces its speed-only quirks: padded paths give the root's top-k to deeper rows,
a score-0 retrieval still returns tokens, and the first step has no retrieval.
"""

from __future__ import annotations

import dataclasses
import logging

import torch
import torch.nn.functional as F

from specnoise.decoding.base import Decoder, Output
from specnoise.decoding.kv import Graphed, upload
from specnoise.decoding.ngram import ahead_noise
from specnoise.decoding.trees import AUTO_TEMPLATE, NodeStats, Tree, best_size, build_tree, sub_tree, with_prefix

log = logging.getLogger("specnoise")


def retrieve(seq: list[int], n: int, length: int, faithful: bool = False) -> list[int]:
    """Up to ``length`` tokens after the earliest n-gram window sharing the longest suffix with ``seq[-n:]``.

    Windows end at least n tokens before the end; score = common suffix length. Score 0 returns nothing
    (MSN's code returns the tokens after window 0; ``faithful`` keeps that).
    """
    stop = len(seq) - n  # windows seq[s:s+n] for s <= len(seq) - 2n, so their last token lies before `stop`
    if stop < n:
        return []
    query, best, start = seq[-n:], 0, 0
    end = n - 1
    while best < n:
        try:
            end = seq.index(query[-1], end, stop)  # every window scoring > 0 ends on the query's last token
        except ValueError:
            break
        score = 1
        while score < n and seq[end - score] == query[-1 - score]:
            score += 1
        if score > best:
            best, start = score, end - n + 1
        end += 1
    if best == 0 and not faithful:
        return []
    return seq[start + n:start + n + length]


def cut(tree: Tree, depth: int) -> Tree:
    """``tree`` without its nodes deeper than ``depth``. Near the budget they could never be emitted (a step emits
    the accepted nodes plus one token), and their positions could run past a learned-position model's context.
    Ancestors are shallower than their descendants, so what is left is still a tree over the same matrix C."""
    keep = [0] + [i for i, node in enumerate(tree.nodes, start=1) if len(node) <= depth]
    new = {old: i for i, old in enumerate(keep)}
    idx = torch.tensor(keep, device=tree.mask.device)
    paths = dict.fromkeys(tuple(new[i] for i in path if i in new) for path in tree.paths)  # cut paths may repeat
    cell = [tree.cell[i - 1] for i in keep[1:]]
    return dataclasses.replace(tree, nodes=[tree.nodes[i - 1] for i in keep[1:]], depth=tree.depth[idx],
                               mask=tree.mask[idx][:, idx], parent=[new[tree.parent[i]] for i in keep],
                               paths=[list(p) for p in paths], cell=cell, used=sorted(set(cell)))


class Tables:
    """A tree's lookup tables on the device: with them a step stays there from the forward to its one host read.

    rank: among the accepted inputs the step keeps the deepest, and on a tie the one on the earliest path (paths in
    template order, the retrieval chain first), in one argmax; path: the first path through each input, padded so
    that the rows after any accepted depth can be gathered without bounds checks (-1 = none; ``faithful``: the root
    up to full depth, as MSN's code pads)."""

    def __init__(self, tree: Tree, faithful: bool, k: int, graphed: bool):
        first = [next(p for p, path in enumerate(tree.paths) if i in path) for i in range(len(tree.parent))]
        depth = [0] + [len(node) for node in tree.nodes]
        rows = tree.rows
        padded = []
        for i in range(len(first)):
            path = tree.paths[first[i]]
            filler = [0] * (rows + 1 - len(path)) if faithful else []
            padded.append((path + filler + [-1] * (2 * rows + 1))[:2 * rows + 1])
        table = lambda values: torch.tensor(values, dtype=torch.long, device=tree.mask.device)  # noqa: E731
        self.tree = tree
        self.span = max(depth) + 1  # KV slots a step may keep: the root and the deepest accepted node
        self.cell, self.parent, self.path = table(tree.cell), table(tree.parent[1:]), table(padded)
        self.rows = table(list(range(1, rows + 1)))  # + a: where the rows after an accepted depth a sit on a path
        self.rank = table([d * len(tree.paths) - first[i] for i, d in enumerate(depth)])
        self.sees = tree.mask[:, 1:]  # [N + 1, N]: node j is input i's ancestor or itself
        self.k = k  # candidates per row: decoder.topk, at most the vocabulary
        self.verify = Graphed(self._verify) if graphed else self._verify

    def _verify(self, logits: torch.Tensor, nodes: torch.Tensor):
        """Greedy verification of the tree: ``logits`` [N + 1, V] of the root and the nodes, ``nodes`` [N] their tokens.
        Returns what the host reads (the accepted depth a, the block of a + 1 tokens padded to ``span``, the best
        path, each node's right flag), the next candidate matrix, the block and the path, all on the device."""
        tree = self.tree
        y = logits.argmax(-1)  # y[i]: the prediction after input i (root = 0, node i = i)
        right = nodes == y[self.parent]  # each node's token is what the target predicts after its parent
        ok = ~(self.sees & ~right).any(-1)  # ... and so is every ancestor's: the path root -> input i is accepted
        # the deepest accepted input, on the earliest path (index_select, not [best]: a 0-dim index reads the device)
        best = torch.where(ok, self.rank, -1).argmax().view(1)
        path, a = self.path.index_select(0, best)[0], tree.depth.index_select(0, best)
        block = y[path[:self.span].clamp(min=0)]  # [:a + 1]: the accepted nodes (= y of their parents) + the bonus
        # next candidates: the top-k after each rejected node of the best path, one row per depth
        after = path.gather(0, a + self.rows)
        top = logits[after.clamp(min=0)].topk(self.k, dim=-1).indices
        C = F.pad(torch.where(after[:, None] >= 0, top, -1), (0, tree.width - self.k), value=-1)
        return torch.cat([a, block, path[:self.span], right]), C, block, path


class TRJacobi(Decoder):
    name = "tr_jacobi"

    def __init__(self, cfg, target, draft=None):
        super().__init__(cfg, target, draft)
        self.R = cfg.retrieval_len if cfg.retrieval else 0
        auto = cfg.tree == "auto"  # calibrate on the full template, then its best sub-tree (pick_tree)
        self.tree = build_tree(AUTO_TEMPLATE if auto else cfg.tree, cfg.topk, self.R, device=self.target.device)
        self.meta = {"tree": AUTO_TEMPLATE if auto else cfg.tree, "tree_nodes": len(self.tree.nodes),
                     "retrieval_len": self.R}
        self.full, self.index = self.tree, None  # tree=auto: the template, and where each node of self.tree sits in it
        self.stats = NodeStats(self.tree) if auto else None
        self.fastest: dict[int, float] = {}  # tree=auto: fastest verify forward seen per size q, over the probes
        self.probes = 0
        self.generations = 0
        self.tables: dict[int, Tables] = {}  # by the deepest node kept: cut trees for the last steps before the budget

    def tables_for(self, budget: int) -> Tables:
        """The tables for a step that may emit ``budget`` more tokens: nodes deeper than budget - 1 are cut."""
        depth = min(budget - 1, self.tree.rows)
        if depth not in self.tables:
            tree = self.tree if depth == self.tree.rows else cut(self.tree, depth)
            k = min(self.cfg.topk, self.target.vocab_size)
            self.tables[depth] = Tables(tree, self.cfg.faithful, k, graphed=self.target.graphs)
        return self.tables[depth]

    def candidates_fill(self, seq: list[int], t: Tables, retrieval: bool, filled: int) -> torch.Tensor:
        """What the empty cells of the candidate matrix get this step: the continuation of an earlier occurrence of
        the newest n-gram in the retrieval column, then ahead noise from the accepted context before the root in
        every other cell the tree reads, in cell order, except the first ``filled`` rows' top-k (the previous step's
        candidates, which stay). The draws are the list version's, so speeds reproduce."""
        tree, K = t.tree, self.cfg.topk
        fill = [-1] * (tree.rows * tree.width)
        if retrieval:
            for d, token in enumerate(retrieve(seq, self.cfg.retrieval_ngram, self.R, self.cfg.faithful)):
                fill[d * tree.width + K] = token
        empty = [c for c in tree.used if fill[c] < 0 and not (c // tree.width < filled and c % tree.width < t.k)]
        for c, token in zip(empty, ahead_noise(seq[:-1] or seq, len(empty), self.generator)):
            fill[c] = token
        return upload(fill, self.target.device).view(tree.rows, tree.width)

    def decode(self, prompt: list[int], out: Output) -> None:
        dev = self.target.device
        seq = list(prompt)  # the accepted context, on the host: retrieval and noise read it
        pending = upload(prompt, dev)  # inputs without KV yet, root last: the first step is fused with prefill
        C = torch.full((self.tree.rows, self.tree.width), -1, device=dev)  # candidate matrix; -1 = empty
        first, filled = True, 0  # filled: rows of C holding the previous step's top-k
        while True:
            t = self.tables_for(out.budget - len(out.tokens))
            tree = t.tree
            retrieval = self.R and not (self.cfg.faithful and first)
            C = torch.where(C >= 0, C, self.candidates_fill(seq, t, retrieval, filled))
            nodes = C.view(-1)[t.cell]

            P, m = self.target.length, pending.numel()
            root = P + m - 1  # the root's slot, and its position
            positions = tree.depth + root
            if m > 1:
                positions = torch.cat([torch.arange(P, root, device=dev), positions])
            logits = self.target.forward(torch.cat([pending, nodes]), positions, with_prefix(tree.mask, m - 1),
                                         last=len(tree.nodes) + 1)
            read, C, block, path = t.verify(logits, nodes)
            read = self.to_host(read)  # the step's one device-to-host read
            a, emitted, path_read = read[0], read[1:read[0] + 2], read[1 + t.span:1 + 2 * t.span]
            kept = path_read[:a + 1]
            if self.stats is not None and tree is self.tree:  # a tree cut at the budget lacks the index
                self.stats.observe([False] + read[1 + 2 * t.span:], tree, self.index)
            out.emit(emitted)
            if out.done:
                return
            if kept != list(range(a + 1)):  # the path's KV next to the cache (a chain prefix is there already)
                self.target.move(root, root + path[:a + 1])
            self.target.crop(root + a + 1)
            seq += emitted
            pending = block[a:a + 1]  # the bonus token, without KV yet: the next root
            first = False
            # the rows after the rejected node: to the end of the path (faithful: of the tree, the root padding it)
            filled = tree.rows - a if self.cfg.faithful else sum(i >= 0 for i in path_read) - a - 1

    # ------------------------------------------------------------------------------------ tree=auto
    def generate(self, prompt, max_new_tokens):
        out = super().generate(prompt, max_new_tokens)
        if self.stats is not None:
            self.generations += 1
            if self.generations >= self.cfg.calibrate:
                self.pick_tree()
        return out

    def pick_tree(self) -> None:
        """Verify the sub-tree with the most expected accepted tokens per second from now on: per-node acceptance
        from every step so far, and the cost of a verify forward t(q) on this engine, probed on a grid of sizes
        over the cache the last generation left (untimed) and interpolated in between. The first five picks probe
        a few rounds each and keep each size's fastest time, so on a busy machine the curve converges on the
        uncontended cost instead of following the load."""
        from specnoise.bench.forward_cost import interpolate, measure_forward_costs

        full = len(self.full.nodes) + 1
        grid = [q for q in (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64) if q < full] + [full]
        if self.probes < 5:  # then the curve has settled; an 8B model's probe costs seconds
            self.target.crop(self.target.max_length - full)  # room for the largest probe
            probed = measure_forward_costs(self.target, grid, repeats=3 if self.fastest else 10, warmup=1, reduce=min)
            self.fastest = {q: min(t, self.fastest.get(q, t)) for q, t in probed.items()}
            self.probes += 1
        cost = interpolate(self.fastest)
        p = self.stats.p()
        k = best_size(p, cost)
        self.tree, self.R, self.index = sub_tree(self.full, p, k, self.cfg.topk, device=self.target.device)
        self.tables = {}
        expected = 1 + sum(p[i] for i in self.index)
        self.meta = {"tree": f"auto({AUTO_TEMPLATE})", "tree_nodes": k, "retrieval_len": self.R,
                     "expected_accepted": round(expected, 3), "observed_steps": self.stats.steps,
                     "speedup_bound": round(expected * cost(1) / cost(1 + k), 3),  # ignores per-step overhead
                     "cost_ratio": {q: round(cost(q) / cost(1), 3) for q in grid}}  # t(q) / t(1)
        log.debug("tr_jacobi tree=auto: %s", self.meta)
