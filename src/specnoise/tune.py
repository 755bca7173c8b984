"""Find the fastest lossless setting of a decoder: an Optuna search over its config keys (``+experiment=tune-*``).

Two sides, one file:

- **the job** (``__main__`` calls ``check_tunable`` before any model loads, then ``objective`` on its results.json):
  one benchmark of the trial's setting against AR, ``benchmark.repeats`` >= 2 times; its value is the lower bound
  of the speedup's 95% confidence interval, never the mean, so a setting that was merely lucky once does not win.
  A trial whose tokens differ from AR's raises ``NotLossless``: the job fails, Optuna records the trial as failed
  (never a winner) and the search exits non-zero at its end;
- **the search** (``Search``, driven by the ``hydra/sweeper=tune`` plugin in ``hydra_plugins/specnoise_tune``): the
  Optuna study in its storage (SQLite in the sweep directory), resumed where an interrupted search stopped, and
  ``tune.json`` at the end: every trial with its speedup, CI and accepted tokens, the best one, and the command
  that re-runs it.
"""

from __future__ import annotations

import json
import logging
import math
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from specnoise.config import Config, UserError
from specnoise.files import write_atomic

log = logging.getLogger("specnoise.tune")
OBJECTIVE = "speedup_ci_low"  # of the tuned decoder's row over all prompts (category `all`)
INTERRUPTED = "specnoise:interrupted"  # system attribute of a trial an interrupted search left unfinished
DEFAULT = "specnoise:default"  # system attribute of the trial of the configured setting (the decoder's defaults)


class NotLossless(RuntimeError):
    """A trial's tokens differ from AR's under greedy decoding: a bug in the decoder, never a result."""


# ------------------------------------------------------------------------------------------------ the job
def check_tunable(conf: Config) -> None:
    """What a trial needs, checked before any model loads."""
    if conf.benchmark.name == "none":
        raise UserError("a tuning trial is a benchmark: set benchmark=NAME (e.g. benchmark=humaneval)")
    if conf.benchmark.repeats < 2:
        raise UserError(f"benchmark.repeats={conf.benchmark.repeats}: the search maximises the speedup's CI lower "
                        "bound, which needs every prompt timed at least twice: set benchmark.repeats=2 or more")
    if conf.benchmark.limit is not None and conf.benchmark.limit < 2:
        raise UserError(f"benchmark.limit={conf.benchmark.limit}: the speedup's CI is bootstrapped over the prompts: "
                        "set benchmark.limit=2 or more (5 or more for a usable interval)")
    if conf.decoder.temperature != 0 or not conf.benchmark.check_lossless:
        raise UserError("every trial must be checked lossless against AR: tune with greedy decoding "
                        "(decoder.temperature=0) and benchmark.check_lossless=true")


def objective(results: Path, decoder: str) -> float:
    """The trial's value: ``speedup_ci_low`` of ``decoder`` over all prompts; raises ``NotLossless``."""
    data = json.loads(Path(results).read_text())
    row = next((r for r in data["rows"] if r["decoder"] == decoder and r["category"] == "all"), None)
    if row is None:
        raise UserError(f"{results} has no row for decoder={decoder}: nothing to tune")
    if row["lossless_fraction"] is None:
        raise UserError(f"{results} was not checked lossless: tune with greedy decoding and check_lossless")
    if row["lossless_fraction"] < 1.0:
        raise NotLossless(f"decoder={decoder} gave different tokens from AR on {1 - row['lossless_fraction']:.0%} "
                          f"of the prompts ({Path(results).parent / 'per_prompt.jsonl'}: first_divergence): a bug "
                          "in the decoder at this setting, never a winner; please report it with this job's "
                          ".hydra/overrides.yaml")
    low = row[OBJECTIVE]
    if low is None or not math.isfinite(low):
        raise UserError(f"{results}: no speedup CI (benchmark.repeats={row.get('repeats')}, {row['prompts']} "
                        "prompts): time more prompts")
    return float(low)


# ------------------------------------------------------------------------------------------------ the search
@dataclass
class Search:
    """An Optuna study in persistent storage, and the sweep directory whose job folders are its trials."""

    study: Any  # optuna.Study
    sweep_dir: Path
    seed: int | None

    @classmethod
    def open(cls, storage: str | None, name: str | None, sampler: Any, directions: list[str], sweep_dir: Path,
             seed: int | None, arguments: list[str]) -> Search:
        """The study (created, or loaded to resume it); refuses to resume a search begun with other overrides:
        its trials would not compare."""
        import optuna

        if not storage or not name:
            raise UserError("hydra/sweeper=tune needs hydra.sweeper.storage (e.g. sqlite:///<sweep dir>/optuna.db) "
                            "and hydra.sweeper.study_name, so an interrupted search can resume")
        sweep_dir.mkdir(parents=True, exist_ok=True)  # SQLite creates the file, not its folder
        study = optuna.create_study(study_name=name, storage=storage, sampler=sampler, directions=directions,
                                    load_if_exists=True)
        begun = study.user_attrs.get("arguments")
        if begun is None:
            study.set_user_attr("arguments", sorted(arguments))
        elif begun != sorted(arguments):
            raise UserError(f"{sweep_dir} holds the search {name} begun with the overrides {' '.join(begun)}; "
                            f"this command has {' '.join(sorted(arguments)) or 'none'}: run the same command to "
                            "resume it, or set hydra.sweep.dir=DIR for a new search")
        return cls(study, sweep_dir, seed)

    def enqueue_default(self, setting: dict[str, Any]) -> None:
        """Queue the configured setting of the searched keys (the decoder's defaults, or what the command line set)
        as a trial of its own, once per study: tune.json compares the best with it, measured the same way."""
        if setting and not any(t.system_attrs.get(DEFAULT) for t in self.study.get_trials(deepcopy=False)):
            self._enqueue(setting, default=True)

    def _enqueue(self, params: dict[str, Any], default: bool) -> None:
        import warnings

        from optuna.exceptions import ExperimentalWarning
        from optuna.trial import TrialState

        with warnings.catch_warnings():  # enqueue_trial: "experimental" in optuna 2.10, stable since 3
            warnings.simplefilter("ignore", ExperimentalWarning)
            self.study.enqueue_trial(params)
        if default:
            queued = self.study.get_trials(deepcopy=False, states=(TrialState.WAITING,))[-1]
            self.study._storage.set_trial_system_attr(queued._trial_id, DEFAULT, True)

    def resume(self, n_trials: int) -> tuple[int, int]:
        """Take up an interrupted search: its unfinished trials fail (marked ``INTERRUPTED``) and their parameters
        are queued again; returns (trials still to run of the budget ``n_trials``, the first new job's number =
        the next trial's number)."""
        from optuna.trial import TrialState

        study = self.study
        trials = study.get_trials(deepcopy=False)
        for trial in (t for t in trials if t.state == TrialState.RUNNING):
            log.warning("trial %d was interrupted: running it again with %s", trial.number, trial.params)
            study._storage.set_trial_system_attr(trial._trial_id, INTERRUPTED, True)
            study.tell(trial.number, state=TrialState.FAIL)
            self._enqueue(trial.params, default=bool(trial.system_attrs.get(DEFAULT)))
        trials = study.get_trials(deepcopy=False)
        done = [t for t in trials if t.state.is_finished() and not t.system_attrs.get(INTERRUPTED)]
        waiting = [t.number for t in trials if t.state == TrialState.WAITING]
        if done:
            log.info("resuming %s: %d of %d trials done", study.study_name, len(done), n_trials)
            self.reseed(len(trials))
        return max(0, n_trials - len(done)), min(waiting, default=len(trials))

    def reseed(self, offset: int) -> None:
        """A resumed sampler must not draw its first random points again (it would repeat finished trials): seed
        it with ``seed + trials so far`` (deterministic, as the search's own seed is)."""
        import numpy as np

        sampler = self.study.sampler
        if self.seed is None or not hasattr(sampler, "_rng"):
            sampler.reseed_rng()
            return
        sampler._rng = np.random.RandomState(self.seed + offset)
        if hasattr(sampler, "_random_sampler"):  # TPE's startup trials
            sampler._random_sampler._rng = np.random.RandomState(self.seed + offset)

    def best(self) -> Any:
        """The best finished trial, or None (failed trials never win)."""
        from optuna.trial import TrialState

        return next(iter(sorted(self.study.get_trials(states=(TrialState.COMPLETE,)), key=lambda t: -t.value)), None)

    def finish(self, config: Any) -> dict:
        """``tune.json`` in the sweep directory, and the winner printed with the command that re-runs it."""
        summary = summarize(self.study, self.sweep_dir, experiment=config.get("experiment"),
                            budget=int(config.hydra.sweeper.n_trials))
        write_atomic(self.sweep_dir / "tune.json", json.dumps(summary, indent=2, default=str))
        print(describe(summary))
        return summary


def trial_dir(sweep_dir: Path, trial: Any) -> Path | None:
    """The job folder of a trial (named after its number), if its overrides hold the trial's parameters."""
    path = sweep_dir / str(trial.number)
    overrides = path / ".hydra" / "overrides.yaml"
    if not overrides.is_file():
        return None
    given = set(yaml.safe_load(overrides.read_text()) or [])
    return path if all(f"{k}={v}" in given for k, v in trial.params.items()) else None


def summarize(study: Any, sweep_dir: Path, experiment: str | None, budget: int) -> dict:
    """Every trial (number, state, parameters, value and, from its results.json, speedup, CI, MAT, lossless),
    the best finished one, and the command that re-runs it as a single job."""
    rows = []
    for trial in study.get_trials(deepcopy=False):
        path = trial_dir(sweep_dir, trial)
        row = {"trial": trial.number, "state": trial.state.name, "value": trial.value, "params": trial.params,
               "interrupted": bool(trial.system_attrs.get(INTERRUPTED)),
               "default": bool(trial.system_attrs.get(DEFAULT)),
               "job": str(path.relative_to(sweep_dir)) if path else None}
        row.update(_job_row(path) if path else {})
        rows.append(row)
    complete = [r for r in rows if r["state"] == "COMPLETE"]
    best = max(complete, key=lambda r: r["value"]) if complete else None
    finished = [r for r in rows if r["state"] in ("COMPLETE", "FAIL", "PRUNED") and not r["interrupted"]]
    default = next((r for r in complete if r["default"]), None)
    return {"experiment": experiment, "study": study.study_name, "objective": OBJECTIVE,
            "direction": study.direction.name.lower(), "budget": budget, "finished": len(finished),
            "failed": sum(r["state"] == "FAIL" and not r["interrupted"] for r in rows),
            "best": best, "default": default,
            "rerun": rerun_command(sweep_dir / best["job"]) if best and best["job"] else None,
            "trials": rows}


def _job_row(path: Path) -> dict:
    """The tuned decoder's numbers from a trial's results.json (or its error from FAILED.json)."""
    if (path / "FAILED.json").is_file():
        return {"error": json.loads((path / "FAILED.json").read_text()).get("error")}
    if not (path / "results.json").is_file():
        return {}
    data = json.loads((path / "results.json").read_text())
    decoder = data["config"]["decoder"]["name"]
    row = next((r for r in data["rows"] if r["decoder"] == decoder and r["category"] == "all"), None)
    keys = ("decoder", "speedup", "speedup_ci_low", "speedup_ci_high", "mean_accepted_tokens", "lossless_fraction",
            "timing_noisy", "prompts", "repeats")
    return {k: row[k] for k in keys} if row else {}


def rerun_command(job: Path) -> str:
    """``python -m specnoise`` with a trial's overrides, as one job (not a search) in a run directory of its own."""
    overrides = yaml.safe_load((job / ".hydra" / "overrides.yaml").read_text()) or []
    return shlex.join(["python", "-m", "specnoise", *overrides, "hydra.mode=RUN"])


def describe(summary: dict) -> str:
    best = summary["best"]
    head = (f"\nsearch {summary['study']}: {summary['finished']} of {summary['budget']} trials done, "
            f"{summary['failed']} failed; objective: the speedup's 95% CI lower bound")
    if best is None:
        return head + "\nno trial finished: see the FAILED.json of its job folder"
    setting = " ".join(f"{k}={v}" for k, v in best["params"].items())
    lines = [head, f"best: trial {best['trial']}: {setting}"]
    if best.get("speedup") is not None:
        lines.append(f"  speedup {best['speedup']:.3f}x over AR (95% CI {best['speedup_ci_low']:.3f}-"
                     f"{best['speedup_ci_high']:.3f}), {best['mean_accepted_tokens']:.2f} tokens per target forward, "
                     f"lossless on {best['prompts']} prompts x {best['repeats']} repeats")
    default = summary.get("default")
    if default and default.get("speedup") is not None:
        setting = " ".join(f"{k}={v}" for k, v in default["params"].items())
        lines.append(f"the configured setting (trial {default['trial']}: {setting}): speedup {default['speedup']:.3f}x "
                     f"(95% CI {default['speedup_ci_low']:.3f}-{default['speedup_ci_high']:.3f}), "
                     f"{default['mean_accepted_tokens']:.2f} tokens per target forward")
    if summary["rerun"]:
        lines.append(f"re-run it: {summary['rerun']}")
    return "\n".join(lines)
