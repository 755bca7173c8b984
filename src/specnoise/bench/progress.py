"""What lets a benchmark stop early and continue later: the per-prompt log, the settings it was measured
under, and a clean stop on SIGINT / SIGTERM.

* ``per_prompt.jsonl`` grows by one fsynced write per finished sample (every decoder, every turn, AR
  included), so a kill loses at most the sample in flight;
* ``resume.json`` holds the settings that decide what is measured (model, draft, decoders, benchmark, and
  the training stage when the job trained its model); a rerun in the same run directory continues only
  under the same settings, and refuses otherwise;
* ``stop_on_signals()``: the first SIGINT / SIGTERM asks the loop to stop after the current generation (the
  unfinished sample is dropped); the runner then writes results.json from the finished samples and raises
  ``Interrupted``, which the entry point turns into exit status 130 / 143. A second signal stops at once.
"""

from __future__ import annotations

import json
import logging
import signal
import threading
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from specnoise.config import UserError
from specnoise.files import append_durably, write_atomic

log = logging.getLogger("specnoise")
SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Interrupted(BaseException):  # like KeyboardInterrupt: no `except Exception` may swallow it
    """A benchmark stopped by a signal; results.json holds the finished samples."""

    def __init__(self, name: str):
        # how to continue is the entry point's to say (a single run's directory, or a sweep's)
        super().__init__(f"stopped by {name}: results.json holds the finished prompts")
        self.name = name
        self.exit_code = 128 + signal.Signals[name].value  # the shell's convention: 130 SIGINT, 143 SIGTERM


class Stop:
    signal: str | None = None  # the name of the first signal received


@contextmanager
def stop_on_signals() -> Iterator[Stop]:
    """Install SIGINT / SIGTERM handlers for the ``with`` block (main thread only), restore them after."""
    stop = Stop()
    if threading.current_thread() is not threading.main_thread():
        yield stop  # only the main thread may set handlers; a job in a worker thread keeps the defaults
        return

    def handle(signum, frame):
        name = signal.Signals(signum).name
        if stop.signal:
            raise Interrupted(name)
        stop.signal = name
        log.warning("%s: stopping after the current generation (send it again to stop at once)", name)

    previous = {s: signal.signal(s, handle) for s in SIGNALS}
    try:
        yield stop
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


# ------------------------------------------------------------------------------------ the settings
def identity(cfg: DictConfig) -> dict:
    """The config sections that decide what the per-prompt rows measure."""
    keys = ["model", "draft", "decoder", "decoders", "benchmark"]
    if cfg.train.name != "none":  # the job benchmarks what it trained
        keys += ["train", "data"]
    return {k: OmegaConf.to_container(cfg[k], resolve=True) if OmegaConf.is_config(cfg[k]) else cfg[k] for k in keys}


def _flat(d: object, prefix: str = "") -> dict[str, object]:
    if not isinstance(d, dict):
        return {prefix: d}
    return {k: v for key, value in d.items() for k, v in _flat(value, f"{prefix}{key}.").items()} or {prefix: d}


def differences(stored: dict, now: dict) -> list[str]:
    a, b = _flat(stored), _flat(now)
    return [f"{k.rstrip('.')}: {a.get(k)!r} -> {b.get(k)!r}" for k in sorted(a.keys() | b.keys())
            if a.get(k) != b.get(k)]


# ------------------------------------------------------------------------------------ the log
def continuing(run_dir: Path, cfg: DictConfig) -> bool:
    """Whether ``run_dir`` holds per-prompt rows of an earlier attempt of this benchmark; a UserError when they
    were measured under other settings (mixing them would compare different things)."""
    path, settings = run_dir / "per_prompt.jsonl", run_dir / "resume.json"
    if not path.is_file() or path.stat().st_size == 0:
        return False
    if not settings.is_file():
        raise UserError(f"{path} exists but {settings.name} does not, so it cannot be continued: use a new "
                        "hydra.run.dir")
    changed = differences(json.loads(settings.read_text()), identity(cfg))
    if changed:
        raise UserError(f"{run_dir} holds a benchmark run with other settings ({'; '.join(changed[:4])}"
                        f"{'; ...' if len(changed) > 4 else ''}): run it with the same settings to continue it, or "
                        "use a new hydra.run.dir")
    return True


def trained_model(run_dir: Path, cfg: DictConfig) -> str | None:
    """The model an interrupted attempt of this job trained, when its benchmark is being continued: the rest of
    the prompts must run on the same weights, so it is not trained again."""
    results = run_dir / "train_results.json"
    if not results.is_file() or not continuing(run_dir, cfg):
        return None
    model = json.loads(results.read_text()).get("model")
    return model if model and Path(model).is_dir() else None


class PromptLog:
    """``per_prompt.jsonl`` of one run directory, read back for a continued run and appended sample by sample."""

    def __init__(self, run_dir: Path, cfg: DictConfig, decoders: list[str]):
        self.path = run_dir / "per_prompt.jsonl"
        self.decoders = decoders
        if continuing(run_dir, cfg):
            self.finished = self._read()  # sample id -> its rows
        else:
            self.path.unlink(missing_ok=True)
            write_atomic(run_dir / "resume.json", json.dumps(identity(cfg), indent=2))
            self.finished = {}

    def _read(self) -> dict[str, list[dict]]:
        rows = []
        for line in self.path.read_text().splitlines():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:  # the last line of a hard kill
                continue
        if rows and "sample_turns" not in rows[0]:
            raise UserError(f"{self.path} holds no token ids (written by an older version), so it cannot be "
                            "continued: use a new hydra.run.dir")
        by_sample = defaultdict(list)
        for row in rows:
            by_sample[row["id"]].append(row)
        finished = {sid: rs for sid, rs in by_sample.items() if self._complete(rs)}
        kept = [row for rs in finished.values() for row in rs]
        if len(kept) < len(rows):  # a sample torn by a hard kill: drop it, it runs again
            write_atomic(self.path, "".join(json.dumps(r) + "\n" for r in kept))
        log.info("continuing %s: %d prompts already finished", self.path.parent, len(finished))
        return finished

    def _complete(self, rows: list[dict]) -> bool:
        """Every decoder has a row for each of the turns the sample ran (``sample_turns``: later turns that no
        longer fit the context are skipped)."""
        turns = defaultdict(list)
        for row in rows:
            turns[row["decoder"]].append(row["turn"])
        whole = list(range(rows[0]["sample_turns"]))
        return set(turns) == set(self.decoders) and all(sorted(t) == whole for t in turns.values())

    def append(self, rows: list[dict]) -> None:
        append_durably(self.path, "".join(json.dumps(r) + "\n" for r in rows))
