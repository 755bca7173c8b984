"""Atomic file writes, shared by the runner and the report: a crash never leaves half a result file."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path


def write_atomic(path: Path, content: str | Callable[[str], object]) -> None:
    """Write ``content`` (text, or a function that writes to the path it is given) via a temporary file in the
    same folder, then rename it over ``path``."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=path.suffix)
    os.close(fd)
    try:
        if callable(content):
            content(tmp)
        else:
            Path(tmp).write_text(content)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
