"""Token Recycling with decoder.auto: an AR step at a root whose row of the matrix is unwritten (the rule since
2026-11-30: ``TokenRecycling.known``) vs every row taken as written (before: a tree drafted from a row of zeros),
side by side with AR in one process.

As the benchmark runs (``bench/measure.py``): per round, each decoder warms up on the first prompt and empties its
matrix, then decodes the prompts in order keeping its matrix (and its controller's statistics) from prompt to prompt;
the three decoders alternate per prompt (ABC / CBA). The shipped small-code-msn, fp32, one thread, ``decoder.auto=true``
with each run's own cost curve. Prints per decoder and rule the speedup over AR of all prompts, the target forwards,
and each of the first ten prompts' speedup (summed over the rounds).

Usage: python experiments/hardware-aware/known_rows.py [--benchmark humaneval|spec_bench]
    [--decoders token_recycling,sam] [--prompts 10] [--new-tokens 128] [--rounds 3]
"""

from __future__ import annotations

import argparse

import torch

from specnoise.bench.datasets import dialogue_text, load_samples
from specnoise.config import ASSETS_DIR, DECODER_SCHEMAS, BenchmarkConfig, ModelConfig
from specnoise.data.templates import encode_prompt
from specnoise.decoding.base import build_decoder
from specnoise.models import load_model

DATA = {"humaneval": "humaneval/HumanEval.jsonl.gz", "spec_bench": "spec_bench/question.jsonl"}


class Everything(set):
    """Every row counts as written: the rule before."""

    def __contains__(self, item) -> bool:
        return True


def main(benchmark: str, names: list[str], n: int, new_tokens: int, rounds: int) -> None:
    torch.set_num_threads(1)
    target = load_model(ModelConfig(name="small-code-msn", path=str(ASSETS_DIR / "models" / "small-code-msn")))
    bench = BenchmarkConfig(name=benchmark, path=str(ASSETS_DIR / "data" / DATA[benchmark]), scorer="per_category",
                            limit_per_category=-(-n // 6) if benchmark == "spec_bench" else None)
    prompts = [encode_prompt(target.tokenizer, dialogue_text(s, "raw", [], target.tokenizer))
               for s in load_samples(bench, "raw")][:n]
    print(f"{benchmark}, {len(prompts)} prompts, {new_tokens} new tokens, {rounds} rounds\n")
    print("| decoder | rule | speedup vs AR, all prompts | target forwards | per prompt (first ten) |")
    print("|---|---|---|---|---|")
    for name in names:
        decoders = {"ar": build_decoder(DECODER_SCHEMAS["ar"](), target),
                    "known": build_decoder(DECODER_SCHEMAS[name](auto=True), target),
                    "every row": build_decoder(DECODER_SCHEMAS[name](auto=True), target)}
        seconds = {k: [0.0] * len(prompts) for k in decoders}
        forwards = dict.fromkeys(decoders, 0)
        for r in range(rounds):
            for key, decoder in decoders.items():
                decoder.generate(prompts[0], new_tokens)  # the warm-up, then an empty matrix
                decoder.reset_history()
                if key == "every row":  # (after each reset: it starts a new set)
                    recycling = getattr(decoder.drafter, "fallback", decoder.drafter)
                    recycling.known = Everything()
            for i, prompt in enumerate(prompts):
                for key in list(decoders) if (i + r) % 2 == 0 else list(reversed(decoders)):
                    out = decoders[key].generate(prompt, new_tokens)
                    seconds[key][i] += out.seconds
                    forwards[key] += out.target_forwards
        for key in ("known", "every row"):
            per = " ".join(f"{a / b:.2f}" for a, b in list(zip(seconds["ar"], seconds[key]))[:10])
            print(f"| {name} | {key} | {sum(seconds['ar']) / sum(seconds[key]):.3f} | {forwards[key]} | {per} |")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--benchmark", default="humaneval", choices=sorted(DATA))
    parser.add_argument("--decoders", default="token_recycling,sam")
    parser.add_argument("--prompts", type=int, default=10)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    main(args.benchmark, args.decoders.split(","), args.prompts, args.new_tokens, args.rounds)
