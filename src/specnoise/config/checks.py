"""The checks every config dataclass runs in ``__post_init__``, and where the package's configs and assets live."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from specnoise.errors import ConfigError

MISSING = "???"  # OmegaConf's marker of a value that must be given (omegaconf.MISSING), without importing it
PACKAGE_DIR = Path(__file__).resolve().parent.parent  # src/specnoise
ASSETS_DIR = PACKAGE_DIR / "assets"


def check(ok: bool, key: str, message: str) -> None:
    if not ok:
        raise ConfigError(f"{key}: {message}")


def one_of(value: Any, key: str, allowed: tuple) -> None:
    check(value in allowed, key, f"got {value!r}, expected one of {', '.join(map(str, allowed))}")


def at_least(value: float, key: str, low: float) -> None:
    check(value >= low, key, f"got {value}, must be >= {low}")


def config_dir() -> Path:
    """Where the YAML configs live: inside the installed package, or at the repository root."""
    for candidate in (PACKAGE_DIR / "conf", PACKAGE_DIR.parent.parent / "conf"):
        if (candidate / "config.yaml").is_file():
            return candidate
    raise FileNotFoundError("specnoise configs not found (expected conf/config.yaml next to the package)")


def check_corpus(path: str | None, key: str = "decoder.corpus") -> None:
    """Fail at config time, before any model loads, on a corpus that is not there or is empty."""
    if path is None:
        return
    file = Path(path)
    if not file.is_file():
        raise ConfigError(f"{key}: {path} does not exist: give a JSON/JSONL text file or a .npy of token ids")
    if file.stat().st_size == 0:
        raise ConfigError(f"{key}: {path} is empty: give a corpus with at least one text row")
