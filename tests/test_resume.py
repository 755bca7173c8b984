"""Interrupted benchmarks: SIGINT / SIGTERM stop cleanly with a partial results.json, and the same command in the
same run directory continues where it stopped (real subprocesses on a tiny random model)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers_models import save_tiny_model

ENV = {**os.environ, "OMP_NUM_THREADS": "1"}
N_PROMPTS = 24
WORDS = ["def", "add", "return", "fox", "dog", "print", "range", "class", "Stack", "apples", "sleeps", "quick"]


@pytest.fixture(scope="module")
def setup(tmp_path_factory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("resume")
    prompts = root / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"text": " ".join(WORDS[(i * 5 + j) % len(WORDS)] for j in range(i % 4 + 2))})
                               + "\n" for i in range(N_PROMPTS)))
    return save_tiny_model(root / "model"), prompts


def command(setup, run_dir: Path, *extra: str) -> list[str]:
    model, prompts = setup
    return [sys.executable, "-m", "specnoise", "decoder=ar", "decoders=[pld]", "benchmark=jsonl",
            f"benchmark.path={prompts}", "benchmark.prompt_field=text", "benchmark.max_new_tokens=48",
            "benchmark.warmup=0", "benchmark.threads=1", "logger=none", f"model.path={model}",
            f"hydra.run.dir={run_dir}", *extra]


def run(cmd: list[str], log: Path, interrupt: signal.Signals | None = None) -> tuple[int, str]:
    """Run ``cmd``; with ``interrupt``, send it once the first sample is in per_prompt.jsonl."""
    per_prompt = Path(cmd[-1].partition("=")[2]) / "per_prompt.jsonl" if interrupt else None
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=ENV, text=True)
        if interrupt:
            deadline = time.time() + 300
            while not (per_prompt.is_file() and per_prompt.read_text().count("\n") >= 2):  # AR + PLD of sample 0
                assert proc.poll() is None and time.time() < deadline, log.read_text()[-3000:]
                time.sleep(0.01)
            proc.send_signal(interrupt)
        proc.wait(timeout=300)
    return proc.returncode, log.read_text()


def read_rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_sigint_stops_cleanly_and_the_rerun_continues(setup, tmp_path):
    run_dir = tmp_path / "run"
    code, out = run(command(setup, run_dir), tmp_path / "first.log", signal.SIGINT)
    assert code == 130, out[-3000:]
    assert "Traceback" not in out and "stopped by SIGINT" in out
    first = json.loads((run_dir / "results.json").read_text())
    done = first["progress"]["prompts"]
    assert first["complete"] is False and first["interrupted"] == "SIGINT"
    assert 1 <= done < N_PROMPTS and first["progress"]["of"] == N_PROMPTS
    assert {r["prompts"] for r in first["rows"]} == {done}  # computed from the finished samples only
    kept = read_rows(run_dir / "per_prompt.jsonl")
    assert len(kept) == 2 * done and all(len(r["tokens"]) == r["new_tokens"] for r in kept)
    assert not (run_dir / ".specnoise.lock").exists() and not (run_dir / "FAILED.json").exists()

    code, out = run(command(setup, run_dir), tmp_path / "second.log")
    assert code == 0, out[-3000:]
    final = json.loads((run_dir / "results.json").read_text())
    assert final["complete"] is True and final["interrupted"] is None
    assert final["progress"] == {"prompts": N_PROMPTS, "of": N_PROMPTS, "resumed": done}
    every = {r["decoder"]: r for r in final["rows"] if r["category"] == "all"}
    assert every["ar"]["prompts"] == every["pld"]["prompts"] == N_PROMPTS
    assert every["pld"]["lossless_fraction"] == 1.0
    rows = read_rows(run_dir / "per_prompt.jsonl")
    assert len(rows) == 2 * N_PROMPTS and len({(r["id"], r["decoder"]) for r in rows}) == 2 * N_PROMPTS
    assert every["pld"]["new_tokens"] == sum(r["new_tokens"] for r in rows if r["decoder"] == "pld")
    # the finished prompts were not run again: their timings are the first run's, to the last digit
    assert [(r["id"], r["decoder"], r["seconds"]) for r in rows[:len(kept)]] == \
        [(r["id"], r["decoder"], r["seconds"]) for r in kept]


@pytest.mark.slow  # two more subprocesses; the SIGINT test above covers the same path
def test_sigterm_then_a_rerun_with_other_settings_refuses(setup, tmp_path):
    run_dir = tmp_path / "run"
    code, out = run(command(setup, run_dir), tmp_path / "first.log", signal.SIGTERM)
    assert code == 143, out[-3000:]
    assert "Traceback" not in out
    partial = (run_dir / "results.json").read_text()
    assert json.loads(partial)["interrupted"] == "SIGTERM"

    code, out = run(command(setup, run_dir, "benchmark.max_new_tokens=32"), tmp_path / "second.log")
    assert code == 2 and "Traceback" not in out
    assert "holds a benchmark run with other settings (benchmark.max_new_tokens: 48 -> 32)" in out
    assert (run_dir / "results.json").read_text() == partial  # nothing measured was touched
