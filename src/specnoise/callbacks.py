"""Hydra callback: after every multirun, write one report of the whole sweep into ``<sweep dir>/report``.

Enabled by ``hydra/callbacks=report`` (conf/hydra/callbacks/report.yaml) and by every sweep preset in
conf/experiment/. It runs in the launching process once all jobs have returned (also with the joblib and
submitit launchers). A failed job has already left its FAILED.json (see ``__main__``), so the report lists
it; a report that cannot be written is logged and never turns a finished sweep into a failure. A sweep in
which some job failed exits with status 1 once the report is written ("N of M jobs failed: see .../FAILED.json").
"""

from __future__ import annotations

import copy
import logging
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf, open_dict, read_write

from specnoise.config import ReportConfig, UserError

log = logging.getLogger("specnoise.report")


SWEEPS_STARTED: list[Path] = []  # this process's sweep dirs: the entry point removes one a refused sweep left empty


class ReportCallback(Callback):
    def __init__(self, subdir: str = "report") -> None:
        self.subdir = subdir

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        SWEEPS_STARTED.append(Path(config.hydra.sweep.dir))

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        sweep_dir = Path(config.hydra.sweep.dir)
        self.write_report(config, sweep_dir)
        failed, total = failed_jobs(sweep_dir)
        if failed:  # SystemExit passes Hydra's callback guard: the sweep's exit status tells schedulers and CI
            shown = ", ".join(str(p / "FAILED.json") for p in failed[:3]) + (", ..." if len(failed) > 3 else "")
            raise SystemExit(f"{len(failed)} of {total} jobs failed: see {shown}")

    def write_report(self, config: DictConfig, sweep_dir: Path) -> None:
        from specnoise.report import build_report, log_to_wandb

        job_cfg = copy.deepcopy(config)  # the sweep's own config, as a job would see it (without `hydra`)
        with read_write(job_cfg), open_dict(job_cfg):
            del job_cfg["hydra"]
        settings = ReportConfig(**OmegaConf.to_container(job_cfg.report, resolve=True))
        experiment = job_cfg.get("experiment", "default")
        try:
            path = build_report([sweep_dir], sweep_dir / self.subdir, settings, title=f"specnoise sweep: {experiment}")
        except UserError as err:
            log.warning(f"no sweep report: {err}")
            return
        except Exception:  # noqa: BLE001 - the jobs' results are safe on disk; a plotting bug must not hide them
            log.exception(f"writing the sweep report for {sweep_dir} failed; run task=report report.runs=[{sweep_dir}]")
            return
        log.info(f"sweep report: {path}")
        if settings.wandb:
            try:  # the sweep's base config may only become valid with each job's overrides
                conf = OmegaConf.to_object(job_cfg)
            except UserError as err:
                log.warning(f"sweep report not logged to wandb: {err}")
                return
            log_to_wandb(path.parent, conf, job_cfg)


def failed_jobs(sweep_dir: Path) -> tuple[list[Path], int]:
    """(the job directories of the sweep that hold FAILED.json, the number of jobs)."""
    from specnoise.report import find_jobs, read_job

    jobs = [job for job in map(read_job, find_jobs([sweep_dir])) if job is not None] if sweep_dir.is_dir() else []
    return [job.path for job in jobs if (job.path / "FAILED.json").is_file()], len(jobs)
