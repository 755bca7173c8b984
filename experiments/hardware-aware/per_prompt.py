"""Each prompt's speedup over AR, per decoder, from a benchmark job's per_prompt.jsonl: which prompts a decoder wins
on and which it loses on (a row's ``slower_units`` / ``worst_unit``, prompt by prompt), with AR's new tokens and time.

    python experiments/hardware-aware/per_prompt.py JOB_DIR [--decoders a,b,...] [--all]

Per prompt (its first turn at batch 1): AR's seconds over the decoder's, each the prompt's repeats by the job's
statistic as the row's ``seconds`` are (the per_prompt.jsonl ``seconds``). ``--all``: faithful decoders too (default:
AR and the ``+auto`` ones).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pandas as pd


def table(job: Path, decoders: list[str] | None, everything: bool) -> str:
    rows = pd.DataFrame([json.loads(line) for line in (job / "per_prompt.jsonl").read_text().splitlines()])
    rows = rows[rows["turn"] == 0]
    seconds = rows.pivot_table(index="id", columns="decoder", values="seconds", sort=False)
    names = decoders or [d for d in seconds.columns if d != "ar" and (everything or d.endswith("+auto"))]
    ar = rows[rows["decoder"] == "ar"].set_index("id")
    out = pd.DataFrame({"new tokens": ar["new_tokens"], "AR ms": (ar["seconds"] * 1e3).round(1)})
    ratios = {name: seconds["ar"] / seconds[name] for name in names}
    slower = {name: int((ratio < 1.0).sum()) for name, ratio in ratios.items()}  # (as the rows count, unrounded)
    for name in names:
        out[name] = ratios[name].round(3)
    text = out.to_markdown()
    return text + "\n\nslower than AR on: " + ", ".join(f"{n} {k} of {len(out)}" for n, k in slower.items()) + "\n"


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("job", type=Path, help="a benchmark job's folder (with per_prompt.jsonl)")
    parser.add_argument("--decoders", default="", help="comma-separated decoders (default: the +auto ones)")
    parser.add_argument("--all", action="store_true", help="faithful decoders too")
    args = parser.parse_args()
    print(table(args.job, [d for d in args.decoders.split(",") if d] or None, args.all))
