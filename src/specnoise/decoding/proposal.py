"""A proposal: what a drafter hands the verifier (verifier.py) for one step, and its shape.

A proposal is a tree of candidate tokens hanging after the root, the newest accepted token (a chain is a tree). Its
block may hold extra rows the target computes in the same forward without verifying them (Lookahead's window, tokens
a faithful variant feeds but never accepts): a ``Shape`` says who sees whom, where each row sits, and which rows form
the tree. A shape is built once (drafters cache theirs) and its tables live on the device, so a step reads nothing
back to judge it. ``Rules`` are a shape's verdict tables with a leading row dimension: one shape's, or a batch's rows'
shapes padded to the step's largest, so that the rows are judged together (``verifier.judge_rows``). A proposal's
``after`` hook runs on the device right after the verdict and sees it as a ``Step`` (``read_argmax`` is the common one).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, NamedTuple

import numpy as np
import torch
import torch.nn.functional as F

from specnoise.decoding.kv import upload_tables


@dataclass(eq=False)  # hashed by identity: the verifier keeps one device function per shape
class Shape:
    """A proposal's layout, built once per shape (drafters cache them). The block is [root, Q tokens]; the tree's
    inputs sit at the block rows ``at`` (the root at row 0), node i's parent is input ``parent[i - 1]``."""

    mask: torch.Tensor  # bool [1 + Q, 1 + Q]: who sees whom (every row sees the root)
    offsets: torch.Tensor  # long [1 + Q]: each row's position minus the root's
    at: torch.Tensor  # long [N + 1]: block row of each tree input
    parent: torch.Tensor  # long [N]
    sees: torch.Tensor  # bool [N + 1, N]: node j is input i or one of its ancestors
    depth: torch.Tensor  # long [N + 1]
    rank: torch.Tensor  # long [N + 1]: deeper first, then the earlier first path (one argmax picks the best input)
    path: torch.Tensor  # long [N + 1, span]: the first path through each input, -1 after its end
    at_host: list[int]  # (``at`` on the host)
    span: int  # deepest input + 1: tokens a step may emit
    causal: bool  # the tree is one chain over the whole block: the forward needs no mask or positions
    prefix: bool  # the tree's inputs are the block's first rows
    # under sampling a node is tested against the draw at its parent, so only inputs with a child need one before
    # acceptance (the best input's is the bonus, drawn after): a wide tree's leaves are never warped
    inner: torch.Tensor  # long [K]: the inputs with a child
    slot: torch.Tensor  # long [N]: node i's parent's index in ``inner``
    padded: dict = field(default_factory=dict, repr=False)  # ``rules`` by size

    @property
    def nodes(self) -> int:
        return self.parent.numel()

    def rules(self, n: int, span: int) -> Rules:
        """The verdict's tables as one row of a batch's, padded to ``n`` nodes and ``span`` (the step's largest shape),
        kept per size."""
        rules = self.padded.get((n, span))
        if rules is None:
            more = n - self.nodes
            rules = self.padded[n, span] = Rules(
                F.pad(self.at, (0, more))[None], F.pad(self.parent, (0, more))[None],
                F.pad(self.sees, (0, more, 0, more))[None], F.pad(self.rank, (0, more), value=-1)[None],
                F.pad(self.depth, (0, more))[None], F.pad(self.path, (0, span - self.span, 0, more), value=-1)[None],
                prefix=self.prefix, chain=self.causal or not self.nodes)
        return rules

    @property
    def last(self) -> int:
        return self.mask.shape[0]  # logits rows a step needs: the root and every row after it


def tree_shape(parents: list[int], paths: list[list[int]] | None = None, *, mask: torch.Tensor | None = None,
               offsets: torch.Tensor | None = None, at: list[int] | None = None, masked: bool = False,
               device=None) -> Shape:
    """The shape of a tree (inputs 0 = root, 1..N = nodes) with ``parents[i - 1]`` the parent of node i (parents
    first). ``paths``: root-to-leaf input lists in tie-break order (default: leaves in node order). ``mask``,
    ``offsets``, ``at``: the block's layout when it holds more than the tree (default: the tree alone). ``masked``:
    pass the mask and positions even for a chain (a drafter whose block is a chain only sometimes keeps one kind of
    forward, and so the same rounding, for all its steps)."""
    n = len(parents) + 1
    depth, anc = [0] * n, [[0] for _ in range(n)]  # anc[i]: the root-to-i path
    for i, p in enumerate(parents, start=1):
        if not 0 <= p < i:
            raise ValueError(f"node {i}'s parent {p} must come before it")
        depth[i], anc[i] = depth[p] + 1, anc[p] + [i]
    if paths is None:
        has_child = set(parents)
        paths = [anc[i] for i in range(n) if i not in has_child] if n > 1 else [[0]]
    first = [-1] * n  # the first path through each input
    for k, path in enumerate(paths):
        for i in path:
            if first[i] < 0:
                first[i] = k
    if min(first) < 0:
        raise ValueError(f"inputs {[i for i in range(n) if first[i] < 0]} lie on none of the paths")
    span = max(depth) + 1
    sees = np.zeros((n, n), dtype=bool)
    sees[[i for i in range(n) for _ in anc[i]], [j for a in anc for j in a]] = True
    sees = torch.from_numpy(sees)
    if mask is None:
        mask, offsets, at = sees, None, list(range(n))
    prefix = list(at[:n]) == list(range(n))
    chain = not masked and parents == list(range(len(parents))) and mask.shape[0] == n
    inner = sorted(set(parents))
    slot = {p: j for j, p in enumerate(inner)}
    padded = [j for i in range(n) for j in (paths[first[i]] + [-1] * span)[:span]]
    at_, parent, depth_, rank, path, inner_, slot_ = upload_tables(
        [at, parents, depth, [d * len(paths) - first[i] for i, d in enumerate(depth)], padded, inner,
         [slot[p] for p in parents]], device)
    return Shape(mask=mask.to(device), offsets=depth_ if offsets is None else offsets.to(device), at=at_,
                 parent=parent, sees=sees[:, 1:].to(device), depth=depth_, rank=rank, path=path.view(n, span),
                 at_host=list(at), span=span, causal=chain, prefix=prefix, inner=inner_, slot=slot_)


@lru_cache(maxsize=256)
def chain_shape(n: int, device=None) -> Shape:
    """A chain of ``n`` drafts after the root, fed as a plain causal block."""
    return tree_shape(list(range(n)), device=device)


@dataclass
class Proposal:
    """What a drafter proposes for one step: the block's tokens after the root (the tree nodes at ``shape.at``,
    extra rows elsewhere), its shape, and optionally the draft distributions of a sampled chain (rejection
    sampling) and a device hook run right after verification: ``after(step) -> (tensor to read, kept)``."""

    tokens: torch.Tensor | list[int]
    shape: Shape
    q: torch.Tensor | None = None  # [N, V]: a sampled chain's draft distributions
    after: Callable[[Step], tuple[torch.Tensor | None, Any]] | None = None


def read_argmax(step: Step):
    """An ``after`` hook: read the target's argmax at every row with the verdict (next guesses, harvests)."""
    return step.y, None


class Step(NamedTuple):
    """The verifications of B rows on the device (B = 1 alone; in a batch, the rows that share a hook), what
    ``after`` hooks see: a hook returns (what to read, [B, ...] or None; what to keep, [B, ...] or None) and each row
    gets its own row of both."""

    logits: torch.Tensor  # [B, 1 + Q, V] from the root on
    y: torch.Tensor  # [B, 1 + Q] argmax per block row (the drafters' guesses, also under sampling)
    right: torch.Tensor  # [B, N] each node's token equals the draw at its parent
    best: torch.Tensor  # [B] the accepted input
    a: torch.Tensor  # [B] accepted nodes
    path: torch.Tensor  # [B, span] tree inputs root -> best, -1 padded

    def logits_at(self, at: torch.Tensor) -> torch.Tensor:
        """Each row's logits at its block rows ``at`` [B, r] (>= 0): [B, r, V]. One ``index_select`` of the rows
        flattened: a gather over an index expanded to the vocabulary (or ``take_along_dim``, which also wraps the
        index) costs ~3x as much on the CPU, ~0.1-0.2 ms of a TR-Jacobi step's verify."""
        B, Q, V = self.logits.shape
        # each row's offset into the flattened rows (alone it is 0: a step at batch 1 skips the two ops)
        rows = at + torch.arange(0, B * Q, Q, device=at.device)[:, None] if B > 1 else at
        return self.logits.reshape(B * Q, V).index_select(0, rows.reshape(-1)).view(B, -1, V)


class Rules(NamedTuple):
    """Tree tables with a leading row dimension: one shape's (1 row, broadcast to every row judged by it,
    ``Shape.rules``) or B rows' shapes padded to the largest (``rules_of``). A pad input is never the best (rank -1)
    and a pad node never right (its proposed token is -1)."""

    at: torch.Tensor  # [R, N + 1] block row of each tree input
    parent: torch.Tensor  # [R, N]
    sees: torch.Tensor  # [R, N + 1, N]
    rank: torch.Tensor  # [R, N + 1]
    depth: torch.Tensor  # [R, N + 1]
    path: torch.Tensor  # [R, N + 1, span]
    prefix: bool  # every row's inputs are its block's first rows: a slice picks them
    chain: bool  # every row's tree is a chain or the root alone: the matching prefix is accepted


def rules_of(shapes: list[Shape]) -> Rules:
    """The rules of B rows' shapes, padded to the most nodes and the longest span among them."""
    n, span = max(s.nodes for s in shapes), max(s.span for s in shapes)
    if all(s is shapes[0] for s in shapes):
        return shapes[0].rules(n, span)
    each = [s.rules(n, span) for s in shapes]
    chain = all(r.chain for r in each)
    # a chain's rule reads the rows and the first path only (the other tables: the first row's, unread)
    tables = [torch.cat(f) if not chain or i in (0, 5) else f[0] for i, f in enumerate(list(zip(*each))[:6])]
    return Rules(*tables, prefix=all(r.prefix for r in each), chain=chain)
