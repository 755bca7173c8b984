"""decoder.auto with one of its run-time calibrations switched off vs on, side by side in one process.

Each calibration corrects the cost curve (timed in a tight loop of one model's forwards) by what the run's own
generations take; here each is switched off in one copy of a decoder and left on in another:

- ``scale``: draft forwards priced at what they take in a generation (``Decoder.draft_scale``, calibration.py
  ``DraftScale``) vs at the draft's curve alone; for the decoders with a draft model (default: speculative decoding and
  Ouroboros).
- ``times``: each step's host work priced and each exploration judged by its own time (calibration.py
  ``StepTimes``) vs by the prices alone; for any drafter.

On the shipped pair (small-code-msn + small-code-draft, fp32, one thread), AR and every setting decode each prompt in
one process, the order reversed from prompt to prompt and repeat to repeat; per decoder the median time of each
prompt, summed, AR's over the decoder's (its speedup), and whether every token equals AR's. The curves come from
``--cost-cache`` (probed there on first use). Usage: python experiments/hardware-aware/auto_ab.py
[spec_bench|humaneval] [--switch scale|times] [--decoders speculative,ouroboros] [--repeats 3]
[--cost-cache outputs/cost_cache]
"""

from __future__ import annotations

import argparse
import statistics
from collections import Counter, defaultdict

import torch

from specnoise.bench.datasets import dialogue_text, load_samples
from specnoise.config import ASSETS_DIR, DECODER_SCHEMAS, BenchmarkConfig, ModelConfig
from specnoise.data.templates import encode_prompt
from specnoise.decoding.base import build_decoder, decoder_class
from specnoise.models import context_length, load_model

NEW_TOKENS = 128
BENCHMARKS = {
    "spec_bench": dict(path="spec_bench/question.jsonl", limit_per_category=10, scorer="per_category"),
    "humaneval": dict(path="humaneval/HumanEval.jsonl.gz", limit=10),  # (the first 10 that fit, as the runner takes)
}


def switch_off(decoder, switch: str) -> None:
    """``decoder`` without the calibration ``switch``, from its first generation on (its controller exists then)."""
    if switch == "scale":
        decoder.calibrate = lambda fed: None  # draft_scale stays 1: the curve's prices alone
    else:
        decoder.auto.times = None  # prices alone, explorations judged by their price


def main(bench_name: str, switch: str, names: list[str], repeats: int, cost_cache: str) -> None:
    torch.set_num_threads(1)
    models = ASSETS_DIR / "models"
    target = load_model(ModelConfig(name="small-code-msn", path=str(models / "small-code-msn")))
    draft = load_model(ModelConfig(name="small-code-draft", path=str(models / "small-code-draft")))
    options = dict(BENCHMARKS[bench_name])
    bench = BenchmarkConfig(name=bench_name, path=str(ASSETS_DIR / "data" / options.pop("path")), **options)
    prompts = [(s.category, encode_prompt(target.tokenizer, dialogue_text(s, "raw", [], target.tokenizer)))
               for s in load_samples(bench, "raw")]
    prompts = [(c, p) for c, p in prompts if len(p) <= context_length(target.model.config) - NEW_TOKENS]
    prompts = prompts[:bench.limit] if bench.limit else prompts
    decoders = {"ar": build_decoder(DECODER_SCHEMAS["ar"](), target)}
    off = set()
    for name in names:
        for column in (name, f"{name}+{switch}"):
            decoders[column] = build_decoder(DECODER_SCHEMAS[name](auto=True, cost_cache=cost_cache), target,
                                             draft if decoder_class(name).needs_draft else None)
        off.add(name)
    for column, decoder in decoders.items():  # warm-up: the curves, the first statistics
        for _, p in prompts[:3]:
            decoder.generate(p, 32)
            if column in off:
                switch_off(decoder, switch)
    seconds: dict = defaultdict(list)
    tokens: dict = {}
    forwards: Counter = Counter()
    columns = list(decoders)
    for r in range(repeats):
        for i, (_, p) in enumerate(prompts):
            for column in columns if (r + i) % 2 == 0 else columns[::-1]:
                out = decoders[column].generate(p, NEW_TOKENS)
                seconds[column, i].append(out.seconds)
                tokens[column, i] = out.tokens
                if r == 0:
                    forwards[column, "target"] += out.target_forwards
                    forwards[column, "draft"] += out.draft_forwards
    same = all(tokens[column, i] == tokens["ar", i] for column in columns for i in range(len(prompts)))
    print(f"{bench_name}: {len(prompts)} prompts (first turns), {NEW_TOKENS} new tokens, {repeats} repeats, "
          f"'{switch}' off in NAME, on in NAME+{switch}; every token equal to AR's: {same}\n")
    print("| decoder | draft scale | host ms (AR / drafted step) | target forwards | draft forwards | seconds | "
          "speedup vs AR |")
    print("|---|---|---|---|---|---|---|")
    total = {column: sum(statistics.median(seconds[column, i]) for i in range(len(prompts))) for column in columns}
    for column in columns:
        decoder = decoders[column]
        scale = f"{decoder.draft_scale:.2f}" if decoder.draft is not None else ""
        times = decoder.auto.times if decoder.auto is not None else None
        host = " / ".join(f"{x * 1e3:.2f}" if x is not None else "-" for x in times.host) if times else ""
        print(f"| {column} | {scale} | {host} | {forwards[column, 'target']} | {forwards[column, 'draft']} | "
              f"{total[column]:.2f} | {total['ar'] / total[column]:.3f} |")
    categories = sorted({c for c, _ in prompts})
    if len(categories) > 1:
        print("\n| category | " + " | ".join(columns[1:]) + " |")
        print("|---|" + "---|" * (len(columns) - 1))
        for c in categories:
            idx = [i for i, (cc, _) in enumerate(prompts) if cc == c]
            t = {column: sum(statistics.median(seconds[column, i]) for i in idx) for column in columns}
            print(f"| {c} | " + " | ".join(f"{t['ar'] / t[column]:.3f}" for column in columns[1:]) + " |")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("benchmark", nargs="?", default="spec_bench", choices=sorted(BENCHMARKS))
    parser.add_argument("--switch", default="scale", choices=("scale", "times"))
    parser.add_argument("--decoders", default="speculative,ouroboros", help="comma-separated drafters")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--cost-cache", default="outputs/cost_cache")
    args = parser.parse_args()
    main(args.benchmark, args.switch, args.decoders.split(","), args.repeats, args.cost_cache)
