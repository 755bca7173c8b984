"""Tensor parallel under torchrun (ranks.py, models.placement): rank 0 alone writes and prints; 2 processes decode
the tokens of 1. The per-family check is tests/test_families.py's test_tensor_parallel_two_processes_match_one."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from specnoise.ranks import check_agree, tensor_parallel
from test_config import compose_object

REPO = Path(__file__).resolve().parents[1]


def test_tensor_parallel_is_read_from_the_command_line():
    assert tensor_parallel(["model=small-code-msn", "model.tp_plan=auto"])
    assert tensor_parallel(["draft.tp_plan=auto"])
    assert not tensor_parallel(["model.tp_plan=null", "decoder=pld"])
    assert not tensor_parallel(["model=small-code-msn"])


def test_one_process_agrees_with_itself():
    check_agree([[1, 2, 3]])  # no process group: nothing to compare, no error


def test_planner_counts_every_cpu_rank_on_one_host():
    """Ranks of a CPU run share the host: 2 ranks hold the target once plus the draft twice."""
    from specnoise.planner import plan

    conf = compose_object(["pair=small-code", "model.tp_plan=auto", "benchmark=humaneval",
                           "benchmark.max_prompt_tokens=100"])
    os.environ["WORLD_SIZE"] = "2"
    try:
        result = plan(conf)
    finally:
        del os.environ["WORLD_SIZE"]
    assert result.fits and "tensor parallel over 2 CPU processes" in result.lines[-1]


def specnoise(args: list[str], run_dir: Path, processes: int, logs: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO / "src"), "OMP_NUM_THREADS": "1"}
    head = ([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(processes), "--master-port",
             "29533", "--redirects", "3", "--log-dir", str(logs), "-m", "specnoise", "model.tp_plan=auto"]
            if processes > 1 else [sys.executable, "-m", "specnoise"])
    return subprocess.run([*head, *args, "logger=none", f"hydra.run.dir={run_dir}"], env=env, capture_output=True,
                          text=True, timeout=1200)


@pytest.mark.slow
def test_two_processes_decode_the_tokens_of_one(tmp_path):
    """The issue's check, smaller: the shipped target split over 2 CPU processes, every decoder lossless, the same
    tokens as 1 process, one results.json, rank 1 silent."""
    args = ["model=small-code-msn", "decoder=tr_jacobi", "decoders=[jacobi,pld,lookahead,sam]", "benchmark=humaneval",
            "benchmark.limit=2", "benchmark.max_new_tokens=32"]
    two = specnoise(args, tmp_path / "two", 2, tmp_path / "logs")
    assert two.returncode == 0, two.stderr[-3000:]
    one = specnoise(args, tmp_path / "one", 1, tmp_path / "logs1")
    assert one.returncode == 0, one.stderr[-3000:]
    rows = json.loads((tmp_path / "two" / "results.json").read_text())["rows"]
    assert {r["decoder"] for r in rows} == {"ar", "tr_jacobi", "jacobi", "pld", "lookahead", "sam"}
    assert all(r["lossless_fraction"] == 1.0 for r in rows)

    def tokens(run):
        return {(r["id"], r["decoder"]): r["tokens"] for r in map(json.loads, (run / "per_prompt.jsonl").open())}

    assert tokens(tmp_path / "two") == tokens(tmp_path / "one")
    rank1 = list((tmp_path / "logs").glob("*/attempt_0/1"))[0]
    assert (rank1 / "stdout.log").read_text() == ""
    assert (rank1 / "stderr.log").read_text().strip() == ""
    assert sorted(p.name for p in tmp_path.iterdir() if (p / "results.json").exists()) == ["one", "two"]
