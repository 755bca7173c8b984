"""TR-Jacobi (MSN §3.3): verify a token tree of Jacobi candidates plus a retrieval chain in one forward.

Candidates live in a matrix ``C`` (one row per depth): columns 0..topk-1 hold the top-k predictions the
previous step made at the first rejected slots of its best path (Jacobi refresh, now with alternatives),
the last column the continuation of an earlier occurrence of the newest n-gram. Empty cells get ahead
noise. The tree template (trees.py) picks which cells are verified; the path with the most accepted
tokens wins, the first one on ties, and its KV is compacted next to the cache.

Unlike MSN's reference code, paths are compared only within their true length (its padding lets the root
match itself: wrong tokens), and the output is cut at the first EOS and at the budget (``Output``).
``faithful=True`` reproduces its speed-only quirks: padded paths give the root's top-k to deeper rows,
a score-0 retrieval still returns tokens, and the first step has no retrieval.
"""

from __future__ import annotations

import dataclasses
import logging

import torch

from specnoise.decoding.base import Decoder, Output
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


def best_path(paths: list[list[int]], right: list[bool]) -> tuple[list[int], int]:
    """The path with the most leading right nodes (the first one on ties) and that count.

    Only a path's own nodes are compared: padding them with the root lets the root "match" itself (MSN's
    reference code), which accepts tokens the model never predicted.
    """
    best, accepted = paths[0], 0
    for path in paths:
        a = 0
        while a + 1 < len(path) and right[path[a + 1]]:
            a += 1
        if a > accepted:
            best, accepted = path, a
    return best, accepted


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
        self.cut_trees: dict[int, Tree] = {}  # by depth, for the last steps before the budget

    def tree_for(self, budget: int) -> Tree:
        """The tree for a step that may emit ``budget`` more tokens: nodes deeper than budget - 1 are cut."""
        if budget - 1 >= self.tree.rows:
            return self.tree
        if budget - 1 not in self.cut_trees:
            self.cut_trees[budget - 1] = cut(self.tree, budget - 1)
        return self.cut_trees[budget - 1]

    def decode(self, prompt: list[int], out: Output) -> None:
        K, faithful = self.cfg.topk, self.cfg.faithful
        seq = list(prompt)  # accepted context
        pending = list(prompt)  # accepted tokens without KV yet, root last; the first step is fused with prefill
        C: list[int | None] = [None] * (self.tree.rows * self.tree.width)  # candidate matrix, flat; None = empty
        first = True
        while True:
            tree = self.tree_for(out.budget - len(out.tokens))
            if self.R and not (faithful and first):
                for d, token in enumerate(retrieve(seq, self.cfg.retrieval_ngram, self.R, faithful)):
                    C[d * tree.width + K] = token
            empty = [c for c in tree.used if C[c] is None]
            for c, token in zip(empty, ahead_noise(seq[:-1] or seq, len(empty), self.generator)):
                C[c] = token  # ahead noise from the accepted context before the root
            nodes = [C[c] for c in tree.cell]

            P, m = self.target.length, len(pending)
            positions = tree.depth + (P + m - 1)
            if m > 1:
                positions = torch.cat([torch.arange(P, P + m - 1, device=positions.device), positions])
            logits = self.target.forward(pending + nodes, positions, with_prefix(tree.mask, m - 1), last=len(nodes) + 1)
            # y[i]: prediction after input i (root = 0, node i = i); top[i]: its top-k, the next step's candidates
            k = min(K, logits.shape[-1])
            read = self.to_host(torch.cat([logits.argmax(-1, keepdim=True), logits.topk(k, dim=-1).indices], dim=1))
            y, top = [r[0] for r in read], [r[1:] for r in read]
            tokens = [pending[-1]] + nodes
            right = [False] + [tokens[i] == y[tree.parent[i]] for i in range(1, len(tokens))]
            if self.stats is not None and tree is self.tree:  # a tree cut at the budget lacks the index
                self.stats.observe(right, tree, self.index)
            path, a = best_path(tree.paths, right)
            block = [tokens[i] for i in path[1:a + 1]] + [y[path[a]]]  # accepted nodes + the bonus token
            out.emit(block)
            if out.done:
                return
            root_slot = P + m - 1
            self.target.compact(root_slot, [root_slot + i for i in path[:a + 1]])
            seq += block
            pending = [block[-1]]
            first = False

            # next candidates: the top-k after each rejected node of the best path, one row per depth
            # (faithful: paths padded with the root to full depth, as MSN's code does)
            C = [None] * (tree.rows * tree.width)
            slots = (path + [0] * tree.rows)[a + 1:tree.rows + 1] if faithful else path[a + 1:]
            for d, slot in enumerate(slots):
                C[d * tree.width:d * tree.width + k] = top[slot]

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
        self.cut_trees = {}
        expected = 1 + sum(p[i] for i in self.index)
        self.meta = {"tree": f"auto({AUTO_TEMPLATE})", "tree_nodes": k, "retrieval_len": self.R,
                     "expected_accepted": round(expected, 3), "observed_steps": self.stats.steps,
                     "speedup_bound": round(expected * cost(1) / cost(1 + k), 3),  # ignores per-step overhead
                     "cost_ratio": {q: round(cost(q) / cost(1), 3) for q in grid}}  # t(q) / t(1)
        log.debug("tr_jacobi tree=auto: %s", self.meta)
