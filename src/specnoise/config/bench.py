"""``benchmark=``, ``logger=``, ``report``, ``forward_cost`` and ``planner``: what a job measures and where it goes."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from specnoise.config.checks import at_least, check, one_of
from specnoise.config.model import TEMPLATES


@dataclass
class BenchmarkConfig:
    name: str = "none"  # none = no benchmark stage
    path: str | None = None  # local JSON/JSONL (overrides hub)
    hub: str | None = None
    hub_config: str | None = None
    split: str = "test"
    prompt_field: str = "prompt"
    id_field: str | None = None
    category_field: str | None = None
    reference_field: str | None = None
    limit: int | None = None  # first N prompts (after the category filter)
    limit_per_category: int | None = None  # first N prompts of each category (Spec-Bench subsets)
    categories: list[str] = field(default_factory=list)  # keep only these categories (empty: all)
    max_new_tokens: int = 128
    # none | pass_at_1 | gsm8k | rouge | bleu | length | per_category (Spec-Bench: each category its own metric)
    scorer: str = "none"
    template: str | None = None  # override the model's prompt template
    warmup: int = 1  # warm-up generations (first prompt), discarded
    check_lossless: bool = True
    exec_timeout: float = 10.0  # seconds per executed completion (pass_at_1)
    exec_memory_mb: int = 1024  # address-space limit per executed completion (pass_at_1)
    max_prompt_tokens: int | None = None  # None: the model's context minus max_new_tokens; longer: skipped
    threads: int | None = None  # torch intra-op threads while benchmarking (None: torch's default)
    strict_numerics: bool = False  # math-only attention, full-precision reductions for AR and every decoder
    # times each prompt is timed per decoder, interleaved with AR (ABAB / BABA); > 1 gives AR's spread across
    # repeats (ar_time_cv), and every repeat must give the same tokens
    repeats: int = 1
    # which of a prompt's repeats is its time: median (the middle repeat by wall time, the mean of the two middle ones
    # for an even count: a repeat slowed by other jobs on a shared machine does not count, which the mean lets in;
    # on the 2-core CI machine a prompt's repeats of the same work differ by up to 50%), mean, or min (the fastest:
    # the uncontended cost, as timeit advises). Every decoder and AR alike; per_prompt.jsonl keeps each repeat
    repeat_stat: str = "median"
    bootstrap: int = 2000  # paired bootstrap resamples of the prompts for the speedup's 95% CI (seeded by `seed`)
    cost_bound: bool = True  # after timing: each decoder's verify block, and its forwards priced by t(q) (bound.py)
    # prompts decoded together, taken in order in groups of this many (the last group may be smaller); every decoder
    # and the AR baseline decode each group together (Decoder.generate_batch); > 1 also times AR at batch 1 (the
    # `ar_bs1` rows: the lossless reference and `speedup_vs_bs1_ar`)
    batch_size: int = 1
    # batch_size > 1: group prompts of similar length (sorted by their first turn's prompt tokens, ties in dataset
    # order), as serving engines and eval harnesses do; false: groups in dataset order. A batch's cache is a rectangle
    # as long as its longest row, so every row attends over the longest prompt: on 18 Spec-Bench questions (prompts of
    # 30 to 1,500 tokens) batched AR at B = 4 ran at 0.99x AR at batch 1 in dataset order and 1.50x grouped by length.
    # Rows decode independently of their neighbours, so the tokens stay the same; the timing changes
    group_by_length: bool = True
    # continuous batching: groups of this many prompts, each decoded by batch_size rows, a row taking the group's next
    # prompt as soon as its own ends (Decoder.generate_batch's ``slots``), where a lock-step group waits for its slowest
    # row. 0: lock-step groups of batch_size. The dynamic engine and specnoise's decoders only (the generate() peers
    # are skipped)
    queue: int = 0

    def __post_init__(self) -> None:
        check(self.limit is None or self.limit >= 1, "benchmark.limit", f"got {self.limit}, must be >= 1")
        check(self.limit_per_category is None or self.limit_per_category >= 1, "benchmark.limit_per_category",
              f"got {self.limit_per_category}, must be >= 1")
        at_least(self.max_new_tokens, "benchmark.max_new_tokens", 1)
        one_of(self.scorer, "benchmark.scorer",
               ("none", "pass_at_1", "gsm8k", "rouge", "bleu", "length", "per_category"))
        at_least(self.warmup, "benchmark.warmup", 0)
        check(self.exec_timeout > 0, "benchmark.exec_timeout", f"got {self.exec_timeout}, must be > 0")
        at_least(self.exec_memory_mb, "benchmark.exec_memory_mb", 64)
        check(self.max_prompt_tokens is None or self.max_prompt_tokens >= 1, "benchmark.max_prompt_tokens",
              f"got {self.max_prompt_tokens}, must be >= 1")
        check(self.threads is None or self.threads >= 1, "benchmark.threads", f"got {self.threads}, must be >= 1")
        at_least(self.repeats, "benchmark.repeats", 1)
        one_of(self.repeat_stat, "benchmark.repeat_stat", ("median", "mean", "min"))
        at_least(self.bootstrap, "benchmark.bootstrap", 100)
        check(isinstance(self.batch_size, int) and self.batch_size >= 1, "benchmark.batch_size",
              f"got {self.batch_size!r}, must be an integer >= 1 (prompts decoded together; 1: one at a time)")
        check(self.queue == 0 or (self.batch_size > 1 and self.queue > self.batch_size), "benchmark.queue",
              f"got {self.queue} with benchmark.batch_size={self.batch_size}: continuous batching needs "
              "benchmark.batch_size > 1 and benchmark.queue > benchmark.batch_size (0: lock-step groups)")
        check(self.template is None or self.template in TEMPLATES, "benchmark.template",
              f"got {self.template!r}, expected one of {', '.join(TEMPLATES)}")
        check(self.name != "jsonl" or bool(self.path), "benchmark.path",
              "benchmark=jsonl needs benchmark.path=FILE (and benchmark.prompt_field=FIELD)")


# ------------------------------------------------------------------------------------ logging, report
@dataclass
class LoggerConfig:
    name: str = "wandb"  # wandb | none
    project: str = "specnoise"
    entity: str | None = None
    mode: str = "auto"  # auto: online when an API key is configured, else offline | online | offline
    group: str | None = None  # default: the experiment name
    tags: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        one_of(self.name, "logger.name", ("wandb", "none"))
        one_of(self.mode, "logger.mode", ("auto", "online", "offline", "disabled"))


@dataclass
class ReportConfig:
    runs: list[str] = field(default_factory=list)  # run / multirun directories to collect
    out_dir: str | None = None  # default: the Hydra run directory
    x: str | None = None  # swept key to plot metrics against (None: the first numeric swept key; "off": none)
    metrics: list[str] = field(default_factory=lambda: ["speedup", "mean_accepted_tokens", "ref_nll"])  # plotted
    categories: bool = True  # per-category table and plot when a benchmark has categories
    plots: bool = True  # PNG plots (matplotlib, Agg)
    wandb: bool = True  # with logger=wandb: also log the table and plots as one `report` run

    def __post_init__(self) -> None:
        check(bool(self.metrics), "report.metrics", "list at least one metric, e.g. [speedup,mean_accepted_tokens]")


@dataclass
class ForwardCostConfig:
    """task=forward_cost: the cost t(q) of one target forward of q new tokens over a cache of cache_len tokens."""

    arch: str = "model"  # model: the configured model | random: train.arch, random weights | config: config_path
    config_path: str | None = None  # arch=config: a config.json (or its folder), e.g. an 8B model's, random weights
    cache_len: int = 512
    q: list[int] = field(default_factory=lambda: [1, 2, 4, 8, 16, 32, 64, 128])  # t(1) is always measured
    repeats: int = 10  # timed forwards per q (median)
    warmup: int = 3  # untimed rounds first
    threads: int | None = None  # torch intra-op threads (None: torch's default)
    memory_floor: bool = True  # on CUDA: also time a device copy of the weights' bytes (one weights read)
    plot: bool = True  # forward_cost.png

    def __post_init__(self) -> None:
        one_of(self.arch, "forward_cost.arch", ("model", "random", "config"))
        check(self.arch != "config" or bool(self.config_path), "forward_cost.config_path",
              "forward_cost.arch=config needs forward_cost.config_path=/path/to/config.json")
        at_least(self.cache_len, "forward_cost.cache_len", 0)
        check(bool(self.q) and min(self.q) >= 1, "forward_cost.q", f"got {self.q}, list sizes >= 1, e.g. [1,2,4,8]")
        at_least(self.repeats, "forward_cost.repeats", 1)
        at_least(self.warmup, "forward_cost.warmup", 0)
        check(self.threads is None or self.threads >= 1, "forward_cost.threads", f"got {self.threads}, must be >= 1")


@dataclass
class PlannerConfig:
    """The memory planner (planner.py), run before any weight loads."""

    enabled: bool = True
    devices: list[str] = field(default_factory=list)  # plan for these device sizes (e.g. [80GB,80GB]); []: visible
    headroom: float = 0.10  # fraction of each device kept free for activations, logits and the allocator

    def __post_init__(self) -> None:
        check(0.0 <= self.headroom < 1.0, "planner.headroom", f"got {self.headroom}, use [0, 1)")
        for size in self.devices:
            check(re.fullmatch(r"\s*[0-9.]+\s*([kmgt]i?b|b)?\s*", str(size), re.I) is not None, "planner.devices[]",
                  f"got {size!r}, write sizes like 80GB, 79GiB or 512MB")
