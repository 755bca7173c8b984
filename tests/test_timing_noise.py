"""The noise alarm on a real job with a CPU hog beside it (slow: bounded at 4 minutes, the hogs at 200 s)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

HOG = "import time\nend = time.time() + 200\nwhile time.time() < end:\n    pass\n"  # bounded even if orphaned


@pytest.mark.slow
def test_a_cpu_hog_beside_the_job_flags_its_rows_noisy(tmp_path):
    hogs = [subprocess.Popen([sys.executable, "-c", HOG]) for _ in range(os.cpu_count() or 2)]  # every core busy
    try:
        run_dir = tmp_path / "run"
        cmd = [sys.executable, "-m", "specnoise", "model=small-code-msn", "decoder=pld", "decoders=[hf_greedy]",
               "benchmark=humaneval", "benchmark.limit=3", "benchmark.repeats=3", "benchmark.max_new_tokens=16",
               "benchmark.template=raw", "benchmark.cost_bound=false", "logger=none",  # torch's threads, as a new user
               f"hydra.run.dir={run_dir}"]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=200)
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
    assert done.returncode == 0, done.stderr[-3000:]
    rows = [r for r in json.loads((run_dir / "results.json").read_text())["rows"] if r["decoder"] != "ar"]
    assert all(r["timing_noisy"] is True for r in rows), [(r["decoder"], r["speedup_ci_low"], r["speedup"],
                                                          r["speedup_ci_high"], r["ar_time_cv"]) for r in rows]
    assert "NOISY TIMING" in done.stdout
