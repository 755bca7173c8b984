"""One training, many benchmarks: ``train.cache_dir`` lets the jobs of a sweep that train the same model share it.

A sweep over decoder settings on a model it fine-tunes (``+experiment=msn-figure4-lengths-tiny``: five Jacobi lengths
on each of three models) would otherwise train each model once per job. With ``train.cache_dir=DIR`` (the presets
use ``${hydra:sweep.dir}/trained``), the first job to train a model records it as ``DIR/<key>.json``; every later job
whose training is the same loads that model, copies the recording job's ``train_results.json`` (with ``reused_from``
added) into its own folder and trains nothing. Report rows name the model after the job that trained it, so the
jobs that share a model share its label.

The key hashes what decides the weights: the base model (its files' fingerprint, as the trajectory cache keys it),
the data settings with a hash of a data file's whole contents in place of its path (a moved copy is the same data,
an edited file is not) and every ``train`` setting but bookkeeping (``BOOKKEEPING``).
It does not hash the code: after changing it, use a new folder. Two jobs of one key started at once (a parallel
launcher) do not both train: the second waits on the key's lock, then reuses. Off by default (null).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import re
from pathlib import Path

from specnoise.config import Config
from specnoise.files import exclusive, write_atomic
from specnoise.training.trajectories import file_fingerprint, model_fingerprint

log = logging.getLogger("specnoise.train")

# train settings that do not change the trained weights
BOOKKEEPING = ("resume", "output_dir", "cache_dir", "logging_steps", "save_steps", "save_total_limit", "num_workers")
# a model a job trained, as report rows name it: base+stage@job (the job: the folder of the run that trained it)
TRAINED_LABEL = re.compile(r"\+\w+@[^@]*$")


def training_key(conf: Config) -> tuple[str, dict]:
    """(key, what it hashes) for this job's training."""
    train = {k: v for k, v in dataclasses.asdict(conf.train).items() if k not in BOOKKEEPING}
    base = conf.model.path if conf.train.name != "pretrain" else None
    data = dataclasses.asdict(conf.data)
    if data["path"] and Path(data["path"]).expanduser().is_file():  # (a python_source folder keeps its path)
        data["path"] = f"file:{file_fingerprint(data['path'])}"
    what = {"base": model_fingerprint(base, conf.model.revision) if base else None, "data": data, "train": train}
    return hashlib.sha256(json.dumps(what, sort_keys=True, default=str).encode()).hexdigest()[:16], what


class TrainedModels:
    """The models recorded in one ``train.cache_dir``."""

    def __init__(self, folder: str | Path):
        self.folder = Path(folder).expanduser().resolve()

    def lock(self, key: str):
        """Held while a job looks up, and if need be trains, the model of ``key``."""
        self.folder.mkdir(parents=True, exist_ok=True)
        return exclusive(self.folder / f"{key}.lock")

    def find(self, key: str) -> Path | None:
        """The recorded model's folder, if its record and the model (and its job's train_results.json) exist."""
        record = self.folder / f"{key}.json"
        if not record.is_file():
            return None
        model = Path(json.loads(record.read_text())["model"])
        return model if model.is_dir() and (model.parent / "train_results.json").is_file() else None

    def record(self, key: str, what: dict, model: Path) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        write_atomic(self.folder / f"{key}.json", json.dumps({"model": str(model.resolve()), **what}, indent=2))


def reuse_into(model: Path, run_dir: Path) -> Path:
    """This job trains nothing: it takes ``model``'s training record as its own (``reused_from`` says whose)."""
    results = json.loads((model.parent / "train_results.json").read_text())
    results["reused_from"] = str(model.parent)
    run_dir.mkdir(parents=True, exist_ok=True)
    write_atomic(run_dir / "train_results.json", json.dumps(results, indent=2))
    log.info("train.cache_dir: this training was done by %s; reusing its model %s", model.parent, model)
    return model


def model_label(base: str, stage: str, run_dir: Path) -> str:
    """``base+stage@job`` for the model this job trained (train.name ``stage`` on ``base``): the job is this run's
    folder, or the one whose model it reused, so the jobs that share a model share its label."""
    results = run_dir / "train_results.json"
    reused = json.loads(results.read_text()).get("reused_from") if results.is_file() else None
    return f"{base}+{stage}@{Path(reused or run_dir).name}"


def without_job(label: str) -> str:
    """``base+stage``: a trained model's label less the job that trained it (other labels unchanged)."""
    return label[:label.rindex("@")] if TRAINED_LABEL.search(label) else label
