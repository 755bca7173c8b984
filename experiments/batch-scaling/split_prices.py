"""How well the batch's price of a step with fewer live rows holds (``plan.Batched.split``), measured.

A batch of B rows prices a step of ``n`` live rows on a line: a fixed part plus a part per live row, through the
B-row curve t_B(q) and the batch-1 curve t_1(q). Here the batched forward of n rows of q tokens is timed itself
(``measure_forward_costs`` with ``rows=n``, the batch-1 one masked, as the curve probes it; the process's CPU time,
the fastest of ``--repeats`` in each of two rounds) on the shipped small-code-msn (fp32, one thread, 200 cached
tokens per row), and set beside the line's price. Printed per n and q: both relative to t_1(1), and the step of q
tokens over the step of one token at the same n, which is what decides whether drafting pays.

Usage: python experiments/batch-scaling/split_prices.py [--batch 16] [--repeats 9]
"""

from __future__ import annotations

import time

from row_host import cli, humaneval_batch  # (run as a script: its folder is on the path)

from specnoise.decoding.cost import measure_forward_costs
from specnoise.decoding.kv import DynamicEngine

SIZES = (1, 2, 3, 5)
CONTEXT = 200


def main(_names: list[str], rows: int, repeats: int) -> None:
    target, _ = humaneval_batch(1)
    kv = DynamicEngine(target.model)
    counts = sorted({1, 2, 3, 4, rows // 2, rows})
    t: dict[tuple[int, int], float] = {}
    for _ in range(2):  # two rounds, the fastest kept: the machine drifts
        for n in counts:
            got = measure_forward_costs(kv, list(SIZES), cache_len=CONTEXT, repeats=repeats, warmup=2, reduce=min,
                                        clock=time.process_time, rows=n)
            for q, seconds in got.items():
                t[n, q] = min(seconds, t.get((n, q), seconds))

    def line(n: int, q: int) -> float:  # plan.Batched.split's price: a + n m, through t_1(q) and t_B(q)
        fixed = (rows * t[1, q] - t[rows, q]) / (rows - 1)
        return fixed + n * (t[rows, q] - fixed) / rows

    print(f"batched forwards of n rows x q tokens over {CONTEXT} cached tokens each, B = {rows}, fastest of "
          f"{repeats} x 2\n")
    print("| n | q | measured / t_1(1) | line / t_1(1) | measured t_n(q) / t_n(1) | line's |")
    print("|---|---|---|---|---|---|")
    for n in counts:
        for q in SIZES:
            print(f"| {n} | {q} | {t[n, q] / t[1, 1]:.3f} | {line(n, q) / t[1, 1]:.3f} | {t[n, q] / t[n, 1]:.3f} "
                  f"| {line(n, q) / line(n, 1):.3f} |")


if __name__ == "__main__":
    cli(main, None)
