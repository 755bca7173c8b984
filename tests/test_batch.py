"""Batches (decoding/batch.py): every decoder decodes B prompts together and each row's tokens are what AR gives that
prompt alone at batch 1; the batched cache holds each row's own KV, ragged, on both engines.

Rows here have prompts of different lengths and one of them hits EOS after a few tokens while the others run to the
budget, on two model families and both engines. Under sampling a row emits the very tokens ``generate`` gives its
prompt and seed alone, and the distribution test of test_sampling_decoders holds at B = 4.
"""

from __future__ import annotations

import dataclasses
import random

import pytest
import torch

from conftest import VOCAB, make_model
from helpers_decoding import PROMPT, SAMPLES, TV_MAX, V, ar, schema, tiny_pair, tv
from specnoise.config import DECODER_SCHEMAS
from specnoise.decoding import batch
from specnoise.decoding.base import DECODER_MODULES, build_decoder
from specnoise.decoding.batch import BatchKV
from specnoise.decoding.kv import DynamicEngine
from specnoise.decoding.static_kv import StaticEngine
from specnoise.errors import UserError
from test_sampling_decoders import OPTIONS, SAMPLERS, exact_marginals

DRAFTERS = [n for n in DECODER_MODULES if not n.startswith("hf_")]
NEW_TOKENS = 40
LENGTHS = (1, 9, 24)


def batch_prompts(seed: int = 2, lengths=LENGTHS) -> list[list[int]]:
    gen = random.Random(seed)
    return [[gen.randrange(3, VOCAB) for _ in range(n)] for n in lengths]


@pytest.fixture(scope="module")
def early_eos(target):
    """The target with an EOS set that ends the second row after 4 tokens (its 4th AR token), prompts of 1, 9 and 24
    tokens."""
    ps = batch_prompts()
    eos = ar(target, ps[1], NEW_TOKENS)[3]
    return dataclasses.replace(target, eos_ids=frozenset({eos})), ps


def on_engine(decoder, static: bool):
    if static:
        decoder.bind(StaticEngine(decoder.target_model.model),
                     StaticEngine(decoder.draft_model.model) if decoder.needs_draft else None)
    return decoder


@pytest.mark.parametrize("static", [False, True], ids=["dynamic", "static"])
@pytest.mark.parametrize("name", DRAFTERS)
def test_each_row_equals_ar_alone(name, static, early_eos, draft):
    target, ps = early_eos
    decoder = on_engine(build_decoder(schema(name), target, draft), static)
    outs = decoder.generate_batch(ps, NEW_TOKENS)
    for out, prompt in zip(outs, ps):
        assert out.tokens == ar(target, prompt, NEW_TOKENS), f"{name}: a row differs from AR alone"
        assert sum(out.accepted) == len(out.tokens) and out.batch_size == 3
        assert out.target_forwards >= len(out.accepted) >= 1
    assert len(outs[1].tokens) <= 4 < len(outs[2].tokens)  # one row ended early, another ran on
    assert outs[1].target_forwards < outs[2].target_forwards  # and took part in fewer forwards


@pytest.mark.parametrize("static", [False, True], ids=["dynamic", "static"])
@pytest.mark.parametrize("name", DRAFTERS)
def test_rows_judged_together_equal_ar_alone(name, static, target, draft, monkeypatch):
    """From ``TOGETHER_CPU`` rows on, a step's greedy rows are judged in one function, their proposals padded to the
    step's largest shape (``verifier.judge_rows``): every drafter's rows at that batch size, prompts of 1 to 24
    tokens, equal AR alone, and the batch did judge its rows together."""
    from specnoise.decoding import verifier

    ps = batch_prompts(5, (1, 3, 5, 9, 12, 17, 20, 24))
    assert len(ps) >= verifier.TOGETHER_CPU
    judged, accept = [], verifier.accept
    monkeypatch.setattr(verifier, "accept", lambda rules, picks, nodes: judged.append(len(picks)) or
                        accept(rules, picks, nodes))
    outs = on_engine(build_decoder(schema(name), target, draft), static).generate_batch(ps, 24)
    for out, prompt in zip(outs, ps):
        assert out.tokens == ar(target, prompt, 24), f"{name}: a row judged with others differs from AR alone"
    assert judged and max(judged) >= verifier.TOGETHER_CPU


def test_rows_keep_their_drafter_state_and_seeds_must_match(target):
    decoder = build_decoder(schema("ouroboros"), target, make_model("llama", 1, 1, hidden_size=32,
                                                                      intermediate_size=64))
    ps = batch_prompts()
    decoder.generate_batch(ps, 10)
    rows = decoder.row_decoders(3)
    assert len({id(r.drafter.pool) for r in rows} | {id(decoder.drafter.pool)}) == 4  # a pool per row slot
    assert decoder.row_decoders(3) == rows  # kept across calls
    with pytest.raises(UserError, match="one per prompt"):
        decoder.generate_batch(ps, 10, seed=[1, 2])


def test_an_error_in_one_row_ends_the_batch(target):
    decoder = build_decoder(schema("pld"), target)
    row = decoder.row_decoders(3)[1]

    def broken(room):
        raise RuntimeError("drafter failed")
    row.drafter.propose = broken
    with pytest.raises(RuntimeError, match="drafter failed"):
        decoder.generate_batch(batch_prompts(), 10)


# ------------------------------------------------------------------------------------------ the batched cache
@pytest.mark.parametrize("static", [False, True], ids=["dynamic", "static"])
def test_batched_cache_matches_one_engine_per_row(static, target):
    """Random forwards (chains and trees), crops and compactions on 3 rows: every row's logits equal those of its own
    batch-1 engine driven the same way, finished rows leave, and the cache never holds more than the longest row
    plus one block."""
    model = target.model
    kv = BatchKV(StaticEngine(model) if static else DynamicEngine(model), 3, need=200)
    alone = [DynamicEngine(model) for _ in range(3)]
    gen = random.Random(0)
    live = [0, 1, 2]
    for step in range(14):
        if step == 9:  # row 1 finishes
            kv.finish(1)
            live.remove(1)
        requests, expect = {}, {}
        for r in live:
            if gen.random() < 0.25 and step:  # this row sits this forward out
                continue
            q = 12 if step == 0 and r == 2 else gen.randint(1, 5)
            tokens = [gen.randrange(3, VOCAB) for _ in range(q)]
            tree = torch.ones(q, q, dtype=torch.bool).tril()
            if q > 2 and gen.random() < 0.5:  # a fork: the last node hangs off the first
                tree[q - 1, 1:q - 1] = False
            positions = [alone[r].length + int(tree[i].sum()) - 1 for i in range(q)]
            requests[r] = (tokens, positions, tree, None)
            expect[r] = alone[r].forward(tokens, positions, tree)
        got = kv.forward(requests)
        for r in requests:
            torch.testing.assert_close(got[r], expect[r], atol=1e-4, rtol=1e-4)
            n = alone[r].length
            keep = sorted(gen.sample(range(n - len(requests[r][0]), n), gen.randint(0, len(requests[r][0]))))
            start = n - len(requests[r][0])
            kv.remap(r, start, keep)
            alone[r].compact(start, keep)
            assert kv.lens[r] == alone[r].length
        kv._tidy()  # what the next forward does first
        assert kv.phys == max(kv.lens[r] for r in live)
        if not static:
            assert kv.cache.layers[0].keys.shape[:3:2] == (len(live), kv.phys)


# ------------------------------------------------------------------------------------------ sampling
@pytest.mark.parametrize("name", SAMPLERS)
def test_sampled_rows_equal_their_tokens_alone(name, target, draft):
    cfg = dict(temperature=0.9, top_p=0.9, seed=5)
    decoder = build_decoder(schema(name, **cfg), target, draft)
    ps = batch_prompts(3)
    alone = [decoder.generate(p, 30, seed=s).tokens for p, s in zip(ps, (5, 6, 7))]
    assert [o.tokens for o in decoder.generate_batch(ps, 30, seed=[5, 6, 7])] == alone


@pytest.mark.parametrize("name", [pytest.param(n, marks=() if n in ("tr_jacobi", "speculative") else pytest.mark.slow)
                                  for n in SAMPLERS])
def test_batched_sampling_keeps_the_target_distribution(name):
    """test_sampling_decoders' distribution test with the generations run 4 at a time, one seed per row."""
    target, drafter = tiny_pair()
    target = dataclasses.replace(target, eos_ids=frozenset())
    cfg = schema(name, vocab=V, **OPTIONS)
    exact = exact_marginals(target, cfg)
    decoder = build_decoder(cfg, target, drafter)
    outs = [o.tokens for i in range(0, SAMPLES, 4)
            for o in decoder.generate_batch([PROMPT] * 4, 3, seed=list(range(i, i + 4)))]
    assert all(len(o) == 3 for o in outs)
    for j in range(3):
        assert tv([o[j] for o in outs], exact[j]) < TV_MAX, f"{name}: token {j + 1} off the target distribution"


def test_samplers_list_is_every_drafter():
    assert sorted(SAMPLERS) == sorted(n for n in DRAFTERS if DECODER_SCHEMAS[n].samples)


def test_tree_auto_in_a_batch_prices_the_batched_forward(target):
    """tree=auto's rows pick their sub-tree from the cost of every row's tree verified together, t(3 x q)."""
    decoder = build_decoder(schema("tr_jacobi", tree="auto"), target)
    ps = batch_prompts()
    for _ in range(2):
        outs = decoder.generate_batch(ps, NEW_TOKENS)
        assert [o.tokens for o in outs] == [ar(target, p, NEW_TOKENS) for p in ps]
    assert set(decoder.drafter.fastest) == {3}  # probed at 3 rows only (the dict is shared with the rows)
    assert all(row.drafter.tree is not row.drafter.full for row in decoder.row_decoders(3))  # each picked a sub-tree


# ------------------------------------------------------------------------------------------ lock-step, independence
def test_no_thread_in_decoding():
    """The batch runs in lock-step on the calling thread: nothing in decoding/ starts a thread."""
    import pathlib

    import specnoise.decoding
    package = pathlib.Path(specnoise.decoding.__file__).parent
    for path in package.glob("*.py"):
        text = path.read_text()
        assert "threading" not in text and "concurrent.futures" not in text, path.name


@pytest.mark.parametrize("static", [False, True], ids=["dynamic", "static"])
def test_a_groups_first_forward_feeds_its_rows_alone_where_padding_would_dominate(static, target):
    """Prompts of 1, 9 and 24 tokens padded to the longest would feed 72 tokens for their 34 (``batch.PAD_SPLIT``): on
    the dynamic engine the first forward feeds each row alone, one forward in every row's count, and the later ones
    are batched; prompts of equal length, and the static engine (whose cache is allocated per bucket), stay batched.
    Every row equals AR alone either way (``test_each_row_equals_ar_alone``)."""
    seen = []
    hook = target.model.register_forward_pre_hook(
        lambda module, args, kwargs: seen.append(tuple(kwargs["input_ids"].shape)), with_kwargs=True)
    try:
        for ps in (batch_prompts(), [p[:9] for p in batch_prompts()[1:]] * 2):
            decoder = on_engine(build_decoder(schema("pld"), target), static)
            if static:  # (the static engine allocates its batch caches, with their pad forwards, on the first)
                decoder.generate_batch(ps, 8)
            seen.clear()
            outs = decoder.generate_batch(ps, 8)
            fed = seen[:]  # (the batch's forwards; AR alone below feeds the model too)
            assert [out.tokens for out in outs] == [ar(target, p, 8) for p in ps]
            assert all(out.target_forwards == len(out.accepted) for out in outs)  # the prefill: one forward
            if static:  # (padded to its buckets: 4 rows, 32 slots)
                assert all(rows > 1 for rows, _ in fed), fed
                continue
            first = sorted(fed[:len(ps)]) if fed[0][0] == 1 else fed[:1]
            alone = len(set(map(len, ps))) > 1
            assert first == (sorted((1, len(p)) for p in ps) if alone else [(len(ps), len(ps[0]))]), fed
            assert all(rows == len(ps) for rows, _ in fed[len(first):][:3]), fed  # then batched
    finally:
        hook.remove()


def test_rows_that_sit_out_the_first_forwards_keep_their_own_kv(target):
    """A forward that only some rows ask for, before anything is cached (a draft model's first forward where the other
    rows took AR steps under decoder.auto) and after: every row's logits equal its own batch-1 engine's."""
    model = target.model
    kv, alone = BatchKV(DynamicEngine(model), 3, need=100), [DynamicEngine(model) for _ in range(3)]
    gen = random.Random(1)
    for rows in ([0, 2], [1], [0, 1, 2], [2], [0, 1]):
        requests, expect = {}, {}
        for r in rows:
            tokens = [gen.randrange(3, VOCAB) for _ in range(gen.randint(1, 6))]
            requests[r] = (tokens, None, None, None)
            expect[r] = alone[r].forward(tokens)
        got = kv.forward(requests)
        for r in rows:
            torch.testing.assert_close(got[r], expect[r], atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("name", ["ouroboros", "speculative"])
def test_a_draft_forward_computes_only_the_rows_that_ask(name, target, draft, monkeypatch):
    """On the dynamic engine a draft model's batched forward runs over the rows still drafting only (``SKIP_IDLE``):
    the rows it computes, summed over its forwards, are the rows' own draft forwards, where pads would add the rows
    that wait for the target; the tokens are AR's either way."""
    ps = batch_prompts(5, lengths=(6, 14, 30))
    fed = []
    hook = draft.model.register_forward_pre_hook(
        lambda module, args, kwargs: fed.append(kwargs["input_ids"].shape[0]), with_kwargs=True)
    rows = {}
    try:
        for skip in (True, False):
            monkeypatch.setattr(batch, "SKIP_IDLE", skip)
            fed.clear()
            outs = build_decoder(schema(name), target, draft).generate_batch(ps, NEW_TOKENS)
            assert [out.tokens for out in outs] == [ar(target, p, NEW_TOKENS) for p in ps]
            rows[skip] = (sum(fed), sum(out.draft_forwards for out in outs))
    finally:
        hook.remove()
    computed, own = rows[True]
    assert computed == own
    assert rows[False][0] > rows[False][1] == own  # pads: rows computed that did not ask; the same own forwards


INDEPENDENT = ["jacobi", "tr_jacobi", "pld", "lookahead", "token_recycling", "sam", "rest", "speculative", "ouroboros"]


@pytest.mark.parametrize("name", INDEPENDENT)
def test_a_row_depends_on_its_prompt_only(name, target, draft):
    """The same prompt in two different batches (other neighbours, another row) and alone gives the same tokens,
    forwards (target and draft) and accepted counts: a row's drafts never depend on its neighbours."""
    ps = batch_prompts(4)
    first = build_decoder(schema(name), target, draft).generate_batch(ps, NEW_TOKENS)[1]
    second = build_decoder(schema(name), target, draft).generate_batch([ps[2], ps[0], ps[1]], NEW_TOKENS)[2]
    alone = build_decoder(schema(name), target, draft).generate(ps[1], NEW_TOKENS)
    for out in (second, alone):
        assert (out.tokens, out.target_forwards, out.draft_forwards, out.accepted) == \
            (first.tokens, first.target_forwards, first.draft_forwards, first.accepted), name


@pytest.mark.parametrize("static", [False, True], ids=["dynamic", "static"])
def test_batched_forwards_never_build_prompt_by_vocab_logits(static):
    """A large-vocabulary model: every batched forward (the prefill included) computes logits for the rows the
    verifier needs only (``logits_to_keep``), never B x prompt x vocab."""
    big = make_model("llama", layers=1, vocab_size=32000)
    decoder = on_engine(build_decoder(schema("pld"), big), static)
    shapes = []
    hook = big.model.lm_head.register_forward_hook(lambda module, args, out: shapes.append(tuple(out.shape)))
    try:
        prompt = [random.Random(r).randrange(3, 300) for r in range(60)]
        outs = decoder.generate_batch([prompt, prompt[:40], prompt[:50]], 6)
    finally:
        hook.remove()
    assert all(len(o.tokens) == 6 for o in outs)
    assert shapes and all(rows <= 11 for _, rows, _ in shapes), shapes  # 1 + num_pred_tokens at most, never 60


def test_every_row_error_is_reported_and_the_batch_ends_cleanly(target):
    decoder = build_decoder(schema("pld"), target)
    rows = decoder.row_decoders(3)
    for r in (0, 2):
        def broken(room, r=r):
            raise RuntimeError(f"drafter {r} failed")
        rows[r].drafter.propose = broken
    with pytest.raises(RuntimeError, match="drafter 0 failed") as info:
        decoder.generate_batch(batch_prompts(), 10)
    assert any("row 2 failed too" in note and "drafter 2 failed" in note for note in info.value.__notes__)
    assert all(row.target is decoder.target for row in rows)  # rows back on the decoder's engines
    for r in (0, 2):
        del rows[r].drafter.propose
    ps = batch_prompts()
    assert [o.tokens for o in decoder.generate_batch(ps, 10)] == [ar(target, p, 10) for p in ps]


def test_an_error_in_a_batched_forward_ends_the_batch(target, monkeypatch):
    decoder = build_decoder(schema("jacobi"), target)
    calls = []

    def failing(self, requests):
        calls.append(len(requests))
        if len(calls) == 3:
            raise RuntimeError("forward failed")
        return real(self, requests)
    real = BatchKV.forward
    monkeypatch.setattr(BatchKV, "forward", failing)
    with pytest.raises(RuntimeError, match="forward failed"):
        decoder.generate_batch(batch_prompts(), 10)
    monkeypatch.setattr(BatchKV, "forward", real)
    ps = batch_prompts()
    assert [o.tokens for o in decoder.generate_batch(ps, 10)] == [ar(target, p, 10) for p in ps]


def test_every_engine_implements_the_protocol(target):
    from specnoise.decoding.engines import EngineProtocol
    kv = BatchKV(DynamicEngine(target.model), 2, need=20)
    for engine in (DynamicEngine(target.model), StaticEngine(target.model), kv.row_engine(0)):
        assert isinstance(engine, EngineProtocol), type(engine).__name__
    assert not isinstance(object(), EngineProtocol)
