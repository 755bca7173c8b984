"""A first step's prompt fed on its own (``kv.SPLIT_PREFIX``) vs with the proposal in one masked forward, on the CPU.

A decoder's first step feeds the prompt together with its first proposal. Where that proposal is a tree (a mask), one
forward takes the attention's masked path over the whole prompt, which AR's plain causal prefill does not; from
``SPLIT_PREFIX`` prompt tokens on the dynamic engine feeds the prompt first, causally, then the tree. Here: the
Spec-Bench-10 prompts (first turns) of at least that many tokens, on the shipped small-code-msn (fp32, one thread),
each generation of 128 new tokens run both ways in one process, alternating (split first in odd repeats), three
repeats after a warm-up; per decoder the median time of each prompt, summed, one way over the other, and whether the
tokens are the same. Usage: python experiments/hardware-aware/prefill_split.py [decoder[+auto] ...]
"""

from __future__ import annotations

import statistics
import sys

import torch

from specnoise.bench.datasets import dialogue_text, load_samples
from specnoise.config import ASSETS_DIR, DECODER_SCHEMAS, BenchmarkConfig, ModelConfig
from specnoise.data.templates import encode_prompt
from specnoise.decoding import kv
from specnoise.decoding.base import build_decoder
from specnoise.models import context_length, load_model

DECODERS = ["ar", "tr_jacobi", "tr_jacobi+auto", "token_recycling", "sam", "lookahead", "rest", "rest+auto"]
NEW_TOKENS = 128


def main(names: list[str]) -> None:
    torch.set_num_threads(1)
    target = load_model(ModelConfig(name="small-code-msn", path=str(ASSETS_DIR / "models" / "small-code-msn")))
    bench = BenchmarkConfig(name="spec_bench", path=str(ASSETS_DIR / "data" / "spec_bench" / "question.jsonl"),
                            limit_per_category=10, scorer="per_category")
    prompts = [encode_prompt(target.tokenizer, dialogue_text(s, "raw", [], target.tokenizer))
               for s in load_samples(bench, "raw")]
    long = [p for p in prompts if kv.SPLIT_PREFIX <= len(p) <= context_length(target.model.config) - NEW_TOKENS]
    print(f"{len(long)} of {len(prompts)} Spec-Bench-10 prompts have {kv.SPLIT_PREFIX}+ tokens "
          f"({min(map(len, long))}-{max(map(len, long))}); {NEW_TOKENS} new tokens, 3 repeats\n")
    print("| decoder | one masked forward (s) | prompt first (s) | first / one | same tokens |")
    print("|---|---|---|---|---|")
    split = kv.SPLIT_PREFIX
    for name in names:
        base, _, auto = name.partition("+")
        decoder = build_decoder(DECODER_SCHEMAS[base](auto=bool(auto)), target)
        decoder.generate(long[0], 16)  # warm-up (decoder.auto: its cost curve)
        seconds = {"one": [[] for _ in long], "first": [[] for _ in long]}
        tokens = {}
        for repeat in range(3):
            for way in ("first", "one") if repeat % 2 else ("one", "first"):
                kv.SPLIT_PREFIX = split if way == "first" else 1 << 30
                for i, p in enumerate(long):
                    out = decoder.generate(p, NEW_TOKENS)
                    seconds[way][i].append(out.seconds)
                    tokens[way, i] = out.tokens
        kv.SPLIT_PREFIX = split
        total = {way: sum(statistics.median(s) for s in v) for way, v in seconds.items()}
        same = all(tokens["one", i] == tokens["first", i] for i in range(len(long)))
        print(f"| {name} | {total['one']:.2f} | {total['first']:.2f} | {total['first'] / total['one']:.3f} | {same} |",
              flush=True)


if __name__ == "__main__":
    main(sys.argv[1:] or DECODERS)
