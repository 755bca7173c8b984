"""The engine choice on the CPU (issue #27 item 3): AR, PLD and TR-Jacobi on the dynamic vs the static-cache engine.

One model (the shipped small-code-msn, fp32, one thread) behind two engines, one prompt of 64 new tokens, the two
engines' generations alternating in one process after a warm-up each: the median ms per target step, [min, max],
over five generations. Usage: python experiments/hardware-aware/static_vs_dynamic.py
"""

from __future__ import annotations

import dataclasses
import statistics

import torch

from specnoise.config import ASSETS_DIR, DECODER_SCHEMAS, ModelConfig
from specnoise.decoding.base import build_decoder
from specnoise.models import load_model

PROMPT = "def is_palindrome(s: str) -> bool:\n    \"\"\"Check whether s reads the same backwards.\"\"\"\n"


def main() -> None:
    torch.set_num_threads(1)
    dynamic = load_model(ModelConfig(name="small-code-msn", path=str(ASSETS_DIR / "models" / "small-code-msn")))
    static = dataclasses.replace(dynamic, static_cache=True, engines={})  # the same weights, its own engine
    prompt = dynamic.tokenizer(PROMPT)["input_ids"]
    for name in ("ar", "pld", "tr_jacobi"):
        decoders = {kind: build_decoder(DECODER_SCHEMAS[name](), model)
                    for kind, model in (("dynamic", dynamic), ("static", static))}
        for decoder in decoders.values():
            decoder.generate(prompt, 64)  # warm-up (the static cache is allocated here)
        ms = {kind: [] for kind in decoders}
        for _ in range(5):
            for kind, decoder in decoders.items():
                out = decoder.generate(prompt, 64)
                ms[kind].append(out.seconds / out.target_forwards * 1e3)
        median = {kind: statistics.median(v) for kind, v in ms.items()}
        print(f"{name:10s} " + "  ".join(f"{kind} {median[kind]:.2f} ms/step [{min(v):.2f}, {max(v):.2f}]"
                                         for kind, v in ms.items())
              + f"  static / dynamic {median['static'] / median['dynamic']:.3f}")


if __name__ == "__main__":
    main()
