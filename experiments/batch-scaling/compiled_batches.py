"""The static engine's batched forwards compiled (``model.compile``: one forward per batch bucket x block bucket, kept
with the engine's batch caches) against the same engine eager and the dynamic engine, on the CPU (inductor, no CUDA
graphs; issue 28). The first 16 HumanEval problems in groups of ``B`` (64 new tokens, fp32, one thread, the shipped
small-code-msn); batched AR and PLD proposing at most 7 tokens, so that every block after the prefill fits the block
buckets (1, 8). Per engine: the compile time (the batch-1 buckets, and each (batch bucket, block bucket) shape the
untimed first pass meets), then ``--repeats`` rounds of each decoder on each engine, the engines' order reversed every
other round; the median time of a pass over the 16 problems, the spread of the round-by-round ratios to the dynamic
engine's, and whether every row's tokens equal the dynamic engine's.

Usage: python experiments/batch-scaling/compiled_batches.py [--batch 4] [--repeats 3]
"""

from __future__ import annotations

import statistics
import time

from row_host import cli, humaneval_batch  # (run as a script: its folder is on the path)

from specnoise.config import DECODER_SCHEMAS
from specnoise.decoding import base
from specnoise.decoding.kv import DynamicEngine
from specnoise.decoding.static_kv import StaticEngine

BUCKETS = (1, 8)
DECODERS = {"ar": {}, "pld": {"num_pred_tokens": 7}}


def main(_names: list[str], rows: int, repeats: int) -> None:
    target, prompts = humaneval_batch(16)
    groups = [prompts[i:i + rows] for i in range(0, len(prompts), rows)]
    engines = {"dynamic": DynamicEngine(target.model), "static, eager": StaticEngine(target.model, buckets=BUCKETS),
               "static, compiled": StaticEngine(target.model, compile=True, buckets=BUCKETS)}
    decoders = {}
    for e, engine in engines.items():
        for name, options in DECODERS.items():
            decoder = base.build_decoder(DECODER_SCHEMAS[name](**options), target)
            decoder.bind(engine, None)
            decoder.reserve(max(map(len, prompts)) + 64)
            decoders[name, e] = decoder
    tokens, seconds = {}, {key: [] for key in decoders}
    for key, decoder in decoders.items():  # warm-up: the batch caches are made, and their shapes compiled, here
        tokens[key] = [o.tokens for group in groups for o in decoder.generate_batch(group, 64)]
    for rep in range(repeats):
        for key in (list(decoders) if rep % 2 == 0 else list(decoders)[::-1]):
            start = time.perf_counter()
            for group in groups:
                decoders[key].generate_batch(group, 64)
            seconds[key].append(time.perf_counter() - start)
    print(f"humaneval, 16 prompts in groups of {rows}, 64 new tokens, block buckets {BUCKETS}, {repeats} rounds\n")
    print("compile seconds:", ", ".join(f"{e} {getattr(engine, 'compile_seconds', 0.0):.0f}"
                                        for e, engine in engines.items()), "\n")
    print("| decoder | engine | s per pass (median) | dynamic / this, rounds | tokens equal the dynamic engine's |")
    print("|---|---|---|---|---|")
    for (name, e), times in seconds.items():
        ratios = sorted(d / t for d, t in zip(seconds[name, "dynamic"], times))
        print(f"| {name} | {e} | {statistics.median(times):.2f} | {ratios[0]:.2f}-{ratios[-1]:.2f} "
              f"| {tokens[name, e] == tokens[name, 'dynamic']} |")


if __name__ == "__main__":
    cli(main, None)
