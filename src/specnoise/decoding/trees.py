"""Token-tree templates as data, and what a verify step needs from one (built once per decoder).

A template is a list of nodes; a node is a tuple of candidate columns, one per depth, Medusa style: the
node's token is ``C[depth - 1][last column]`` of the step's candidate matrix ``C``, whatever its parent.
Ancestors (the node's prefixes) must come before it. TR-Jacobi puts a retrieval chain ``(R,), (R, R), ...``
in front, with ``R`` the column after the top-k ones.

Input index 0 is the root (the newest accepted token); template node i sits at index i + 1.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specnoise.errors import UserError
from specnoise.tree_templates import MC_SIM_7B_63, TEMPLATES  # noqa: F401  (the templates, as data)


@dataclass(frozen=True)
class Tree:
    """A template as the drafters read it, in host lists (a step walks them in Python, faster than a dozen tiny tensor
    ops). What the forward and the verifier take (mask, positions, paths as tensors) is the ``Shape`` that
    ``proposal.tree_shape`` builds from ``parent`` and ``paths``."""

    nodes: list[tuple[int, ...]]  # template order, retrieval chain first
    parent: list[int]  # [N + 1]; the root is its own parent
    paths: list[list[int]]  # root-to-leaf input indices, true lengths, retrieval chain first
    cell: list[int]  # [N]: flat index of each node's token in the candidate matrix [depth, width]
    used: list[int]  # the cells some node reads
    depth: int  # candidate-matrix rows = the deepest node's depth
    width: int  # candidate-matrix columns = topk (+ 1 retrieval column)


def tree_names() -> str:
    return ", ".join(TEMPLATES)


def build_tree(name: str, topk: int, retrieval_len: int = 0,
               template: list[tuple[int, ...]] | None = None) -> Tree:
    """The template ``name`` (or the node list ``template``, e.g. a sub-tree picked by ``decoder.tree=auto``) with a
    retrieval chain of ``retrieval_len`` nodes in column ``topk`` in front."""
    if template is None and name not in TEMPLATES:
        raise UserError(f"unknown tree template {name!r}: set decoder.tree to one of {tree_names()}")
    template = TEMPLATES[name] if template is None else template
    widest = max((c for node in template for c in node), default=-1) + 1
    if widest > topk:
        raise UserError(f"tree {name!r} uses candidate ranks up to {widest - 1}: set decoder.topk >= {widest} "
                        "or pick a smaller tree")
    nodes = [(topk,) * d for d in range(1, retrieval_len + 1)] + list(template)
    index = {node: i + 1 for i, node in enumerate(nodes)}
    if len(index) != len(nodes):
        raise ValueError(f"tree {name!r} repeats a node")

    n = len(nodes) + 1
    parent = [0] * n
    paths = [[0]]  # the root-to-i input path of every input i
    for i, node in enumerate(nodes, start=1):
        ancestors = [index.get(node[:d], n) for d in range(1, len(node))]
        if any(a >= i for a in ancestors):
            raise ValueError(f"tree {name!r}: node {node} comes before one of its ancestors")
        parent[i] = ancestors[-1] if ancestors else 0
        paths.append([0, *ancestors, i])
    has_child = set(parent[1:])
    paths = [paths[i] for i in range(1, n) if i not in has_child]  # the leaves', in node order
    width = topk + (1 if retrieval_len else 0)
    cell = [(len(node) - 1) * width + node[-1] for node in nodes]
    return Tree(nodes, parent, paths, cell, sorted(set(cell)), max(map(len, nodes), default=0), width)


def with_prefix(mask: torch.Tensor, n: int) -> torch.Tensor:
    """The keep-matrix for ``n`` causal tokens (an uncached prompt) followed by a tree that sees all of them."""
    if n == 0:
        return mask
    q = n + mask.shape[0]
    keep = torch.zeros(q, q, dtype=torch.bool, device=mask.device)
    keep[:n, :n] = torch.ones(n, n, dtype=torch.bool, device=mask.device).tril_()
    keep[n:, :n] = True
    keep[n:, n:] = mask
    return keep


# ------------------------------------------------------------------------- hardware-aware sizing (tree=auto)
AUTO_TEMPLATE = "mc_sim_7b_63"  # decoder.tree=auto picks a sub-tree of this template (plus the retrieval chain)


class NodeStats:
    """Per node of a tree, over the steps that verified it with its parent's path right: how often its own token
    was right too (``hits`` of ``trials``). Steps on a sub-tree count for the nodes it kept (``index``), so
    acceptance keeps being learnt after a pick."""

    def __init__(self, tree: Tree):
        self.tree, self.steps = tree, 0
        self.trials, self.hits = [0] * len(tree.nodes), [0] * len(tree.nodes)

    def observe(self, right: list[bool], tree: Tree | None = None, index: list[int] | None = None) -> None:
        """``right[i]``: input i of ``tree`` (default: the full tree) equals the target's prediction after its parent;
        ``index[i - 1]``: the full tree's node that input i is."""
        tree = tree or self.tree
        ok = [True] + [False] * len(tree.nodes)  # the path root -> input i is right
        for i in range(1, len(ok)):  # parents come before children
            ok[i] = right[i] and ok[tree.parent[i]]
            if ok[tree.parent[i]]:
                n = i - 1 if index is None else index[i - 1]
                self.trials[n] += 1
                self.hits[n] += ok[i]
        self.steps += 1

    def p(self) -> list[float]:
        """Each node's chance that its whole path is right: its parent's times its own rate given the parent's path
        right, a posterior mean under a uniform prior, (hits + 1) / (trials + 2). Conditional rates are learnt from
        the few steps where the parent was right, so a node is judged by its own record, not by how often its
        parent failed while it sat outside the tree; p(child) <= p(parent) keeps every pick a tree."""
        p = [0.0] * len(self.hits)
        for i, (h, n) in enumerate(zip(self.hits, self.trials)):
            parent = self.tree.parent[i + 1]
            p[i] = (h + 1) / (n + 2) * (p[parent - 1] if parent else 1.0)
        return p


def best_size(p: list[float], cost) -> int:
    """The node count k >= 1 maximising expected accepted tokens per second, (1 + sum of the k largest p) / cost(1 + k).

    ``cost(q)``: seconds of one verify forward of q tokens (the root and k nodes)."""
    best_k, best_rate, gain = 1, float("-inf"), 1.0
    for k, pk in enumerate(sorted(p, reverse=True), start=1):
        gain += pk
        rate = gain / cost(1 + k)
        if rate > best_rate:
            best_k, best_rate = k, rate
    return best_k


def sub_tree(tree: Tree, p: list[float], k: int, topk: int) -> tuple[Tree, int, list[int]]:
    """The ``k`` nodes of ``tree`` with the largest p (ties: template order), as a tree of its own.

    With p(child) <= p(parent), a stable sort keeps every node's ancestors before it (ancestors come first in
    template order): the pick is a tree. Returns it, its retrieval-chain length (a prefix of the chain, maybe 0)
    and the index in ``tree`` of each of its nodes."""
    keep = sorted(sorted(range(len(p)), key=lambda i: -p[i])[:k])  # the sub-tree keeps the full tree's order
    chain = sum(1 for i in keep if tree.nodes[i][0] == topk)  # the retrieval chain sits in column topk, first
    template = [tree.nodes[i] for i in keep[chain:]]
    return build_tree("auto", topk, chain, template=template), chain, keep
