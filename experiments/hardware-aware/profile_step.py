"""Where a decode step's time goes on the CPU: inside the target forwards vs the host work around them.

For AR and each chain/tree drafter on the shipped small-code-msn (fp32, one thread), three prompts of 64 new tokens
after one warm-up generation: the wall time, the time inside target forwards (the engine's clock) and the rest
(``other``), per step and relative to one AR step; then one generation under ``torch.profiler`` and its top host
ops outside the model forward. Usage: python experiments/hardware-aware/profile_step.py [decoder ...] [--auto]
"""

from __future__ import annotations

import sys

import torch
from torch.profiler import ProfilerActivity, profile

from specnoise.config import ASSETS_DIR, DECODER_SCHEMAS, ModelConfig
from specnoise.decoding.base import build_decoder
from specnoise.models import load_model

TEXTS = ["def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
         "def is_palindrome(s: str) -> bool:\n    \"\"\"Check whether s reads the same backwards.\"\"\"\n",
         "def sort_by_length(words):\n    \"\"\"Sort words by length, shortest first.\"\"\"\n"]


def main(names: list[str], auto: bool, profile_ops: bool) -> None:
    torch.set_num_threads(1)
    target = load_model(ModelConfig(name="small-code-msn", path=str(ASSETS_DIR / "models" / "small-code-msn")))
    prompts = [target.tokenizer(t)["input_ids"] for t in TEXTS]
    ar_step = None
    print(f"{'decoder':16s} {'steps':>5s} {'tokens':>6s} {'ms/step':>8s} {'target':>7s} {'other':>7s} "
          f"{'other/AR step':>13s}")
    for name in ["ar", *names]:
        decoder = build_decoder(DECODER_SCHEMAS[name](auto=auto), target)
        decoder.generate(prompts[0], 64)  # warm-up (and decoder.auto's curve)
        steps = tokens = seconds = target_s = 0.0
        for _ in range(3):
            for p in prompts:
                out = decoder.generate(p, 64)
                steps += out.target_forwards
                tokens += len(out.tokens)
                seconds += out.seconds
                target_s += out.target_seconds
        step, other = seconds / steps, (seconds - target_s) / steps
        if name == "ar":
            ar_step = step
        print(f"{name:16s} {steps / 9:5.1f} {tokens / 9:6.1f} {step * 1e3:8.3f} {target_s / steps * 1e3:7.3f} "
              f"{other * 1e3:7.3f} {other / ar_step:13.3f}")
        if profile_ops:
            with profile(activities=[ProfilerActivity.CPU]) as prof:
                decoder.generate(prompts[1], 64)
            table = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=12)
            print("\n".join(table.splitlines()[:16]))


if __name__ == "__main__":
    args = sys.argv[1:]
    main([a for a in args if not a.startswith("--")], "--auto" in args, "--ops" in args)
