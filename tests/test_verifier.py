"""The verifier on its own: which path a tree step accepts, the KV it keeps, and the two sampling rules (a draw per
output position for deterministic proposals, rejection sampling for a sampled chain) against exact distributions.
Decoders through it are tested in test_lossless.py (greedy) and test_sampling_decoders.py (sampling)."""

from __future__ import annotations

import pytest
import torch

from specnoise.config import ARConfig
from specnoise.decoding.kv import DynamicEngine
from specnoise.decoding.proposal import Proposal, Step, chain_shape, tree_shape
from specnoise.decoding.verifier import Verifier, prompt_seed

TRIALS = 4000
THRESHOLD = 0.05  # TV of 4000 exact draws over <= 6 outcomes is ~0.015; the wrong samplers are > 0.1 away


def tv(samples: torch.Tensor, p: torch.Tensor) -> float:
    counts = torch.bincount(samples, minlength=len(p)).float()
    return 0.5 * float((counts / counts.sum() - p).abs().sum())


def dist(seed: int, v: int = 6, sharp: float = 1.5) -> torch.Tensor:
    return torch.softmax(torch.randn(v, generator=torch.Generator().manual_seed(seed)) * sharp, -1)


def one_hot_logits(best: list[int], v: int = 10) -> torch.Tensor:
    logits = torch.full((len(best), v), -1.0)
    logits[range(len(best)), best] = 1.0
    return logits


def greedy(shape, logits, nodes):
    read, _, _, bonus, _ = Verifier(None, None).verify(shape, None, logits, torch.tensor(nodes), None, None, None)
    read = read.tolist()
    a = read[0]
    return read[1:a + 2], read[1 + shape.span:1 + 2 * shape.span][:a + 1], int(bonus)


def test_tree_step_takes_the_deepest_match_on_the_earliest_path():
    # root; a chain 4 -> 9 (inputs 1, 2); two chains 4 -> 5 -> 6 and 4 -> 5 -> 7 (inputs 3..5 and 6..8)
    parents = [0, 1, 0, 3, 4, 0, 6, 7]
    paths = [[0, 1, 2], [0, 3, 4, 5], [0, 6, 7, 8]]
    nodes = [4, 9, 4, 5, 6, 4, 5, 7]
    shape = tree_shape(parents, paths)
    # argmax after each input: root 4, (1) 5, (2) x, (3) 5, (4) 6, (5) 8, (6) 5, (7) 6, (8) x
    tokens, path, bonus = greedy(shape, one_hot_logits([4, 5, 1, 5, 6, 8, 5, 6, 1]), nodes)
    assert tokens == [4, 5, 6, 8] and path == [0, 3, 4, 5] and bonus == 8  # the second chain: first of the deepest
    tokens, path, _ = greedy(shape, one_hot_logits([3, 5, 1, 5, 6, 8, 5, 6, 1]), nodes)
    assert tokens == [3] and path == [0]  # nothing matches: the target's own token alone


def test_chain_step_accepts_the_matching_prefix():
    shape = chain_shape(3)
    assert shape.causal
    tokens, path, _ = greedy(shape, one_hot_logits([7, 8, 2, 5]), [7, 8, 9])
    assert tokens == [7, 8, 2] and path == [0, 1, 2]


def test_tree_step_keeps_only_the_accepted_paths_kv(target):
    """After commit, the cache holds prefix + root + the accepted nodes, and the next token's logits are those of a
    plain forward of that text."""
    kv = DynamicEngine(target.model)
    verifier = Verifier(kv, torch.Tensor.tolist)
    prefix = [5, 6, 7]
    y = DynamicEngine(target.model).forward(prefix).argmax(-1).tolist()
    second = DynamicEngine(target.model).forward(prefix + [y[-1]]).argmax(-1).tolist()[-1]
    wrong = (y[-1] + 1) % 90 + 3
    # two children of the root: a wrong one first, then the right one with its right child
    shape = tree_shape([0, 0, 2])
    v = verifier.step(prefix, Proposal([wrong, y[-1], second], shape), base=0)
    assert v.tokens[:2] == [y[-1], second] and v.path[:3] == [0, 2, 3]
    verifier.commit(v)
    assert kv.length == len(prefix) + 2  # root + two accepted nodes; the bonus has no KV yet
    ref = DynamicEngine(target.model).forward(prefix + [y[-1], second, v.tokens[2]])[-1]
    assert torch.allclose(kv.forward([v.tokens[2]])[-1], ref, atol=1e-4)


@pytest.mark.parametrize("B", [1, 3])
def test_a_hook_reads_each_rows_own_logits_at_its_block_rows(B):
    logits = torch.randn(B, 7, 11)
    at = torch.randint(0, 7, (B, 4))
    got = Step(logits, *[None] * 5).logits_at(at)
    assert got.shape == (B, 4, 11)
    for b in range(B):
        for j in range(4):
            assert torch.equal(got[b, j], logits[b, at[b, j]])


def test_per_prompt_seeds_differ_by_prompt_and_seed():
    assert prompt_seed(0, [1, 2, 3]) == prompt_seed(0, [1, 2, 3])
    assert len({prompt_seed(s, p) for s in (0, 1) for p in ([1, 2, 3], [1, 2, 4], [12, 3])}) == 6


def sampled_first_tokens(shape, p_rows, nodes, q=None, trials=TRIALS, seed=0):
    """The first emitted token of ``trials`` verifications of the same proposal, each with fresh uniforms."""
    verifier = Verifier(None, None, sampling=ARConfig(temperature=1.0))
    gen = torch.Generator().manual_seed(seed)
    logits, nodes, out = p_rows.log(), torch.tensor(nodes), []
    for _ in range(trials):
        u, v = torch.rand(2, shape.span, generator=gen, dtype=torch.float64)
        read = verifier.verify(shape, None, logits, nodes, u, v, q)[0]
        out.append(int(read[1]))
    return torch.tensor(out)


@pytest.mark.parametrize("seed", [0, 1])
def test_rejection_sampling_keeps_the_target_distribution(seed):
    """A draft sampled from q, kept with probability min(1, p/q), else replaced from the residual: the first token
    is p's. Trusting the draft (always keeping it) is q's, and the same threshold sees it."""
    p, q = torch.stack([dist(seed), dist(seed + 10)]), dist(seed + 20).view(1, -1)
    verifier = Verifier(None, None, sampling=ARConfig(temperature=1.0))
    gen, shape, firsts = torch.Generator().manual_seed(seed), chain_shape(1), []
    drafts = torch.multinomial(q[0], TRIALS, replacement=True, generator=gen)
    for d in drafts:
        u, v = torch.rand(2, shape.span, generator=gen, dtype=torch.float64)
        firsts.append(int(verifier.verify(shape, None, p.log(), d.view(1), u, v, q)[0][1]))
    assert tv(torch.tensor(firsts), p[0]) < THRESHOLD
    assert tv(drafts, p[0]) > 2 * THRESHOLD


@pytest.mark.parametrize("candidates", [[2], [0, 3, 1], [1, 1, 4]])
def test_a_draw_per_input_keeps_the_target_distribution_for_any_proposal(candidates):
    """Deterministic children of the root (any tokens, repeated ones too): the first token is p's draw whatever they
    are, and a verifier that accepts a child whenever it is the target's argmax does not."""
    p = dist(7)
    shape = tree_shape([0] * len(candidates))
    rows = p.expand(len(candidates) + 1, -1)
    assert tv(sampled_first_tokens(shape, rows, candidates), p) < THRESHOLD
    best = int(p.argmax())
    wrong = torch.where(torch.rand(TRIALS, generator=torch.Generator().manual_seed(1)) < p.max() + 0.2,
                        torch.tensor(best), sampled_first_tokens(shape, rows, candidates))
    assert tv(wrong, p) > THRESHOLD


def test_a_sampled_tree_step_warps_only_inputs_with_children_and_the_best(monkeypatch):
    """Under sampling a node is tested against its parent's draw: leaves need no warp (only the accepted best's, for
    the bonus), and the tokens are those of warping every row."""
    from specnoise.decoding import verifier

    parents = [0, 1, 0, 3, 4, 0, 6, 7]  # inputs with children: 0, 1, 3, 4, 6, 7 (leaves 2, 5, 8)
    shape = tree_shape(parents, [[0, 1, 2], [0, 3, 4, 5], [0, 6, 7, 8]])
    logits = torch.randn(9, 10, generator=torch.Generator().manual_seed(0)) * 3
    nodes = torch.tensor([4, 9, 4, 5, 6, 4, 5, 7])
    u = torch.rand(shape.span, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    cfg = ARConfig(temperature=0.9, top_p=0.9)
    rows: list[int] = []
    real = verifier.warp
    monkeypatch.setattr(verifier, "warp", lambda x, c: rows.append(x.shape[0]) or real(x, c))
    read, *_ = Verifier(None, None, cfg).verify(shape, None, logits, nodes, u, None, None)
    assert rows == [6, 1]
    # the same draws as warping all nine rows at once
    picks = verifier.draw(real(logits, cfg), u.index_select(0, shape.depth))
    a = int(read[0])
    path = read[1 + shape.span:1 + 2 * shape.span][:a + 1].tolist()
    assert read[1:a + 2].tolist() == picks[path].tolist()


class KeepTop:
    """An ``after`` hook of one row's own state (as Token Recycling's): reads the root's argmax, keeps its top-2."""

    def __call__(self, step):
        return step.y[:, :1], step.logits[:, 0].topk(2, dim=-1).indices


@pytest.mark.parametrize("kinds", ["every kind", "chains only"])
def test_rows_judged_together_equal_each_judged_alone(kinds):
    """A batch's greedy rows of different shapes (a tree, chains, the root alone, a block with a row outside its
    tree; or chains alone, which take the chain's rule), padded to the largest and judged in one function, get each
    the reply it gets alone: what the host reads, what its hook keeps, the argmax, the bonus token and the path."""
    from specnoise.decoding.proposal import read_argmax
    from specnoise.decoding.verifier import TOGETHER_CPU, Check, judge_rows

    g = torch.Generator().manual_seed(0)
    tree = tree_shape([0, 1, 0, 3, 4, 0, 6, 7], [[0, 1, 2], [0, 3, 4, 5], [0, 6, 7, 8]])
    extra_row = tree_shape([0, 1], mask=torch.tril(torch.ones(4, 4, dtype=torch.bool)),
                           offsets=torch.tensor([0, 1, 1, 2]), at=[0, 2, 3])
    rows = [(chain_shape(3), None), (chain_shape(0), KeepTop()), (chain_shape(5), read_argmax),
            (chain_shape(3), None), (chain_shape(5), read_argmax)] * 2
    if kinds == "every kind":
        rows += [(tree, read_argmax), (tree, read_argmax), (extra_row, None), (tree, KeepTop())]
    checks, verifier = [], Verifier(None, None)
    for shape, after in rows:
        logits = torch.randn(shape.last, 12, generator=g)
        y = logits.argmax(-1)
        at_parent = y.index_select(0, shape.at.index_select(0, shape.parent))
        wrong = torch.randint(0, 12, at_parent.shape, generator=g)
        nodes = torch.where(torch.rand(at_parent.shape, generator=g) < 0.75, at_parent, wrong)
        checks.append(Check(verifier, shape, after, False, (logits, nodes)))
    # a chain accepted whole whose bonus token is 0: its pad nodes must not match what comes after it
    checks.append(Check(verifier, chain_shape(1), None, False, (one_hot_logits([7, 0], 12), torch.tensor([7]))))
    assert len(checks) >= TOGETHER_CPU  # enough rows to be judged together on the CPU
    together = judge_rows(checks)
    accepted = []
    for check, got in zip(checks, together):
        alone = verifier.verify(check.shape, check.after, *check.args, None, None, None)
        (tokens, path, extra), (tokens_, path_, extra_) = verdict(got), verdict(alone)
        span, last = check.shape.span, check.shape.last
        assert tokens == tokens_ and extra == extra_ and path[:span] == path_ and set(path[span:]) <= {-1}
        assert (got[1] is None) == (alone[1] is None) and (got[1] is None or torch.equal(got[1], alone[1]))
        assert torch.equal(got[2][:last], alone[2]) and torch.equal(got[3], alone[3])  # argmax, bonus token
        assert torch.equal(got[4][:span], alone[4])  # the path on the device
        accepted.append(len(tokens) - 1)
    assert max(accepted) >= 2 and min(accepted) == 0  # the rows' verdicts differ: deep matches and none


def verdict(reply):
    """What the host reads of a step's reply, as ``Verifier.steps`` parses it: (tokens, path, the hook's read)."""
    values, span = reply[0].tolist(), reply[4].shape[-1]
    a = values[0]
    return values[1:a + 2], values[1 + span:1 + 2 * span], values[1 + 2 * span:]
