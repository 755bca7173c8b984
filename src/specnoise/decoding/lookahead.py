"""Lookahead decoding (LADE, docs/algorithms.md §7): a 2-D window of guesses and an n-gram pool, one forward per step.

Each step feeds, after the uncached context ending in the root ``c``, two branches that never see each other:
  * the lookahead branch: N-1 rows of W guesses; cell (r, i) sits at position p+r+i and sees row 0 up to
    column i and column i of rows 1..r, i.e. one Jacobi trajectory per column. The last row's predictions
    close one n-gram per column, which goes into the pool, and become the window's new last row;
  * the verification branch: the pool's n-grams for ``c``, each a chain hanging after ``c``: the tree the verifier
    checks (the window rides along as extra rows). The longest verified n-gram is accepted (the first on a tie).
``Window`` is the reusable part: Ouroboros runs the same window on its draft model.
"""

from __future__ import annotations

from functools import lru_cache
from typing import NamedTuple

import torch

from specnoise.decoding.acceptance import Backoff
from specnoise.decoding.cost import CHAIN, TREE
from specnoise.decoding.drafter import Drafter
from specnoise.decoding.ngram import NGramPool, ahead_noise
from specnoise.decoding.proposal import Proposal, Shape, tree_shape


class Layout(NamedTuple):
    tree: torch.Tensor  # bool [q, q]: who sees whom inside the block
    offsets: torch.Tensor  # position of each token minus the root's
    last_row: list[int]  # the window's last row (row 0 includes the root), counted from the root (= 0)
    ngrams: list[list[int]]  # each n-gram's tokens, counted from the root


@lru_cache(maxsize=256)
def layout(rows: tuple[int, ...], k: int, m: int, device=None) -> Layout:
    """The block [root | window rows | k n-grams of m tokens], its tensors on ``device``, built once per shape and
    device, so a steady-state step copies no layout to the device.

    ``rows`` are the window's row lengths; row 0 counts the root as its column 0. Indices count from the root."""
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


@lru_cache(maxsize=256)
def window_shape(rows: tuple[int, ...], k: int, m: int, faithful: bool, device=None) -> tuple[Shape, ReadRows]:
    """The verifier's shape of [root | window rows | k n-grams of m tokens]: the tree is the n-gram chains (faithful,
    as LADE: without their last token, which is fed but never accepted), the window extra rows. And the hook that
    reads the window's last-row predictions with the verdict."""
    lay = layout(rows, k, m, device)
    kept = m - 1 if faithful else m
    tree_rows, parents, paths = [0], [], []
    for g in lay.ngrams:
        path = [0]
        for row in g[:kept]:
            parents.append(path[-1])
            tree_rows.append(row)
            path.append(len(tree_rows) - 1)
        paths.append(path)
    shape = tree_shape(parents, paths or None, mask=lay.tree, offsets=lay.offsets, at=tree_rows, device=device)
    return shape, ReadRows(torch.tensor(lay.last_row, dtype=torch.long, device=device))


class ReadRows:
    """An ``after`` hook: read the target's argmax at fixed block rows with the verdict."""

    def __init__(self, at: torch.Tensor):
        self.at = at

    def __call__(self, step):
        return step.y.index_select(1, self.at), None


class Window:
    """The 2-D window over one model and the n-gram pool it feeds. ``rows[0][0]`` stands for the root."""

    def __init__(self, N: int, W: int, pool: NGramPool, context: list[int], generator: torch.Generator,
                 faithful: bool = False):
        self.N, self.pool, self.faithful = N, pool, faithful
        # warm-up (§7.1): row 0 starts N-2 columns longer than W so that, losing one column per warm-up step
        # while the rows below it fill in, every row ends W columns long
        self.rows = [[-1] + ahead_noise(context, W + N - 3, generator)]

    def cells(self) -> int:
        return sum(map(len, self.rows)) - 1  # the window's rows fed after the root

    def propose(self, root: int, device, count: int | None = None) -> Proposal:
        """The window and the pool's n-grams for ``root`` (the first ``count`` of them) as one proposal."""
        ngrams = self.pool.get(root)[:count]
        shape, read_last_row = window_shape(tuple(map(len, self.rows)), len(ngrams), self.N - 1, self.faithful, device)
        cells = self.rows[0][1:] + [t for row in self.rows[1:] for t in row]
        return Proposal(cells + [t for g in ngrams for t in g], shape, after=read_last_row)

    def advance(self, root: int, new: list[int]) -> None:
        """Move the window one column on, whatever was accepted (LADE's ALWAYS_FWD_ONE); ``new``: the predictions
        at the last row (row 0 includes the root)."""
        if len(self.rows) < self.N - 1:  # warm-up: one more row, each row loses its first column
            self.rows = [row[1:] for row in self.rows] + [new[1:]]
            return
        for i in range(len(new)):  # each column closes an n-gram: its row-0 token, the rows below, the prediction
            self.pool.insert(root if i == 0 else self.rows[0][i], [row[i] for row in self.rows[1:]] + [new[i]])
        self.rows = self.rows[1:] + [new]


# decoder.auto: the window runs at every step of a generation while its forward costs at most WINDOW_NEAR more than an
# AR step's and, from the generation's WINDOW_TRIAL-th windowed step on, its windowed steps have emitted at least an AR
# step's tokens per second (priced by the curve); elsewhere only on the backoff's explorations. The window's worth is
# an investment (the pool it fills pays in later steps), which a fixed threshold on its forward's cost cannot price.
# On an H100 (CUDA graphs) the 28-token window's forward measured 1.10x an AR step in one lease and 1.28x in the next:
# with a threshold of 1/16 Lookahead fell from 1.73x to 0.93x AR on Spec-Bench in the first; with 1/4, in the next, it
# ran at 1.71x there but at 1.01x on HumanEval (it never drafted), where its faithful setting ran at 1.24x. On the CPU
# the window costs 1.7-2.5x (experiments/hardware-aware/tiny): there the backoff decides, as before.
WINDOW_NEAR, WINDOW_TRIAL = 0.5, 24


class Lookahead(Drafter):
    name = "lookahead"
    kept = ("idle",)  # its n-gram pool is a generation's own

    def setup(self):
        # decoder.auto: when a run of AR steps runs the window; its gap kept across prompts (Backoff.restart)
        self.idle = Backoff(unpaid=True)
        self.trees: dict[int, tuple[list[int], list[int]]] = {}  # decoder.auto: n-gram tokens -> parents, sizes

    def fork(self, decoder):
        clone = super().fork(decoder)
        clone.idle = Backoff(unpaid=True)  # a row's own
        return clone

    def begin(self, prompt, budget, seed):
        super().begin(prompt, budget, seed)
        self.window = Window(self.cfg.N, self.cfg.W, NGramPool(self.cfg.G), prompt, self.noise, self.cfg.faithful)
        self.idle.restart()  # a new text: the window explores at the EXPLORE-th AR step again, the gap kept
        self.windowed = True
        # decoder.auto (``steady``): this generation's windowed steps, the tokens they emitted, their forwards' price
        self.runs, self.emitted, self.spent, self.stopped = 0, 0, 0.0, False

    def propose(self, room):
        count = None
        if self.decoder.auto is not None:
            # the controller cuts whole n-grams (pool order), the window riding along as extra rows. A step that
            # verifies none is a plain AR step without the window, unless the window runs at every step here
            # (``steady``) or the run of such steps is due to explore (acceptance.Backoff: the EXPLORE-th, then ever
            # more rarely while the run lasts)
            m = self.cfg.N - 2 if self.cfg.faithful else self.cfg.N - 1
            cells, cost = self.window.cells(), self.decoder.auto.cost
            n = len(self.window.pool.get(self.seq[-1])) * m
            if n not in self.trees:  # each n-gram a chain off the root; the sizes: whole n-grams (once per count)
                self.trees[n] = ([-1 if j % m == 0 else j - 1 for j in range(n)], list(range(0, n + 1, max(m, 1))))
            parents, cuts = self.trees[n]
            count = self.cut(n, extra=cells, cuts=cuts, parents=parents) // max(m, 1)
            if count:
                self.idle = Backoff(unpaid=True)
            self.windowed = bool(count) or self.steady(cost, cells) or self.idle.due()
            if not self.windowed:
                return self.chain([])
        return self.window.propose(self.seq[-1], self.target.device, count)

    def steady(self, cost, cells: int) -> bool:
        """decoder.auto: whether the window runs at every step of this generation (WINDOW_NEAR, WINDOW_TRIAL). Once
        its windowed steps fall short of an AR step's tokens per second, it stops for the rest of the generation."""
        if self.stopped or cost(1 + cells, TREE) > cost(1, CHAIN) * (1 + WINDOW_NEAR):
            return False
        self.stopped = self.runs >= WINDOW_TRIAL and self.emitted / self.spent < 1 / cost(1, CHAIN)
        return not self.stopped

    def observe(self, v):
        root = self.seq[-1]
        super().observe(v)
        if not self.windowed:  # a plain AR step (decoder.auto)
            return
        if self.decoder.auto is not None and not self.stopped:  # priced as fed: the root, the window, the n-grams
            self.runs, self.emitted = self.runs + 1, self.emitted + 1 + v.accepted
            self.spent += self.decoder.auto.cost(1 + self.window.cells() + v.shape.nodes, TREE)
        self.window.advance(root, v.extra)
