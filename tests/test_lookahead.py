"""Lookahead decoding: the window/verification mask, the warm-up, the pool, and greedy equality with AR."""

from __future__ import annotations

import pytest
import torch

from conftest import prompts
from helpers_decoding import ar, cycle_successor, map_model
from specnoise.config import LookaheadConfig
from specnoise.decoding.base import build_decoder
from specnoise.decoding.kv import DynamicEngine
from specnoise.decoding.lookahead import Window, layout, window_shape
from specnoise.decoding.ngram import NGramPool
from specnoise.decoding.trees import with_prefix
from specnoise.decoding.verifier import Verifier


@pytest.mark.parametrize("shape", [(3, (6,), 0, 3), (1, (5, 4), 2, 3), (2, (4, 4, 4), 3, 2), (1, (), 2, 4)],
                         ids=["prefill-warmup", "warmup-2rows", "steady", "phrases-only"])
def test_every_token_of_the_block_gets_the_logits_of_its_path(target, shape):
    """Mask and positions together: each window cell and n-gram token, fed in one tree forward after ``trunk``
    uncached tokens (the root last), must get the logits of a plain causal forward of exactly the tokens it sees."""
    trunk, rows, k, m = shape
    lay = layout(rows, k, m)
    gen = torch.Generator().manual_seed(0)
    prefix = torch.randint(3, 96, (4 + trunk - 1,), generator=gen).tolist()
    block = torch.randint(3, 96, (lay.tree.shape[0],), generator=gen).tolist()
    kv = DynamicEngine(target.model)
    kv.forward(prefix[:4])
    root = len(prefix)
    positions = torch.cat([torch.arange(4, root), lay.offsets + root])
    logits = kv.forward(prefix[4:] + block, positions, with_prefix(lay.tree, trunk - 1))[trunk - 1:]
    for i in range(len(block)):
        seen = lay.tree[i].nonzero().flatten().tolist()
        assert int(lay.offsets[i]) == len(seen) - 1  # its position = the length of its path
        ref = DynamicEngine(target.model).forward(prefix + [block[j] for j in seen])[-1]
        assert torch.allclose(logits[i], ref, atol=1e-4), f"block token {i} of {shape}"


def test_layout_columns_and_is_built_once_per_shape():
    lay = layout((3, 3), 1, 2)  # root c=0, row0 cells 1,2; row1 cells 3,4,5; n-gram 6,7
    assert lay.last_row == [3, 4, 5] and lay.ngrams == [[6, 7]]
    assert lay.tree[4].nonzero().flatten().tolist() == [0, 1, 4]  # cell (1,1) sees c, (0,1) and itself
    assert lay.tree[7].nonzero().flatten().tolist() == [0, 6, 7]  # n-gram branch never sees the window
    assert lay.offsets.tolist() == [0, 1, 2, 1, 2, 3, 1, 2]
    assert layout((3, 3), 1, 2) is lay  # the steady-state shape: no per-step work
    shape, _ = window_shape((3, 3), 1, 2, False)
    assert shape.at_host == [0, 6, 7] and shape.parent.tolist() == [0, 1]  # the verifier's tree: the n-gram
    faithful, _ = window_shape((3, 3), 1, 2, True)
    assert faithful.at_host == [0, 6]  # LADE feeds the n-gram's last token but never accepts it


def test_window_warms_up_then_feeds_the_pool(target):
    """N-2 warm-up steps grow the window a row at a time (rows ending W long); only then do columns close
    n-grams for the pool."""
    N, W = 4, 3
    pool = NGramPool(5)
    window = Window(N, W, pool, [5, 6, 7, 8], torch.Generator().manual_seed(0))
    model, seq = DynamicEngine(target.model), [5, 6, 7, 8]
    verifier = Verifier(model, torch.Tensor.tolist)
    lengths, sizes = [], []
    for _ in range(4):
        lengths.append([len(r) for r in window.rows])
        v = verifier.step(seq[model.length:], window.propose(seq[-1], model.device), base=0)
        verifier.commit(v)
        window.advance(seq[-1], v.extra)
        seq += v.tokens
        sizes.append(len(pool))
        assert model.length == len(seq) - 1  # the cache holds everything but the new root
    assert lengths == [[W + 2], [W + 1, W + 1], [W, W, W], [W, W, W]]
    assert sizes[:2] == [0, 0] and 0 < sizes[2] <= sizes[3]
    assert all(len(g) == N - 1 for key in pool.table for g in pool.get(key))


# the defaults run in test_lossless.py; here the shapes around them
CONFIGS = [dict(N=2, W=3, G=2), dict(N=3, W=4, G=3, faithful=True), dict(N=6, W=10, G=10), dict(G=0)]


@pytest.mark.parametrize("overrides", CONFIGS, ids=lambda o: ",".join(f"{k}={v}" for k, v in o.items()) or "default")
def test_greedy_equals_ar(target, overrides):
    decoder = build_decoder(LookaheadConfig(**overrides), target)
    for prompt in prompts(3, seed=3) + [[9]]:
        for budget in (7, 40):
            out = decoder.generate(prompt, budget)
            assert out.tokens == ar(target, prompt, budget), (overrides, prompt, budget)
            assert sum(out.accepted) == len(out.tokens) and out.target_forwards == len(out.accepted)


@pytest.fixture(scope="module")
def cycle(family):
    return map_model(family, cycle_successor)


def test_accepts_ngrams_and_keeps_kv_right(cycle):
    """On a model that cycles, the window's columns are correct n-grams once warmed up: whole n-grams get
    accepted and their compacted KV must keep the outputs exact."""
    prompt = [3, 4, 5]
    out = build_decoder(LookaheadConfig(), cycle).generate(prompt, 60)
    assert out.tokens == ar(cycle, prompt, 60)
    assert max(out.accepted) == 5  # N-1 n-gram tokens + the bonus
    assert out.mean_accepted > 2.5
    faithful = build_decoder(LookaheadConfig(faithful=True), cycle).generate(prompt, 60)
    assert faithful.tokens == out.tokens and max(faithful.accepted) == 4  # LADE drops the bonus


LONG = list(range(10, 22))  # a 12-token cycle: its later tokens first come out after the warm-up


def long_successor(i: int) -> int:
    return LONG[(LONG.index(i) + 1) % len(LONG)] if i in LONG else LONG[0]


@pytest.mark.parametrize("eos", [16, 18, 21])
def test_stops_at_an_eos_inside_an_accepted_ngram(family, eos):
    model = map_model(family, long_successor, {eos})
    prompt = LONG * 2  # window noise drawn from the cycle: n-grams for later keys are ready after the warm-up
    out = build_decoder(LookaheadConfig(), model).generate(prompt, 60)
    assert out.tokens == ar(model, prompt, 60) == LONG[:LONG.index(eos) + 1]
    assert out.accepted[-1] > 1  # the EOS came inside an accepted n-gram


def test_budget_inside_an_accepted_ngram(cycle):
    prompt, full = [3, 4, 5], ar(cycle, [3, 4, 5], 40)
    decoder = build_decoder(LookaheadConfig(), cycle)
    for budget in range(1, 26):
        out = decoder.generate(prompt, budget)
        assert out.tokens == full[:budget] and len(out.tokens) == budget
