"""A lock-step batch's verifications judged together vs row by row (issue 28, item 1), side by side in one process:
the rows' greedy steps as one device function (``verifier.judge_rows``: the rows' proposals padded to the step's
largest shape, one argmax, one verdict, one read tensor; each drafter's hook once per group of rows that share it)
against each row's own step function (``Check.run``, as before). Per decoder: the host time of the verifications
per batch step (the lock-step loop's verify round, every row's), the generation's wall time, and whether the two
give the same tokens (they must). The first 16 HumanEval problems as one batch of ``B`` (64 new tokens, fp32, one
thread, the shipped small-code-msn), each decoder with ``decoder.auto=true`` (AR plain); one untimed generation,
then ``--repeats`` timed pairs, alternating which goes first.

Usage: python experiments/batch-scaling/verify_rows.py [--decoders ar,pld,tr_jacobi] [--batch 16] [--repeats 3]
"""

from __future__ import annotations

import statistics
import time

from row_host import cli, humaneval_batch  # (run as a script: its folder is on the path)

from specnoise.config import DECODER_SCHEMAS
from specnoise.decoding import base, batch

MODES = {"alone": lambda checks: [check.run() for check in checks], "together": batch.judge_rows}


def main(names: list[str], rows: int, repeats: int) -> None:
    target, prompts = humaneval_batch(rows)
    print(f"humaneval, {rows} prompts as one batch, 64 new tokens, {repeats} repeats (median)\n")
    print("| decoder | batch steps per generation | verify ms per step: alone | together | generation s: alone "
          "| together | same tokens |")
    print("|---|---|---|---|---|---|---|")
    for name in names:
        decoder = base.build_decoder(DECODER_SCHEMAS[name](auto=name != "ar"), target)
        decoder.generate_batch(prompts, 64)
        spent = {mode: [] for mode in MODES}
        wall = {mode: [] for mode in MODES}
        tokens = {}
        for rep in range(repeats):
            for mode in (list(MODES) if rep % 2 == 0 else list(MODES)[::-1]):
                def timed(checks, judge=MODES[mode], into=spent[mode]):
                    start = time.perf_counter()
                    replies = judge(checks)
                    into.append(time.perf_counter() - start)
                    return replies
                batch.judge_rows = timed
                start = time.perf_counter()
                outs = decoder.generate_batch(prompts, 64)
                wall[mode].append(time.perf_counter() - start)
                tokens.setdefault(mode, [out.tokens for out in outs])
        batch.judge_rows = MODES["together"]
        steps = len(spent["together"]) / repeats
        cells = [f"{1e3 * statistics.mean(spent[m]):.2f}" for m in MODES] + \
            [f"{statistics.median(wall[m]):.3f}" for m in MODES]
        print(f"| {name} | {steps:.0f} | {' | '.join(cells)} | {tokens['alone'] == tokens['together']} |", flush=True)


if __name__ == "__main__":
    cli(main, "ar,pld,jacobi,lookahead,tr_jacobi,token_recycling,sam,rest")
