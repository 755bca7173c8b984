"""Draft forwards priced at what they take in a generation (``Decoder.draft_scale``) vs at the draft's curve alone.

decoder.auto prices a draft model's forwards by the draft's curve, timed in a tight loop; inside a generation a draft
forward follows a target forward and runs with cold caches. Since this change each decoder scales its draft prices by
what its draft forwards took over their price, relative to the target's (auto.py ``DraftScale``). Here, on the shipped
pair (small-code-msn + small-code-draft, fp32, one thread), speculative decoding and Ouroboros with auto, each without
the scale (the code before) and with it, beside AR, every prompt decoded by all five in one process, the order reversed
from prompt to prompt and repeat to repeat; per decoder the median time of each prompt, summed, AR's over the
decoder's (its speedup), and whether every token equals AR's. The curves come from ``--cost-cache`` (probed there on
first use). Usage: python experiments/hardware-aware/draft_scale.py [spec_bench|humaneval] [--repeats 3]
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
from specnoise.decoding.base import build_decoder
from specnoise.models import context_length, load_model

NEW_TOKENS = 128
# column -> (decoder, whether its draft prices carry the run's scale)
SETTINGS = {"ouroboros": ("ouroboros", False), "ouroboros+scale": ("ouroboros", True),
            "speculative": ("speculative", False), "speculative+scale": ("speculative", True)}
BENCHMARKS = {
    "spec_bench": dict(path="spec_bench/question.jsonl", limit_per_category=10, scorer="per_category"),
    "humaneval": dict(path="humaneval/HumanEval.jsonl.gz", limit=10),  # (the first 10 that fit, as the runner takes)
}


def main(bench_name: str, repeats: int, cost_cache: str) -> None:
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
    for column, (name, scaled) in SETTINGS.items():
        decoders[column] = build_decoder(DECODER_SCHEMAS[name](auto=True, cost_cache=cost_cache), target, draft)
        if not scaled:
            decoders[column].calibrate = lambda fed: None  # draft_scale stays 1: the curve's prices alone
    for decoder in decoders.values():  # warm-up: the curves, the first statistics
        for _, p in prompts[:3]:
            decoder.generate(p, 32)
    seconds: dict = defaultdict(list)
    tokens: dict = {}
    forwards: Counter = Counter()
    names = list(decoders)
    for r in range(repeats):
        for i, (_, p) in enumerate(prompts):
            for name in names if (r + i) % 2 == 0 else names[::-1]:
                out = decoders[name].generate(p, NEW_TOKENS)
                seconds[name, i].append(out.seconds)
                tokens[name, i] = out.tokens
                if r == 0:
                    forwards[name, "target"] += out.target_forwards
                    forwards[name, "draft"] += out.draft_forwards
    same = all(tokens[name, i] == tokens["ar", i] for name in names for i in range(len(prompts)))
    print(f"{bench_name}: {len(prompts)} prompts (first turns), {NEW_TOKENS} new tokens, {repeats} repeats; "
          f"every token equal to AR's: {same}\n")
    print("| decoder | draft scale | target forwards | draft forwards | seconds | speedup vs AR |")
    print("|---|---|---|---|---|---|")
    total = {name: sum(statistics.median(seconds[name, i]) for i in range(len(prompts))) for name in names}
    for name in names:
        scale = decoders[name].draft_scale if name != "ar" else None
        print(f"| {name} | {'' if scale is None else f'{scale:.2f}'} | {forwards[name, 'target']} | "
              f"{forwards[name, 'draft']} | {total[name]:.2f} | {total['ar'] / total[name]:.3f} |")
    categories = sorted({c for c, _ in prompts})
    if len(categories) > 1:
        print("\n| category | " + " | ".join(names[1:]) + " |")
        print("|---|" + "---|" * (len(names) - 1))
        for c in categories:
            idx = [i for i, (cc, _) in enumerate(prompts) if cc == c]
            t = {name: sum(statistics.median(seconds[name, i]) for i in idx) for name in names}
            print(f"| {c} | " + " | ".join(f"{t['ar'] / t[name]:.3f}" for name in names[1:]) + " |")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("benchmark", nargs="?", default="spec_bench", choices=sorted(BENCHMARKS))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--cost-cache", default="outputs/cost_cache")
    args = parser.parse_args()
    main(args.benchmark, args.repeats, args.cost_cache)
