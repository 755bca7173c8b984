"""What a forward costs with transformers' ``sdpa`` against ``sdpa_gqa`` (attention.py), on the CPU, side by side in
one process: a chain (no mask: both take transformers' own path), a tree (a 4D mask) and a 4-row batch's forward
(always masked), over a cache of 300 and 1,024 tokens; the fastest of 9 (7 for the batch) by CPU time.

With a mask and more than one token per row, transformers' ``sdpa`` copies the KV cache per query head
(``repeat_kv``) in every layer; ``sdpa_gqa`` packs a group's query heads into its KV head's rows instead. Then the
logits of both at batch 1: random tree masks and 2-token chains under a mask after 5-1,000 cached tokens, how many
forwards give bitwise the same logits and the largest difference.

    python experiments/batch-scaling/attention_costs.py [--model small-code-msn]
"""

from __future__ import annotations

import argparse
import time

import torch

from specnoise.config import ASSETS_DIR, ModelConfig
from specnoise.decoding.cost import causal_block, measure_forward_costs
from specnoise.decoding.kv import DynamicEngine
from specnoise.models import load_model

SIZES = [1, 2, 4, 8, 16, 32]


def load(name: str, attention: str):
    return load_model(ModelConfig(name=name, path=str(ASSETS_DIR / "models" / name), attn_implementation=attention))


def same_logits(name: str) -> str:
    """Batch-1 masked forwards of both attentions: how many give bitwise equal logits, the largest difference."""
    models = {attention: load(name, attention).model for attention in ("sdpa", "sdpa_gqa")}
    gen = torch.Generator().manual_seed(0)
    equal, count, worst = 0, 0, 0.0
    for context in (5, 40, 300, 1000):
        prompt = torch.randint(0, 4000, (context,), generator=gen).tolist()
        for q in (2, 3, 8, 20, 64):
            block = torch.randint(0, 4000, (q,), generator=gen).tolist()
            tree = torch.tril(torch.rand(q, q, generator=gen) < 0.5) | torch.eye(q, dtype=torch.bool)
            tree[:, 0] = True  # (every node under the root)
            out = {}
            for attention, model in models.items():
                engine = DynamicEngine(model)
                engine.forward(prompt)
                out[attention] = (engine.forward(block, tree=tree), engine.forward(block[:2], tree=causal_block(2)))
            for a, b in zip(out["sdpa"], out["sdpa_gqa"]):
                count, equal = count + 1, equal + torch.equal(a, b)
                worst = max(worst, (a - b).abs().max().item())
    return f"{name}: {equal} of {count} masked batch-1 forwards bitwise equal, largest difference {worst:.2e}"


def main(name: str) -> None:
    torch.set_num_threads(1)
    costs = {}
    for attention in ("sdpa", "sdpa_gqa"):
        engine = DynamicEngine(load(name, attention).model)
        for context in (300, 1024):
            for kind in ("chain", "tree"):
                costs[attention, kind, context] = measure_forward_costs(
                    engine, SIZES, cache_len=context, repeats=9, warmup=2, reduce=min, causal=kind == "chain",
                    clock=time.process_time)
        costs[attention, "4 rows", 1024] = measure_forward_costs(engine, SIZES[:4], cache_len=1024, repeats=7,
                                                                 warmup=2, reduce=min, rows=4, clock=time.process_time)
    print(f"{name}, fp32, one thread: ms per forward (t(q) / t(1) in brackets)\n")
    print("| forward | context | attention | " + " | ".join(f"q = {q}" for q in SIZES) + " |")
    print("|---|---|---|" + "---|" * len(SIZES))
    for (attention, kind, context), got in sorted(costs.items(), key=lambda kv: (kv[0][1], kv[0][2], kv[0][0])):
        cells = [f"{got[q] * 1e3:.2f} ({got[q] / got[1]:.2f})" if q in got else "" for q in SIZES]
        print(f"| {kind} | {context} | {attention} | " + " | ".join(cells) + " |")
    print("\n" + same_logits(name))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="small-code-msn", help="a shipped model (src/specnoise/assets/models)")
    main(parser.parse_args().model)
