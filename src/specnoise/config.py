"""Structured configs: one plain dataclass per config-group option.

Nothing here imports Hydra or OmegaConf, so every layer (the decoding core included) can take these objects;
``conf_store.register`` hands them to Hydra's ConfigStore, and only the entry point calls it. Types are checked by
OmegaConf while Hydra composes; ranges are checked in ``__post_init__``, which runs when ``__main__`` turns the
composed config into these objects (``OmegaConf.to_object``). Every check raises :class:`ConfigError` naming the
full key and what is allowed, so a bad command line fails at start-up with one readable line instead of a stack
trace deep inside a stage.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from specnoise.errors import ConfigError, UserError  # noqa: F401  (re-exported: the layers above import them here)
from specnoise.tree_templates import TEMPLATES as TREE_TEMPLATES

MISSING = "???"  # OmegaConf's marker of a value that must be given (omegaconf.MISSING), without importing it
PACKAGE_DIR = Path(__file__).resolve().parent
ASSETS_DIR = PACKAGE_DIR / "assets"


def check(ok: bool, key: str, message: str) -> None:
    if not ok:
        raise ConfigError(f"{key}: {message}")


def one_of(value: Any, key: str, allowed: tuple) -> None:
    check(value in allowed, key, f"got {value!r}, expected one of {', '.join(map(str, allowed))}")


def at_least(value: float, key: str, low: float) -> None:
    check(value >= low, key, f"got {value}, must be >= {low}")


def config_dir() -> Path:
    """Where the YAML configs live: inside the installed package, or at the repository root."""
    for candidate in (PACKAGE_DIR / "conf", PACKAGE_DIR.parent.parent / "conf"):
        if (candidate / "config.yaml").is_file():
            return candidate
    raise FileNotFoundError("specnoise configs not found (expected conf/config.yaml next to the package)")


# block sizes the static engine pads to (one compiled graph each); 72 fits TR-Jacobi's 69-token tree step
STATIC_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 72, 128)
DTYPES = ("float32", "float16", "bfloat16", "auto")
DEVICES = ("auto", "cpu", "cuda")
DEVICE_MAPS = ("auto", "balanced", "balanced_low_0", "sequential")  # accelerate's strategies
ATTN = ("sdpa", "sdpa_gqa", "eager")  # sdpa_gqa: SDPA without repeat_kv's cache copies (attention.py)
SDPA_BACKENDS = ("flash", "efficient", "math", "cudnn")
TEMPLATES = ("raw", "chat", "alpaca", "vicuna", "llama2-chat", "deepseek-coder", "code-instruct")


def check_corpus(path: str | None, key: str = "decoder.corpus") -> None:
    """Fail at config time, before any model loads, on a corpus that is not there or is empty."""
    if path is None:
        return
    file = Path(path)
    if not file.is_file():
        raise ConfigError(f"{key}: {path} does not exist: give a JSON/JSONL text file or a .npy of token ids")
    if file.stat().st_size == 0:
        raise ConfigError(f"{key}: {path} is empty: give a corpus with at least one text row")



# --------------------------------------------------------------------------------------------- models
@dataclass
class ModelConfig:
    name: str = MISSING
    path: str | None = MISSING  # hub id or local folder; None only for draft=none
    dtype: str = "float32"
    device: str = "auto"
    attn_implementation: str = "sdpa_gqa"  # transformers' sdpa without its per-head copy of the KV cache (attention.py)
    template: str = "raw"  # prompt template (data/templates.py); "chat" = tokenizer.apply_chat_template
    revision: str | None = None
    trust_remote_code: bool = False
    # SDPA kernels allowed (numerics.py); math is always the fallback; [] = torch's own choice
    sdpa_backends: list[str] = field(default_factory=lambda: ["flash", "efficient", "math"])
    static_cache: Any = "auto"  # true | false | auto (= when compiling): decoders' static-cache engine
    compile: bool = False  # torch.compile the static engine's fixed-shape forwards (CUDA graphs on CUDA)
    static_buckets: list[int] = field(default_factory=lambda: list(STATIC_BUCKETS))
    # more than one device (README "Beyond one device"): accelerate's dispatch of the weights over the devices,
    # auto | balanced | balanced_low_0 | sequential | {module: device}; null = all on `device`
    device_map: Any = None
    max_memory: Any = None  # {device: size} caps for device_map, e.g. {0: 20GiB, cpu: 60GiB}
    offload_folder: str | None = None  # device_map's disk offload of what fits no device
    tp_plan: str | None = None  # auto: transformers' tensor parallel over the torchrun processes

    def __post_init__(self) -> None:
        self._check("model")

    def _check(self, key: str) -> None:
        one_of(self.dtype, f"{key}.dtype", DTYPES)
        one_of(self.device, f"{key}.device", DEVICES)
        one_of(self.attn_implementation, f"{key}.attn_implementation", ATTN)
        one_of(self.template, f"{key}.template", TEMPLATES)
        for backend in self.sdpa_backends:
            one_of(backend, f"{key}.sdpa_backends[]", SDPA_BACKENDS)
        one_of(self.static_cache, f"{key}.static_cache", (True, False, "auto"))
        check(bool(self.static_buckets) and min(self.static_buckets) >= 1, f"{key}.static_buckets",
              f"got {self.static_buckets}, list block sizes >= 1, e.g. [1,8,16,72]")
        check(not (self.compile and self.static_cache is False), f"{key}.compile",
              f"compiling needs fixed shapes: set {key}.static_cache=true (or auto), or {key}.compile=false")
        check(self.device_map is None or isinstance(self.device_map, dict) or self.device_map in DEVICE_MAPS,
              f"{key}.device_map", f"got {self.device_map!r}, expected null, one of {', '.join(DEVICE_MAPS)} or a "
              "{module: device} map")
        check(self.max_memory is None or (isinstance(self.max_memory, dict) and self.device_map is not None),
              f"{key}.max_memory", f"got {self.max_memory!r}: a {{device: size}} map, used with {key}.device_map")
        check(self.offload_folder is None or self.device_map is not None, f"{key}.offload_folder",
              f"disk offload is part of a device map: set {key}.device_map=auto too")
        one_of(self.tp_plan, f"{key}.tp_plan", (None, "auto"))
        check(not (self.tp_plan and self.device_map is not None), f"{key}.tp_plan",
              f"tensor parallel and a device map exclude each other: set {key}.device_map=null or {key}.tp_plan=null")


@dataclass
class DraftConfig(ModelConfig):
    name: str = "none"
    path: str | None = None

    def __post_init__(self) -> None:
        self._check("draft")
        check(self.name == "none" or bool(self.path), "draft.path", "a draft model needs a hub id or a local path")


# ------------------------------------------------------------------------------------------- training
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


# ------------------------------------------------------------------------------------------- decoders
@dataclass
class DecoderConfig:
    # whether the decoder samples at temperature > 0 (the one place this is said): every drafter does, through the
    # verifier; a greedy-only decoder (the generate() peers) keeps the sampling keys below neutral
    samples: ClassVar[bool] = True

    name: str = MISSING
    # benchmark jobs use benchmark.max_new_tokens (this key may repeat it, but not differ: Config checks);
    # without a benchmark this is the budget for `prompt` (None: benchmark.max_new_tokens)
    max_new_tokens: int | None = None
    temperature: float = 0.0  # 0 = greedy
    top_p: float = 1.0
    top_k: int = 0
    seed: int = 0  # seeds noise initialisation and sampling
    # hardware-aware drafting (decoding/auto.py): size every step's proposal from the measured forward cost and the
    # drafter's running acceptance (0: a plain AR step); False keeps the faithful fixed sizes. AR and the generate()
    # peers have nothing to size (a no-op there, so one override flips a whole sweep)
    auto: bool = False
    # decoder.auto's forward-cost timings: a folder of one file per machine + model + settings, or one .json file used
    # whatever the machine (a pinned curve: reproducible choices); None: probe every run
    cost_cache: str | None = "outputs/cost_cache"

    def __post_init__(self) -> None:
        check(self.max_new_tokens is None or self.max_new_tokens >= 1, "decoder.max_new_tokens",
              f"got {self.max_new_tokens}, must be >= 1")
        at_least(self.temperature, "decoder.temperature", 0.0)
        check(0.0 < self.top_p <= 1.0, "decoder.top_p", f"got {self.top_p}, must be in (0, 1]")
        at_least(self.top_k, "decoder.top_k", 0)
        if not self.samples:  # a greedy-only decoder would silently ignore these
            for key, neutral in NEUTRAL_SAMPLING.items():
                check(getattr(self, key) == neutral, f"decoder.{key}",
                      f"decoder={self.name} is greedy-only, so {key}={getattr(self, key)} would be ignored: use "
                      f"{key}={neutral}, or a decoder that samples ({', '.join(sampling_decoders())})")

    @property
    def sampling_keys_set(self) -> bool:
        """Any sampling key off its neutral value (with temperature 0 AR still decodes greedily)."""
        return any(getattr(self, key) != neutral for key, neutral in NEUTRAL_SAMPLING.items())


NEUTRAL_SAMPLING = {"temperature": 0.0, "top_p": 1.0, "top_k": 0}  # the values under which decoding is greedy


# a ``decoders`` entry NAME+auto: decoder NAME with decoder.auto=true, timed in the same job as the others (beside NAME
# itself, faithful): comparing two jobs compares their AR baselines too, which moved 6-8% between the faithful and the
# auto job of a GPU lease (experiments/gpu/h100/checks2)
AUTO_VARIANT = "+auto"


def decoder_entry(entry: str) -> tuple[str, bool]:
    """A ``decoders`` entry's decoder name, and whether it is the ``NAME+auto`` variant."""
    name = entry.removesuffix(AUTO_VARIANT)
    return name, name != entry


def sampling_decoders() -> list[str]:
    return [name for name, schema in DECODER_SCHEMAS.items() if schema.samples]


@dataclass
class ARConfig(DecoderConfig):
    name: str = "ar"


@dataclass
class JacobiConfig(DecoderConfig):
    name: str = "jacobi"
    draft_len: int = 4  # noise slots verified per step (MSN: = training noise length)

    def __post_init__(self) -> None:
        super().__post_init__()
        at_least(self.draft_len, "decoder.draft_len", 1)


@dataclass
class TRJacobiConfig(DecoderConfig):
    name: str = "tr_jacobi"
    tree: str = "mc_sim_7b_63"  # template name in decoding/trees.py
    topk: int = 10  # Jacobi candidates per depth
    retrieval: bool = True  # False = the paper's "w/o R" ablation
    retrieval_len: int = 5
    retrieval_ngram: int = 3
    faithful: bool = False  # reproduce MSN-R's speed-relevant quirks (never its lossy ones)
    calibrate: int = 1  # tree=auto: generations on the full tree before picking a sub-tree (then re-picked after each)

    def __post_init__(self) -> None:
        super().__post_init__()
        one_of(self.tree, "decoder.tree", (*TREE_TEMPLATES, "auto"))
        check(not (self.auto and self.tree == "auto"), "decoder.tree",
              "tree=auto picks one sub-tree per generation, decoder.auto=true sizes every step: set decoder.tree to a "
              "template (auto cuts its node list) or decoder.auto=false")
        at_least(self.calibrate, "decoder.calibrate", 1)
        at_least(self.topk, "decoder.topk", 1)
        at_least(self.retrieval_len, "decoder.retrieval_len", 1)
        at_least(self.retrieval_ngram, "decoder.retrieval_ngram", 1)


@dataclass
class PLDConfig(DecoderConfig):
    name: str = "pld"
    max_ngram_size: int = 3
    num_pred_tokens: int = 10

    def __post_init__(self) -> None:
        super().__post_init__()
        at_least(self.max_ngram_size, "decoder.max_ngram_size", 1)
        at_least(self.num_pred_tokens, "decoder.num_pred_tokens", 1)


@dataclass
class LookaheadConfig(DecoderConfig):
    name: str = "lookahead"
    W: int = 7  # window
    N: int = 5  # n-gram size including the key
    G: int = 7  # n-grams kept per key and verified per step
    faithful: bool = False  # LADE: a fully matched n-gram drops its bonus token

    def __post_init__(self) -> None:
        super().__post_init__()
        at_least(self.W, "decoder.W", 1)
        at_least(self.N, "decoder.N", 2)
        at_least(self.G, "decoder.G", 0)


@dataclass
class TokenRecyclingConfig(DecoderConfig):
    name: str = "token_recycling"
    tree: str = "mc_sim_7b_63"  # static tree template in decoding/trees.py, drafted by BFS over the matrix
    topk: int = 10  # candidates kept per token (the adjacency matrix's columns; the template's ranks must fit)
    reuse_history: bool = True  # keep the matrix across prompts (reset after the benchmark warm-up)

    def __post_init__(self) -> None:
        super().__post_init__()
        one_of(self.tree, "decoder.tree", tuple(TREE_TEMPLATES))
        at_least(self.topk, "decoder.topk", 1)
        widest = 1 + max(c for node in TREE_TEMPLATES[self.tree] for c in node)
        check(self.topk >= widest, "decoder.topk", f"got {self.topk}: tree {self.tree} uses candidate ranks up to "
                                                   f"{widest - 1}, set decoder.topk >= {widest} or a smaller tree")


SHIPPED_CORPUS = str(ASSETS_DIR / "data" / "codegen-instruct.json")  # the shipped SFT data (conf/data/codegen-instruct)


@dataclass
class SAMConfig(TokenRecyclingConfig):
    """SAM-Decoding; ``tree`` / ``topk`` / ``reuse_history`` are its Token Recycling fallback's."""

    name: str = "sam"
    corpus: str | None = None  # JSON/JSONL text (or .npy token ids) for the static automaton; None: dynamic only
    cache_dir: str = "outputs/corpus_cache"  # tokenized corpora and suffix arrays (relative: to the working dir)
    max_draft: int = 10  # tokens drafted after the longest match
    min_match: int = 2  # shorter matches draft with the fallback instead
    fallback: str = "token_recycling"  # token_recycling | none (a plain AR step)

    def __post_init__(self) -> None:
        super().__post_init__()
        check_corpus(self.corpus)
        at_least(self.max_draft, "decoder.max_draft", 1)
        at_least(self.min_match, "decoder.min_match", 1)
        one_of(self.fallback, "decoder.fallback", ("token_recycling", "none"))


@dataclass
class RESTConfig(DecoderConfig):
    name: str = "rest"
    corpus: str = SHIPPED_CORPUS  # JSON/JSONL text (or .npy token ids): the datastore
    cache_dir: str = "outputs/corpus_cache"  # tokenized corpora and suffix arrays (relative: to the working dir)
    max_suffix: int = 16  # longest context suffix looked up (the longest that occurs is used)
    min_suffix: int = 2  # a shorter match drafts nothing
    num_draft: int = 64  # trie nodes verified per step (the most frequent continuation prefixes)
    max_depth: int = 8  # tokens per retrieved continuation
    matches: int = 500  # occurrences whose continuations build the trie (spread over all of them)

    def __post_init__(self) -> None:
        super().__post_init__()
        check_corpus(self.corpus)
        at_least(self.min_suffix, "decoder.min_suffix", 1)
        check(self.max_suffix >= self.min_suffix, "decoder.max_suffix",
              f"got {self.max_suffix}, must be >= decoder.min_suffix={self.min_suffix}")
        for key in ("num_draft", "max_depth", "matches"):
            at_least(getattr(self, key), f"decoder.{key}", 1)


@dataclass
class SpeculativeConfig(DecoderConfig):
    name: str = "speculative"
    gamma: int = 5
    schedule: str = "constant"  # constant | heuristic (+2 on full acceptance, -1 otherwise, floor 1)

    def __post_init__(self) -> None:
        super().__post_init__()
        at_least(self.gamma, "decoder.gamma", 1)
        one_of(self.schedule, "decoder.schedule", ("constant", "heuristic"))


@dataclass
class OuroborosConfig(DecoderConfig):
    name: str = "ouroboros"
    gamma: int = 6  # draft tokens per target step (paper: γ)
    W: int = 15  # lookahead window of the draft model (= phrase pool capacity per key; paper: W = G)
    # phrase body length M: tokens a phrase adds. The draft's lookahead n-gram size is N = M + 1 (OUR-R's
    # lookahead_level) and the paper's β is N + 1 = M + 2 (docs/algorithms.md §9.1): paper β 8 -> phrase_len 6
    phrase_len: int = 4
    beta: int | None = None  # renamed phrase_len (a different quantity from the paper's β); setting it is an error
    K: int = 3  # phrases that lengthen a draft
    phrase_drafting: bool = True  # ablation: False = plain token-by-token drafting
    lengthening: bool = True  # ablation: False = no phrase candidates after the draft
    harvest: str = "paper"  # paper | specbench | none (ablation: no harvest from verification)
    reuse_history: bool = True  # keep the phrase pool across prompts
    faithful: bool = False  # OUR-R: a fully matched phrase drops its bonus token
    # under sampling (temperature > 0): draft tokens sampled from the draft model and kept by rejection sampling, as
    # speculative decoding does (pool phrases stay deterministic guesses); False = greedy drafts verified by matching
    # the target's draws. Both are exact; no effect when greedy
    sampled_drafts: bool = False

    def __post_init__(self) -> None:
        super().__post_init__()
        at_least(self.gamma, "decoder.gamma", 1)
        at_least(self.W, "decoder.W", 1)
        check(self.beta is None, "decoder.beta", "renamed decoder.phrase_len (the phrase body length M = paper β - 2): "
                                                 f"set decoder.phrase_len={self.beta} for what beta meant before")
        at_least(self.phrase_len, "decoder.phrase_len", 1)
        at_least(self.K, "decoder.K", 0)
        one_of(self.harvest, "decoder.harvest", ("paper", "specbench", "none"))


@dataclass
class HFGreedyConfig(DecoderConfig):
    samples: ClassVar[bool] = False  # the peers run generate() greedily
    name: str = "hf_greedy"


@dataclass
class HFStaticConfig(DecoderConfig):
    samples: ClassVar[bool] = False  # the peers run generate() greedily
    name: str = "hf_static"  # generate() greedy with a static cache (compiled on CUDA): the fastest stock AR


@dataclass
class HFPLDConfig(DecoderConfig):
    samples: ClassVar[bool] = False  # the peers run generate() greedily
    name: str = "hf_pld"
    prompt_lookup_num_tokens: int = 10
    max_matching_ngram_size: int = 3

    def __post_init__(self) -> None:
        super().__post_init__()
        at_least(self.prompt_lookup_num_tokens, "decoder.prompt_lookup_num_tokens", 1)
        at_least(self.max_matching_ngram_size, "decoder.max_matching_ngram_size", 1)


@dataclass
class HFAssistedConfig(DecoderConfig):
    samples: ClassVar[bool] = False  # the peers run generate() greedily
    name: str = "hf_assisted"
    num_assistant_tokens: int = 5
    schedule: str = "constant"

    def __post_init__(self) -> None:
        super().__post_init__()
        at_least(self.num_assistant_tokens, "decoder.num_assistant_tokens", 1)
        one_of(self.schedule, "decoder.schedule", ("constant", "heuristic"))


DECODER_SCHEMAS: dict[str, type[DecoderConfig]] = {
    c.name: c  # the class default: no instance, whose checks may import modules that import this one
    for c in (ARConfig, JacobiConfig, TRJacobiConfig, PLDConfig, LookaheadConfig, TokenRecyclingConfig, SAMConfig,
              RESTConfig, SpeculativeConfig, OuroborosConfig, HFGreedyConfig, HFPLDConfig, HFAssistedConfig,
              HFStaticConfig)
}


# ----------------------------------------------------------------------------------------- benchmarks
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
