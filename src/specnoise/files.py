"""Result files, shared by the runner and the report: atomic writes (a crash never leaves half a file),
durable appends (a killed run keeps every finished line), and the lock that keeps one job per run directory; and the
one reader of the users' JSON / JSONL files (benchmark prompts, training data, decoders' corpora), whose every error
names the key, the file, the line and the column.

Every file is created with mode 0666 minus the umask (0644 under umask 022), like any file a shell writes.
"""

from __future__ import annotations

import contextlib
import fcntl
import gzip
import json
import os
import secrets
import socket
from collections.abc import Callable
from pathlib import Path

from specnoise.config import UserError

LOCK_NAME = ".specnoise.lock"


def _create(path: Path) -> int:
    return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)  # the umask applies, unlike mkstemp's 0600


def write_atomic(path: Path, content: str | Callable[[str], object]) -> None:
    """Write ``content`` (text, or a function that writes to the path it is given) via a temporary file in the
    same folder, then rename it over ``path``."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}{path.suffix}")
    os.close(_create(tmp))
    try:
        if callable(content):
            content(str(tmp))
        else:
            tmp.write_text(content)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def append_durably(path: Path, text: str) -> None:
    """Append ``text`` in one write and fsync it: once this returns, a kill or a power cut cannot lose it."""
    with open(path, "a") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())


@contextlib.contextmanager
def exclusive(path: Path, enabled: bool = True):
    """``with exclusive(path):`` - one process at a time (others on this host wait), by an flock on ``path``; for jobs
    of a sweep that would otherwise do the same work twice (a trajectory collection, a training)."""
    if not enabled:
        yield
        return
    with Path(path).open("a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


class RunDirBusy(UserError):
    """Another live job holds the run directory's lock."""


class RunLock:
    """``with RunLock(run_dir):`` - one job at a time per run directory. The lock file holds "host pid";
    a lock left by a dead process on this host is taken over, one from another host is not (its pid
    cannot be checked here)."""

    def __init__(self, run_dir: Path):
        self.path = Path(run_dir) / LOCK_NAME
        self.owner = f"{socket.gethostname()} {os.getpid()}"

    def __enter__(self) -> RunLock:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        for attempt in range(2):
            try:
                fd = _create(self.path)
            except FileExistsError:
                holder = self._holder()
                if attempt == 0 and holder is not None and self._is_stale(holder):
                    self.path.unlink(missing_ok=True)  # its job died without releasing it
                    continue
                raise RunDirBusy(f"{self.path.parent} is in use by another job ({holder or 'unknown'}, see "
                                 f"{self.path}): wait for it, use another hydra.run.dir, or delete the lock "
                                 "file if no job runs there") from None
            with os.fdopen(fd, "w") as f:
                f.write(self.owner + "\n")
            return self
        raise AssertionError("unreachable")

    def __exit__(self, *exc) -> None:
        if self._holder() == self.owner:  # never remove a lock another job took over
            self.path.unlink(missing_ok=True)

    def _holder(self) -> str | None:
        try:
            return self.path.read_text().strip() or None
        except FileNotFoundError:
            return None

    @staticmethod
    def _is_stale(holder: str) -> bool:
        host, _, pid = holder.rpartition(" ")
        if host != socket.gethostname() or not pid.isdigit():
            return False
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            return True
        except PermissionError:  # alive, owned by someone else
            return False
        return False


def read_json_rows(path: str | Path, key: str) -> list[tuple[str, object]]:
    """The rows of a .json file (a list; ``{"data": [...]}`` or another wrapper's first list; any other value is one
    row) or of a .jsonl file (one value per line, blank lines skipped), either optionally .gz, each with where it came
    from. ``key`` is the config key that named the file: every error says it, with the file, line and column."""
    p = Path(path).expanduser()
    if not p.is_file():
        raise UserError(f"{key}: no file at {p}")
    opener = gzip.open if p.name.endswith(".gz") else open
    if p.stat().st_size == 0:
        return []  # the caller says what an empty file means for it
    try:
        with opener(p, "rt", encoding="utf-8") as f:
            if p.name.removesuffix(".gz").endswith(".json"):
                try:
                    data = json.load(f)
                except json.JSONDecodeError as err:
                    raise UserError(f"{key}: {p}, line {err.lineno}, column {err.colno}: not valid JSON "
                                    f"({_json_error(err)})") from None
                if isinstance(data, dict):
                    data = data["data"] if isinstance(data.get("data"), list) else \
                        next((v for v in data.values() if isinstance(v, list)), [data])
                rows = data if isinstance(data, list) else [data]
                return [(f"{p}, record {i}", row) for i, row in enumerate(rows, 1)]
            rows = []
            for i, line in enumerate(f, 1):
                if line.strip():
                    try:
                        rows.append((f"{p}, line {i}", json.loads(line)))
                    except json.JSONDecodeError as err:
                        raise UserError(f"{key}: {p}, line {i}, column {err.pos + 1}: not valid JSON "
                                        f"({_json_error(err)}); one JSON value per line") from None
            return rows
    except UnicodeDecodeError as err:
        raise UserError(f"{key}: {p}: not UTF-8 text ({err.reason} at byte {err.start})") from None


def _json_error(err: json.JSONDecodeError) -> str:
    # some of json's messages end in "at", written to be followed by the position the message no longer carries
    return err.msg.removesuffix(" at")
