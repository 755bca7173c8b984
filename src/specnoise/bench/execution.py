"""Run untrusted generated code: a separate ``python -I`` process per program, in a fresh temporary
directory, under a wall-clock timeout and ``setrlimit`` limits (address space, CPU seconds, file size).

A program passes only if it prints a random per-run token *after* its tests have run, so ``sys.exit(0)``
or ``os._exit(0)`` inside the generated code cannot fake a pass. An infinite loop, a crash, a huge
allocation, a fork that outlives the parent or a deleted working directory costs that one program.
This is isolation from accidents, not a security sandbox: run models you do not trust inside a container.
"""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

# Executed before the program: set the limits, then disable what could damage the machine (after human-eval's
# reliability_guard). Limits are set here rather than in a preexec_fn, which is unsafe with the worker threads.
GUARD = """\
import builtins, faulthandler, os, resource, shutil, subprocess
for _limit, _value in (("RLIMIT_AS", {memory}), ("RLIMIT_CPU", {cpu}), ("RLIMIT_FSIZE", {fsize}), ("RLIMIT_CORE", 0)):
    resource.setrlimit(getattr(resource, _limit), (_value, _value))
faulthandler.disable()
for _name in ("kill", "killpg", "system", "putenv", "remove", "removedirs", "rmdir", "unlink", "rename",
              "renames", "truncate", "replace", "fork", "forkpty", "setsid", "setuid", "chmod", "chown", "chdir"):
    setattr(os, _name, None)
shutil.rmtree = shutil.move = shutil.chown = None
subprocess.Popen = None
builtins.help = None
del _name, _limit, _value
"""


@dataclass
class ExecResult:
    passed: bool
    status: str  # passed | failed | timeout
    detail: str = ""  # the tail of stderr, for the per-prompt file


def run_program(program: str, timeout: float = 10.0, memory_mb: int = 1024, file_mb: int = 16) -> ExecResult:
    """Run ``program`` (code followed by its tests); it passes if it runs to the end within the limits."""
    token = secrets.token_hex(16)
    guard = GUARD.format(memory=memory_mb << 20, cpu=int(timeout) + 1, fsize=file_mb << 20)
    # `from __future__` imports must open the file
    future = "".join(line + "\n" for line in program.splitlines() if line.startswith("from __future__ import"))
    source = f"{future}{guard}\n{program}\n\nprint({token!r}, flush=True)\n"
    with tempfile.TemporaryDirectory(prefix="specnoise-exec-") as tmp:
        Path(tmp, "program.py").write_text(source)
        proc = subprocess.Popen(
            [sys.executable, "-I", "program.py"], cwd=tmp, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True, errors="replace", start_new_session=True,
            env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONHASHSEED": "0", "LC_ALL": "C.UTF-8"},
        )
        try:
            stdout, stderr = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            proc.communicate()
            return ExecResult(False, "timeout", f"no result within {timeout:g} s")
        finally:
            _kill_group(proc)  # children the program left behind die with it
    if stdout.rstrip().endswith(token):
        return ExecResult(True, "passed")
    lines = stderr.strip().splitlines() or [f"exit status {proc.returncode} before the tests finished"]
    return ExecResult(False, "failed", lines[-1][:300])


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def run_programs(programs: list[str], timeout: float = 10.0, memory_mb: int = 1024, workers: int | None = None,
                 progress=None) -> list[ExecResult]:
    """``run_program`` over many programs, a few at a time (each is a process of its own)."""
    workers = workers or min(4, os.cpu_count() or 1)
    with ThreadPoolExecutor(max_workers=workers) as pool:
        results = []
        for result in pool.map(lambda p: run_program(p, timeout, memory_mb), programs):
            results.append(result)
            if progress is not None:
                progress.update(1)
    return results
