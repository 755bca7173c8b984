"""A/B of two checkouts' batched decoding (issue 28: the threaded batch core vs the lock-step one): the first 4
HumanEval prompts at B = 4, 64 new tokens, AR / PLD / TR-Jacobi, the minimum over 3 interleaved runs of each.
Run once per checkout, back to back:
    PYTHONPATH=OLD/src python experiments/batch-scaling/lockstep_ab.py old
    PYTHONPATH=NEW/src python experiments/batch-scaling/lockstep_ab.py new
Prints per decoder: tokens, batched steps (forwards of the longest row), min seconds, tokens/s."""
import gzip
import json
import sys
import time

import torch

import specnoise.config as C
from specnoise.config import DECODER_SCHEMAS, ModelConfig
from specnoise.decoding.base import build_decoder
from specnoise.models import load_model

torch.set_num_threads(1)
label = sys.argv[1]
target = load_model(ModelConfig(name="small-code-msn", path=str(C.ASSETS_DIR / "models/small-code-msn")))
rows = [json.loads(l) for l in gzip.open(C.ASSETS_DIR / "data/humaneval/HumanEval.jsonl.gz", "rt")][:8]
prompts = [target.tokenizer(r["prompt"])["input_ids"] for r in rows]
groups = [prompts[:4]]
specs = {"ar": {}, "pld": {}, "tr_jacobi": {}}
decs = {n: build_decoder(DECODER_SCHEMAS[n](**o), target) for n, o in specs.items()}
for d in decs.values():
    d.generate_batch(groups[0], 8)  # warm-up
best = {n: [float("inf")] * len(groups) for n in decs}
info = {}
for _ in range(3):
    for n, d in decs.items():  # interleaved: drift spreads over all decoders
        for g, grp in enumerate(groups):
            t = time.perf_counter()
            outs = d.generate_batch(grp, 64)
            best[n][g] = min(best[n][g], time.perf_counter() - t)
            info.setdefault(n, {})[g] = (sum(len(o.tokens) for o in outs), max(o.target_forwards for o in outs))
for n in decs:
    tokens = sum(v[0] for v in info[n].values())
    steps = sum(v[1] for v in info[n].values())
    secs = sum(best[n])
    print(f"{label} {n:10s} B=4 tokens={tokens} batch_steps={steps} min_seconds={secs:.3f} tok/s={tokens / secs:.1f}")
