"""Jobs and their directories: one job per run directory, file modes, and failures that are never silent."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from helpers_models import save_tiny_model
from specnoise.callbacks import ReportCallback
from specnoise.config import config_dir
from specnoise.files import LOCK_NAME, RunDirBusy, RunLock, append_durably, write_atomic

ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


def specnoise(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "specnoise", *args, "logger=none"], capture_output=True, text=True,
                          timeout=300, env=ENV)


def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid  # reaped: no process has this pid now (until the kernel reuses it, far later)


def test_run_lock_is_exclusive_and_takes_over_stale_locks(tmp_path):
    with RunLock(tmp_path):
        assert (tmp_path / LOCK_NAME).read_text().split() == [socket.gethostname(), str(os.getpid())]
        with pytest.raises(RunDirBusy, match=r"in use by another job .*hydra\.run\.dir"):
            RunLock(tmp_path).__enter__()
    assert not (tmp_path / LOCK_NAME).exists()  # released

    (tmp_path / LOCK_NAME).write_text(f"{socket.gethostname()} {dead_pid()}\n")  # its job died
    with RunLock(tmp_path):
        assert (tmp_path / LOCK_NAME).read_text().split()[1] == str(os.getpid())
    (tmp_path / LOCK_NAME).write_text("other-node 1\n")  # another host's pid cannot be checked from here
    with pytest.raises(RunDirBusy, match="other-node 1"):
        RunLock(tmp_path).__enter__()


def test_files_honour_the_umask(tmp_path):
    old = os.umask(0o022)
    try:
        write_atomic(tmp_path / "a.json", "{}")
        write_atomic(tmp_path / "b.csv", lambda tmp: Path(tmp).write_text("x\n"))
        append_durably(tmp_path / "c.jsonl", "{}\n")
        os.umask(0o077)
        write_atomic(tmp_path / "private.json", "{}")
    finally:
        os.umask(old)
    modes = {p.name: p.stat().st_mode & 0o777 for p in tmp_path.iterdir()}
    assert modes == {"a.json": 0o644, "b.csv": 0o644, "c.jsonl": 0o644, "private.json": 0o600}  # no temp files left


def test_a_busy_run_directory_refuses_a_second_job(tmp_path):
    """New-user finding 1: the refused job must not touch the running job's record (its .hydra/ files, which the
    report reads its overrides from, and its log)."""
    run_dir = tmp_path / "run"
    (run_dir / ".hydra").mkdir(parents=True)
    record = {"config.yaml": "decoder:\n  name: pld\n", "overrides.yaml": "- decoder=pld\n"}
    for name, text in record.items():
        (run_dir / ".hydra" / name).write_text(text)
    (run_dir / "specnoise.log").write_text("the first job's log\n")
    (run_dir / LOCK_NAME).write_text(f"{socket.gethostname()} {os.getpid()}\n")  # this test process is alive
    done = specnoise("prompt='hi'", "decoder=lookahead", f"hydra.run.dir={run_dir}")
    assert done.returncode == 2 and "is in use by another job" in done.stderr + done.stdout
    assert "Traceback" not in done.stderr
    assert not (run_dir / "FAILED.json").exists()  # the directory belongs to the other job
    assert (run_dir / LOCK_NAME).read_text().split()[1] == str(os.getpid())
    assert {name: (run_dir / ".hydra" / name).read_text() for name in record} == record
    assert (run_dir / "specnoise.log").read_text() == "the first job's log\n"


def test_an_unwritable_run_directory_is_one_line_and_exit_2(tmp_path):
    """New-user finding 3 (a path through a file is unwritable also for root, unlike chmod)."""
    (tmp_path / "file").write_text("")
    done = specnoise("prompt='hi'", f"hydra.run.dir={tmp_path / 'file' / 'run'}")
    assert done.returncode == 2, done.stderr[-2000:]
    assert "Traceback" not in done.stderr and "Unable to configure handler" not in done.stderr
    assert done.stderr.strip().splitlines()[-1].startswith("error: cannot write to the run directory")


@pytest.mark.parametrize("args", [["decoder=nope"], ["+experiment=nope"], ["benchmark.nope=1"]])
def test_what_hydra_refuses_exits_2_as_bad_input(tmp_path, args):
    """New-user finding 5: the README's "bad input exits 2" holds for composition errors too."""
    done = specnoise(*args, f"hydra.run.dir={tmp_path / 'run'}")
    assert done.returncode == 2, (done.returncode, done.stderr[-2000:])
    assert "Traceback" not in done.stderr


def test_a_crash_leaves_failed_json_and_the_traceback(tmp_path):
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "config.json").write_text('{"model_type": "no_such_arch"}')  # not a UserError: a crash inside transformers
    run_dir = tmp_path / "run"
    done = specnoise(f"model.path={bad}", "prompt='hi'", f"hydra.run.dir={run_dir}")
    assert done.returncode == 1 and "Traceback" in done.stderr
    failed = json.loads((run_dir / "FAILED.json").read_text())
    assert failed["error"].startswith("error: ") and "Traceback" in failed["traceback"]
    assert not (run_dir / LOCK_NAME).exists()


@pytest.mark.slow  # a real two-job sweep; the callback test below covers the exit status in-process
def test_a_sweep_with_a_failed_job_exits_nonzero_after_the_others(tmp_path):
    model = save_tiny_model(tmp_path / "model")
    sweep = tmp_path / "sweep"
    done = specnoise("-m", f"model.path={model},{tmp_path / 'nope'}", "prompt='def add(a, b):'",
                     "decoder.max_new_tokens=4", f"hydra.sweep.dir={sweep}")
    out = done.stderr + done.stdout
    assert done.returncode == 1, out[-3000:]
    assert f"1 of 2 jobs failed: see {sweep / '1' / 'FAILED.json'}" in out
    assert "no model at" in json.loads((sweep / "1" / "FAILED.json").read_text())["error"]
    assert not (sweep / "0" / "FAILED.json").exists()  # the other job ran
    assert (sweep / "report" / "report.md").is_file()  # and the sweep report was written first


def test_the_sweep_callback_exits_nonzero_when_a_job_failed(tmp_path):
    sweep = tmp_path / "sweep"
    for num, error in enumerate([None, "error: boom", None]):
        job = sweep / str(num)
        (job / ".hydra").mkdir(parents=True)
        (job / ".hydra" / "overrides.yaml").write_text(f"- decoder.gamma={num}\n")
        rows = [{"decoder": "ar", "model": "m", "draft": None, "benchmark": "b", "category": "all", "speedup": 1.0}]
        (job / ("FAILED.json" if error else "results.json")).write_text(
            json.dumps({"error": error, "traceback": None} if error else {"rows": rows}))
    with initialize_config_dir(config_dir=str(config_dir()), version_base="1.3"):
        cfg = compose("config", overrides=["logger=none", f"hydra.sweep.dir={sweep}"], return_hydra_config=True)
    with pytest.raises(SystemExit, match=rf"^1 of 3 jobs failed: see {sweep / '1' / 'FAILED.json'}$"):
        ReportCallback().on_multirun_end(cfg)
    assert (sweep / "report" / "report.md").is_file()  # written before the exit
    (sweep / "1" / "FAILED.json").unlink()
    ReportCallback().on_multirun_end(cfg)  # no failure: no exit
