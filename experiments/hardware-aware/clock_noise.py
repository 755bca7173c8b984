"""How much one generation's time moves on this machine, and whether the thread's CPU time moves with it.

AR on the shipped small-code-msn (fp32, one thread), the same 64-token generation ``RUNS`` times in one process after
one warm-up: each run's wall time (``perf_counter``) and the thread's CPU time (``thread_time``), their coefficients of
variation, and how far the two differ per run. If the CPU time moves with the wall time, the spread is the core's own
speed (other tenants' load on the host's caches and memory), not the thread waiting to be scheduled, and no choice of
clock removes it. Also the machine's steal time since boot (``/proc/stat``, Linux), the share of time the hypervisor
gave this VM's CPUs to others.

Usage: python experiments/hardware-aware/clock_noise.py [RUNS]
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

import torch

from specnoise.config import ASSETS_DIR, ARConfig, ModelConfig
from specnoise.decoding.base import build_decoder
from specnoise.models import load_model

PROMPT = "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n"


def steal_share() -> float | None:
    """Steal time over all CPU time since boot (None where /proc/stat is missing)."""
    stat = Path("/proc/stat")
    if not stat.is_file():
        return None
    fields = [int(v) for v in stat.read_text().split("\n", 1)[0].split()[1:]]
    return fields[7] / sum(fields[:8]) if len(fields) > 7 else None


def main(runs: int) -> None:
    torch.set_num_threads(1)
    loaded = load_model(ModelConfig(name="small-code-msn", path=str(ASSETS_DIR / "models" / "small-code-msn")))
    decoder = build_decoder(ARConfig(), loaded)
    prompt = loaded.tokenizer(PROMPT)["input_ids"]
    decoder.generate(prompt, 64)  # warm-up
    wall, cpu = [], []
    for _ in range(runs):
        w, c = time.perf_counter(), time.thread_time()
        decoder.generate(prompt, 64)
        wall.append(time.perf_counter() - w)
        cpu.append(time.thread_time() - c)
    cv = {name: statistics.stdev(xs) / statistics.mean(xs) for name, xs in (("wall", wall), ("cpu", cpu))}
    gap = max(abs(w - c) / w for w, c in zip(wall, cpu))
    steal = steal_share()
    print("| runs | wall ms (min-max) | wall CV | CPU CV | largest wall-CPU gap in a run | steal since boot |")
    print("|---|---|---|---|---|---|")
    print(f"| {runs} | {1e3 * min(wall):.0f}-{1e3 * max(wall):.0f} | {cv['wall']:.1%} | {cv['cpu']:.1%} | {gap:.2%} | "
          f"{'-' if steal is None else f'{steal:.2%}'} |")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 20)
