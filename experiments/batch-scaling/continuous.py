"""Continuous batching against lock-step groups, side by side in one process (issue 28's B = 16 cells).

A lock-step group of B rows takes as many steps as its slowest row: at B = 16 on HumanEval's first 48 problems (64 new
tokens, ``decoder.auto=true``, ``tiny/continuous.md``) a PLD prompt took 27 steps on average and the three groups 147
in all, 49 each, a TR-Jacobi prompt 25 and its groups 128, while AR's took 48 and 192, so the drafters' saved steps
barely showed. With ``slots`` (``benchmark.queue``) a row whose prompt ends takes the next one at once: 95 and 86
steps, against AR's 172.

The first ``--prompts`` HumanEval problems (raw prompts, sorted by length as ``benchmark.group_by_length`` sorts them),
64 new tokens, the shipped small-code-msn on one thread; each decoder (``decoder.auto=true``; AR plain) decodes them in
lock-step groups of ``--batch`` and as one queue for ``--batch`` rows, the modes and decoders alternating from repeat
to repeat; one untimed pass of each first. Per decoder and mode: the median total seconds over the repeats, the
speedup against AR in the same mode, and the target forwards; every prompt's tokens are checked against AR's.

Usage: python experiments/batch-scaling/continuous.py [--decoders ar,pld,tr_jacobi] [--batch 16] [--prompts 48]
[--repeats 3]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from specnoise.bench.datasets import dialogue_text, load_samples
from specnoise.config import ASSETS_DIR, DECODER_SCHEMAS, BenchmarkConfig, ModelConfig
from specnoise.data.templates import encode_prompt
from specnoise.decoding.base import build_decoder
from specnoise.models import load_model

NEW_TOKENS = 64


def main(names: list[str], batch: int, count: int, repeats: int) -> None:
    torch.set_num_threads(1)
    target = load_model(ModelConfig(name="small-code-msn", path=str(ASSETS_DIR / "models" / "small-code-msn")))
    bench = BenchmarkConfig(name="humaneval", path=str(ASSETS_DIR / "data" / "humaneval" / "HumanEval.jsonl.gz"),
                            limit=count)
    prompts = sorted((encode_prompt(target.tokenizer, dialogue_text(s, "raw", [], target.tokenizer))
                      for s in load_samples(bench, "raw")), key=len)[:count]
    decoders = {name: build_decoder(DECODER_SCHEMAS[name](auto=name != "ar"), target) for name in names}

    def run(name: str, mode: str):
        """(seconds, outputs, the batch's steps: its host reads, one per step for drafters without a draft model)"""
        decoder, start, reads = decoders[name], time.perf_counter(), 0
        if mode == "queue":
            outs = decoder.generate_batch(prompts, NEW_TOKENS, slots=batch)
            reads = decoder.host_reads
        else:
            outs = []
            for i in range(0, len(prompts), batch):
                outs += decoder.generate_batch(prompts[i:i + batch], NEW_TOKENS)
                reads += decoder.host_reads
        return time.perf_counter() - start, outs, reads

    modes = ("lock-step", "queue")
    cells = [(name, mode) for name in names for mode in modes]
    for cell in cells:  # untimed: curves, batch curves, first statistics
        run(*cell)
    seconds: dict = {cell: [] for cell in cells}
    tokens, forwards, steps, accepted = {}, {}, {}, {}
    for r in range(repeats):
        for cell in cells if r % 2 == 0 else cells[::-1]:
            took, outs, steps[cell] = run(*cell)
            seconds[cell].append(took)
            tokens[cell] = [out.tokens for out in outs]
            accepted[cell] = [out.accepted for out in outs]
            forwards[cell] = sum(out.target_forwards for out in outs)
    same = all(tokens[cell] == tokens["ar", cell[1]] for cell in cells)
    print(f"humaneval, first {len(prompts)} problems sorted by length, {NEW_TOKENS} new tokens, B = {batch}, "
          f"{repeats} repeats (medians); every prompt's tokens equal to AR's: {same}\n")
    print("| decoder | lock-step s | queue s | lock-step vs batched AR | queue vs queued AR | queue / lock-step "
          "speed | forwards lock-step / queue |")
    print("|---|---|---|---|---|---|---|")
    median = {cell: statistics.median(v) for cell, v in seconds.items()}
    for name in names:
        lock, queue = median[name, "lock-step"], median[name, "queue"]
        print(f"| {name} | {lock:.2f} | {queue:.2f} | {median['ar', 'lock-step'] / lock:.3f} | "
              f"{median['ar', 'queue'] / queue:.3f} | {lock / queue:.3f} | "
              f"{forwards[name, 'lock-step']} / {forwards[name, 'queue']} |")
    print("\nsteps (counts, not times): the batch's steps in lock-step groups (each group's slowest row), the same in "
          "the queue, and a prompt's own steps on average\n")
    print("| decoder | lock-step batch steps | queue batch steps | a prompt's steps, mean |")
    print("|---|---|---|---|")
    for name in names:
        print(f"| {name} | {steps[name, 'lock-step']} | {steps[name, 'queue']} | "
              f"{statistics.mean(len(a) for a in accepted[name, 'queue']):.1f} |")
    spread = {cell: (min(v), max(v)) for cell, v in seconds.items()}
    print("\nper cell, fastest and slowest repeat (s): " + ", ".join(
        f"{n} {m} {a:.2f}-{b:.2f}" for (n, m), (a, b) in spread.items()))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--decoders", default="ar,pld,tr_jacobi")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--prompts", type=int, default=48)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    main(args.decoders.split(","), args.batch, args.prompts, args.repeats)
