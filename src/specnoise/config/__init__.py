"""Structured configs: one plain dataclass per config-group option, one module per group of conf/.

* ``model.py``: ``model=`` and ``draft=``;
* ``training.py``: ``train=`` (its noise, architecture and trajectory settings) and ``data=``;
* ``decoders.py``: ``decoder=``, one dataclass per option and ``DECODER_SCHEMAS``, the registry of their names;
* ``bench.py``: ``benchmark=``, ``logger=``, ``report``, ``forward_cost`` and ``planner``;
* here: ``Config``, the root that holds one of each, and the overrides a job would ignore.

Nothing here imports Hydra or OmegaConf, so every layer (the decoding core included) can take these objects;
``conf_store.register`` hands them to Hydra's ConfigStore, and only the entry point calls it. Types are checked by
OmegaConf while Hydra composes; ranges are checked in ``__post_init__`` (with ``checks.py``), which runs when
``__main__`` turns the composed config into these objects (``OmegaConf.to_object``). Every check raises
:class:`ConfigError` naming the full key and what is allowed, so a bad command line fails at start-up with one
readable line instead of a stack trace deep inside a stage. The layers above import every name from here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from specnoise.config.bench import BenchmarkConfig, ForwardCostConfig, LoggerConfig, PlannerConfig, ReportConfig
from specnoise.config.checks import ASSETS_DIR, MISSING, check, check_corpus, config_dir, one_of
from specnoise.config.decoders import (
    AUTO_VARIANT,
    DECODER_SCHEMAS,
    NEUTRAL_SAMPLING,
    ARConfig,
    DecoderConfig,
    JacobiConfig,
    LookaheadConfig,
    OuroborosConfig,
    PLDConfig,
    RESTConfig,
    SAMConfig,
    SpeculativeConfig,
    TokenRecyclingConfig,
    TRJacobiConfig,
    decoder_entry,
    sampling_decoders,
)
from specnoise.config.model import STATIC_BUCKETS, DraftConfig, ModelConfig
from specnoise.config.training import (
    ArchConfig,
    CLLMConfig,
    DataConfig,
    JacobiForcingConfig,
    NoiseConfig,
    TrainConfig,
    TrajectoryConfig,
)
from specnoise.errors import ConfigError, UserError

__all__ = [  # what the layers above import (the group modules hold the rest)
    "ASSETS_DIR", "AUTO_VARIANT", "DECODER_SCHEMAS", "STATIC_BUCKETS", "ARConfig", "ArchConfig", "BenchmarkConfig",
    "CLLMConfig", "Config", "ConfigError", "DataConfig", "DecoderConfig", "DraftConfig", "ForwardCostConfig",
    "JacobiConfig", "JacobiForcingConfig", "LoggerConfig", "LookaheadConfig", "ModelConfig", "NoiseConfig",
    "OuroborosConfig", "PLDConfig", "PlannerConfig", "RESTConfig", "ReportConfig", "SAMConfig", "SpeculativeConfig",
    "TRJacobiConfig", "TokenRecyclingConfig", "TrainConfig", "TrajectoryConfig", "UserError", "check_corpus",
    "config_dir", "config_warnings", "decoder_entry", "refuse_ignored_overrides",
]


@dataclass
class Config:
    model: ModelConfig = MISSING
    draft: DraftConfig = field(default_factory=DraftConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    data: DataConfig = MISSING
    decoder: Any = MISSING  # one of DECODER_SCHEMAS, chosen by the decoder group
    # more decoder options benchmarked in the same job; an entry NAME+auto is NAME with decoder.auto=true (AUTO_VARIANT)
    decoders: list[str] = field(default_factory=list)
    benchmark: BenchmarkConfig = field(default_factory=BenchmarkConfig)
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    report: ReportConfig = field(default_factory=ReportConfig)
    forward_cost: ForwardCostConfig = field(default_factory=ForwardCostConfig)
    planner: PlannerConfig = field(default_factory=PlannerConfig)
    task: str = "run"  # run: train and/or benchmark (or generate `prompt`) | report | forward_cost
    experiment: str = "default"  # set by experiment presets; groups wandb runs
    prompt: str = "def fibonacci(n):"  # `task=run` with train=none and benchmark=none generates this
    seed: int = 0

    def __post_init__(self) -> None:
        one_of(self.task, "task", ("run", "report", "forward_cost"))
        for entry in self.decoders:
            name, variant = decoder_entry(entry)
            one_of(name, "decoders[]", tuple(DECODER_SCHEMAS))
            check(not (variant and self.decoder.auto), "decoders[]",
                  f"{entry} duplicates {name} when decoder.auto=true: every entry has auto on already; drop the "
                  f"{AUTO_VARIANT} entries or set decoder.auto=false to time each beside its faithful setting")
            # every `decoders` entry shares decoder's sampling keys (bench/runner.py, decoder_configs)
            check(DECODER_SCHEMAS[name].samples or not self.decoder.sampling_keys_set, "decoders[]",
                  f"{name} is greedy-only but shares decoder={self.decoder.name}'s sampling keys (temperature="
                  f"{self.decoder.temperature}, top_p={self.decoder.top_p}, top_k={self.decoder.top_k}): drop it "
                  f"or keep to decoders that sample ({', '.join(sampling_decoders())})")
        budget = self.decoder.max_new_tokens
        check(budget is None or self.benchmark.name == "none" or budget == self.benchmark.max_new_tokens,
              "decoder.max_new_tokens", f"got {budget} but benchmark.max_new_tokens={self.benchmark.max_new_tokens}: "
              "a benchmark has one generation length, set benchmark.max_new_tokens only")


# ------------------------------------------------------------------------- keys the chosen options ignore
# Keys that only one option reads. Set on the command line while that option is off, such a key would be accepted and
# ignored (`train=jacobi_forcing train.cllm.prompts=8` collected on every prompt), so it is refused. Group options and
# presets set these keys legitimately for options they do not pick, so only the user's own overrides are checked:
# the entry point, the one module that knows Hydra, hands them to `refuse_ignored_overrides`. First match wins, so a
# narrow prefix comes before a wider one; a prefix ending in "." matches the keys below it, not the group choice
# itself (`train=none` chooses, `train.max_steps=5` is a key of the stage).
STAGES = "a training stage (train=sft|msn|pretrain|cllm|jacobi_forcing)"
READ_ONLY_BY: list[tuple[str, str, Any]] = [  # (key prefix, who reads it, whether the composed config reads it)
    ("train.cllm", "train=cllm", lambda c: c.train.name == "cllm"),
    ("train.jacobi_forcing", "train=jacobi_forcing", lambda c: c.train.name == "jacobi_forcing"),
    ("train.noise", "train=msn", lambda c: c.train.name == "msn"),
    ("train.arch", "train=pretrain (or task=forward_cost with forward_cost.arch=random)",
     lambda c: c.train.name == "pretrain" or (c.task == "forward_cost" and c.forward_cost.arch == "random")),
    ("train.tokenizer_path", "train=pretrain", lambda c: c.train.name == "pretrain"),
    # where a sweep's trainings share their models: a sweep mixing jobs that train with jobs that do not
    # (msn_table3=l1,l8,l4-shipped) sets it once for all, and a job that trains nothing has nothing to share
    ("train.cache_dir", "", lambda c: True),
    ("train.", STAGES, lambda c: c.train.name != "none"),
    ("data", STAGES, lambda c: c.train.name != "none"),
    ("forward_cost", "task=forward_cost", lambda c: c.task == "forward_cost"),
    ("benchmark.max_new_tokens", "", lambda c: True),  # also the budget of a single `prompt`
    ("benchmark.template", "", lambda c: True),  # also the template of a single `prompt`
    ("benchmark.", "a benchmark (benchmark=NAME)", lambda c: c.task == "run" and c.benchmark.name != "none"),
    ("decoders", "a benchmark (benchmark=NAME)", lambda c: c.task == "run" and c.benchmark.name != "none"),
]


def override_key(override: str) -> str:
    """The key of a command-line override (``+a.b=1``, ``~a.b``, ``a.b=1`` -> ``a.b``)."""
    return override.split("=", 1)[0].lstrip("+~")


def refuse_ignored_overrides(conf: Config, overrides: list[str]) -> None:
    """Refuse (one line, exit 2) an override of a key that no stage of this job reads; before any model loads."""
    for key in map(override_key, overrides):
        for prefix, reader, reads in READ_ONLY_BY:
            if key.startswith(prefix) if prefix.endswith(".") else (key == prefix or key.startswith(prefix + ".")):
                check(reads(conf), key, f"only {reader} reads it, and this job does not run that (train="
                      f"{conf.train.name}, benchmark={conf.benchmark.name}, task={conf.task}): drop the key or "
                      "choose the option that reads it")
                break


def config_warnings(conf: Config) -> list[str]:
    """Settings that run but do less than they say: each one line, logged at start and kept in results.json."""
    d = conf.decoder
    set_keys = [f"decoder.{k}={getattr(d, k)}" for k in ("top_p", "top_k") if getattr(d, k) != NEUTRAL_SAMPLING[k]]
    if d.temperature == 0 and set_keys:  # refused would break a temperature sweep that includes 0
        return [f"{' and '.join(set_keys)} ignored: decoder.temperature=0 decodes greedily (set decoder.temperature "
                "> 0 to sample with them)"]
    return []
