"""What a batch's last live row pays for staying in the batch (issue 28): its forward in a ``BatchKV`` (the batched 4D
mask over its row, one upload of the lengths, the pads' bookkeeping) against the batch-1 engine's forward of the same
block on the same context (SDPA's causal path for a chain, no mask for one token). The shipped small-code-msn, fp32,
one thread; a 200-token context, then forwards of q = 1, 3 and 8 tokens, each followed by a crop to one kept token,
the two engines alternating forward by forward (``--repeats`` x 40 pairs per q, the first 10 of each 40 dropped). Per
q: the median ms of each and the median and interquartile range of the per-pair ratio (batch / batch-1).

Usage: python experiments/batch-scaling/last_row.py [--repeats 3]
"""

from __future__ import annotations

import random
import statistics
import time

import torch
from row_host import cli  # (run as a script: its folder is on the path)

from specnoise.config import ASSETS_DIR, ModelConfig
from specnoise.decoding.batch import BatchKV
from specnoise.decoding.kv import DynamicEngine
from specnoise.models import load_model

CONTEXT = 200


def main(_names: list[str], _rows: int, repeats: int) -> None:
    torch.set_num_threads(1)
    model = load_model(ModelConfig(name="small-code-msn", path=str(ASSETS_DIR / "models" / "small-code-msn"))).model
    gen = random.Random(0)
    print(f"one live row of a batch against the batch-1 engine, {CONTEXT} cached tokens, {repeats * 40} pairs per q\n")
    print("| q | batch, ms | batch-1, ms | batch / batch-1 per pair: median | IQR |")
    print("|---|---|---|---|---|")
    for q in (1, 3, 8):
        times: dict[str, list[float]] = {"batch": [], "alone": []}
        for _ in range(repeats):
            context = [gen.randrange(3, 1000) for _ in range(CONTEXT)]
            kv, alone = BatchKV(DynamicEngine(model), 2, need=CONTEXT + 50), DynamicEngine(model)
            kv.forward({0: (context, None, None, 1), 1: (context, None, None, 1)})
            kv.finish(0)  # row 1 is the batch's last live row
            alone.forward(context, last=1)
            for i in range(40):
                block = [gen.randrange(3, 1000) for _ in range(q)]
                for which in (("batch", "alone") if i % 2 else ("alone", "batch")):
                    start = time.perf_counter()
                    if which == "batch":
                        kv.forward({1: (block, None, None, 1 if q == 1 else None)})
                        kv.remap(1, kv.lens[1] - q, [kv.lens[1] - q])
                    else:
                        alone.forward(block, last=1 if q == 1 else None)
                        alone.crop(alone.length - q + 1)
                    if i >= 10:
                        times[which].append(time.perf_counter() - start)
        ratios = sorted(b / a for b, a in zip(times["batch"], times["alone"]))
        n = len(ratios)
        print(f"| {q} | {1e3 * statistics.median(times['batch']):.2f} | {1e3 * statistics.median(times['alone']):.2f} "
              f"| {statistics.median(ratios):.3f} | {ratios[n // 4]:.2f}-{ratios[3 * n // 4]:.2f} |")


if __name__ == "__main__":
    cli(main, None)
