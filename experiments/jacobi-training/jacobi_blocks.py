"""CLLM's own speed measure: Jacobi forwards per 16-token block on held-out prompts, for each trained model.

    python experiments/jacobi-training/jacobi_blocks.py NAME=MODEL_DIR [...] [--out FILE.csv]

For every held-out codegen-instruct prompt (the 64 the training stages never see, same draw as their held-out
loss) the model's output is produced in 16-token blocks by plain Jacobi iteration from random prompt tokens
(training/trajectories.py, the trajectory collector itself; greedy, 64 new tokens), and each block counts its
forwards until the fixed point is confirmed (states + 1). tokens/forward = 16 / mean forwards per block is what a
consistency-trained model should raise (CLLM: to 2.4-3.4x on 7B models); 1.0 means one token per forward, as AR.
``--split train``: the first 64 training prompts instead, which CLLM and Jacobi Forcing trained on (does the
consistency loss fit its own data at all?).
"""

from __future__ import annotations

import argparse
import random
import sys

import torch

from specnoise.config import ASSETS_DIR, CLLMConfig, DataConfig, ModelConfig, TrainConfig
from specnoise.data.sft import load_sft
from specnoise.decoding.kv import KVModel
from specnoise.models import load_model
from specnoise.training.trajectories import jacobi_trajectory


def measure(path: str, block: int = 16, new: int = 64, split: str = "heldout") -> dict:
    loaded = load_model(ModelConfig(name="m", path=path, device="cpu", template="code-instruct"))
    data = DataConfig(name="codegen-instruct", path=str(ASSETS_DIR / "data" / "codegen-instruct.json"))
    train, heldout = load_sft(data, loaded.tokenizer, "code-instruct", TrainConfig(name="sft", eval_samples=64))
    if split == "train":  # the first 64 training prompts: inside the 400 the consistency stages trained on
        heldout = train[:64]
    kv, cfg = KVModel(loaded.model), CLLMConfig(block=block, max_new_tokens=new)
    forwards, blocks = [], 0
    for i, f in enumerate(heldout):
        traj = jacobi_trajectory(kv, f["input_ids"][: f["prompt_len"]], cfg, {loaded.tokenizer.eos_token_id},
                                 random.Random(i))
        forwards += [len(b["states"]) + 1 for b in traj["blocks"]]
        blocks += len(traj["blocks"])
    mean = sum(forwards) / len(forwards)
    return {"prompts": len(heldout), "blocks": blocks, "forwards_per_block": mean, "tokens_per_forward": block / mean}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="+", help="NAME=MODEL_DIR")
    parser.add_argument("--out", default=None)
    parser.add_argument("--split", choices=["heldout", "train"], default="heldout",
                        help="train: the first 64 training prompts (trained on by cllm / jacobi_forcing)")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    rows = []
    for spec in args.models:
        name, path = spec.split("=", 1)
        rows.append({"row": name, "split": args.split, **measure(path, split=args.split)})
        print(rows[-1], flush=True)
    if args.out:
        import pandas as pd

        pd.DataFrame(rows).to_csv(args.out, index=False)


if __name__ == "__main__":
    main(sys.argv[1:])
