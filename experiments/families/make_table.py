"""Writes README's family support table (experiments/families/table.md) by running tests/test_families.py's checks:
every family x every decoder on the dynamic engine, every engine-run decoder on the static engine (where the family's
cache allows it), greedy tokens equal to AR's on 2 prompts x 24 tokens of tiny random fp32 models on the CPU.

    PYTHONPATH=src python experiments/families/make_table.py   # ~10 min on one core of a shared 2-core CPU

The TP column is transformers' own: whether the family's config carries a tensor-parallel plan (base_model_tp_plan);
experiments/tensor-parallel/ says what a 2-process run of the shipped models shows.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1] / "tests"))
torch.set_num_threads(1)

from helpers_families import FAMILIES, family_config  # noqa: E402
from specnoise.decoding.base import DECODER_MODULES  # noqa: E402
from specnoise.models import sliding_window  # noqa: E402
from test_families import ENGINE_DECODERS, check_lossless  # noqa: E402


def passed(family: str, names: list[str], static: bool = False) -> tuple[int, list[str]]:
    failed = []
    for name in names:
        try:
            check_lossless(family, name, static)
        except Exception as err:  # noqa: BLE001  (a row of the table, not a crash)
            failed.append(f"{name} ({type(err).__name__})")
    return len(names) - len(failed), failed


def main() -> None:
    rows = ["| family (model_type) | sliding window | dynamic engine | static engine | TP plan in transformers |",
            "|---|---|---|---|---|"]
    every = list(DECODER_MODULES)
    for family in FAMILIES:
        config = family_config(family)
        window = sliding_window(config)
        ok, failed = passed(family, every)
        dynamic = f"{ok}/{len(every)} lossless" + (f"; fails: {', '.join(failed)}" if failed else "")
        if window:
            static = "refused (rolling cache): use the dynamic engine"
        else:
            ok, failed = passed(family, ENGINE_DECODERS, static=True)
            static = f"{ok}/{len(ENGINE_DECODERS)} lossless" + (f"; fails: {', '.join(failed)}" if failed else "")
        tp = "yes" if getattr(config, "base_model_tp_plan", None) else "no"
        rows.append(f"| {family} | {'yes (prompt + budget <= window)' if window else 'no'} | {dynamic} | "
                    f"{static} | {tp} |")
        print(rows[-1], flush=True)
    (HERE / "table.md").write_text("\n".join(rows) + "\n")


if __name__ == "__main__":
    main()
