"""Entry point: ``python -m specnoise [+experiment=NAME] [group=option ...] [key=value ...] [-m]``.

One job = compose and check the config, then run its stages in order: train (if ``train`` is not
``none``), benchmark what was trained or the configured model (if ``benchmark`` is not ``none``), or,
with neither, generate a completion of ``prompt``. ``task=report`` collects earlier runs instead;
``task=forward_cost`` times one target forward of q new tokens.

A job holds its run directory's lock while it runs (a second job there refuses). A run directory named on the
command line (``hydra.run.dir=DIR``) is checked and locked by ``entry`` *before* Hydra writes anything into it, so a
refused second job cannot rewrite the running job's ``.hydra/`` files or append to its log. Exit status: 0 done;
2 bad input (one line, and FAILED.json), including what Hydra refuses before the job starts (an unknown option or
preset, an unwritable run directory); 1 a crash (FAILED.json with the traceback, which is also shown) or, for a
sweep, any failed job; 130 / 143 a benchmark stopped by SIGINT / SIGTERM (results.json of the finished prompts).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sys
import traceback
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from specnoise.conf_store import register
from specnoise.config import Config, UserError, config_dir, config_warnings, refuse_ignored_overrides
from specnoise.files import RunDirBusy, RunLock, write_atomic
from specnoise.ranks import quiet_rank_args, rank, tensor_parallel

log = logging.getLogger("specnoise")
register()  # the schemas and the ${asset:} resolver, before Hydra composes anything
NO_JOB_FLAGS = ("--help", "-h", "--hydra-help", "--cfg", "-c", "--info", "-i", "--shell-completion", "-sc",
                "--multirun", "-m", "--resolve", "-p", "--package")  # runs no job in a run dir of its own
_state = {"started": False, "locked": None}  # whether Hydra reached the job; the run dir `entry` locked


def run(cfg: DictConfig, run_dir: Path, overrides: list[str] = (), tuning: bool = False) -> dict | float:
    """Run one job; returns a small summary (also what multirun jobs leave in their directory), or, for a trial of
    an Optuna search (``tuning``), its objective value (tune.py). ``overrides`` are the job's command-line
    overrides: a key among them that no stage of the job reads is refused."""
    conf: Config = OmegaConf.to_object(cfg)  # dataclass __post_init__ checks every range here
    refuse_ignored_overrides(conf, list(overrides))  # before anything loads
    if tuning:
        from specnoise.tune import check_tunable

        check_tunable(conf)
    for warning in config_warnings(conf):
        log.warning("warning: %s", warning)

    if conf.task == "report":
        from specnoise.report import run_report

        return {"report": str(run_report(conf, run_dir))}
    if conf.task == "forward_cost":
        from specnoise.bench.forward_cost import run_forward_cost

        return {"forward_cost": str(run_forward_cost(conf, run_dir))}

    summary: dict = {}
    model_path = conf.model.path
    if conf.train.name == "none":  # a config error before any weights load, not an out-of-memory crash after
        from specnoise.planner import check_memory

        check_memory(conf)
    if conf.train.name != "none":
        from specnoise.bench.progress import trained_model
        from specnoise.training import train

        model_path = trained_model(run_dir, cfg)  # a continued benchmark keeps the weights it started on
        if model_path:
            log.info("continuing with the model this job trained before: %s", model_path)
        else:
            model_path = str(train(conf, cfg, run_dir))
        summary["trained_model"] = model_path
    if conf.benchmark.name != "none":
        from specnoise.bench.runner import run_benchmark

        summary["results"] = str(run_benchmark(conf, cfg, run_dir, model_path=model_path))
        if tuning:  # the sweeper reads the job's return value
            from specnoise.tune import objective

            return objective(Path(summary["results"]), conf.decoder.name)
    if conf.train.name == "none" and conf.benchmark.name == "none":
        from specnoise.generate import generate_once

        summary["completion"] = generate_once(conf, cfg)
    return summary


def _is_multirun() -> bool:
    try:
        return HydraConfig.get().mode == RunMode.MULTIRUN
    except ValueError:
        return False


def _is_tuning() -> bool:
    """Whether this job is a trial of an Optuna search (hydra/sweeper=tune, or the stock optuna): the sweeper reads
    the job's return value as the trial's objective."""
    if not _is_multirun():
        return False
    target = str(HydraConfig.get().sweeper.get("_target_", ""))
    return target.startswith(("hydra_plugins.specnoise_tune.", "hydra_plugins.hydra_optuna_sweeper."))


def continue_advice(run_dir: Path) -> str:
    """How to continue a stopped job: a sweep's jobs continue in their sweep directory, a single run in its own."""
    if _is_multirun():
        return (f"run the same command (-m) with hydra.sweep.dir={HydraConfig.get().sweep.dir} to continue: each job "
                "continues in its own folder")
    return f"run the same command with hydra.run.dir={run_dir} to continue"


def _fail(run_dir: Path, message: str, trace: str | None) -> None:
    """A failed job leaves its error in its own directory (the report lists it; a sweep exits non-zero)."""
    write_atomic(run_dir / "FAILED.json", json.dumps({"error": message, "traceback": trace}, indent=2))
    log.error(message)


@hydra.main(version_base="1.3", config_path=str(config_dir()), config_name="config")
def main(cfg: DictConfig) -> dict | float | None:
    from specnoise.bench.progress import Interrupted

    _state["started"] = True
    run_dir = Path(HydraConfig.get().runtime.output_dir)
    # accelerate's other ranks share rank 0's directory (training agrees on it), so only rank 0 locks it; `entry`
    # may hold it already
    held = _state["locked"] is not None and Path(_state["locked"]).resolve() == run_dir.resolve()
    lock = RunLock(run_dir) if rank() == 0 and not held else contextlib.nullcontext()
    try:
        with lock:
            (run_dir / "FAILED.json").unlink(missing_ok=True)  # an earlier attempt's failure; this one decides
            try:
                return run(cfg, run_dir, HydraConfig.get().overrides.task, tuning=_is_tuning())
            except Interrupted as stop:  # results.json holds the finished prompts
                log.warning(f"{stop}; {continue_advice(run_dir)}")
                sys.exit(stop.exit_code)
            except (UserError, FileNotFoundError) as err:
                _fail(run_dir, f"error: {err}", None)
            except Exception as err:  # a sweep must outlive one failing job; a single run shows the traceback
                _fail(run_dir, f"error: {type(err).__name__}: {err}", traceback.format_exc())
                if not _is_multirun():
                    raise
    except RunDirBusy as err:  # not this job's directory: leave no FAILED.json in it
        log.error(f"error: {err}")
        sys.exit(2)
    if not _is_multirun():
        sys.exit(2)
    return None


def named_run_dir(args: list[str]) -> Path | None:
    """The run directory a single job was given on the command line (None: Hydra picks a fresh timestamped one, or
    the command runs no job, or the path is interpolated and only Hydra can resolve it)."""
    if any(a.split("=")[0] in NO_JOB_FLAGS for a in args):
        return None
    for arg in args:
        key, _, value = arg.partition("=")
        if key.lstrip("+") == "hydra.run.dir" and value and "${" not in value:
            return Path(value.strip("'\"")).expanduser()
    return None


def writable(run_dir: Path) -> None:
    """Create ``run_dir`` and write in it once, or say in one line why not (Hydra would end in a traceback)."""
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        probe = run_dir / f".specnoise-probe-{os.getpid()}"
        probe.write_text("")
        probe.unlink()
    except OSError as err:
        raise UserError(f"cannot write to the run directory {run_dir} ({err.strerror or err}): make it writable or "
                        "set hydra.run.dir to a writable folder") from None


def entry() -> None:
    """``python -m specnoise`` and the ``specnoise`` script: checks and locks a named run directory, runs Hydra,
    and maps what Hydra refuses before the job starts to exit status 2 (bad input) instead of Hydra's 1."""
    run_dir = named_run_dir(sys.argv[1:])
    if rank() != 0 and tensor_parallel(sys.argv[1:]):  # rank 0 alone checks, locks and writes the run directory
        sys.argv[1:] = quiet_rank_args(sys.argv[1:], run_dir)
        run_dir = None
    fresh = run_dir is not None and not run_dir.exists()  # created here: removed again if no job gets to use it
    try:
        lock: contextlib.AbstractContextManager = contextlib.nullcontext()
        if run_dir is not None and rank() == 0:
            writable(run_dir)
            lock = RunLock(run_dir)
            _state["locked"] = str(run_dir)
        with lock:
            main()
    except (RunDirBusy, UserError) as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)
    except SystemExit as done:
        if done.code == 1 and not _state["started"]:  # Hydra's own refusal: composition, override, run dir
            leave_nothing_behind(run_dir if fresh else None)
            sys.exit(2)
        raise


def leave_nothing_behind(run_dir: Path | None) -> None:
    """After Hydra refused the command before any job started: the run directory this process created, and a sweep
    directory holding only Hydra's multirun.yaml, are removed (a typo leaves no empty folders to wade through)."""
    from specnoise.callbacks import SWEEPS_STARTED

    for sweep in SWEEPS_STARTED:
        if sweep.is_dir() and [p.name for p in sweep.iterdir()] == ["multirun.yaml"]:
            (sweep / "multirun.yaml").unlink()
            sweep.rmdir()
    if run_dir is not None and run_dir.is_dir() and not any(run_dir.iterdir()):
        run_dir.rmdir()


if __name__ == "__main__":
    entry()
