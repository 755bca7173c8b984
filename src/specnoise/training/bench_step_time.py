"""MSN must cost what SFT costs per step: time both on the same batches in one process.

    python -m specnoise.training.bench_step_time --model PATH [--steps 30] [--batch-size 8] [--max-seq-len 384]

Each step is collate (MSN: noise injection) + forward + backward + optimizer step, on a batch drawn once and
used by both; the two alternate, each going first on every other batch, so machine drift hits both
alike. Prints (and returns) the median step times and the median of the per-batch MSN / SFT ratios.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time

import torch

from specnoise.config import ASSETS_DIR, DataConfig, ModelConfig, NoiseConfig, TrainConfig
from specnoise.data.sft import load_sft
from specnoise.models import load_model
from specnoise.training.collator import Collator


def bench_step_time(model_path: str, data_path: str | None = None, steps: int = 30, batch_size: int = 8,
                    max_seq_len: int = 384, template: str = "code-instruct", noise: NoiseConfig | None = None,
                    warmup: int = 2, seed: int = 0) -> dict:
    loaded = load_model(ModelConfig(name="bench", path=model_path, device="auto", template=template))
    model, tokenizer = loaded.model.train(), loaded.tokenizer
    data = DataConfig(name="bench", path=data_path or str(ASSETS_DIR / "data" / "codegen-instruct.json"))
    features, _ = load_sft(data, tokenizer, template, TrainConfig(name="msn", max_seq_len=max_seq_len, eval_samples=0))
    rng = random.Random(seed)
    batches = [rng.sample(features, batch_size) for _ in range(warmup + steps)]
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    collators = {"sft": Collator(pad), "msn": Collator(pad, noise or NoiseConfig(), vocab_size=len(tokenizer),
                                                       seed=seed)}
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-6)  # tiny steps: the model barely moves
    sync = torch.cuda.synchronize if loaded.device.type == "cuda" else (lambda: None)

    def step(kind: str, batch: list[dict]) -> float:
        sync()
        start = time.perf_counter()
        inputs = {k: v.to(loaded.device) for k, v in collators[kind](batch).items()}
        model(**inputs).loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        sync()
        return time.perf_counter() - start

    times: dict[str, list[float]] = {"sft": [], "msn": []}
    for i, batch in enumerate(batches):
        order = ("sft", "msn") if i % 2 == 0 else ("msn", "sft")
        for kind in order:
            seconds = step(kind, batch)
            if i >= warmup:
                times[kind].append(seconds)
    ratios = [m / s for m, s in zip(times["msn"], times["sft"])]
    return {
        "model": model_path, "device": str(loaded.device), "steps": steps, "batch_size": batch_size,
        "sft_median_s": statistics.median(times["sft"]), "msn_median_s": statistics.median(times["msn"]),
        "ratio_of_medians": statistics.median(times["msn"]) / statistics.median(times["sft"]),
        "median_ratio": statistics.median(ratios),
        "sum_ratio": sum(times["msn"]) / sum(times["sft"]),
    }


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=str(ASSETS_DIR / "models" / "small-code"))
    parser.add_argument("--data", default=None, help="Alpaca-style JSON/JSONL (default: shipped codegen-instruct)")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--max-seq-len", type=int, default=384)
    parser.add_argument("--template", default="code-instruct")
    parser.add_argument("--noise-length", type=int, default=4)
    args = parser.parse_args(argv)
    result = bench_step_time(args.model, args.data, args.steps, args.batch_size, args.max_seq_len, args.template,
                             NoiseConfig(length=args.noise_length))
    print(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
