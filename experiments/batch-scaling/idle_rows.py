"""A draft model's batched forward while only some rows still draft (issue 28, item 1): the rows that finished
drafting left out (``batch.SKIP_IDLE``: the asking rows' KV gathered, the forward run over them, their KV put back)
against computed as pads, side by side in one process. Per decoder: the share of pad rows in its draft forwards, the
seconds inside its draft forwards and the generation's wall time per batch (medians), and whether the two give the
same tokens (they must). The first 16 HumanEval problems as one batch of ``B`` (64 new tokens, fp32, one thread, the
shipped small-code-msn with small-code-draft), faithful settings (``--auto``: ``decoder.auto=true``); one untimed
generation, then ``--repeats`` timed pairs, alternating which goes first.

Usage: python experiments/batch-scaling/idle_rows.py [--decoders speculative,ouroboros] [--batch 4] [--repeats 5]
    [--auto]
"""

from __future__ import annotations

import statistics
import time

from row_host import cli, humaneval_batch  # (run as a script: its folder is on the path)

from specnoise.config import ASSETS_DIR, DECODER_SCHEMAS, ModelConfig
from specnoise.decoding import base, batch
from specnoise.models import load_model

MODES = {"pads": False, "left out": True}


def main(names: list[str], rows: int, repeats: int, auto: bool) -> None:
    target, prompts = humaneval_batch(16)
    draft = load_model(ModelConfig(name="small-code-draft", path=str(ASSETS_DIR / "models" / "small-code-draft")))
    groups = [prompts[i:i + rows] for i in range(0, len(prompts), rows)]
    rows_fed = {"asking": 0, "live": 0}
    forward = batch.BatchKV.forward

    def counted(kv, requests):
        if kv.priority == batch.DRAFT_FORWARDS and kv.phys:  # (not a group's first forward)
            rows_fed["asking"] += len(requests)
            rows_fed["live"] += len([r for r in kv.at if r not in kv.done])
        return forward(kv, requests)

    batch.BatchKV.forward = counted
    print(f"humaneval, 16 prompts in groups of {rows}, 64 new tokens, {repeats} repeats (median), "
          f"{'decoder.auto=true' if auto else 'faithful'}\n")
    print("| decoder | pad rows in draft forwards | draft forward s: pads | left out | generation s: pads | left out | "
          "left out / pads | same tokens |")
    print("|---|---|---|---|---|---|---|---|")
    for name in names:
        decoder = base.build_decoder(DECODER_SCHEMAS[name](auto=auto), target, draft)
        for group in groups:
            decoder.generate_batch(group, 64)
        wall = {mode: [] for mode in MODES}
        drafting = {mode: [] for mode in MODES}
        tokens = {}
        rows_fed.update(asking=0, live=0)
        for rep in range(repeats):
            for mode in (list(MODES) if rep % 2 == 0 else list(MODES)[::-1]):
                batch.SKIP_IDLE = MODES[mode]
                decoder.reset_history()
                start, spent, outs = time.perf_counter(), 0.0, []
                for group in groups:
                    got = decoder.generate_batch(group, 64)
                    spent += sum(out.draft_seconds for out in got)
                    outs += got
                wall[mode].append(time.perf_counter() - start)
                drafting[mode].append(spent)
                tokens.setdefault(mode, [out.tokens for out in outs])
        batch.SKIP_IDLE = True
        pads = 1 - rows_fed["asking"] / max(rows_fed["live"], 1)
        med = {mode: (statistics.median(drafting[mode]), statistics.median(wall[mode])) for mode in MODES}
        print(f"| {name} | {pads:.0%} | {med['pads'][0]:.3f} | {med['left out'][0]:.3f} | {med['pads'][1]:.3f} | "
              f"{med['left out'][1]:.3f} | {med['left out'][1] / med['pads'][1]:.3f} | "
              f"{tokens['pads'] == tokens['left out']} |", flush=True)


if __name__ == "__main__":
    cli(main, "speculative,ouroboros", batch=4, repeats=5, auto=True)
