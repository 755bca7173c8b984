"""decoder.auto with one of its run-time calibrations switched off vs on, side by side in one process.

Each calibration corrects the cost curve (timed in a tight loop of one model's forwards) by what the run's own
generations take; here each is switched off in one copy of a decoder and left on in another:

- ``scale``: draft forwards priced at what they take in a generation (``Decoder.draft_scale``, calibration.py
  ``DraftScale``) vs at the draft's curve alone; for the decoders with a draft model (default: speculative decoding and
  Ouroboros).
- ``times``: each step's host work priced and each exploration judged by its own time (calibration.py
  ``StepTimes``) vs by the prices alone; for any drafter.
- ``attention``: not a calibration: the models loaded with ``attn_implementation=sdpa_gqa`` (attention.py: no copy of
  the KV cache per query head under a mask, as every tree and batched forward has) in the switched-on copy, ``sdpa``
  in the other (AR runs on ``sdpa``: its one-token and prefill forwards take neither copy).

``--batch B``: the prompts sorted by length into groups of B (as ``benchmark.group_by_length``), every decoder (AR
too) decoding each group in lock-step (``generate_batch``); the units timed are the groups.

On the shipped pair (small-code-msn + small-code-draft, fp32, one thread), AR and every setting decode each prompt in
one process, the order reversed from prompt to prompt and repeat to repeat; per decoder the median time of each
prompt (group), summed, AR's over the decoder's (its speedup), the slowest prompt's (group's), and whether every
token equals AR's. The curves come from
``--cost-cache`` (probed there on first use). Usage: python experiments/hardware-aware/auto_ab.py
[spec_bench|humaneval] [--switch scale|times|attention] [--batch 1] [--limit N]
[--decoders speculative,ouroboros] [--repeats 3] [--cost-cache outputs/cost_cache]
"""

from __future__ import annotations

import argparse
import statistics
import time
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


def load(name: str, attention: str = "sdpa"):
    return load_model(ModelConfig(name=name, path=str(ASSETS_DIR / "models" / name), attn_implementation=attention))


def main(bench_name: str, switch: str, names: list[str], repeats: int, cost_cache: str, batch: int,
         limit: int = 0) -> None:
    torch.set_num_threads(1)
    target, draft = load("small-code-msn"), load("small-code-draft")
    models = {False: (target, draft)}  # per copy (switched on or not): its target and draft
    models[True] = (load("small-code-msn", "sdpa_gqa"), load("small-code-draft", "sdpa_gqa")) \
        if switch == "attention" else models[False]
    options = dict(BENCHMARKS[bench_name])
    if limit:
        options["limit"] = limit
    bench = BenchmarkConfig(name=bench_name, path=str(ASSETS_DIR / "data" / options.pop("path")), **options)
    prompts = [(s.category, encode_prompt(target.tokenizer, dialogue_text(s, "raw", [], target.tokenizer)))
               for s in load_samples(bench, "raw")]
    prompts = [(c, p) for c, p in prompts if len(p) <= context_length(target.model.config) - NEW_TOKENS]
    prompts = prompts[:bench.limit] if bench.limit else prompts
    if batch > 1:  # groups of similar length (benchmark.group_by_length), each timed whole
        ordered = sorted(prompts, key=lambda cp: len(cp[1]))
        units = [ordered[i:i + batch] for i in range(0, len(ordered), batch)]
    else:
        units = [[cp] for cp in prompts]
    decoders = {"ar": build_decoder(DECODER_SCHEMAS["ar"](), target)}
    off = set()
    for name in names:
        for on, column in ((False, name), (True, f"{name}+{switch}")):
            model, drafter = models[on]
            decoders[column] = build_decoder(DECODER_SCHEMAS[name](auto=True, cost_cache=cost_cache), model,
                                             drafter if decoder_class(name).needs_draft else None)
        off.add(name)
    for column, decoder in decoders.items():  # warm-up: the curves, the first statistics
        for _, p in prompts[:3]:
            decoder.generate(p, 32)
            if column in off and switch != "attention":
                switch_off(decoder, switch)
        if batch > 1:
            decoder.generate_batch([p for _, p in units[0]], 32)
    seconds: dict = defaultdict(list)
    tokens: dict = {}
    forwards: Counter = Counter()
    columns = list(decoders)
    for r in range(repeats):
        for i, unit in enumerate(units):
            for column in columns if (r + i) % 2 == 0 else columns[::-1]:
                rows = [p for _, p in unit]
                start = time.perf_counter()
                outs = decoders[column].generate_batch(rows, NEW_TOKENS) if batch > 1 else \
                    [decoders[column].generate(rows[0], NEW_TOKENS)]
                seconds[column, i].append(time.perf_counter() - start)
                tokens[column, i] = [out.tokens for out in outs]
                if r == 0:
                    forwards[column, "target"] += sum(out.target_forwards for out in outs)
                    forwards[column, "draft"] += sum(out.draft_forwards for out in outs)
    same = all(tokens[column, i] == tokens["ar", i] for column in columns for i in range(len(units)))
    print(f"{bench_name}: {len(prompts)} prompts (first turns), {NEW_TOKENS} new tokens, {repeats} repeats, "
          f"batch {batch} ({len(units)} timed units), '{switch}' off in NAME, on in NAME+{switch}; every token "
          f"equal to AR's: {same}\n")
    print("| decoder | draft scale | host ms (AR / drafted step) | target forwards | draft forwards | seconds | "
          "speedup vs AR | slowest unit |")
    print("|---|---|---|---|---|---|---|---|")
    median = {key: statistics.median(times) for key, times in seconds.items()}
    total = {column: sum(median[column, i] for i in range(len(units))) for column in columns}
    for column in columns:
        decoder = decoders[column]
        scale = f"{decoder.draft_scale:.2f}" if decoder.draft is not None else ""
        times = decoder.auto.times if decoder.auto is not None else None
        host = " / ".join(f"{x * 1e3:.2f}" if x is not None else "-" for x in times.host) if times else ""
        print(f"| {column} | {scale} | {host} | {forwards[column, 'target']} | {forwards[column, 'draft']} | "
              f"{total[column]:.2f} | {total['ar'] / total[column]:.3f} | "
              f"{min(median['ar', i] / median[column, i] for i in range(len(units))):.3f} |")
    categories = sorted({c for c, _ in prompts})
    if len(categories) > 1 and batch == 1:
        print("\n| category | " + " | ".join(columns[1:]) + " |")
        print("|---|" + "---|" * (len(columns) - 1))
        for c in categories:
            idx = [i for i, (cc, _) in enumerate(prompts) if cc == c]
            t = {column: sum(median[column, i] for i in idx) for column in columns}
            print(f"| {c} | " + " | ".join(f"{t['ar'] / t[column]:.3f}" for column in columns[1:]) + " |")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("benchmark", nargs="?", default="spec_bench", choices=sorted(BENCHMARKS))
    parser.add_argument("--switch", default="scale", choices=("scale", "times", "attention"))
    parser.add_argument("--batch", type=int, default=1, help="rows decoded together (groups of similar length)")
    parser.add_argument("--limit", type=int, default=0, help="the first N prompts (default: the benchmark's subset)")
    parser.add_argument("--decoders", default="speculative,ouroboros", help="comma-separated drafters")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--cost-cache", default="outputs/cost_cache")
    args = parser.parse_args()
    main(args.benchmark, args.switch, args.decoders.split(","), args.repeats, args.cost_cache, args.batch, args.limit)
