"""The primitives every decoder stands on: tree forward, crop, compact, the start-up self-test, tree templates
and TR-Jacobi's retrieval."""

from __future__ import annotations

from collections import Counter

import pytest
import torch
from transformers import MistralConfig, MistralForCausalLM

from specnoise.config import UserError
from specnoise.decoding import kv as kv_module
from specnoise.decoding.kv import DynamicEngine, self_test
from specnoise.decoding.proposal import tree_shape
from specnoise.decoding.tr_jacobi import retrieve
from specnoise.decoding.trees import TEMPLATES, build_tree, with_prefix


def causal_logits(model, tokens: list[int]) -> torch.Tensor:
    return DynamicEngine(model).forward(tokens)


def test_self_test_passes_on_both_families(target):
    assert self_test(target.model) < 1e-4


def test_self_test_fails_clearly_when_mask_is_not_honoured(target):
    with pytest.raises(UserError, match="attn_implementation"):
        self_test(target.model, atol=-1.0)  # nothing can be that close: the failure path and its advice


def test_tree_forward_gives_each_node_its_path_logits(target):
    """A real template (trees.py) behind an uncached prompt prefix, as TR-Jacobi's first step feeds it."""
    tree = build_tree("2level_12", topk=6, retrieval_len=3)
    gen = torch.Generator().manual_seed(1)
    prompt = torch.randint(3, 96, (7,), generator=gen).tolist()
    nodes = torch.randint(3, 96, (len(tree.nodes),), generator=gen).tolist()
    kv = DynamicEngine(target.model)
    kv.forward(prompt[:3])  # some of the prompt cached, the rest fed with the tree
    pending = prompt[3:]
    m = len(pending)
    shape = tree_shape(tree.parent[1:], tree.paths)  # the mask and position offsets the verifier feeds
    positions = list(range(3, 3 + m - 1)) + (3 + m - 1 + shape.offsets).tolist()
    logits = kv.forward(pending + nodes, positions, with_prefix(shape.mask, m - 1))[m - 1:]
    for path in tree.paths:
        ref = causal_logits(target.model, prompt + [nodes[i - 1] for i in path[1:]])[len(prompt) - 1:]
        assert torch.allclose(logits[path], ref, atol=1e-4)


@pytest.mark.parametrize("last", [None, 18, 16, 15, 4])
def test_a_long_prompt_fed_with_a_tree_runs_causally_first_and_gives_the_same_logits(target, monkeypatch, last):
    """A first step feeds the prompt with the tree; from ``SPLIT_PREFIX`` prompt tokens on (lowered here) the CPU
    engine feeds the prompt as a plain causal forward first: the logits (every ``last`` rows: the prompt's and the
    tree's, the root's and the tree's, the tree's only, some of the tree's) and the cache are those of one masked
    forward, and it counts and logs as one forward."""
    tree = build_tree("2level_12", topk=6, retrieval_len=3)  # 15 nodes
    gen = torch.Generator().manual_seed(2)
    prompt = torch.randint(3, 96, (9,), generator=gen).tolist()
    nodes = torch.randint(3, 96, (len(tree.nodes),), generator=gen).tolist()
    shape = tree_shape(tree.parent[1:], tree.paths)
    positions = list(range(2, 2 + 6)) + (2 + 6 + shape.offsets).tolist()
    got, fed, model_call = {}, [], DynamicEngine._logits
    monkeypatch.setattr(DynamicEngine, "_logits", lambda self, ids, *rest: fed.append(ids.shape[1])
                        or model_call(self, ids, *rest))
    for split in (10**9, 4):
        monkeypatch.setattr(kv_module, "SPLIT_PREFIX", split)
        kv = DynamicEngine(target.model)
        kv.forward(prompt[:2])
        logits = kv.forward(prompt[2:] + nodes, positions, with_prefix(shape.mask, 6), last, prefix=7)
        got[split] = logits, kv.forward([40])[-1], kv.forwards, kv.forward_log
    (one, after_one, count_one, log_one), (two, after_two, count_two, log_two) = got.values()
    assert one.shape == two.shape == (last or 7 + 15, one.shape[-1])
    assert torch.allclose(one, two, atol=1e-4) and torch.allclose(after_one, after_two, atol=1e-4)
    assert count_one == count_two == 3 and log_one == log_two
    assert fed == [2, 22, 1] + [2, 7, 15, 1]  # the model's calls: one masked forward, then the prompt and the tree


def test_crop_forgets_rejected_slots(target):
    kv = DynamicEngine(target.model)
    kv.forward([5, 6, 7, 8, 9])
    kv.crop(3)
    assert kv.length == 3
    kv.crop(10)  # cropping beyond the length keeps everything
    assert kv.length == 3
    assert torch.allclose(kv.forward([20])[-1], causal_logits(target.model, [5, 6, 7, 20])[-1], atol=1e-5)
    assert kv.forwards == 2


def test_compact_moves_an_accepted_path_next_to_the_cache(target):
    """After compacting root + a branch, the cache equals a plain causal prefill of that path."""
    prefix, root = [11, 12, 13, 14], 15
    # root r, children a b, a's children c d, d's child e      (input indices 0..5)
    tokens, parents = [root, 21, 22, 23, 24, 25], [-1, 0, 0, 1, 1, 4]
    depth, tree = [0] * 6, torch.eye(6, dtype=torch.bool)
    for i, p in enumerate(parents):
        if p >= 0:
            depth[i], tree[i] = depth[p] + 1, tree[i] | tree[p]
    kv = DynamicEngine(target.model)
    kv.forward(prefix)
    P = kv.length
    kv.forward(tokens, [P + d for d in depth], tree)
    kv.compact(P, [P + 0, P + 1, P + 4, P + 5])  # r -> a -> d -> e
    assert kv.length == P + 4
    got = kv.forward([30, 31])
    ref = causal_logits(target.model, prefix + [root, 21, 24, 25, 30, 31])[-2:]
    assert torch.allclose(got, ref, atol=1e-4)


def test_compact_of_a_contiguous_prefix_is_a_crop(target):
    kv = DynamicEngine(target.model)
    kv.forward([3, 4, 5, 6, 7, 8])
    kv.compact(2, [2, 3])
    assert kv.length == 4
    assert torch.allclose(kv.forward([9])[-1], causal_logits(target.model, [3, 4, 5, 6, 9])[-1], atol=1e-5)


def test_sliding_window_models_run_on_a_dense_cache_inside_the_window():
    """The window is the context (models.context_length); a probe past it (a draft's lookahead block) is cropped back,
    which transformers' own sliding layers cannot do once the window has filled."""
    config = MistralConfig(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                           num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512, sliding_window=16)
    kv = DynamicEngine(MistralForCausalLM(config))
    assert kv.max_length == 16
    kv.forward(list(range(3, 15)))
    kv.forward(list(range(20, 28)))  # 12 + 8 slots: past the window
    kv.crop(12)
    assert kv.length == 12


# ------------------------------------------------------------------------------------ tree templates
def test_mc_sim_7b_63_with_retrieval_has_the_papers_shape():
    tree = build_tree("mc_sim_7b_63", topk=10, retrieval_len=5)
    template = tree.nodes[5:]
    assert len(template) == 63 and len(tree.nodes) == 68
    assert Counter(len(node) for node in template) == {1: 10, 2: 28, 3: 23, 4: 2}
    assert len(tree.paths) == 43
    assert Counter(len(path) for path in tree.paths) == {6: 1, 5: 2, 4: 22, 3: 18}  # lengths include the root
    assert tree.paths[0] == [0, 1, 2, 3, 4, 5]  # the retrieval chain comes first, so it wins ties
    assert (tree.depth, tree.width) == (5, 11)


def test_without_retrieval_only_the_template_remains():
    tree = build_tree("mc_sim_7b_63", topk=10, retrieval_len=0)
    assert len(tree.nodes) == 63 and len(tree.paths) == 42 and (tree.depth, tree.width) == (4, 10)


@pytest.mark.parametrize("name", list(TEMPLATES))
def test_tree_tables_agree_with_the_node_lists(name):
    tree = build_tree(name, topk=10, retrieval_len=3)
    shape = tree_shape(tree.parent[1:], tree.paths)
    index = {node: i for i, node in enumerate(tree.nodes, start=1)}
    for i, node in enumerate(tree.nodes, start=1):
        ancestors = [index[node[:d]] for d in range(1, len(node))]
        assert all(a < i for a in ancestors)  # ancestors precede descendants
        assert tree.parent[i] == (ancestors[-1] if ancestors else 0)
        assert int(shape.offsets[i]) == len(node)
        assert set(shape.mask[i].nonzero().view(-1).tolist()) == {0, *ancestors, i}
        assert tree.cell[i - 1] == (len(node) - 1) * tree.width + node[-1]
    for path in tree.paths:  # root-to-leaf chains; no path is a prefix of another; every node on one
        assert path[0] == 0 and all(tree.parent[b] == a for a, b in zip(path, path[1:]))
        assert not any(other != path and other[:len(path)] == path for other in tree.paths)
    assert {i for path in tree.paths for i in path} == set(range(len(tree.nodes) + 1))


def test_bad_tree_choices_are_user_errors():
    with pytest.raises(UserError, match="mc_sim_7b_63.*2level_12"):
        build_tree("nope", topk=10)
    with pytest.raises(UserError, match="decoder.topk >= 10"):
        build_tree("mc_sim_7b_63", topk=4)


def test_with_prefix_puts_a_causal_prompt_before_the_tree():
    tree = build_tree("chain_4", topk=1)
    mask = tree_shape(tree.parent[1:], tree.paths).mask
    keep = with_prefix(mask, 3)
    assert keep.shape == (8, 8)
    assert torch.equal(keep[:3, :3], torch.ones(3, 3, dtype=torch.bool).tril())
    assert not keep[:3, 3:].any() and keep[3:, :3].all() and torch.equal(keep[3:, 3:], mask)
    assert with_prefix(mask, 0) is mask


def test_retrieval_takes_the_earliest_window_with_the_longest_common_suffix():
    #        0  1  2  3  4  5  6  7  8  9 10 11 12 13 14
    seq = [5, 1, 2, 3, 40, 41, 9, 2, 3, 50, 51, 52, 1, 2, 3]
    assert retrieve(seq, 3, 5) == [40, 41, 9, 2, 3]  # exact 3-gram at 1..3 beats the 2-gram at 7..8
    seq = [5, 7, 2, 3, 40, 41, 9, 8, 3, 50, 51, 52, 1, 2, 3]
    assert retrieve(seq, 3, 5) == [40, 41, 9, 8, 3]  # best score 2 (window 1..3), earliest
    seq = [5, 7, 2, 3, 40, 41, 9, 8, 3, 50, 51, 52, 1, 2, 3][:12] + [60, 61, 62]
    assert retrieve(seq, 3, 5) == []  # score 0: nothing (MSN's code would return seq[3:8])
    assert retrieve(seq, 3, 5, faithful=True) == seq[3:8]
    # windows end n tokens before the end: the query cannot match itself or overlap it
    assert retrieve([1, 2, 3, 1, 2, 3], 3, 5) == [1, 2, 3]
    assert retrieve([1, 2, 3, 1, 2], 3, 5) == []
    assert retrieve([4, 1, 2, 3, 9], 3, 2, faithful=True) == []  # too short for a window
