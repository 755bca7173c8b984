"""`make check-experiments`: every committed miniature still reproduces from its recorded command.

A committed result folder (``experiments/<study>/tiny/``, ``experiments/sweep-examples/<name>/``) that holds a
``command.txt`` (the arguments of ``python -m specnoise`` that made it; ``#`` lines are comments) is re-run into a
temporary directory, and every row's ``new_tokens`` and ``target_forwards`` - exact counts, unlike timings - must
equal the committed ``report.csv``'s. Rows are matched on job, decoder, model, draft, benchmark and category.
Slow (minutes per miniature on a CPU): ``make check-experiments``, or ``-k msn-table1`` for one.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from specnoise.report import collect

REPO = Path(__file__).resolve().parents[1]
COMMANDS = sorted(REPO.glob("experiments/**/command.txt"))
KEYS = ["job", "decoder", "model", "draft", "benchmark", "category"]
COUNTS = ["new_tokens", "target_forwards"]


def command_args(path: Path) -> list[str]:
    lines = [line for line in path.read_text().splitlines() if line.strip() and not line.lstrip().startswith("#")]
    return shlex.split(" ".join(lines))


def counts(df: pd.DataFrame) -> pd.DataFrame:
    df = df[[k for k in KEYS if k in df] + COUNTS].copy()
    for key in KEYS:  # csv round trips turn job 0 into an int and a missing draft into NaN / "none"
        df[key] = df[key].fillna("none").astype(str) if key in df else "none"
    return df.set_index(KEYS).sort_index()


def differences(committed: pd.DataFrame, rerun: pd.DataFrame) -> list[str]:
    old, new = counts(committed), counts(rerun)
    out = [f"only in the committed report: {k}" for k in old.index.difference(new.index)]
    out += [f"only in the re-run: {k}" for k in new.index.difference(old.index)]
    both = old.index.intersection(new.index)
    for key in both:
        a, b = old.loc[key, COUNTS].astype(int).tolist(), new.loc[key, COUNTS].astype(int).tolist()
        if a != b:
            out.append(f"{key}: committed new_tokens, target_forwards = {a}, re-run = {b}")
    return out


def test_differences_name_each_changed_row():
    """The comparison itself, on two small tables (no model): what the slow check relies on."""
    committed = pd.DataFrame({"job": [0, 0, 1], "decoder": ["ar", "jacobi", "ar"], "model": "m", "draft": [None] * 3,
                              "benchmark": "humaneval", "category": "all", "new_tokens": [10, 10, 7],
                              "target_forwards": [10, 8, 7]})
    assert differences(committed, committed.assign(draft="none", job=["0", "0", "1"])) == []
    rerun = committed.assign(target_forwards=[10, 9, 7]).iloc[:2]
    found = differences(committed, rerun)
    assert len(found) == 2 and "only in the committed report" in found[0] and "[10, 8], re-run = [10, 9]" in found[1]


@pytest.mark.slow
@pytest.mark.parametrize("command", COMMANDS, ids=[str(p.parent.relative_to(REPO / "experiments")) for p in COMMANDS])
def test_committed_miniature_reproduces(command: Path, tmp_path: Path):
    env = dict(os.environ, WANDB_MODE="disabled", TOKENIZERS_PARALLELISM="false",
               PYTHONPATH=os.pathsep.join(filter(None, [str(REPO / "src"), os.environ.get("PYTHONPATH")])))
    args = command_args(command) + [f"hydra.sweep.dir={tmp_path / 'sweep'}", f"hydra.run.dir={tmp_path / 'run'}"]
    proc = subprocess.run([sys.executable, "-m", "specnoise", *args], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=3600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rerun, jobs = collect([tmp_path / "sweep" if (tmp_path / "sweep").is_dir() else tmp_path / "run"])
    found = [f"job {j.path} failed: {j.error}" for j in jobs if j.error]
    found += differences(pd.read_csv(command.parent / "report.csv"), rerun)
    assert not found, f"{command.parent} does not reproduce ({len(found)} rows):\n" + "\n".join(found[:20])
