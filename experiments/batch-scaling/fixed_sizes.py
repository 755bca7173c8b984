"""What a lock-step batch gains from PLD at small fixed sizes against ``decoder.auto``, side by side in one process
(issue 28, the B = 16 cells). The first ``B`` HumanEval problems as one batch (64 new tokens, fp32, one thread, the
shipped small-code-msn). Settings: batched AR, PLD with ``num_pred_tokens`` 1, 2, 3 and 5, PLD and TR-Jacobi with
``decoder.auto=true``. One untimed generation each, then ``--repeats`` rounds, the order reversed every other round.
Per setting: the median generation time over batched AR's, the spread of the round-by-round ratios, the batch's steps
(its slowest row's target forwards: a lock-step batch runs until its last row is done), MAT and the mean verify block.

Usage: python experiments/batch-scaling/fixed_sizes.py [--batch 16] [--repeats 5]
"""

from __future__ import annotations

import statistics
import time

from row_host import cli, humaneval_batch  # (run as a script: its folder is on the path)

from specnoise.config import DECODER_SCHEMAS
from specnoise.decoding import base

SETTINGS = {"ar": ("ar", {}), **{f"pld, {k} tokens": ("pld", {"num_pred_tokens": k}) for k in (1, 2, 3, 5)},
            "pld, auto": ("pld", {"auto": True}), "tr_jacobi, auto": ("tr_jacobi", {"auto": True})}


def main(_names: list[str], rows: int, repeats: int) -> None:
    target, prompts = humaneval_batch(rows)
    decoders = {name: base.build_decoder(DECODER_SCHEMAS[d](**kw), target) for name, (d, kw) in SETTINGS.items()}
    for decoder in decoders.values():
        decoder.generate_batch(prompts, 64)
    seconds: dict[str, list[float]] = {name: [] for name in decoders}
    counts = {}
    for rep in range(repeats):
        for name in (list(decoders) if rep % 2 == 0 else list(decoders)[::-1]):
            start = time.perf_counter()
            outs = decoders[name].generate_batch(prompts, 64)
            seconds[name].append(time.perf_counter() - start)
            forwards = sum(o.target_forwards for o in outs)
            counts[name] = (max(o.target_forwards for o in outs), sum(len(o.tokens) for o in outs) / forwards,
                            sum(sum(f[0] for f in o.forward_log[1:]) for o in outs) / (forwards - len(outs)))
    ar = seconds["ar"]
    print(f"humaneval, {rows} prompts as one batch, 64 new tokens, {repeats} rounds\n")
    print("| setting | x batched AR (medians) | round ratios | batch steps | MAT | verify block |")
    print("|---|---|---|---|---|---|")
    for name, times in seconds.items():
        ratios = sorted(a / t for a, t in zip(ar, times))
        steps, mat, block = counts[name]
        print(f"| {name} | {statistics.median(ar) / statistics.median(times):.3f} | {ratios[0]:.2f}-{ratios[-1]:.2f} "
              f"| {steps} | {mat:.2f} | {block:.2f} |")


if __name__ == "__main__":
    cli(main, None)
