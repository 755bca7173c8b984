"""Writes README's family support table (experiments/families/table.md) by running tests/test_families.py's checks:
every family x every decoder on the dynamic engine, every engine-run decoder on the static engine (where the family's
cache allows it), greedy tokens equal to AR's on 2 prompts x 24 tokens of tiny random fp32 models on the CPU.

    PYTHONPATH=src python experiments/families/make_table.py   # ~10 min on one core of a shared 2-core CPU

The TP column: for the families whose config carries a tensor-parallel plan (base_model_tp_plan), the target split over
2 torchrun processes (gloo) by test_families.run_tp_families, with AR, tr_jacobi, lookahead and speculative: tokens
identical to 1 process, and every decoder equal to AR.
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
from test_families import (  # noqa: E402
    ENGINE_DECODERS,
    NEW_TOKENS,
    PROMPTS,
    TP_FAMILIES,
    check_lossless,
    run_tp_families,
)
from tp_families import TP_DECODERS, as_loaded, decode  # noqa: E402


def passed(family: str, names: list[str], static: bool = False) -> tuple[int, list[str]]:
    failed = []
    for name in names:
        try:
            check_lossless(family, name, static)
        except Exception as err:  # noqa: BLE001  (a row of the table, not a crash)
            failed.append(f"{name} ({type(err).__name__})")
    return len(names) - len(failed), failed


def tp_verdicts() -> dict[str, str]:
    import tempfile

    root = Path(tempfile.mkdtemp(prefix="specnoise-tp-families-"))
    found = run_tp_families(root, TP_FAMILIES)
    verdicts = {}
    for family in TP_FAMILIES:
        if "error" in found[family]:
            verdicts[family] = f"fails: {found[family]['error']}"
            continue
        one = decode(as_loaded(root / family, tp=False), as_loaded(root / f"{family}-draft", tp=False), PROMPTS,
                     NEW_TOKENS)
        same = all(found[family][n] == one[n] for n in TP_DECODERS)
        lossless = all(found[family][n] == found[family]["ar"] for n in TP_DECODERS)
        verdicts[family] = ("2 processes = 1, lossless" if same and lossless else
                            f"{'same' if same else 'DIFFERENT'} tokens, {'lossless' if lossless else 'NOT lossless'}")
    return verdicts


def main() -> None:
    tp = tp_verdicts()
    rows = ["| family (model_type) | sliding window | dynamic engine | static engine | tensor parallel (2 processes) |",
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
