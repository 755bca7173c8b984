"""Where a batched step spends its time (issue 28): cProfile over 3 batches of 4 prompts, 64 new tokens, cumulative
seconds of the lock-step loop, the model forward, the slot compaction (BatchKV._tidy), the mask, the batched read.
    python experiments/batch-scaling/profile_step.py [DECODER, default pld]"""
import cProfile
import pstats
import sys

import torch

import specnoise.config as C
from specnoise.config import DECODER_SCHEMAS, ModelConfig
from specnoise.decoding.base import build_decoder
from specnoise.models import load_model

torch.set_num_threads(1)
name = sys.argv[1] if len(sys.argv) > 1 else "pld"
target = load_model(ModelConfig(name="small-code-msn", path=str(C.ASSETS_DIR / "models/small-code-msn")))
ps = [target.tokenizer(t)["input_ids"] for t in [
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    "def is_prime(n):\n    \"\"\"Check whether n is prime.\"\"\"\n",
    "def reverse_words(s):\n    \"\"\"Reverse the words of s.\"\"\"\n",
    "def flatten(xs):\n    \"\"\"Flatten a nested list xs.\"\"\"\n"]]
dec = build_decoder(DECODER_SCHEMAS[name](), target)
dec.generate_batch(ps, 64)
prof = cProfile.Profile()
prof.enable()
for _ in range(3):
    outs = dec.generate_batch(ps, 64)
prof.disable()
st = pstats.Stats(prof)
NAMES = ("generate_batch", "lockstep", "forward", "_tidy", "_call", "attention_mask", "read_together", "to_host",
         "steps")
for fn in NAMES:
    hits = [(k, v) for k, v in st.stats.items() if k[2] == fn]
    for k, v in hits:
        print(f"{k[0].split('/')[-1]}:{fn}: cum {v[3]:.3f}s over {v[1]} calls")
print("tokens per row", [len(o.tokens) for o in outs], "forwards", [o.target_forwards for o in outs],
      "batch reads", dec.host_reads)
