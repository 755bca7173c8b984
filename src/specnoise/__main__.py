"""Entry point: ``python -m specnoise [+experiment=NAME] [group=option ...] [key=value ...] [-m]``.

One job = compose and check the config, then run its stages in order: train (if ``train`` is not
``none``), benchmark what was trained or the configured model (if ``benchmark`` is not ``none``), or,
with neither, generate a completion of ``prompt``. ``task=report`` collects earlier runs instead;
``task=forward_cost`` times one target forward of q new tokens.
"""

from __future__ import annotations

import json
import logging
import sys
import traceback
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from specnoise.config import Config, UserError, config_dir

log = logging.getLogger("specnoise")


def run(cfg: DictConfig) -> dict:
    """Run one job; returns a small summary (also what multirun jobs leave in their directory)."""
    conf: Config = OmegaConf.to_object(cfg)  # dataclass __post_init__ checks every range here
    run_dir = Path(HydraConfig.get().runtime.output_dir)

    if conf.task == "report":
        from specnoise.report import run_report

        return {"report": str(run_report(conf, run_dir))}
    if conf.task == "forward_cost":
        from specnoise.bench.forward_cost import run_forward_cost

        return {"forward_cost": str(run_forward_cost(conf, run_dir))}

    summary: dict = {}
    model_path = conf.model.path
    if conf.train.name != "none":
        from specnoise.training import train

        model_path = str(train(conf, cfg, run_dir))
        summary["trained_model"] = model_path
    if conf.benchmark.name != "none":
        from specnoise.bench.runner import run_benchmark

        summary["results"] = str(run_benchmark(conf, cfg, run_dir, model_path=model_path))
    if conf.train.name == "none" and conf.benchmark.name == "none":
        from specnoise.generate import generate_once

        summary["completion"] = generate_once(conf, cfg)
    return summary


def _is_multirun() -> bool:
    try:
        return HydraConfig.get().mode == RunMode.MULTIRUN
    except ValueError:
        return False


@hydra.main(version_base="1.3", config_path=str(config_dir()), config_name="config")
def main(cfg: DictConfig) -> dict | None:
    try:
        return run(cfg)
    except (UserError, FileNotFoundError) as err:
        message = f"error: {err}"
        trace = None
    except Exception as err:  # noqa: BLE001 - a sweep must outlive one failing job
        if not _is_multirun():
            raise
        message, trace = f"error: {type(err).__name__}: {err}", traceback.format_exc()
    # A failed job leaves its error in its own directory; in a sweep the other jobs go on.
    run_dir = Path(HydraConfig.get().runtime.output_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "FAILED.json").write_text(json.dumps({"error": message, "traceback": trace}, indent=2))
    log.error(message)
    if not _is_multirun():
        sys.exit(2)
    return None


if __name__ == "__main__":
    main()
