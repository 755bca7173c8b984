"""Each row's own host work per row-step in a lock-step batch (issue 28): its generator's code between its target
forwards (the drafter's candidates, the commit, ``observe``, the controller), by the kind of the step (AR: a one-token
block; drafted: more), per row-step in ms. The first 16 HumanEval problems as one batch of ``B`` (64 new tokens, fp32,
one thread, the shipped small-code-msn), each decoder with ``decoder.auto=true`` (AR plain), one untimed generation,
then ``--repeats`` timed. The batch's own work (the lock-step loop, the cache's tidying, the mask, the read) is not in
it, nor, since the verifications became the batch's requests (``verifier.Check``, served by ``judge_rows``), the
verify ops (the README's table was taken before, with them). AR's "drafted" row-steps are its prefills.

Usage: python experiments/batch-scaling/row_host.py [--decoders ar,pld,tr_jacobi] [--batch 16] [--repeats 3]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from specnoise.bench.datasets import dialogue_text, load_samples
from specnoise.config import ASSETS_DIR, DECODER_SCHEMAS, BenchmarkConfig, ModelConfig
from specnoise.data.templates import encode_prompt
from specnoise.decoding import base, batch
from specnoise.decoding.kv import Forward
from specnoise.models import load_model

SPENT: dict[bool, list[float]] = {False: [], True: []}  # host seconds per row-step: AR, drafted


def timed(steps):
    """A row's generator of requests, its own seconds between two target forwards kept per kind of the earlier one."""
    reply, spent, drafted = None, 0.0, None
    while True:
        start = time.perf_counter()
        try:
            request = steps.send(reply)
        except StopIteration:
            return
        spent += time.perf_counter() - start
        if isinstance(request, Forward) and request.engine.kv.priority == batch.TARGET_FORWARDS:
            if drafted is not None:
                SPENT[drafted].append(spent)
            spent, drafted = 0.0, len(request.tokens) > 1
        reply = yield request


def humaneval_batch(rows: int):
    """The shipped small-code-msn on one thread, and the first ``rows`` of 16 HumanEval problems (raw prompts)."""
    torch.set_num_threads(1)
    target = load_model(ModelConfig(name="small-code-msn", path=str(ASSETS_DIR / "models" / "small-code-msn")))
    bench = BenchmarkConfig(name="humaneval", path=str(ASSETS_DIR / "data" / "humaneval" / "HumanEval.jsonl.gz"),
                            limit=16)
    return target, [encode_prompt(target.tokenizer, dialogue_text(s, "raw", [], target.tokenizer))
                    for s in load_samples(bench, "raw")][:rows]


def main(names: list[str], rows: int, repeats: int) -> None:
    target, prompts = humaneval_batch(rows)
    lockstep = batch.lockstep
    base.lockstep = lambda steps, kvs, read, *rest: lockstep({r: timed(g) for r, g in steps.items()}, kvs, read,
                                                             *rest)
    print(f"humaneval, {rows} prompts as one batch, 64 new tokens, {repeats} repeats\n")
    print("| decoder | AR row-steps per generation | host ms each | drafted row-steps | host ms each |")
    print("|---|---|---|---|---|")
    for name in names:
        decoder = base.build_decoder(DECODER_SCHEMAS[name](auto=name != "ar"), target)
        decoder.generate_batch(prompts, 64)
        for kind in SPENT.values():
            kind.clear()
        for _ in range(repeats):
            decoder.generate_batch(prompts, 64)
        cells = [f"{len(v) / repeats:.0f} | {1e3 * statistics.mean(v):.3f}" if v else "0 | -" for v in SPENT.values()]
        print(f"| {name} | {' | '.join(cells)} |")
    base.lockstep = lockstep


def cli(main, decoders: str | None, batch: int = 16, repeats: int = 3, auto: bool = False) -> None:
    """This folder's timers' command line: ``main(decoder names, batch size, repeats[, auto])``; ``decoders``: the
    default of ``--decoders`` (None: a timer of fixed settings, no such option, no names); ``batch``, ``repeats``:
    the defaults of ``--batch`` and ``--repeats``; ``auto``: a ``--auto`` flag (decoder.auto=true), passed on."""
    parser = argparse.ArgumentParser()
    if decoders is not None:
        parser.add_argument("--decoders", default=decoders)
    parser.add_argument("--batch", type=int, default=batch)
    parser.add_argument("--repeats", type=int, default=repeats)
    if auto:
        parser.add_argument("--auto", action="store_true")
    args = parser.parse_args()
    names = args.decoders.split(",") if decoders is not None else []
    main(names, args.batch, args.repeats, *([args.auto] if auto else []))

if __name__ == "__main__":
    cli(main, "ar,pld,tr_jacobi")
