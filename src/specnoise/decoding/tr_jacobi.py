"""TR-Jacobi (MSN §3.3): verify a token tree of Jacobi candidates plus a retrieval chain in one forward.

Candidates live in a matrix ``C`` (one row per depth): columns 0..topk-1 hold the top-k predictions the
previous step made at the first rejected slots of its best path (Jacobi refresh, now with alternatives),
the last column the continuation of an earlier occurrence of the newest n-gram. Empty cells get ahead
noise. The tree template (trees.py) picks which cells are verified; the path with the most accepted
tokens wins, the first one on ties (the verifier's rule), and its KV is compacted next to the cache. A step stays on
the device from its candidates to one host read: the next candidate matrix is computed by the verifier's ``after``
hook (``Tables.after``), recorded with the verification as one CUDA graph on a graph engine; the host keeps only
the accepted text, for retrieval and noise.

Unlike MSN's reference code, paths are compared only within their true length (its padding lets the root
match itself: wrong tokens), and the output is cut at the first EOS and at the budget (``Output``).
``faithful=True`` reproduces its speed-only quirks: padded paths give the root's top-k to deeper rows,
a score-0 retrieval still returns tokens, and the first step has no retrieval.
"""

from __future__ import annotations

import copy
import dataclasses
import logging

import torch
import torch.nn.functional as F

from specnoise.decoding.cost import TREE, Curve, interpolate, measure_forward_costs
from specnoise.decoding.drafter import Drafter
from specnoise.decoding.kv import upload
from specnoise.decoding.ngram import ahead_noise, suffix_continuation
from specnoise.decoding.proposal import Proposal, tree_shape
from specnoise.decoding.trees import AUTO_TEMPLATE, NodeStats, Tree, best_size, build_tree, sub_tree

log = logging.getLogger("specnoise")


def retrieve(seq: list[int], n: int, length: int, faithful: bool = False) -> list[int]:
    """Up to ``length`` tokens after the earliest n-gram window sharing the longest suffix with ``seq[-n:]``.

    Windows end at least n tokens before the end; score = common suffix length. Score 0 returns nothing
    (MSN's code returns the tokens after window 0; ``faithful`` keeps that).
    """
    if len(seq) < 2 * n:
        return []
    for score in range(n, 0, -1):  # every window scoring `score` ends on a match of the query's last `score` tokens
        found = suffix_continuation(seq, score, length, first_end=n - 1, end_stop=len(seq) - n)
        if found is not None:
            return found
    return seq[n:n + length] if faithful else []


def cut(tree: Tree, depth: int, nodes: tuple[int, ...] | None = None) -> Tree:
    """``tree`` without its nodes deeper than ``depth`` or, given ``nodes`` (0-based node indices whose ancestors are
    among them: ``decoder.auto``'s pick), with those nodes only. Near the budget deep nodes could never be emitted (a
    step emits the accepted nodes plus one token), and their positions could run past a learned-position model's
    context. Ancestors are shallower than their descendants, so what is left is still a tree over the same matrix C."""
    if nodes is None:
        keep = [0] + [i for i, node in enumerate(tree.nodes, start=1) if len(node) <= depth]
    else:
        keep = [0] + [i + 1 for i in nodes]
    new = {old: i for i, old in enumerate(keep)}
    parent = [new[tree.parent[i]] for i in keep]
    # each path cut to its kept nodes, in the same order; cut paths may repeat, and a path whose kept part ends on a
    # node that keeps a child is no root-to-leaf path of the cut tree (the verifier reads a chain's path as its first)
    leaves = set(range(len(keep))) - set(parent[1:])
    cut_paths = dict.fromkeys(tuple(new[i] for i in path if i in new) for path in tree.paths)
    paths = [p for p in cut_paths if p[-1] in leaves]
    cell = [tree.cell[i - 1] for i in keep[1:]]
    return dataclasses.replace(tree, nodes=[tree.nodes[i - 1] for i in keep[1:]], parent=parent,
                               paths=[list(p) for p in paths], cell=cell, used=sorted(set(cell)))


class Tables:
    """A tree's shape for the verifier, and the tables of its ``after`` hook: the next candidate matrix from the
    target's top-k after each rejected node of the accepted path, computed on the device.

    path: the first path through each input, padded so that the rows after any accepted depth can be gathered
    without bounds checks (-1 = none; ``faithful``: the root up to full depth, as MSN's code pads)."""

    def __init__(self, tree: Tree, faithful: bool, k: int, stats: bool, device):
        rows = tree.depth
        self.tree, self.k, self.stats = tree, k, stats  # k: candidates per row, decoder.topk within the vocabulary
        self.shape = tree_shape(tree.parent[1:], tree.paths, device=device)  # the tree alone is the block
        # the verifier's first path through each input (-1 after its end), widened to 2 rows + 1 (a cut tree keeps the
        # full tree's candidate rows, so its paths are shorter than rows + 1)
        self.path = F.pad(self.shape.path, (0, 2 * rows + 1 - self.shape.span), value=-1)
        if faithful:
            self.path[:, :rows + 1].clamp_(min=0)
        self.cell = torch.tensor(tree.cell, dtype=torch.long, device=device)
        # + a: where the rows after an accepted depth a sit. A path holds span - 1 nodes, so at most that many rows
        # can follow a rejected node (faithful: every row, the root padding the path): decoder.auto's 2-4-deep picks
        # take the top-k of 1-3 rows, not of all 5 (~45 us of a TR-Jacobi step's ~0.3 ms verify on the CPU)
        self.ahead = torch.arange(1, (rows if faithful else self.shape.span - 1) + 1, device=device)
        # no node kept (decoder.auto's AR step, or the budget's last token): no row after the root to take candidates
        # from, so the next matrix is empty whatever the target says (faithful: the root's top-k in every row, as
        # MSN's code pads)
        self.blank = not tree.nodes and not faithful

    def after(self, step):
        """Reads each node's right flag (tree=auto's statistics) and keeps the next candidate matrix: the top-k after
        each rejected node of the best path, one row per depth."""
        tree = self.tree
        after = self.path.index_select(0, step.best).gather(1, step.a[:, None] + self.ahead)  # [B, rows read]
        top = step.logits_at(after.clamp(min=0)).topk(self.k, dim=-1).indices
        C = F.pad(torch.where(after[..., None] >= 0, top, -1),
                  (0, tree.width - self.k, 0, tree.depth - after.shape[1]), value=-1)
        return (step.right if self.stats else None), C


class TRJacobi(Drafter):
    name = "tr_jacobi"
    backoff = False  # its explorations feed its next candidates (auto.py)

    def setup(self):
        cfg = self.cfg
        self.R = cfg.retrieval_len if cfg.retrieval else 0
        auto = cfg.tree == "auto"  # calibrate on the full template, then its best sub-tree (pick_tree)
        self.tree = build_tree(AUTO_TEMPLATE if auto else cfg.tree, cfg.topk, self.R)
        self.meta = {"tree": AUTO_TEMPLATE if auto else cfg.tree, "tree_nodes": len(self.tree.nodes),
                     "retrieval_len": self.R}
        self.full, self.index = self.tree, None  # tree=auto: the template, and where each node of self.tree sits in it
        self.stats = NodeStats(self.tree) if auto else None
        # tree=auto, per batch size (rows verified together): the fastest verify forward seen per size q over the
        # probes, and the probes so far (shared by a batch's row drafters: filled in place, never replaced)
        self.fastest: dict[int, dict[int, float]] = {}
        self.probes: dict[int, int] = {}
        self.curve: Curve | None = None  # at batch 1: the run's cost curve (cost.py)
        self.generations = 0
        # by the deepest node kept (cut trees for the last steps before the budget) and decoder.auto's pick
        self.tables: dict[tuple[int, tuple[int, ...] | None], Tables] = {}
        self.parents: tuple = (None, [])  # decoder.auto: (tree, its nodes' parents), built once per tree

    def tables_for(self, budget: int) -> Tables:
        """The tables for a step that may emit ``budget`` more tokens: nodes deeper than budget - 1 are cut; under
        ``decoder.auto`` the tree is the controller's pick among the rest (retrieval chain and template alike)."""
        depth = min(budget - 1, self.tree.depth)
        pick = None
        if self.decoder.auto is not None:
            tree = self.tree
            if self.parents[0] is not tree:  # node index of each node's parent, -1 = the root (once per tree)
                self.parents = (tree, [p - 1 for p in tree.parent[1:]])
            allow = None if depth == tree.depth else [len(node) <= depth for node in tree.nodes]
            pick = tuple(self.select(self.parents[1], allow=allow))
        if (depth, pick) not in self.tables:
            tree = self.tree if depth == self.tree.depth and pick is None else cut(self.tree, depth, pick)
            k = min(self.cfg.topk, self.target.vocab_size)
            self.tables[depth, pick] = Tables(tree, self.cfg.faithful, k, self.stats is not None, self.target.device)
        return self.tables[depth, pick]

    def candidates_fill(self, seq: list[int], t: Tables, retrieval: bool, filled: int) -> torch.Tensor:
        """What the empty cells of the candidate matrix get this step: the continuation of an earlier occurrence of
        the newest n-gram in the retrieval column, then ahead noise from the accepted context before the root in
        every other cell the tree reads, in cell order, except the first ``filled`` rows' top-k (the previous step's
        candidates, which stay). The draws are the list version's, so speeds reproduce."""
        tree, K = t.tree, self.cfg.topk
        fill = [-1] * (tree.depth * tree.width)
        if retrieval:
            for d, token in enumerate(retrieve(seq, self.cfg.retrieval_ngram, self.R, self.cfg.faithful)):
                fill[d * tree.width + K] = token
        empty = [c for c in tree.used if fill[c] < 0 and not (c // tree.width < filled and c % tree.width < t.k)]
        for c, token in zip(empty, ahead_noise(seq[:-1] or seq, len(empty), self.noise)):
            fill[c] = token
        return upload(fill, self.target.device).view(tree.depth, tree.width)

    def begin(self, prompt, budget, seed):
        super().begin(prompt, budget, seed)
        self.C = torch.full((self.tree.depth, self.tree.width), -1, device=self.target.device)  # -1 = empty
        self.first, self.filled = True, 0  # filled: rows of C holding the previous step's top-k

    def propose(self, room):
        self.t = t = self.tables_for(room + 1)
        if t.blank:  # nothing to fill or to read back (at B = 16 on the CPU most rows' steps: ~0.1 ms each)
            return Proposal([], t.shape)
        retrieval = self.R and not (self.cfg.faithful and self.first)
        self.C = torch.where(self.C >= 0, self.C, self.candidates_fill(self.seq, t, retrieval, self.filled))
        return Proposal(self.C.view(-1).index_select(0, t.cell), t.shape, after=t.after)

    def observe(self, v):
        t, a = self.t, v.accepted
        if self.stats is not None and t.tree is self.tree:  # a tree cut at the budget lacks the index
            self.stats.observe([False] + v.extra, t.tree, self.index)
        super().observe(v)
        if v.done:
            return
        self.C, self.first = (torch.full_like(self.C, -1) if t.blank else v.kept), False
        # the rows after the rejected node: to the end of the path (faithful: of the tree, the root padding it)
        self.filled = t.tree.depth - a if self.cfg.faithful else sum(i >= 0 for i in v.path) - a - 1

    # ------------------------------------------------------------------------------------ tree=auto
    def history(self):
        """tree=auto's statistics and the sub-tree they picked (``Decoder.history``). The tree and its tables are
        replaced by a new pick, never changed in place: kept by reference, so a restored tree's verify shapes keep
        their device functions (recorded graphs on a graph engine)."""
        if self.stats is None:
            return {}
        return {"stats": copy.deepcopy(self.stats), "generations": self.generations, "meta": dict(self.meta),
                "tree": (self.tree, self.R, self.index, dict(self.tables), self.parents)}

    def restore(self, saved):
        if saved:
            self.stats, self.generations = copy.deepcopy(saved["stats"]), saved["generations"]
            self.meta, self.tables = dict(saved["meta"]), dict(saved["tree"][3])
            self.tree, self.R, self.index, _, self.parents = saved["tree"]

    def after_generation(self):
        if self.stats is not None:
            self.generations += 1
            if self.generations >= self.cfg.calibrate:
                self.pick_tree()

    def pick_tree(self) -> None:
        """Verify the sub-tree with the most expected accepted tokens per second from now on: per-node acceptance
        from every step so far, and the cost of a verify forward t(q) on this engine: at batch 1 the tree-forward
        curve of ``decoding/cost.py`` (probed once over the first generation's context, cached per machine + model +
        settings under ``decoder.cost_cache``); in a batch, the forward of every row's tree together, t(rows x q),
        which grows faster with q: the first five picks per batch size probe a few rounds each over the cache the
        last generation left and keep each size's fastest time, so on a busy machine the curve converges on the
        uncontended cost instead of following the load."""
        full = len(self.full.nodes) + 1
        grid = [q for q in (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64) if q < full] + [full]
        rows = self.decoder.batch  # in a batch the verify forward carries every row's tree: t(rows x q)
        fastest = self.fastest.setdefault(rows, {})
        if rows == 1:  # the run's tree-forward curve (cost.py): probed once over this context, cached per machine
            if self.curve is None:
                self.curve = Curve(self.target, len(self.seq), full, self.cfg.cost_cache)
            fastest.update({q: self.curve(q, TREE) for q in grid})
        elif self.probes.get(rows, 0) < 5:  # then the curve has settled; an 8B model's probe costs seconds
            self.target.crop(self.target.max_length - full)  # room for the largest probe
            probed = measure_forward_costs(self.target, grid, cache_len=len(self.seq),
                                           repeats=3 if fastest else 10, warmup=1, reduce=min, rows=rows)
            fastest.update({q: min(t, fastest.get(q, t)) for q, t in probed.items()})
            self.probes[rows] = self.probes.get(rows, 0) + 1
        cost = interpolate(fastest)
        p = self.stats.p()
        k = best_size(p, cost)
        self.tree, self.R, self.index = sub_tree(self.full, p, k, self.cfg.topk)
        self.tables = {}
        expected = 1 + sum(p[i] for i in self.index)
        self.meta = {"tree": f"auto({AUTO_TEMPLATE})", "tree_nodes": k, "retrieval_len": self.R,
                     "expected_accepted": round(expected, 3), "observed_steps": self.stats.steps,
                     "speedup_bound": round(expected * cost(1) / cost(1 + k), 3),  # ignores per-step overhead
                     "cost_ratio": {q: round(cost(q) / cost(1), 3) for q in grid}}  # t(q) / t(1)
        log.debug("tr_jacobi tree=auto: %s", self.meta)
