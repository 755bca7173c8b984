"""decoder.auto as it runs on a graph engine (the compiled static engine on a GPU), simulated on the CPU: what the
controller chooses and what its Python costs per step, faithful and auto side by side on the shipped small-code-msn.

A GPU's committed cost curve is pinned (default: the H100 curve of experiments/gpu/h100/checks4), the controller
prices blocks at that engine's buckets and keeps its picks as on a graph engine (``auto.STICKY``, ``Controller
.kept_pick``); the forwards run on the CPU's dynamic engine, so only the choices and the host time per step carry
over, not the speed. Per drafter: target forwards, the mean size auto verified, the controller's microseconds per
step (``select`` / ``size`` / ``idle`` + ``observe``, timed around the calls) and the host time per step (wall time
outside the model's forwards), faithful and auto, the fastest of ``--rounds`` rounds (the least disturbed by other
work on the machine), and whether auto's tokens equal faithful's (they must: both are lossless).

Usage: python experiments/hardware-aware/graph_sim.py [--decoders tr_jacobi,lookahead] [--prompts 6] [--rounds 3]
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import time
from pathlib import Path

import torch
from profile_step import SPENT, timed  # (this folder's: the script's own folder is on the path)

from specnoise.config import ASSETS_DIR, DECODER_SCHEMAS, ModelConfig
from specnoise.decoding import auto
from specnoise.decoding.base import build_decoder
from specnoise.models import load_model

CURVE = Path(__file__).parents[1] / "gpu/h100/checks4/call1/cost_cache/forward-cost-cd04df44325c74ed.json"
BUCKETS = (1, 8, 16, 64, 72)  # the static engine's buckets that curve was probed on (experiments/gpu/run_checks.sh)
DECODERS = "jacobi,tr_jacobi,pld,lookahead,token_recycling,sam,rest"
CONTROLLER = ("select", "size", "idle", "observe")  # the controller's calls per step


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--decoders", default=DECODERS)
    parser.add_argument("--prompts", type=int, default=6)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--curve", default=str(CURVE))
    args = parser.parse_args()
    torch.set_num_threads(1)
    target = load_model(ModelConfig(name="small-code-msn", path=str(ASSETS_DIR / "models/small-code-msn")))
    with gzip.open(ASSETS_DIR / "data/humaneval/HumanEval.jsonl.gz", "rt") as f:
        texts = [json.loads(line)["prompt"] for line, _ in zip(f, range(args.prompts))]
    prompts = [target.tokenizer(t, add_special_tokens=False).input_ids for t in texts]
    timed(type(target.model), "forward", "forward")
    for attr in CONTROLLER:
        timed(auto.Controller, attr, attr)
    print(f"curve {os.path.relpath(args.curve)}, buckets {BUCKETS}, {args.prompts} HumanEval prompts x "
          f"{args.new_tokens} tokens, the fastest of {args.rounds} rounds\n")
    print("| decoder | forwards faithful / auto | auto's mean size | controller us per step | host us per step, "
          "faithful / auto | auto - faithful | same tokens |")
    print("|---|---|---|---|---|---|---|")
    for name in args.decoders.split(","):
        faithful = build_decoder(DECODER_SCHEMAS[name](), target)
        aware = build_decoder(DECODER_SCHEMAS[name](auto=True, cost_cache=args.curve), target)
        aware.generate(prompts[0], 8)  # builds the controller on the pinned curve
        aware.auto.sticky = auto.STICKY  # as on a graph engine (base.Decoder.start_auto)
        curve = aware.curves["target"]
        curve.buckets, curve.fits, aware.auto.prices = BUCKETS, None, {}  # priced at the engine's buckets
        for p in prompts[:2]:  # warm-up: the statistics and the sticky picks settle
            faithful.generate(p, args.new_tokens), aware.generate(p, args.new_tokens)
        hosts: dict[str, list[float]] = {"faithful": [], "auto": []}
        control, forwards, same = [], {}, True
        for _ in range(args.rounds):
            outs = {}
            for label, decoder in (("faithful", faithful), ("auto", aware)):
                SPENT.clear()
                start = time.perf_counter()
                outs[label] = [decoder.generate(p, args.new_tokens) for p in prompts]
                wall = time.perf_counter() - start
                steps = sum(o.target_forwards for o in outs[label])
                forwards[label] = steps
                hosts[label].append((wall - SPENT["forward"]) / steps * 1e6)
                if label == "auto":
                    control.append(sum(SPENT[a] for a in CONTROLLER) / steps * 1e6)
            same &= all(a.tokens == b.tokens for a, b in zip(outs["faithful"], outs["auto"]))
        sizes = [k for stream in aware.auto.describe().values() for k in stream["sizes"]]
        host = {label: min(v) for label, v in hosts.items()}
        print(f"| {name} | {forwards['faithful']} / {forwards['auto']} | {sum(sizes) / max(len(sizes), 1):.1f} | "
              f"{min(control):.1f} | {host['faithful']:.0f} / {host['auto']:.0f} | "
              f"{host['auto'] - host['faithful']:+.0f} | {same} |")


if __name__ == "__main__":
    main()
