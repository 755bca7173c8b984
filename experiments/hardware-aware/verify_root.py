"""The verify of a step that proposes nothing (a tree drafter's AR step under decoder.auto: the root alone, in a masked
block), timed on the CPU right after a one-token forward of the shipped small-code-msn (fp32, one thread), as in a
decode: median over ``ROUNDS`` forwards, in us, the host read included. Run it at two commits to compare (the verifier
takes the chain's ops for the root alone since 2026-11-30: ``verifier.Verifier.verify``).

Usage: python experiments/hardware-aware/verify_root.py
"""

from __future__ import annotations

import statistics
import time

import torch

from specnoise.config import ASSETS_DIR, ModelConfig
from specnoise.decoding.kv import DynamicEngine
from specnoise.decoding.proposal import tree_shape
from specnoise.decoding.verifier import Verifier
from specnoise.models import load_model

ROUNDS = 300


def main() -> None:
    torch.set_num_threads(1)
    target = load_model(ModelConfig(name="small-code-msn", path=str(ASSETS_DIR / "models" / "small-code-msn")))
    engine = DynamicEngine(target.model)
    verifier = Verifier(engine, read=lambda t: t.tolist())
    shape, nodes = tree_shape([], masked=True), torch.zeros(0, dtype=torch.long)  # the root alone, masked
    engine.forward(list(range(5, 100)))  # a 95-token context
    times = []
    with torch.inference_mode():
        for _ in range(ROUNDS):
            logits = engine.forward([7], last=1)
            engine.crop(engine.length - 1)
            start = time.perf_counter()
            read, *_ = verifier.verify(shape, None, logits, nodes, None, None, None)
            read.tolist()
            times.append(time.perf_counter() - start)
    print(f"verify of the root alone right after a forward: median {1e6 * statistics.median(times[20:]):.1f} us "
          f"({ROUNDS - 20} rounds)")


if __name__ == "__main__":
    main()
