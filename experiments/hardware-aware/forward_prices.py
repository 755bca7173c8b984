"""What a decoder's target forwards take inside its generations over what the cost curve prices them at, by kind and
size: where the curve (a tight loop of one kind of forward) and the run part.

On the shipped small-code-msn (fp32, one thread), the first 10 HumanEval prompts, 128 new tokens, each decoder after
a warm-up generation, the decoders in turn on each prompt in one process; every target forward but each generation's
prefill, grouped by kind (a causal chain, or a tree / window with a 4D mask) and size band: its engine's per-forward
clock (``Clock.laps``) summed over the curve's price of it at its size, kind and context (``cost.Curve``, from
``--cost-cache``), and the count.
Usage: python experiments/hardware-aware/forward_prices.py [decoder[+auto] ...] [--cost-cache DIR]
"""

from __future__ import annotations

import argparse
from collections import defaultdict

import torch

from specnoise.bench.datasets import dialogue_text, load_samples
from specnoise.config import ASSETS_DIR, DECODER_SCHEMAS, BenchmarkConfig, ModelConfig
from specnoise.data.templates import encode_prompt
from specnoise.decoding.base import LONG_CONTEXT, build_decoder, largest_probe
from specnoise.decoding.cost import CHAIN, TREE, Curve
from specnoise.models import load_model

DECODERS = ["ar", "pld+auto", "tr_jacobi+auto", "token_recycling+auto", "sam+auto", "rest+auto", "tr_jacobi"]
BANDS = ((1, "1"), (8, "2-8"), (32, "9-32"), (1 << 30, "33+"))


def main(names: list[str], cost_cache: str) -> None:
    torch.set_num_threads(1)
    target = load_model(ModelConfig(name="small-code-msn", path=str(ASSETS_DIR / "models" / "small-code-msn")))
    bench = BenchmarkConfig(name="humaneval", path=str(ASSETS_DIR / "data" / "humaneval" / "HumanEval.jsonl.gz"))
    prompts = [encode_prompt(target.tokenizer, dialogue_text(s, "raw", [], target.tokenizer))
               for s in load_samples(bench, "raw")][:10]
    decoders, curves, sums = {}, {}, {}
    for name in names:
        base, _, auto = name.partition("+")
        decoder = decoders[name] = build_decoder(DECODER_SCHEMAS[base](auto=bool(auto), cost_cache=cost_cache), target)
        decoder.generate(prompts[0], 16)  # warm-up (decoder.auto: its curve and first statistics)
        # the decoder's own curve, or for a faithful one the curve auto would probe for these prompts
        curves[name] = decoder.curves.get("target") or Curve(decoder.target, LONG_CONTEXT,
                                                             largest_probe(decoder.target), cost_cache)
        sums[name] = defaultdict(lambda: [0.0, 0.0, 0])
    for prompt in prompts:  # the decoders in turn on each prompt: a drift of the machine's speed reaches them all
        for name, decoder in decoders.items():
            out = decoder.generate(prompt, 128)
            for (q, masked, context), seconds in list(zip(out.forward_log, decoder.target.clock.laps))[1:]:
                band = next(label for top, label in BANDS if q <= top)
                row = sums[name]["tree" if masked else "chain", band]
                row[0] += seconds
                row[1] += curves[name](q, TREE if masked else CHAIN, context)
                row[2] += 1
    print("| decoder | kind | tokens | forwards | measured / priced |")
    print("|---|---|---|---|---|")
    for name in names:
        for (kind, band), (measured, priced, count) in sorted(sums[name].items()):
            print(f"| {name} | {kind} | {band} | {count} | {measured / priced:.2f} |")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("decoders", nargs="*", default=DECODERS)
    parser.add_argument("--cost-cache", default="outputs/cost_cache")
    args = parser.parse_args()
    main(args.decoders, args.cost_cache)
