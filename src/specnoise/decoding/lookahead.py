"""Lookahead decoding (LADE, ALGORITHMS.md §7): a 2-D window of guesses and an n-gram pool, one forward per step.

Each step feeds, after the uncached context ending in the root ``c``, two branches that never see each other:
  * the lookahead branch: N-1 rows of W guesses; cell (r, i) sits at position p+r+i and sees row 0 up to
    column i and column i of rows 1..r, i.e. one Jacobi trajectory per column. The last row's predictions
    close one n-gram per column, which goes into the pool, and become the window's new last row;
  * the verification branch: the pool's n-grams for ``c``, each a chain hanging after ``c``.
The longest verified n-gram is accepted and its KV moved next to the cache. ``LookaheadWindow`` is the
reusable part: Ouroboros runs the same window on its draft model.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import lru_cache
from typing import NamedTuple

import torch

from specnoise.decoding.base import Decoder, Output
from specnoise.decoding.kv import KVModel
from specnoise.decoding.ngram import NGramPool, ahead_noise
from specnoise.decoding.trees import with_prefix


class Layout(NamedTuple):
    tree: torch.Tensor  # bool [q, q]: who sees whom inside the block
    offsets: torch.Tensor  # position of each token minus the position of the block's first token
    last_row: list[int]  # the window's last row (row 0 includes the root), counted from the root (= 0)
    ngrams: list[list[int]]  # each n-gram's tokens, counted from the root


def layout(trunk: int, rows: tuple[int, ...], k: int, m: int, device=None) -> Layout:
    """The block [trunk (causal, ends in the root) | window rows | k n-grams of m tokens], its tensors on ``device``.

    ``rows`` are the window's row lengths; row 0 counts the root as its column 0. Indices count from the root:
    only the rows from the root on need logits.
    """
    core, n = _core(rows, k, m, device), trunk - 1  # the context before the root comes first
    if n == 0:
        return core
    offsets = torch.cat([torch.arange(n, device=core.offsets.device), core.offsets + n])
    return core._replace(tree=with_prefix(core.tree, n), offsets=offsets)


@lru_cache(maxsize=256)
def _core(rows: tuple[int, ...], k: int, m: int, device=None) -> Layout:
    """The block from the root on, built once per shape and device (the context before the root varies: not
    cached), so a steady-state step copies no layout to the device."""
    index, nxt = [], 1  # index[r][i] = block index of window cell (r, i); the root is 0
    for r, length in enumerate(rows):
        first = [0] if r == 0 else []
        index.append(first + list(range(nxt, nxt + length - len(first))))
        nxt += length - len(first)
    ngrams = [list(range(nxt + g * m, nxt + (g + 1) * m)) for g in range(k)]
    tree = torch.eye(nxt + k * m, dtype=torch.bool)
    tree[:, 0] = True  # everything sees the root
    offsets = torch.zeros(nxt + k * m, dtype=torch.long)  # positions after the root's
    for r, row in enumerate(index):
        for i, cell in enumerate(row):
            tree[cell, index[0][1:i + 1]] = True  # row 0 up to this column
            tree[cell, [index[s][i] for s in range(1, r + 1)]] = True  # this column of rows 1..r
            offsets[cell] = r + i
    for nodes in ngrams:
        for j, node in enumerate(nodes):
            tree[node, nodes[:j + 1]] = True
            offsets[node] = 1 + j
    return Layout(tree.to(device), offsets.to(device), index[-1] if index else [], ngrams)


Pick = Callable[[int, list[int]], tuple[int, bool]]


def greedy_pick(y: list[int]) -> Pick:
    """The greedy decision at block index ``at``: the target's argmax there (``y``, read once per step), and
    whether a candidate matches it."""
    return lambda at, candidates: (y[at], y[at] in candidates)


def walk(paths: list, nodes: list[list[int]], root: int, pick: Pick) -> tuple[list[int], list[int]]:
    """Accept the longest verified prefix along a trie of candidate paths hanging after block index ``root``.

    paths[i][j] is verified at the prediction of its parent (``root`` for j = 0, else nodes[i][j-1]). At each
    depth ``pick(at, candidates)`` decides among the distinct candidates of the paths still alive (greedy: the
    argmax; sampling: sequential multi-candidate rejection). Returns the emitted tokens (accepted candidates plus
    the target's own next token) and the block indices of the accepted candidates, along the first surviving path
    (the first path with the longest match).
    """
    live, out, at = list(range(len(paths))), [], root
    while True:
        j = len(out)
        token, hit = pick(at, _candidates(paths, live, j))
        out.append(token)
        if not hit:
            return out, (nodes[live[0]][:j] if live else [])
        live = _follow(paths, live, j, token)
        at = nodes[live[0]][j]


def branch_points(paths: list, nodes: list[list[int]], root: int) -> dict[int, list[int]]:
    """Every block index ``walk`` may pick at, with the candidates it would try there, whatever it picks before:
    a sampling walk can then draw all its decisions in one batch on the device and read them back once."""
    points: dict[int, list[int]] = {}

    def explore(live: list[int], j: int, at: int) -> None:
        points[at] = _candidates(paths, live, j)
        for token in points[at]:
            alive = _follow(paths, live, j, token)
            explore(alive, j + 1, nodes[alive[0]][j])

    explore(list(range(len(paths))), 0, root)
    return points


def _candidates(paths: list, live: list[int], j: int) -> list[int]:
    return list(dict.fromkeys(paths[i][j] for i in live if j < len(paths[i])))


def _follow(paths: list, live: list[int], j: int, token: int) -> list[int]:
    return [i for i in live if j < len(paths[i]) and paths[i][j] == token]


class LookaheadWindow:
    """The 2-D window over one model and the n-gram pool it feeds. ``rows[0][0]`` stands for the root."""

    def __init__(self, N: int, W: int, pool: NGramPool, context: list[int], generator: torch.Generator,
                 read: Callable[[torch.Tensor], list], faithful: bool = False):
        """read: the decoder's ``to_host`` (one read per step)."""
        self.N, self.pool, self.read, self.faithful = N, pool, read, faithful
        # warm-up (§7.1): row 0 starts N-2 columns longer than W so that, losing one column per warm-up step
        # while the rows below it fill in, every row ends W columns long
        self.rows = [[-1] + ahead_noise(context, W + N - 3, generator)]

    def step(self, model: KVModel, tokens: list[int], vocab: int | None = None) -> list[int]:
        """One forward of ``model`` over the uncached part of ``tokens`` (the last one is the root), the window and
        the pool's n-grams for the root. Returns the accepted greedy tokens (>= 1); afterwards the cache holds
        ``tokens`` + all of them but the last. ``vocab`` limits argmaxes to a shared vocabulary."""
        P = model.length
        trunk, root, m = tokens[P:], tokens[-1], self.N - 1
        ngrams = self.pool.get(root)
        lay = layout(len(trunk), tuple(map(len, self.rows)), len(ngrams), m, model.device)
        cells = self.rows[0][1:] + [t for row in self.rows[1:] for t in row]
        positions = (lay.offsets + P).clamp_(max=model.max_length - 1)  # window guesses may run past the context
        block = trunk + cells + [t for g in ngrams for t in g]
        logits = model.forward(block, positions, lay.tree, last=len(block) - len(trunk) + 1)[:, :vocab]
        paths = [g[:m - 1] if self.faithful else g for g in ngrams]  # LADE drops a full match's bonus token
        y = self.read(logits.argmax(-1))  # every decision of the step from one read
        out, kept = walk(paths, lay.ngrams, 0, greedy_pick(y))
        root_slot = P + len(trunk) - 1
        model.compact(root_slot + 1, [root_slot + i for i in kept])
        self._advance(root, [y[i] for i in lay.last_row])
        return out

    def _advance(self, root: int, new: list[int]) -> None:
        """Move the window one column on, whatever was accepted (LADE's ALWAYS_FWD_ONE)."""
        if len(self.rows) < self.N - 1:  # warm-up: one more row, each row loses its first column
            self.rows = [row[1:] for row in self.rows] + [new[1:]]
            return
        for i in range(len(new)):  # each column closes an n-gram: its row-0 token, the rows below, the prediction
            self.pool.insert(root if i == 0 else self.rows[0][i], [row[i] for row in self.rows[1:]] + [new[i]])
        self.rows = self.rows[1:] + [new]


class Lookahead(Decoder):
    name = "lookahead"

    def decode(self, prompt: list[int], out: Output) -> None:
        cfg = self.cfg
        noise = torch.Generator().manual_seed(cfg.seed)  # per prompt: speed independent of prompt order
        window = LookaheadWindow(cfg.N, cfg.W, NGramPool(cfg.G), prompt, noise, self.to_host, cfg.faithful)
        seq = list(prompt)  # the first step is fused with the prefill
        while not out.done:
            seq += out.emit(window.step(self.target, seq))
