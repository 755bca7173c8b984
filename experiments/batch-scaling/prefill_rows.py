"""A batch's first forward fed row by row vs padded to the longest prompt (``batch.PAD_SPLIT``), side by side.

The first 16 Spec-Bench questions of ``benchmark.limit_per_category=3`` (the ``checks_auto.sh`` group of 16: prompts
of 14 to 1,332 tokens) decoded as one lock-step batch by AR and by the given drafters with ``decoder.auto=true``
(64 new tokens, fp32, one thread, the shipped small-code-msn), each with the group's first forward fed row by row
(``rows``) and padded (``padded``: ``PAD_SPLIT`` set out of reach), the two alternating, ``--repeats`` times; AR at
batch 1 over the same prompts for scale. Prints each setting's median seconds per group and its speedup over batched
AR with the same prefill, and whether every row's tokens equal AR's alone.

Usage: python experiments/batch-scaling/prefill_rows.py [--decoders pld,tr_jacobi] [--repeats 3]
"""

from __future__ import annotations

import argparse
import math
import statistics
import time

import torch

from specnoise.bench.datasets import dialogue_text, load_samples
from specnoise.config import ASSETS_DIR, DECODER_SCHEMAS, BenchmarkConfig, ModelConfig
from specnoise.data.templates import encode_prompt
from specnoise.decoding import batch
from specnoise.decoding.base import build_decoder
from specnoise.models import load_model

NEW_TOKENS = 64


def main(names: list[str], repeats: int) -> None:
    torch.set_num_threads(1)
    target = load_model(ModelConfig(name="small-code-msn", path=str(ASSETS_DIR / "models" / "small-code-msn")))
    bench = BenchmarkConfig(name="spec_bench", path=str(ASSETS_DIR / "data" / "spec_bench" / "question.jsonl"),
                            limit_per_category=3, scorer="per_category")
    prompts = [encode_prompt(target.tokenizer, dialogue_text(s, "raw", [], target.tokenizer))
               for s in load_samples(bench, "raw")][:16]
    decoders = {name: build_decoder(DECODER_SCHEMAS[name](auto=name != "ar"), target) for name in ["ar", *names]}
    split = batch.PAD_SPLIT
    seconds: dict[tuple[str, str], list[float]] = {}
    same = True
    alone = [decoders["ar"].generate(p, NEW_TOKENS).tokens for p in prompts]
    for r in range(repeats + 1):  # the first round warms up (and probes the curves), untimed
        for prefill in ("rows", "padded") if r % 2 == 0 else ("padded", "rows"):
            batch.PAD_SPLIT = split if prefill == "rows" else math.inf
            for name, decoder in decoders.items():
                start = time.perf_counter()
                outs = decoder.generate_batch(prompts, NEW_TOKENS)
                if r:
                    seconds.setdefault((name, prefill), []).append(time.perf_counter() - start)
                same = same and [out.tokens for out in outs] == alone
    batch.PAD_SPLIT = split
    start = time.perf_counter()
    for p in prompts:
        decoders["ar"].generate(p, NEW_TOKENS)
    bs1 = time.perf_counter() - start
    print(f"spec_bench, 16 prompts ({min(map(len, prompts))}-{max(map(len, prompts))} tokens, "
          f"{sum(map(len, prompts))} in all) as one batch of 16, {NEW_TOKENS} new tokens, {repeats} repeats; AR at "
          f"batch 1: {bs1:.2f} s; every row's tokens equal AR's alone: {same}\n")
    print("| decoder | first forward | seconds (median) | vs batched AR (same prefill) | vs AR at batch 1 |")
    print("|---|---|---|---|---|")
    median = {key: statistics.median(times) for key, times in seconds.items()}
    for name in decoders:
        for prefill in ("rows", "padded"):
            t = median[name, prefill]
            print(f"| {name} | {prefill} | {t:.2f} | {median['ar', prefill] / t:.3f} | {bs1 / t:.2f} |")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--decoders", default="pld,tr_jacobi")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    main(args.decoders.split(","), args.repeats)
