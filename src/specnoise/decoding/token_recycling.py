"""Token Recycling (Luo et al., 2024): the target's own top-k candidates in an adjacency matrix, drafted as a tree.

Every verify forward computes the target's logits at every block row, and all but the accepted path's are thrown
away. Token Recycling keeps them: ``M[token]`` (vocab x k, on the device) holds the top-k next tokens the target
predicted the last time ``token`` was an input, rewritten for every row of every step by the verifier's ``after``
hook (``Recycle``), on the device, with no extra host read. A step drafts a static tree template (trees.py) by
BFS from the root: a node of columns (c1, ..., cd) gets ``M[its parent's token][cd]``, computed on the device one
depth at a time. The matrix is kept across prompts (``reuse_history``; ``reset_history`` after the warm-up clears
it as for Ouroboros' pool).

Departures from the paper's code: the tree is one of trees.py's templates (default Medusa's ``mc_sim_7b_63``, 63
nodes of depth <= 4, not the paper's own 80-node tree of depth 6, and no ``tree=auto``); the matrix starts from
zeros (its drafts fail until the first updates; under ``decoder.auto`` a root whose row is unwritten takes an AR
step instead, ``known``); rows repeated in one block are written in an unspecified order (a
speed, never an output, difference); and the prompt's own rows are not recycled at the prefill (only the root's).
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from specnoise.decoding.drafter import Drafter
from specnoise.decoding.kv import upload_tables, write
from specnoise.decoding.proposal import Proposal, chain_shape, tree_shape
from specnoise.decoding.trees import build_tree
from specnoise.errors import ConfigError


class Recycle:
    """An ``after`` hook for blocks of ``n`` rows (root first): ``M[row's token] = top-k of the row's logits``. The
    tokens sit in ``inputs``, written before each step (fixed address: a recorded CUDA graph reads it in place), and
    are read with the verdict (``TokenRecycling.known``)."""

    def __init__(self, M: torch.Tensor, n: int):
        self.M, self.inputs = M, torch.zeros(n, dtype=torch.long, device=M.device)
        self.k = min(M.shape[1], M.shape[0])  # a vocabulary smaller than k leaves the last columns at 0

    def __call__(self, step):
        # the hook of one row's matrix: its step is that row's alone (verifier.finish_rows groups rows by hook)
        top = step.logits[0, :self.inputs.numel()].topk(self.k, dim=-1).indices
        if self.k < self.M.shape[1]:  # (a pad of nothing still copies: ~15 us of a step on the CPU)
            top = F.pad(top, (0, self.M.shape[1] - self.k))
        self.M.index_copy_(0, self.inputs, top)
        return self.inputs[None], None


class Plan:
    """A tree's BFS plan: per depth, the nodes (input indices), their parents and the matrix column each reads.

    Built from ``keep``, template indices in template order (parents first, every kept node's parent kept), for
    each new pick of the controller (about every other step under ``decoder.auto``), so from the template's own
    tables: through ``build_tree`` it took ~0.23 ms on the CPU. ``levels``: (nodes, parents, columns) per depth,
    numpy arrays on the CPU (``fill``), else device tensors."""

    def __init__(self, template: list[tuple[int, ...]], parents: list[int], keep: list[int], device):
        at = {i: j for j, i in enumerate(keep, start=1)}  # template index -> input index
        parent = [at[parents[i]] if parents[i] >= 0 else 0 for i in keep]
        self.shape = tree_shape(parent, device=device)
        depth = [len(template[i]) for i in keep]
        tables = []
        for d in range(1, max(depth) + 1):
            nodes = [j for j, dj in enumerate(depth, start=1) if dj == d]
            tables += [nodes, [parent[j - 1] for j in nodes], [template[keep[j - 1]][-1] for j in nodes]]
        if device.type == "cpu":
            self.levels = [tuple(np.array(t) for t in tables[i:i + 3]) for i in range(0, len(tables), 3)]
        else:
            views = upload_tables(tables, device)
            self.levels = [views[i:i + 3] for i in range(0, len(views), 3)]

    def fill(self, tokens: torch.Tensor, M: torch.Tensor) -> None:
        """Write the tree's tokens after the root ``tokens[0]``, one depth at a time from its parents' rows of M. On
        the CPU through numpy views of the same memory: right after a forward the torch ops of a 3-4 level BFS took
        ~180-220 us against numpy's ~85-105 (their dispatch runs cold there; hardware-aware/cold_ops.py)."""
        if tokens.device.type == "cpu":
            t, m = tokens.numpy(), M.numpy()
            for at, parent, column in self.levels:
                t[at] = m[t[parent], column]
            return
        for at, parent, column in self.levels:
            tokens[at] = M[tokens[parent], column]


class TokenRecycling(Drafter):
    name = "token_recycling"
    backoff = False  # its explorations feed its next candidates (auto.py)
    kept = ("M", "known")  # the matrix, kept across prompts (``Decoder.history``), and what the host knows of it

    def setup(self):
        cfg, target = self.cfg, self.target
        self.template = build_tree(cfg.tree, cfg.topk).nodes  # checks the template's ranks against topk
        if len(self.template) + 1 > target.max_length:
            raise ConfigError(f"decoder.tree={cfg.tree} has {len(self.template)} nodes, more than the model's context "
                              f"of {target.max_length}: pick a smaller tree")
        self.M = torch.zeros(target.vocab_size, cfg.topk, dtype=torch.long, device=target.device)
        # tokens whose row of M holds the target's top-k: every block row's token, read with the verdict. At a root
        # outside it decoder.auto takes an AR step (which writes the row): its tree would be drafted from zeros, and
        # a matrix emptied after the warm-up made the first HumanEval problems verify such trees at most steps
        self.known: set[int] = set()
        # by the deepest node kept (trees cut at the budget) and decoder.auto's pick
        self.plans: dict[tuple[int, tuple[int, ...] | None], Plan | None] = {}
        index = {node: i for i, node in enumerate(self.template)}
        self.parents = [index.get(node[:-1], -1) for node in self.template]  # -1: the root
        self.hooks: dict[int, Recycle] = {}  # by block rows
        self.meta = {"tree": cfg.tree, "tree_nodes": len(self.template), "topk": cfg.topk}
        self.deepest = max(map(len, self.template))

    def begin(self, prompt, budget, seed):
        super().begin(prompt, budget, seed)
        if not self.cfg.reuse_history:
            self.reset_history()

    def reset_history(self):
        self.M.zero_()
        self.known = set()

    def observe(self, v):
        self.known.update(v.extra)  # the rows ``Recycle`` wrote
        super().observe(v)

    def fork(self, decoder):
        clone = super().fork(decoder)
        # a row's own matrix, and hooks whose input buffers are its own
        clone.M, clone.known, clone.hooks = self.M.clone(), set(self.known), {}
        return clone

    def hook(self, n: int) -> Recycle:
        if n not in self.hooks:
            self.hooks[n] = Recycle(self.M, n)
        return self.hooks[n]

    def plan(self, room: int) -> Plan | None:
        """The template without nodes deeper than ``room`` (they could never be emitted), under ``decoder.auto`` the
        controller's pick among them (none at a root whose row of M is not ``known``); None when none is left."""
        depth = min(room, self.deepest)
        allow = None if depth == self.deepest else [len(node) <= depth for node in self.template]
        pick = self.select(self.parents if self.seq[-1] in self.known else [], "token_recycling", allow)
        pick = None if pick is None else tuple(pick)
        if (depth, pick) not in self.plans:
            keep = sorted(pick) if pick is not None else [i for i, n in enumerate(self.template) if len(n) <= depth]
            self.plans[depth, pick] = Plan(self.template, self.parents, keep, self.target.device) if keep else None
        return self.plans[depth, pick]

    def propose(self, room):
        plan = self.plan(room)
        if plan is None:
            return self.recycled([])
        hook = self.hook(plan.shape.nodes + 1)
        tokens = hook.inputs
        write(tokens, [self.seq[-1]])
        plan.fill(tokens, self.M)
        return Proposal(tokens[1:], plan.shape, after=hook)

    def recycled(self, drafts: list[int]) -> Proposal:
        """A chain of ``drafts`` whose rows still feed the matrix (SAM-Decoding's matched drafts)."""
        hook = self.hook(len(drafts) + 1)
        write(hook.inputs, [self.seq[-1], *drafts])
        return Proposal(hook.inputs[1:], chain_shape(len(drafts), self.target.device), after=hook)
