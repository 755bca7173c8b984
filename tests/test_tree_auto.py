"""decoder.tree=auto: per-node path acceptance, the size that maximises accepted tokens per second, sub-trees
that stay trees, and TR-Jacobi on any picked sub-tree still equal to AR (fp32, two families)."""

from __future__ import annotations

import json

import pytest
import torch
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from conftest import prompts
from helpers_decoding import CYCLE, ar, cycle_successor, map_model
from helpers_models import save_tiny_model
from specnoise.bench.runner import run_benchmark
from specnoise.config import ConfigError, TRJacobiConfig, config_dir
from specnoise.decoding.base import build_decoder
from specnoise.decoding.trees import AUTO_TEMPLATE, NodeStats, best_size, build_tree, sub_tree

PROMPTS = prompts(5, seed=3)


# ------------------------------------------------------------------------------------------ selection
def test_best_size_trades_acceptance_against_cost():
    p = [0.05, 0.9, 0.1, 0.5]
    assert best_size(p, lambda q: 1.0) == 4  # free nodes: take every node that can be right
    assert best_size(p, lambda q: 1 + 0.2 * (q - 1)) == 2  # 2.4 / 1.4 beats 1.9 / 1.2 and 2.5 / 1.6
    assert best_size(p, lambda q: float(q)) == 1  # every node costs a whole forward: 1.9 / 2 beats 2.4 / 3
    assert best_size([0.0] * 5, lambda q: 1.0) == 1  # nothing to gain: the smallest tree


def test_node_stats_count_whole_paths():
    tree = build_tree("2level_12", topk=6, retrieval_len=2)  # inputs: root, (6,), (6, 6), (0,), (1,), ...
    index = {node: i for i, node in enumerate(tree.nodes)}
    stats = NodeStats(tree)
    right = [False] * (len(tree.nodes) + 1)
    right[index[(6,)] + 1] = right[index[(6, 6)] + 1] = True  # the whole retrieval chain
    right[index[(0, 0)] + 1] = True  # right after a wrong parent: its path is wrong
    stats.observe(right)
    right[index[(6,)] + 1] = False
    right[index[(0,)] + 1] = True
    stats.observe(right)
    hits, trials = dict(zip(tree.nodes, stats.hits)), dict(zip(tree.nodes, stats.trials))
    assert stats.steps == 2
    assert hits[(6,)] == hits[(6, 6)] == hits[(0,)] == hits[(0, 0)] == 1 and hits[(1,)] == hits[(1, 0)] == 0
    assert trials[(6,)] == trials[(0,)] == 2 and trials[(6, 6)] == trials[(0, 0)] == 1 and trials[(1, 0)] == 0
    p = dict(zip(tree.nodes, stats.p()))  # own rate given the parent right, (hits + 1) / (trials + 2), x parent's
    assert p[(0,)] == 0.5 and p[(1,)] == 0.25 and p[(0, 0)] == pytest.approx(0.5 * 2 / 3)
    assert p[(1, 0)] == pytest.approx(0.25 * 0.5)  # never tried: the prior

    # a step on a sub-tree counts for the nodes it kept
    small, _, kept = sub_tree(tree, [1.0, 0.9] + [0.0] * (len(tree.nodes) - 2), 2, topk=6)
    assert small.nodes == [(6,), (6, 6)] and kept == [0, 1]
    for _ in range(4):
        stats.observe([False, True, True], small, kept)
    assert stats.trials[:3] == [6, 5, 2] and stats.hits[:3] == [5, 5, 1]
    assert stats.p()[:2] == [pytest.approx(6 / 8), pytest.approx(6 / 8 * 6 / 7)]


def closed(tree, p):
    """p made consistent the way path counts are: a node never beats its parent."""
    p = list(p)
    for i in range(1, len(p) + 1):
        if tree.parent[i]:
            p[i - 1] = min(p[i - 1], p[tree.parent[i] - 1])
    return p


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_sub_trees_are_the_top_nodes_and_stay_trees(seed):
    full = build_tree(AUTO_TEMPLATE, topk=10, retrieval_len=5)
    p = closed(full, torch.rand(len(full.nodes), generator=torch.Generator().manual_seed(seed)).tolist())
    ranked = sorted(p, reverse=True)
    for k in range(1, len(full.nodes) + 1):
        tree, chain, kept = sub_tree(full, p, k, topk=10)
        assert len(tree.nodes) == k and tree.nodes == [full.nodes[i] for i in kept]
        assert tree.nodes[:chain] == [(10,) * d for d in range(1, chain + 1)]  # a prefix of the retrieval chain
        assert all(node[:d] in tree.nodes for node in tree.nodes for d in range(1, len(node)))  # ancestors kept
        assert sum(p[i] for i in kept) == pytest.approx(sum(ranked[:k]))
        assert tree.width == (11 if chain else 10)


def test_auto_is_a_tree_option():
    assert TRJacobiConfig(tree="auto").tree == "auto"
    with pytest.raises(ConfigError, match="decoder.calibrate"):
        TRJacobiConfig(tree="auto", calibrate=0)


# ------------------------------------------------------------------------------------------ exactness
def test_auto_tree_tokens_equal_ar(target):
    decoder = build_decoder(TRJacobiConfig(tree="auto", calibrate=2), target)
    outs = []
    for i, prompt in enumerate(PROMPTS):
        outs.append(decoder.generate(prompt, 30))
        assert outs[-1].tokens == ar(target, prompt, 30)
        assert (not decoder.drafter.fastest) == (i < 1)  # the full template until calibrated, then a sub-tree
        # every step is learnt from but the last few of a generation, whose trees are cut at the budget
        forwards = sum(out.target_forwards for out in outs)
        assert forwards - decoder.drafter.full.depth * len(outs) <= decoder.drafter.stats.steps <= forwards
    assert decoder.drafter.meta["tree"] == f"auto({AUTO_TEMPLATE})" \
        and decoder.drafter.meta["observed_steps"] == decoder.drafter.stats.steps
    drafter = decoder.drafter
    assert len(drafter.tree.nodes) == drafter.meta["tree_nodes"] and drafter.R == drafter.meta["retrieval_len"]


def test_auto_tree_learns_the_accepted_nodes():
    """On a model whose greedy continuation is a fixed cycle, retrieval always finds the cycle: calibration must
    see exactly that and keep the whole chain, and tokens stay equal to AR on the sub-tree it picks."""
    target = map_model("llama", cycle_successor)
    prompt = [5, 6] + CYCLE * 2
    with_retrieval = build_decoder(TRJacobiConfig(tree="auto"), target)
    stats = with_retrieval.drafter.stats
    assert with_retrieval.generate(prompt, 64).tokens == ar(target, prompt, 64)
    assert stats.hits[:5] == stats.trials[:5] == [stats.steps] * 5  # the chain: always right
    assert max(stats.hits[5:]) < stats.steps / 2  # the rest is ahead noise (a fully accepted path leaves no rows)
    assert with_retrieval.drafter.R == 5 and with_retrieval.meta["expected_accepted"] > 5
    assert with_retrieval.generate(prompt[:4], 40).tokens == ar(target, prompt[:4], 40)


@pytest.mark.parametrize("k", [1, 2, 4, 9, 30, 68])
@pytest.mark.parametrize("retrieval_first", [True, False])
def test_every_sub_tree_size_is_lossless(target, k, retrieval_first):
    decoder = build_decoder(TRJacobiConfig(tree=AUTO_TEMPLATE), target)
    full = decoder.drafter.tree
    # ranks by template order, with the retrieval chain first or last (then small sub-trees have none)
    p = [1.0 - i / 1000 if (i < 5) == retrieval_first else 0.5 - i / 1000 for i in range(len(full.nodes))]
    decoder.drafter.tree, decoder.drafter.R, _ = sub_tree(full, closed(full, p), k, topk=10)
    assert decoder.drafter.R == (min(k, 5) if retrieval_first else max(0, k - 63))
    for prompt in PROMPTS[:3]:
        assert decoder.generate(prompt, 24).tokens == ar(target, prompt, 24)


def test_runner_records_the_picked_tree(tmp_path):
    model = save_tiny_model(tmp_path / "model")
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"text": t}) + "\n" for t in ["def add(a, b):", "for i in range(10):"]))
    overrides = [f"model.path={model}", "logger=none", "decoder=tr_jacobi", "decoder.tree=auto", "benchmark=jsonl",
                 f"benchmark.path={prompts}", "benchmark.prompt_field=text", "benchmark.max_new_tokens=12"]
    with initialize_config_dir(config_dir=str(config_dir()), version_base="1.3"):
        cfg = compose("config", overrides=overrides)
    results = json.loads(run_benchmark(OmegaConf.to_object(cfg), cfg, tmp_path).read_text())
    picked = results["meta"]["decoders"]["tr_jacobi"]
    assert picked["tree"] == f"auto({AUTO_TEMPLATE})" and 1 <= picked["tree_nodes"] <= 68
    assert picked["observed_steps"] > 0 and picked["cost_ratio"]["1"] == 1.0
    assert all(r["lossless_fraction"] == 1.0 for r in results["rows"])


def ancestors(tree, i: int) -> list[int]:
    """The tree inputs above input ``i`` (1-based), the root (0) excluded."""
    out = []
    while tree.parent[i] > 0:
        i = tree.parent[i]
        out.append(i)
    return out


@pytest.mark.parametrize("node", [5, 12, 32, 40])
def test_a_cut_to_one_branch_keeps_root_to_leaf_paths(node):
    """decoder.auto may keep one branch of the template (one node under the root, a chain): the cut tree's paths are
    its root-to-leaf paths only, so the verifier's chain path (its first) runs through the kept node, not the
    root alone left over from the branches cut away (that path compacted the wrong KV slot: tokens diverged)."""
    from specnoise.decoding.proposal import tree_shape
    from specnoise.decoding.tr_jacobi import cut

    tree = build_tree(AUTO_TEMPLATE, 10, 5)
    keep = sorted([node, *(i - 1 for i in ancestors(tree, node + 1))])  # (node indices 0-based, tree inputs 1-based)
    small = cut(tree, tree.depth, tuple(keep))
    shape = tree_shape(small.parent[1:], small.paths)
    assert small.paths == [list(range(len(keep) + 1))] and shape.causal
    assert shape.path[0].tolist() == list(range(len(keep) + 1))


@pytest.mark.parametrize("seed", range(6))
def test_the_next_candidates_are_the_top_k_after_the_rejected_node(seed):
    """TR-Jacobi's next candidate matrix (``Tables.after``, on decoder.auto's cut trees, here at most 3 deep of the
    template's 5): row j holds the target's top-k at the (j + 1)-th path input after the accepted node, for as long as
    the accepted path goes on, and -1 in every other cell (the matrix keeps the template's shape). Every node wrong,
    then some: the first path after the root alone, then after deeper accepted nodes."""
    from specnoise.decoding.tr_jacobi import Tables, cut
    from specnoise.decoding.verifier import Verifier

    gen = torch.Generator().manual_seed(seed)
    tree = build_tree(AUTO_TEMPLATE, 10, 5)
    shallow = [i for i, node in enumerate(tree.nodes) if len(node) <= 3]
    picked = [shallow[i] for i in torch.randperm(len(shallow), generator=gen)[:10].tolist()]
    keep = sorted({a for i in picked for a in [i, *(j - 1 for j in ancestors(tree, i + 1))]})
    tables = Tables(cut(tree, tree.depth, tuple(keep)), faithful=False, k=3, stats=True, device=torch.device("cpu"))
    shape = tables.shape
    assert shape.span - 1 < tree.depth
    logits = torch.randn(shape.last, 50, generator=gen)
    for wrong in (1.0, 0.4):
        tokens = logits.argmax(-1).index_select(0, shape.parent)  # every node right ...
        tokens[torch.rand(len(tokens), generator=gen) < wrong] = -5  # ... or wrong
        read, C, *_ = Verifier(None, read=None).verify(shape, tables.after, logits, tokens, None, None, None)
        a, path = int(read[0]), read[1 + shape.span:1 + 2 * shape.span].tolist()
        after = [i for i in path[a + 1:] if i >= 0]
        assert C.shape == (tree.depth, tree.width) and (a > 0 or len(after) == len(tables.tree.paths[0]) - 1)
        for j in range(tree.depth):
            top = logits[after[j]].topk(3).indices.tolist() if j < len(after) else [-1] * 3
            assert C[j].tolist() == top + [-1] * (tree.width - 3), (j, a, path)
