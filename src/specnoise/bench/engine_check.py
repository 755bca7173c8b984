"""GPU check of the engines, one command: every decoder on three engines (dynamic, static eager, static compiled)
against dynamic AR's tokens, with ms/token and compile seconds.

    python -m specnoise.bench.engine_check [--dtype bfloat16] [--buckets 1,8,16,64,72] [--out report.json]
"""

from __future__ import annotations

import argparse
import dataclasses
import gzip
import json
import sys
import time

from specnoise.config import ASSETS_DIR, DECODER_SCHEMAS, ModelConfig
from specnoise.decoding.base import build_decoder
from specnoise.decoding.static_kv import BUCKETS
from specnoise.models import load_model

CHECK_DECODERS = ("ar", "jacobi", "tr_jacobi", "pld", "lookahead", "speculative", "ouroboros", "hf_static")


def check(model: str | None = None, draft: str | None = None, dtype: str = "float32", prompts: int = 4,
          new_tokens: int = 128, decoders=CHECK_DECODERS, device: str = "auto", buckets=None) -> dict:
    """Every decoder on three engines (dynamic, static eager, static compiled) against dynamic AR's tokens on the
    shipped tiny models and HumanEval prompts; prints ms/token, tokens identical to AR and compile seconds.
    Returns {engine: {decoder: {...}}}; ``ok`` is False when a decoder's tokens differ from AR's (fp32) or
    compiled tokens differ from eager static ones (any dtype)."""
    sizes = list(buckets or BUCKETS)
    loaded = {role: load_model(ModelConfig(name=role, path=path, dtype=dtype, device=device, static_cache=False,
                                           static_buckets=sizes))
              for role, path in (("model", model or str(ASSETS_DIR / "models/small-code-msn")),
                                 ("draft", draft or str(ASSETS_DIR / "models/small-code-draft")))}
    with gzip.open(ASSETS_DIR / "data/humaneval/HumanEval.jsonl.gz", "rt") as f:
        texts = [json.loads(line)["prompt"] for line, _ in zip(f, range(prompts))]
    ids = [loaded["model"].tokenizer(t, add_special_tokens=False).input_ids for t in texts]
    engines = {"dynamic": dict(static_cache=False), "static": dict(static_cache=True),
               "compiled": dict(static_cache=True, compile=True)}
    report, tokens = {"ok": True}, {}
    for engine, flags in engines.items():
        target, drafter = (dataclasses.replace(m, engines={}, **flags) for m in loaded.values())
        report[engine] = {}
        for name in decoders:
            if name.startswith("hf_") and engine != "dynamic":
                continue  # generate() keeps its own cache, whatever the engine
            decoder = build_decoder(DECODER_SCHEMAS[name](), target, drafter)
            start = time.perf_counter()
            decoder.generate(ids[0], new_tokens)  # warm-up: allocation and compilation
            warmup = time.perf_counter() - start
            outs = [decoder.generate(p, new_tokens) for p in ids]
            tokens[engine, name] = [o.tokens for o in outs]
            n, seconds = sum(len(o.tokens) for o in outs), sum(o.seconds for o in outs)
            same_ar = sum(a == b for a, b in zip(tokens[engine, name], tokens["dynamic", "ar"])) / len(ids)
            same_eager = (sum(a == b for a, b in zip(tokens[engine, name], tokens["static", name])) / len(ids)
                          if engine == "compiled" else None)
            report[engine][name] = dict(ms_per_token=1e3 * seconds / max(n, 1), tokens=n, identical_to_ar=same_ar,
                                        identical_to_static_eager=same_eager, warmup_seconds=warmup,
                                        compile_seconds=decoder.compile_seconds())
            report["ok"] &= (same_ar == 1.0 or dtype != "float32") and same_eager in (None, 1.0)
            print(f"{engine:9s} {name:12s} {report[engine][name]}", flush=True)
    return report


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="Static-cache engine check: compiled vs eager tokens and timings.")
    parser.add_argument("--model", help="target model path (default: the shipped small-code-msn)")
    parser.add_argument("--draft", help="draft model path (default: the shipped small-code-draft)")
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16"))
    parser.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--decoders", default=",".join(CHECK_DECODERS))
    parser.add_argument("--buckets", help="padded block sizes, e.g. 1,8,128 (fewer: faster compilation)")
    parser.add_argument("--out", help="write the report as JSON here")
    args = parser.parse_args()
    result = check(args.model, args.draft, args.dtype, args.prompts, args.new_tokens, args.decoders.split(","),
                   args.device, args.buckets and [int(b) for b in args.buckets.split(",")])
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=2)
    print("OK" if result["ok"] else "MISMATCH")
    sys.exit(0 if result["ok"] else 1)
