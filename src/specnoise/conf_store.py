"""Hydra's side of the configs: the schemas in Hydra's ConfigStore and the ``${asset:...}`` resolver.

Called explicitly by the entry point (and by tests that compose configs), never on import: the dataclasses in
``config/`` stay plain, and importing any layer below the entry point loads neither Hydra nor OmegaConf.
"""

from __future__ import annotations

from hydra.core.config_store import ConfigStore
from omegaconf import OmegaConf

from specnoise.config import (
    ASSETS_DIR,
    DECODER_SCHEMAS,
    BenchmarkConfig,
    Config,
    DataConfig,
    DraftConfig,
    LoggerConfig,
    ModelConfig,
    TrainConfig,
    config_dir,
)


def register() -> None:
    """Register every schema so YAML options can extend ``/schema/<group>/<name>``, and the resolver
    ``${asset:models/small-code}`` -> an absolute path inside the package, so shipped models and data resolve the
    same from a clone, an editable install or a wheel; ``${repo:experiments/...}`` -> an absolute path next to the
    configs (in a clone: the repository root), for files a committed study reads whatever the working directory; and
    ``${run_dir:...}``, the run directory of a job (conf/config.yaml's hydra.run.dir): a report with
    ``report.out_dir`` runs in that folder instead of making a timestamped one beside it. Idempotent."""
    if not OmegaConf.has_resolver("asset"):
        OmegaConf.register_new_resolver("asset", lambda rel: str(ASSETS_DIR / rel))
    if not OmegaConf.has_resolver("repo"):
        OmegaConf.register_new_resolver("repo", lambda rel: str(config_dir().parent / rel))
    if not OmegaConf.has_resolver("run_dir"):
        OmegaConf.register_new_resolver("run_dir", lambda task, out_dir, stamped: out_dir if task == "report" and
                                        out_dir else stamped)
    cs = ConfigStore.instance()
    cs.store(name="config_schema", node=Config)
    cs.store(group="schema/model", name="model", node=ModelConfig)
    cs.store(group="schema/draft", name="draft", node=DraftConfig)
    cs.store(group="schema/train", name="train", node=TrainConfig)
    cs.store(group="schema/data", name="data", node=DataConfig)
    cs.store(group="schema/benchmark", name="benchmark", node=BenchmarkConfig)
    cs.store(group="schema/logger", name="logger", node=LoggerConfig)
    for name, schema in DECODER_SCHEMAS.items():
        cs.store(group="schema/decoder", name=name, node=schema)
