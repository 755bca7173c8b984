"""Token Recycling, SAM-Decoding and REST beyond the shared lossless tests: their data structures against brute force,
drafts accepted where they must be, the corpus cache through a real tokenizer, and every bad input they name."""

from __future__ import annotations

import dataclasses
import json
import random
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch

from conftest import make_model, prompts
from helpers_decoding import CYCLE, ar, cycle_successor, map_model, schema, token_corpus
from helpers_models import tiny_tokenizer
from specnoise.config import ConfigError, RESTConfig, SAMConfig, TokenRecyclingConfig, UserError
from specnoise.decoding.base import build_decoder
from specnoise.decoding.corpus import SuffixArray, suffix_array
from specnoise.decoding.proposal import tree_shape
from specnoise.decoding.rest import trie
from specnoise.decoding.sam import SuffixAutomaton
from specnoise.decoding.token_recycling import Plan
from specnoise.decoding.trees import build_tree


# ------------------------------------------------------------------------------------------ data structures
def test_suffix_array_sorts_like_python():
    rng = np.random.default_rng(0)
    for _ in range(40):
        tokens = rng.integers(-1, 4, size=int(rng.integers(1, 50))).astype(np.int32)
        assert suffix_array(tokens).tolist() == sorted(range(len(tokens)), key=lambda i: tokens[i:].tolist())


def test_longest_suffix_and_its_continuations():
    store = SuffixArray(np.array([5, 6, 7, -1, 5, 6, 8, 5, 6, 7, 9], dtype=np.int32))
    n, lo, hi, _ = store.longest_suffix([1, 5, 6, 7], 10)
    assert (n, hi - lo) == (3, 2)  # "5 6 7" twice
    assert sorted(store.continuations(n, lo, hi, 2, 10).tolist()) == [[-1, -1], [9, -1]]  # stops at document ends
    n, lo, hi, _ = store.longest_suffix([3, 5, 6], 10)
    assert (n, hi - lo) == (2, 3)
    assert store.longest_suffix([4], 10)[:3] == (0, 0, 0)


def test_suffix_automaton_finds_the_longest_earlier_match():
    """Against brute force: the longest suffix that also ends earlier, and the end of its first occurrence."""
    rnd = random.Random(0)
    for _ in range(30):
        text = [rnd.randrange(3) for _ in range(rnd.randrange(2, 40))]
        sam = SuffixAutomaton(text[:1])
        for i in range(1, len(text)):
            sam.extend(text[i])
            seq = text[:i + 1]
            n = max(m for m in range(len(seq)) if any(seq[e - m + 1:e + 1] == seq[len(seq) - m:] or m == 0
                                                      for e in range(m - 1, len(seq) - 1)))
            first = min((e for e in range(n - 1, len(seq) - 1) if seq[e - n + 1:e + 1] == seq[len(seq) - n:]),
                        default=-1)
            assert sam.match(0, 1) == (n, first if n else -1)  # room 0: no back-off


def test_longest_suffix_matches_brute_force():
    """Every bound, grown or looked up anew: the longest suffix that occurs (up to the bound) and all its
    occurrences, against a scan of the corpus."""
    rng = np.random.default_rng(1)
    for _ in range(60):
        tokens = rng.integers(-1, 3, size=int(rng.integers(1, 60))).astype(np.int32)
        store = SuffixArray(tokens)
        seq = rng.integers(0, 3, size=int(rng.integers(1, 12))).tolist()
        at = {n: [i for i in range(len(tokens) - n + 1) if tokens[i:i + n].tolist() == seq[len(seq) - n:]]
              for n in range(1, len(seq) + 1)}  # where each suffix of seq occurs
        for longest in range(0, len(seq) + 2):
            n = max((n for n in range(1, min(longest, len(seq)) + 1) if at[n]), default=0)
            found, lo, hi, _ = store.longest_suffix(seq, longest)
            assert found == n
            if n:
                assert sorted(store.sa[lo:hi].tolist()) == at[n]
                # the 3 tokens after every occurrence, -1 from a document's end (or the corpus's) on
                after = [tokens[i + n:i + n + 3].tolist() + [-1] * 3 for i in at[n]]
                after = [(row[:row.index(-1)] + [-1] * 3)[:3] for row in after]
                assert sorted(store.continuations(n, lo, hi, 3, limit=100).tolist()) == sorted(after)
                # a sample of them, in the suffix array's order: sorted already (what REST's trie takes)
                rows = store.continuations(n, lo, hi, 3, limit=int(rng.integers(1, 6)))
                assert rows.tolist() == sorted(rows.tolist())
        # grown a few tokens at a time, each search told the last one's answer (REST and SAM): the same answers
        cap, last, end = int(rng.integers(1, 8)), None, 0
        while end < len(seq):
            end = min(len(seq), end + int(rng.integers(1, 4)))
            last = store.longest_suffix(seq[:end], cap, last)
            assert last[:3] == store.longest_suffix(seq[:end], cap)[:3] and last.end == end


def test_trie_keeps_the_most_frequent_prefixes_parents_first():
    tokens, parents = trie([[1, 2, 3], [1, 2, 4], [1, 5, -1], [6, -1, -1]], size=4)
    assert tokens == [1, 2, 6, 5] and parents == [0, 1, 0, 1]  # (1) x3, (1, 2) x2, then the 1-counts, shorter first


def test_trie_matches_counting_every_prefix():
    """Against a Counter of every prefix, sorted by (-count, length, prefix): the same nodes in the same order."""
    rng = np.random.default_rng(0)
    for _ in range(500):
        m, depth = int(rng.integers(1, 30)), int(rng.integers(1, 6))
        rows = rng.integers(0, int(rng.integers(1, 5)), size=(m, depth))
        rows[np.arange(depth)[None, :] >= rng.integers(0, depth + 1, size=m)[:, None]] = -1  # documents end
        rows = np.array(sorted(rows.tolist()))  # in lexicographic order, as a suffix array's continuations come
        size = int(rng.integers(1, 20))
        counts = Counter(tuple(row[:d]) for row in rows.tolist() for d in range(1, depth + 1) if row[d - 1] >= 0)
        picked = sorted(counts, key=lambda p: (-counts[p], len(p), p))[:size]
        index = {p: i for i, p in enumerate(picked, start=1)}
        assert trie(rows, size) == ([p[-1] for p in picked], [index[p[:-1]] if len(p) > 1 else 0 for p in picked])


# ------------------------------------------------------------------------------------------ drafting helps
@pytest.mark.parametrize("name,options", [("token_recycling", {}), ("sam", {}), ("sam", dict(fallback="none")),
                                          ("rest", {})])
def test_drafts_are_accepted_where_they_must_be(name, options, family):
    """A model that says 7 after anything: Token Recycling's matrix learns 7 -> 7 in one step, SAM matches the run
    of 7s it generated, REST finds a run of 7s in its corpus."""
    target = map_model(family, lambda i: 7)
    out = build_decoder(schema(name, **options), target).generate(list(range(20, 40)), 48)
    assert out.tokens == [7] * 48
    assert out.mean_accepted > 2.0, out.accepted


def test_rest_reuses_its_tries_within_a_generation_only(tmp_path, monkeypatch):
    """A generation that meets the same suffix interval again drafts the trie it built for it (no second look at the
    corpus's continuations); the next generation builds its own, so a benchmark's repeats pay what the first run
    paid."""
    target = map_model("llama", lambda i: 7)
    decoder = build_decoder(schema("rest", corpus=token_corpus(), cache_dir=str(tmp_path)), target)
    store = decoder.drafter.store
    looked = []
    continuations = store.continuations
    monkeypatch.setattr(store, "continuations", lambda *args: looked.append(args) or continuations(*args))
    counts = []
    for _ in range(2):
        looked.clear()
        hits = decoder.drafter.hits
        out = decoder.generate(list(range(20, 40)), 64)
        assert out.tokens == [7] * 64
        counts.append((len(looked), decoder.drafter.hits - hits))
    (first, hits), again = counts
    assert len(set(looked)) == first < hits  # a run of 7s: every look-up after the first few finds the same interval
    assert again == counts[0]


def test_sam_drafts_from_its_static_corpus(family, tmp_path):
    """No repeat in the prompt: the cycle comes from the corpus, and the output is still AR's."""
    target = map_model(family, cycle_successor)
    decoder = build_decoder(schema("sam", corpus=token_corpus(), cache_dir=str(tmp_path), fallback="none"), target)
    out = decoder.generate([40, 50, 10, 11], 30)
    decoder.drafter.after_generation()
    assert out.tokens == ar(target, [40, 50, 10, 11], 30)
    assert out.mean_accepted > 3.0 and decoder.meta["draft_sources"]["static"] > 0  # then its own text repeats


def test_sam_with_a_corpus_stays_lossless(target, tmp_path):
    decoder = build_decoder(schema("sam", corpus=token_corpus(), cache_dir=str(tmp_path)), target)
    for prompt in prompts(4, seed=3):
        assert decoder.generate(prompt, 30).tokens == ar(target, prompt, 30)


def test_token_recycling_keeps_its_matrix_until_reset(target):
    decoder = build_decoder(schema("token_recycling"), target)
    decoder.generate(CYCLE, 20)
    assert decoder.drafter.M.any()
    decoder.reset_history()
    assert not decoder.drafter.M.any()


def test_a_picked_sub_tree_plans_the_tree_of_its_nodes():
    """A controller's pick (template indices, closed under parents) is planned from the template's own tables: the
    same shape as the tree built from the picked nodes, and each node's token ``M[its parent's token, its column]``."""
    template = build_tree("mc_sim_7b_63", 10).nodes
    index = {node: i for i, node in enumerate(template)}
    parents = [index.get(node[:-1], -1) for node in template]
    rng = random.Random(0)
    M = torch.randint(0, 50, (50, 10), generator=torch.Generator().manual_seed(0))
    for _ in range(20):
        keep = sorted({index[node[:d]] for node in rng.sample(template, rng.randint(1, 12))
                       for d in range(1, len(node) + 1)})
        plan = Plan(template, parents, keep, torch.device("cpu"))
        tree = build_tree("pick", 10, template=[template[i] for i in keep])
        built = tree_shape(tree.parent[1:], tree.paths, device=torch.device("cpu"))
        for name in ("mask", "at", "parent", "sees", "depth", "rank", "path", "inner", "slot"):
            assert torch.equal(getattr(plan.shape, name), getattr(built, name)), name
        tokens = torch.zeros(len(keep) + 1, dtype=torch.long)
        tokens[0] = 7
        plan.fill(tokens, M)
        for j, node in enumerate(tree.nodes, start=1):
            assert tokens[j] == M[tokens[tree.parent[j]], node[-1]]


# ------------------------------------------------------------------------------------------ corpus through a tokenizer
@pytest.fixture(scope="module")
def tokenized():
    """A random model over a real (tiny BPE) tokenizer's vocabulary."""
    tok = tiny_tokenizer()
    return dataclasses.replace(make_model("llama", vocab_size=len(tok)), tokenizer=tok)


def write_corpus(path, rows):
    path.write_text("\n".join(json.dumps(r) for r in rows))
    return str(path)


def test_a_text_corpus_is_tokenized_once_and_cached(tokenized, tmp_path):
    corpus = write_corpus(tmp_path / "c.jsonl", [{"instruction": "Add.", "output": "def add(a, b):\n    return a + b"},
                                                {"text": "for i in range(10):\n    print(i)"}])
    cache = tmp_path / "cache"
    decoder = build_decoder(RESTConfig(corpus=corpus, cache_dir=str(cache)), tokenized)
    files = sorted(p.name for p in cache.iterdir())
    # tokens, their tokenizer, the suffix arrays of the corpus and of the corpus reversed
    assert len(files) == 4 and "corpus_build_seconds" in decoder.meta
    docs = ["Add.\ndef add(a, b):\n    return a + b", "for i in range(10):\n    print(i)"]  # fields joined by lines
    assert decoder.meta["corpus_tokens"] == sum(len(tokenized.tokenizer(d)["input_ids"]) for d in docs)
    again = build_decoder(RESTConfig(corpus=corpus, cache_dir=str(cache)), dataclasses.replace(tokenized, engines={}))
    assert sorted(p.name for p in cache.iterdir()) == files and again.meta == decoder.meta  # read back, not rebuilt
    prompt = tokenized.tokenizer("def add(a, b):\n")["input_ids"]
    assert decoder.generate(prompt, 20).tokens == build_decoder(schema("ar"), tokenized).generate(prompt, 20).tokens


# ------------------------------------------------------------------------------------------ bad input
@pytest.mark.parametrize("schema_class", [SAMConfig, RESTConfig])
def test_a_missing_or_empty_corpus_fails_at_config_time(schema_class, tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        schema_class(corpus=str(tmp_path / "nope.jsonl"))
    (tmp_path / "empty.jsonl").write_text("")
    with pytest.raises(ConfigError, match="is empty"):
        schema_class(corpus=str(tmp_path / "empty.jsonl"))


def test_a_corpus_without_text_rows_is_a_user_error(tokenized, tmp_path):
    corpus = write_corpus(tmp_path / "c.jsonl", [{"id": 1}, {"text": "  "}])
    with pytest.raises(UserError, match="no text rows"):
        build_decoder(RESTConfig(corpus=corpus, cache_dir=str(tmp_path)), tokenized)


def test_a_corpus_tokenized_with_another_tokenizer_is_a_user_error(tokenized, tmp_path):
    corpus = write_corpus(tmp_path / "c.jsonl", [{"text": "def add(a, b):\n    return a + b"}])
    other = dataclasses.replace(tokenized, tokenizer=tiny_tokenizer(vocab_size=300), engines={})
    cached = build_decoder(RESTConfig(corpus=corpus, cache_dir=str(tmp_path / "c")), other).meta["corpus_cache"]
    with pytest.raises(UserError, match="another tokenizer"):
        build_decoder(RESTConfig(corpus=cached, cache_dir=str(tmp_path / "c")), tokenized)


def test_token_ids_past_the_vocabulary_are_a_user_error(target, tmp_path):
    np.save(tmp_path / "ids.npy", np.array([5, 6, 500], dtype=np.int32))
    with pytest.raises(UserError, match="past the target's vocabulary"):
        build_decoder(RESTConfig(corpus=str(tmp_path / "ids.npy"), cache_dir=str(tmp_path)), target)


def test_bad_sizes_are_config_errors():
    with pytest.raises(ConfigError, match="decoder.topk"):
        TokenRecyclingConfig(topk=0)
    with pytest.raises(ConfigError, match="decoder.topk >= 10"):
        TokenRecyclingConfig(topk=4)
    with pytest.raises(ConfigError, match="decoder.max_suffix"):
        RESTConfig(min_suffix=4, max_suffix=3)
    with pytest.raises(ConfigError, match="decoder.max_draft"):
        SAMConfig(max_draft=0)


@pytest.mark.parametrize("name,options", [("token_recycling", {}), ("sam", {}), ("rest", dict(num_draft=40))])
def test_a_tree_too_large_for_the_context_is_a_config_error(name, options):
    short = make_model("llama", max_position_embeddings=32)
    with pytest.raises(ConfigError, match="context of 32"):
        build_decoder(schema(name, **options), short)


@pytest.mark.parametrize("name", ["rest", "sam"])
def test_a_malformed_corpus_says_file_line_column_as_benchmark_path_does(tokenized, tmp_path, name):
    from specnoise.bench.datasets import read_records
    from specnoise.config import DECODER_SCHEMAS, UserError

    bad = write_corpus(tmp_path / "bad.jsonl", [{"text": "fine"}])
    Path(bad).write_text('{"text": "fine"}\n{"text": oops}\n')
    with pytest.raises(UserError) as as_corpus:
        build_decoder(DECODER_SCHEMAS[name](corpus=bad, cache_dir=str(tmp_path / "cache")), tokenized)
    with pytest.raises(UserError) as as_prompts:
        read_records(bad)
    where = f"{bad}, line 2, column 10: not valid JSON (Expecting value); one JSON value per line"
    assert str(as_corpus.value) == f"decoder.corpus: {where}" and str(as_prompts.value) == f"benchmark.path: {where}"


def test_rest_keeps_a_bounded_number_of_step_graphs(tokenized, tmp_path, monkeypatch):
    """REST's trie shapes vary almost every step: past the cap a shape runs eagerly, unrecorded, and the tokens stay
    AR's. The engine here pretends to replay graphs and counts what it is asked to record."""
    from specnoise.decoding import verifier

    monkeypatch.setattr(verifier, "MAX_FUNCTIONS", 3)
    corpus = write_corpus(tmp_path / "c.jsonl", [{"text": "def add(a, b):\n    return a + b\n" * 3},
                                                {"text": "for i in range(10):\n    print(i)\n" * 3}])
    decoder = build_decoder(RESTConfig(corpus=corpus, cache_dir=str(tmp_path / "cache"), min_suffix=1), tokenized)
    engine = decoder.verifier.engine
    recorded = []
    monkeypatch.setattr(engine, "graphs", True, raising=False)
    monkeypatch.setattr(engine, "graph", lambda fn: recorded.append(fn) or fn, raising=False)
    prompt = tokenized.tokenizer("def add(a, b):\n")["input_ids"]
    out = decoder.generate(prompt, 40)
    assert out.target_forwards > 3  # more steps (each a new trie shape at most) than the cap
    assert len(decoder.verifier.functions) == len(recorded) <= 3
    assert out.tokens == build_decoder(schema("ar"), tokenized).generate(prompt, 40).tokens


def test_a_step_shape_is_recorded_at_its_second_step(tokenized, tmp_path, monkeypatch):
    """Recording a step's CUDA graph costs several eager runs, which a shape seen once never earns back (REST's tries
    ran 3x slower per step than AR on an H100 while every new shape was recorded): a shape's first step runs eagerly,
    its second records it, and later steps replay that one recording. The engine pretends to replay graphs."""
    import collections

    corpus = write_corpus(tmp_path / "c.jsonl", [{"text": "def add(a, b):\n    return a + b\n" * 3},
                                                {"text": "for i in range(10):\n    print(i)\n" * 3}])
    decoder = build_decoder(RESTConfig(corpus=corpus, cache_dir=str(tmp_path / "cache"), min_suffix=1), tokenized)
    verifier, recorded, uses = decoder.verifier, [], collections.Counter()
    monkeypatch.setattr(verifier.engine, "graphs", True, raising=False)
    monkeypatch.setattr(verifier.engine, "graph", lambda fn: recorded.append(fn) or fn, raising=False)
    function = verifier.function

    def counted(shape, after, rejection):
        uses[shape, after, rejection] += 1
        return function(shape, after, rejection)

    monkeypatch.setattr(verifier, "function", counted)
    prompt = tokenized.tokenizer("def add(a, b):\n")["input_ids"]
    out = decoder.generate(prompt, 60)
    assert 1 in uses.values() and max(uses.values()) > 2, uses  # shapes seen once and shapes seen again
    assert set(verifier.functions) == {key for key, n in uses.items() if n >= 2}
    assert len(recorded) == len(verifier.functions)  # one recording per kept shape, whatever its later steps
    assert out.tokens == build_decoder(schema("ar"), tokenized).generate(prompt, 60).tokens
