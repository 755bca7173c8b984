"""``hydra/sweeper=tune``: Hydra's Optuna sweeper (hydra-optuna-sweeper), made resumable, with a summary at the end.

Hydra only instantiates sweepers that live in the ``hydra_plugins`` namespace, hence this small module; what it
does is in ``specnoise/tune.py``. The stock sweeper, run again on the same storage, would start its job folders at 0
again (over the finished trials' results) and run ``n_trials`` more; this one, before handing over to it:

- holds the sweep directory's lock (a second search there refuses) and creates the directory (SQLite needs it);
- refuses to resume a search begun with other command-line overrides;
- queues the configured setting of the searched keys (the decoder's defaults) as a trial, once per study;
- marks the trials an interrupted search left RUNNING as failed and queues their parameters again;
- counts the finished trials against ``n_trials`` and numbers the new jobs after them (job folder = trial number);
- and, once the stock sweep returns, writes ``tune.json`` (every trial, the best one, the command that re-runs it)
  into the sweep directory, where ``task=report`` and the sweep report find it, and prints the winner.

Imported by Hydra's plugin scan at every start: optuna (seconds to import) is imported only when a sweep runs.
"""

from dataclasses import dataclass
from pathlib import Path

from hydra.core.config_store import ConfigStore
from hydra_plugins.hydra_optuna_sweeper.config import OptunaSweeperConf
from hydra_plugins.hydra_optuna_sweeper.optuna_sweeper import OptunaSweeper
from omegaconf import OmegaConf


@dataclass
class TuneSweeperConf(OptunaSweeperConf):
    _target_: str = "hydra_plugins.specnoise_tune.tune_sweeper.TuneSweeper"
    direction: str = "maximize"  # the objective is a speedup's CI lower bound
    n_jobs: int = 1  # trials launched at once (per batch); more only with a parallel launcher and spare cores


ConfigStore.instance().store(group="hydra/sweeper", name="tune", node=TuneSweeperConf, provider="specnoise")


class TuneSweeper(OptunaSweeper):
    def sweep(self, arguments: list[str]) -> None:
        from specnoise.files import RunLock
        from specnoise.tune import Search

        impl = self.sweeper  # the stock OptunaSweeperImpl: its sampler, storage and launcher
        sweep_dir = Path(str(impl.config.hydra.sweep.dir))
        with RunLock(sweep_dir):
            search = Search.open(impl.storage, impl.study_name, impl.sampler, impl._get_directions(), sweep_dir,
                                 seed=impl.config.hydra.sweeper.sampler.get("seed"), arguments=arguments)
            params = impl.config.hydra.sweeper.params or {}
            search.enqueue_default({k: OmegaConf.select(impl.config, k) for k in params
                                    if OmegaConf.select(impl.config, k) is not None})
            impl.n_trials, impl.job_idx = search.resume(impl.n_trials)
            if impl.n_trials > 0:
                try:
                    impl.sweep(arguments)
                except ValueError:  # the stock sweep ends with the best trial, and raises if none finished
                    if search.best() is not None:
                        raise
            search.finish(impl.config)
