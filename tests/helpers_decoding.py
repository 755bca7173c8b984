"""Helpers shared by the decoder tests: AR reference tokens, "map models" with known greedy outputs, a cache
recorder that checks KV consistency on every forward, and the exact/sampled marginals of the sampling tests."""

from __future__ import annotations

import atexit
import dataclasses
import shutil
import tempfile
from pathlib import Path

import numpy as np
import torch

from conftest import VOCAB, make_model, prompts
from specnoise.config import DECODER_SCHEMAS, ARConfig
from specnoise.decoding.base import build_decoder
from specnoise.decoding.kv import DynamicEngine
from specnoise.decoding.sampling import warp

CYCLE = [10, 11, 12, 13, 14]
_AR: dict = {}
CORPUS_DIR = Path(tempfile.mkdtemp(prefix="specnoise-test-corpus-"))  # per process: xdist workers never share it
atexit.register(shutil.rmtree, CORPUS_DIR, ignore_errors=True)


def token_corpus(vocab: int = VOCAB) -> str:
    """A corpus of token ids (.npy) for the tokenizer-less test models: the cycle, a run of 7s and random prompts, so
    retrieval drafters find matches, right ones on the map models, mostly wrong ones elsewhere."""
    path = CORPUS_DIR / f"ids-{vocab}.npy"
    if not path.exists():
        docs = [CYCLE * 6, [7] * 30] + prompts(30, seed=1)
        np.save(path, np.array([t for doc in docs for t in (*(i % vocab for i in doc), -1)], dtype=np.int32))
    return str(path)


def schema(name: str, vocab: int = VOCAB, **overrides):
    """``name``'s config for the test models; REST, which needs a datastore, gets ``token_corpus`` (the default, a
    text corpus, needs a tokenizer these models lack)."""
    if name == "rest":
        overrides = {"corpus": token_corpus(vocab), "cache_dir": str(CORPUS_DIR), **overrides}
    return DECODER_SCHEMAS[name](**overrides)


def ar(target, prompt, n):
    """AR's tokens (greedy: a shorter budget is a prefix of a longer one), computed once per model and prompt."""
    key = (id(target.model), tuple(prompt), target.eos_ids)
    if key not in _AR:
        # the model is kept with its tokens: alive, its id cannot be reused by another model
        _AR[key] = target.model, build_decoder(ARConfig(), target).generate(prompt, 64).tokens
    assert n <= 64
    return _AR[key][1][:n]


class Recording(DynamicEngine):
    """A DynamicEngine that checks its cache on every forward: the first new token must get the logits of a fresh
    causal forward of everything the cache claims to hold, so stale or misplaced KV fails at once."""

    def __init__(self, model):
        super().__init__(model)
        self.fed: list[int] = []  # the tokens whose KV the cache holds, in slot order
        self.sizes: list[int] = []  # tokens per forward

    def reset(self):
        super().reset()
        self.fed, self.sizes = [], []

    def forward(self, tokens, positions=None, tree=None, last=None, prefix=0):
        tokens = [int(t) for t in tokens]
        logits = super().forward(tokens, positions, tree, prefix=prefix)
        ref = DynamicEngine(self.model).forward(self.fed + tokens[:1])[-1]
        assert torch.allclose(logits[0], ref, atol=1e-4), "cache content differs from the tokens it should hold"
        self.fed += tokens
        self.sizes.append(len(tokens))
        return logits[-last:] if last is not None else logits

    def crop(self, n):
        super().crop(n)
        del self.fed[n:]

    def move(self, start, src):
        src = [int(i) for i in src]
        super().move(start, src)  # (compact moves through self.move, then crops through self.crop)
        self.fed[start:start + len(src)] = [self.fed[i] for i in src]


def recorded(decoder):
    decoder.bind(Recording(decoder.target.model), Recording(decoder.draft.model))
    return decoder


def map_model(family: str, successor, eos=None):
    """A model whose greedy next token is ``successor(current token)``, whatever came before.

    One-hot embeddings (hidden size = vocabulary), zeroed attention and MLP outputs so the residual stream
    is the current token's embedding, and an LM head that is the map's 0/1 matrix: one logit is positive,
    the rest exactly 0, so every kernel shape agrees on the argmax.
    """
    loaded = make_model(family, layers=1, hidden_size=VOCAB, intermediate_size=32)
    model = loaded.model
    with torch.no_grad():
        model.get_input_embeddings().weight.copy_(torch.eye(VOCAB))
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        head = torch.zeros(VOCAB, VOCAB)
        head[[successor(i) for i in range(VOCAB)], range(VOCAB)] = 1.0
        model.get_output_embeddings().weight.copy_(head)
    return dataclasses.replace(loaded, eos_ids=frozenset(eos)) if eos else loaded


def cycle_successor(i: int) -> int:
    """10 -> 11 -> 12 -> 13 -> 14 -> 10; every other token enters the cycle."""
    return CYCLE[(CYCLE.index(i) + 1) % len(CYCLE)] if i in CYCLE else CYCLE[0]


SAMPLES = 2500
# TV of 2500 exact draws over 6 outcomes: mean ~0.014, 99.9th percentile ~0.035 (simulated), so a correct sampler
# passes for any seed; the wrong samplers below are > 0.1 away
TV_MAX = 0.05
V = 6
PROMPT = [3, 5, 1]


def tiny_pair():
    """A tiny-vocabulary random target with spread-out next-token distributions, and a drafter close to it (its
    weights plus noise): the drafter's greedy token is the target's likeliest, yet their distributions differ
    (TV ~0.25 at PROMPT), so drafts are often accepted and the wrong sampler below is clearly wrong."""
    kw = dict(vocab_size=V, hidden_size=16, intermediate_size=32, initializer_range=0.3)
    target, drafter = make_model("llama", layers=1, seed=11, **kw), make_model("llama", layers=1, seed=11, **kw)
    gen = torch.Generator().manual_seed(12)
    with torch.no_grad():
        for weight in drafter.model.parameters():
            weight.add_(torch.randn(weight.shape, generator=gen) * 0.04)
    return target, drafter


def exact_marginals(model, cfg, prompt=PROMPT) -> tuple[torch.Tensor, torch.Tensor]:
    """The target's distributions of the first and second generated tokens (under cfg's warping)."""
    kv = DynamicEngine(model.model)
    first = warp(kv.forward(prompt)[-1], cfg)
    second = sum(first[t] * warp(DynamicEngine(model.model).forward(prompt + [t])[-1], cfg) for t in range(V))
    return first, second


def tv(samples: list[int], p: torch.Tensor) -> float:
    counts = torch.bincount(torch.tensor(samples), minlength=len(p)).float()
    return 0.5 * float((counts / counts.sum() - p).abs().sum())


def sampled_marginals(decoder, n=SAMPLES, budget=2, prompt=PROMPT) -> tuple[list[int], list[int]]:
    outs = [decoder.generate(prompt, budget, seed=i).tokens for i in range(n)]  # a seed per sample
    assert all(len(o) == budget for o in outs)  # no EOS in this vocabulary's way: id 2 is rare enough
    return [o[0] for o in outs], [o[-1] for o in outs]


