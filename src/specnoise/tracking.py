"""Experiment tracking with wandb: one run per job, never a reason for a job to fail.

Usage (benchmark and training stages alike)::

    tracker = start_run(conf, cfg, run_dir, job_type="bench")   # or "train"
    tracker.log({"loss": 1.2}, step=10)          # a point of a curve
    tracker.summary({"speedup": 1.8})            # final numbers shown in the runs table
    tracker.table("results", dataframe)          # a pandas DataFrame as a wandb.Table
    tracker.finish()                             # also works as `with start_run(...) as tracker:`

Mode: an explicit ``logger.mode`` (online / offline / disabled) wins; with ``logger.mode=auto`` the
``WANDB_MODE`` environment variable is used when set, else online when an API key is configured (the
``WANDB_API_KEY`` variable or an ``api.wandb.ai`` entry in ~/.netrc) and offline otherwise. Offline runs
are written under ``<run_dir>/wandb`` and uploaded later with ``wandb sync <run_dir>/wandb/offline-run-*``.
If an online start fails (no network), the run falls back to offline. ``logger=none`` logs nothing.

Runs are grouped by ``logger.group`` or else the experiment name; the job type names the stage; tags name
the decoder, model and benchmark. The whole composed config is logged as a plain dict.

Each run's id is kept in ``<run_dir>/wandb/<job_type>.id``; ``start_run(..., resume=True)`` (a resumed
training run) continues that wandb run instead of starting a second one, so its loss curve is one line.
Offline, both parts are written under the same id: sync them in order.
"""

from __future__ import annotations

import logging
import netrc
import os
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from specnoise.config import Config

log = logging.getLogger("specnoise")


class Tracker:
    """No-op tracker (``logger=none``); ``WandbTracker`` overrides every method."""

    mode = "disabled"

    def log(self, metrics: dict, step: int | None = None) -> None:
        pass

    def summary(self, metrics: dict) -> None:
        pass

    def table(self, name: str, dataframe) -> None:
        pass

    def finish(self) -> None:
        pass

    def __enter__(self) -> Tracker:
        return self

    def __exit__(self, *exc) -> None:
        self.finish()


class WandbTracker(Tracker):
    def __init__(self, run, mode: str):
        self.run, self.mode = run, mode

    def log(self, metrics: dict, step: int | None = None) -> None:
        self.run.log(metrics, step=step)

    def summary(self, metrics: dict) -> None:
        self.run.summary.update(metrics)

    def table(self, name: str, dataframe) -> None:
        import wandb

        self.run.log({name: wandb.Table(dataframe=dataframe.reset_index(drop=True))})

    def finish(self) -> None:
        if self.run is not None:
            self.run.finish()
            if self.mode == "offline":
                log.info("wandb offline run in %s; upload it with `wandb sync %s`", self.run.dir,
                         Path(self.run.dir).parent)
            self.run = None


def has_api_key() -> bool:
    if os.environ.get("WANDB_API_KEY"):
        return True
    try:
        return netrc.netrc().authenticators("api.wandb.ai") is not None
    except (FileNotFoundError, netrc.NetrcParseError, OSError):
        return False


def resolve_mode(configured: str) -> str:
    """online | offline | disabled, from ``logger.mode``, then WANDB_MODE, then whether a key exists."""
    if configured != "auto":
        return configured
    env = os.environ.get("WANDB_MODE", "").strip().lower()
    if env:
        return {"dryrun": "offline", "run": "online"}.get(env, env)
    return "online" if has_api_key() else "offline"


def run_tags(conf: Config) -> list[str]:
    tags = [f"decoder:{conf.decoder.name}", f"model:{conf.model.name}", f"benchmark:{conf.benchmark.name}"]
    tags += [f"decoder:{name}" for name in conf.decoders if name != conf.decoder.name]
    if conf.benchmark.batch_size > 1:  # also in the logged config (benchmark.batch_size): a sweep groups by it
        tags.append(f"batch_size:{conf.benchmark.batch_size}")
    return [t[:64] for t in [*tags, *conf.logger.tags]]  # wandb's tag length limit


def start_run(conf: Config, cfg: DictConfig, run_dir: Path, job_type: str, resume: bool = False) -> Tracker:
    """A tracker for this job (see the module docstring); a no-op one for ``logger=none``. ``resume``: continue
    this run directory's earlier run of the same job type, when there is one."""
    mode = resolve_mode(conf.logger.mode)
    if conf.logger.name == "none" or mode == "disabled":
        return Tracker()
    import wandb

    run_dir = Path(run_dir)
    id_file = run_dir / "wandb" / f"{job_type}.id"
    id_file.parent.mkdir(parents=True, exist_ok=True)
    run_id = id_file.read_text().strip() if resume and id_file.is_file() else None
    kwargs = dict(
        project=conf.logger.project, entity=conf.logger.entity, group=conf.logger.group or conf.experiment,
        job_type=job_type, tags=run_tags(conf), name=f"{job_type}-{conf.decoder.name}-{run_dir.name}",
        config=OmegaConf.to_container(cfg, resolve=True), dir=str(run_dir),
        settings=wandb.Settings(console="off", silent=True), id=run_id, resume="allow" if run_id else None,
    )
    for attempt in (mode, "offline") if mode == "online" else (mode,):
        try:
            run = wandb.init(mode=attempt, **kwargs)
            id_file.write_text(run.id)
            return WandbTracker(run, attempt)
        except Exception as err:  # noqa: BLE001 - tracking must never cost the job
            log.warning("wandb could not start in %s mode (%s: %s)", attempt, type(err).__name__, err)
    log.warning("continuing without wandb tracking")
    return Tracker()
