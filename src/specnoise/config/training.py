"""``train=`` and ``data=``: the training stages (SFT, MSN's noisy SFT, pre-training, CLLM, Jacobi Forcing) and
their data."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from specnoise.config.checks import MISSING, at_least, check, one_of


@dataclass
class NoiseConfig:
    length: int = 4  # tokens per noisy segment (paper: 4)
    content: str = "ahead"  # ahead: copy of an earlier token of the sequence; random: uniform over vocab
    location: str = "random"  # random start in the response; ppl: the lowest-loss segment (paper App. A)
    segments: int = 1  # noisy segments per sample (paper: 1)
    # A response of <= `length` tokens (before its EOS) is too short for the segment: skip noise for it (the paper,
    # docs/algorithms.md §2) or shrink the segment to fit. Training stops before it starts when the full segment fits
    # fewer than half of the responses (training/preflight.py).
    short_response: str = "skip"

    def __post_init__(self) -> None:
        at_least(self.length, "train.noise.length", 1)
        one_of(self.content, "train.noise.content", ("ahead", "random"))
        one_of(self.location, "train.noise.location", ("random", "ppl"))
        at_least(self.segments, "train.noise.segments", 1)
        one_of(self.short_response, "train.noise.short_response", ("shrink", "skip"))


@dataclass
class ArchConfig:
    """Architecture of a model trained from scratch (train=pretrain); any transformers config type."""

    model_type: str = "llama"
    vocab_size: int = 4096
    hidden_size: int = 256
    intermediate_size: int = 768
    num_hidden_layers: int = 6
    num_attention_heads: int = 8
    num_key_value_heads: int = 4
    max_position_embeddings: int = 1024
    tie_word_embeddings: bool = True


@dataclass
class TrajectoryConfig:
    """Jacobi trajectories collected on the model being trained (training/trajectories.py), shared by the
    consistency stages: per prompt, ``block``-token blocks Jacobi-iterated (greedy, KV cached) to their fixed
    point, every intermediate state kept."""

    block: int = 16  # tokens per Jacobi block (CLLM: n = 16)
    max_new_tokens: int = 128  # per prompt, in whole blocks (CLLM: max_new_seq_len 512)
    prompts: int | None = None  # training prompts to collect on, the first N of the training split (None: all)
    cache_dir: str = "outputs/trajectories"  # keyed by model + prompts + settings: a rerun reuses, a resume continues
    trajectories: str | None = None  # an explicit trajectory file (.jsonl) instead of the keyed cache
    repeat_ngram: int = 10  # an output in which one repeat_ngram-gram occurs repeat_count times is dropped
    repeat_count: int = 3
    ar_weight: float = 10.0  # loss = ar_weight * AR cross-entropy + consistency (CLLM: 10)
    label_smoothing: float = 0.1  # on the AR cross-entropy (CLLM: 0.1)
    seed: int = 0  # initial block states (random prompt tokens, as CLLM)

    def __post_init__(self) -> None:
        key = f"train.{self.key}"
        check(self.block > 1, f"{key}.block", f"got {self.block}: a Jacobi block needs at least 2 tokens (one "
              "token per step is plain AR decoding, nothing to make consistent); use 16 as CLLM")
        check(self.max_new_tokens >= self.block, f"{key}.max_new_tokens",
              f"got {self.max_new_tokens} < block {self.block}: collect at least one block")
        check(self.prompts is None or self.prompts >= 1, f"{key}.prompts", f"got {self.prompts}, use null or >= 1")
        at_least(self.repeat_ngram, f"{key}.repeat_ngram", 1)
        at_least(self.repeat_count, f"{key}.repeat_count", 2)
        at_least(self.ar_weight, f"{key}.ar_weight", 0.0)
        check(0.0 <= self.label_smoothing < 1.0, f"{key}.label_smoothing", f"got {self.label_smoothing}, use [0, 1)")

    key: ClassVar[str] = "trajectory"


@dataclass
class CLLMConfig(TrajectoryConfig):
    key: ClassVar[str] = "cllm"
    ar_labels: str = "fixed_point"  # fixed_point: the model's own collected output | gold: the data's response
    consistency: str = "global"  # global: state -> fixed point (released code) | local: state -> next state (paper)

    def __post_init__(self) -> None:
        super().__post_init__()
        one_of(self.ar_labels, "train.cllm.ar_labels", ("fixed_point", "gold"))
        one_of(self.consistency, "train.cllm.consistency", ("global", "local"))


@dataclass
class JacobiForcingConfig(TrajectoryConfig):
    key: ClassVar[str] = "jacobi_forcing"
    min_noisy_ratio: float = 0.0  # unconverged fraction of the first block of a window
    max_noisy_ratio: float = 1.0  # ... rising linearly to this at the window's last block
    window: int = 0  # blocks over which the ratio rises (then it starts again); 0: all blocks of a sample

    def __post_init__(self) -> None:
        super().__post_init__()
        check(0.0 <= self.min_noisy_ratio <= self.max_noisy_ratio <= 1.0, "train.jacobi_forcing.min_noisy_ratio",
              f"got min {self.min_noisy_ratio}, max {self.max_noisy_ratio}: need 0 <= min <= max <= 1")
        at_least(self.window, "train.jacobi_forcing.window", 0)


@dataclass
class TrainConfig:
    name: str = "none"  # none | sft | msn | pretrain | cllm | jacobi_forcing
    output_dir: str = "model"  # relative to the Hydra run directory
    max_steps: int = -1  # > 0 overrides epochs
    epochs: float = 1.0
    learning_rate: float = 2e-4
    lr_scheduler: str = "cosine"
    warmup_ratio: float = 0.03
    weight_decay: float = 0.0
    per_device_batch_size: int = 8
    gradient_accumulation_steps: int = 1
    max_seq_len: int = 512
    truncation: str = "right"  # over-long samples are cut at max_seq_len ("right") or raise ("error")
    bf16: bool = False
    seed: int = 42
    save_steps: int = 500
    save_total_limit: int = 2
    logging_steps: int = 10
    eval_samples: int = 64  # held-out samples for the reported held-out loss
    resume: bool = False
    cache_dir: str | None = None  # jobs of the same training share one model (training/reuse.py); null = each trains
    gradient_checkpointing: bool = False
    noise: NoiseConfig = field(default_factory=NoiseConfig)
    arch: ArchConfig = field(default_factory=ArchConfig)  # only train=pretrain
    tokenizer_path: str | None = None  # train=pretrain: reuse this tokenizer instead of training one
    num_workers: int = 0
    save_dtype: str = "float32"  # dtype of the saved final model (bfloat16 halves the files of shipped models)
    max_minutes: float | None = None  # time budget: stop then, warmup + cosine over wall-clock time (see trainer)
    cllm: CLLMConfig = field(default_factory=CLLMConfig)  # only train=cllm
    jacobi_forcing: JacobiForcingConfig = field(default_factory=JacobiForcingConfig)  # only train=jacobi_forcing

    def __post_init__(self) -> None:
        one_of(self.name, "train.name", ("none", "sft", "msn", "pretrain", "cllm", "jacobi_forcing"))
        one_of(self.save_dtype, "train.save_dtype", ("float32", "bfloat16", "float16"))
        check(self.max_minutes is None or self.max_minutes > 0, "train.max_minutes",
              f"got {self.max_minutes}, use null or > 0")
        check(self.max_steps == -1 or self.max_steps > 0, "train.max_steps", f"got {self.max_steps}, use -1 or > 0")
        check(self.epochs > 0, "train.epochs", f"got {self.epochs}, must be > 0")
        check(self.learning_rate > 0, "train.learning_rate", f"got {self.learning_rate}, must be > 0")
        at_least(self.per_device_batch_size, "train.per_device_batch_size", 1)
        at_least(self.gradient_accumulation_steps, "train.gradient_accumulation_steps", 1)
        at_least(self.max_seq_len, "train.max_seq_len", 8)
        one_of(self.truncation, "train.truncation", ("right", "error"))
        at_least(self.save_steps, "train.save_steps", 1)
        at_least(self.eval_samples, "train.eval_samples", 0)


@dataclass
class DataConfig:
    name: str = MISSING
    format: str = "alpaca"  # alpaca (instruction/input/output) | text (pretraining corpus) | python_source
    path: str | None = None  # local .json / .jsonl file (or folder for python_source)
    hub: str | None = None  # datasets hub name, used when path is None
    split: str = "train"
    instruction_field: str = "instruction"
    input_field: str = "input"
    output_field: str = "output"  # "response" is accepted as a fallback
    text_field: str = "text"
    conversation_field: str = "conversations"  # LIMA-style rows: alternating user / assistant turns
    max_samples: int | None = None
    # python_source: packages whose installed .py files form the corpus (plus the standard library)
    packages: list[str] = field(default_factory=list)
    include_stdlib: bool = True
    max_chars: int | None = None

    def __post_init__(self) -> None:
        one_of(self.format, "data.format", ("alpaca", "text", "python_source"))
        check(self.format == "python_source" or bool(self.path or self.hub), "data.path",
              "give a local file (data.path=FILE) or a hub dataset (data.hub=NAME)")
