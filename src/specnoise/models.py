"""Load a target or draft model by hub id or local path, the same way for shipped tiny models and 8B ones."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

import specnoise.attention  # noqa: F401  (registers attn_implementation=sdpa_gqa)
from specnoise.config import ModelConfig, UserError
from specnoise.numerics import use_numerics

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def use_static_cache(setting, compile: bool, device: torch.device) -> bool:
    """``model.static_cache``: true | false | auto = only when the forward is compiled. Measured on the H100 (bf16,
    experiments/gpu/h100): the static cache pays off compiled (AR 1695 vs 250 tokens/s eager), not eager, where its
    whole-length masks cost more than the dynamic cache's growing ones."""
    return setting is True or (setting == "auto" and compile)


def context_length(config) -> int:
    """Positions a model can take, from its config (the one place that reads it); unbounded without a limit.

    A sliding-window model (Mistral v0.1, Gemma 2/3, OLMo 3, ...) attends to its last ``window`` tokens only. Both
    engines keep a dense cache, which is exact while prompt + new tokens stay inside the window (the model's own
    rolling cache could not be cropped or compacted): so the window is the context here, and a longer prompt or
    budget is refused with these numbers, or skipped by a benchmark like any over-long prompt."""
    limit = 1 << 30
    for key in ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length"):
        value = getattr(config, key, None)
        if isinstance(value, int) and value > 0:
            limit = value
            break
    return min(limit, sliding_window(config) or limit)


def sliding_window(config) -> int | None:
    """The window of a model whose layers (some or all) attend to the last ``window`` tokens only; None when none do
    (Qwen2's ``use_sliding_window=false``, ``layer_types`` without sliding layers)."""
    text = config.get_text_config()
    window = getattr(text, "sliding_window", None)
    if not window or getattr(text, "use_sliding_window", True) is False:
        return None
    types = getattr(text, "layer_types", None)
    return window if types is None or "sliding_attention" in types else None


# Layers whose state is a recurrence (Mamba, linear attention, convolutions), not a KV cache: nothing the verifier can
# crop back to the accepted tokens, and no 4D mask to verify a tree with.
RECURRENT_LAYERS = ("linear_attention", "mamba", "conv", "hybrid", "recurrent", "rwkv")
RECURRENT_TYPES = ("mamba", "mamba2", "falcon_mamba", "rwkv", "recurrent_gemma", "xlstm")


def check_architecture(config, name: str) -> None:
    """Refuse, before loading, a model whose layers cannot take an additive 4D tree mask over a croppable KV cache
    (what every decoder's verifier step needs)."""
    text = config.get_text_config()
    types = set(getattr(text, "layer_types", None) or ())
    recurrent = sorted(t for t in types if any(word in t for word in RECURRENT_LAYERS))
    if recurrent or text.model_type in RECURRENT_TYPES:
        what = f"layers of type {', '.join(recurrent)}" if recurrent else f"a {text.model_type} architecture"
        raise UserError(f"model {name} ({text.model_type}) has {what}: a recurrent state, not a KV cache, so it "
                        "cannot verify a tree of guesses under a 4D attention mask nor drop rejected tokens; use an "
                        "attention-only model")


def execution_device(model: torch.nn.Module) -> torch.device:
    """Where a model takes its inputs (and, through accelerate's io_same_device hook, returns its logits): for a model
    dispatched by a device map, accelerate's main device (the first one that is neither ``cpu`` nor ``disk``, else the
    CPU); else its parameters' device. Every tensor a decoder creates lives here, never on a hard-coded device."""
    mapping = getattr(model, "hf_device_map", None)
    if mapping and (len(set(mapping.values())) > 1 or "disk" in mapping.values()):  # accelerate hooks it
        devices = set(mapping.values()) - {"cpu", "disk"}
        return torch.device(list(devices)[0]) if devices else torch.device("cpu")  # accelerate's own choice
    return next(model.parameters()).device


@dataclass
class LoadedModel:
    name: str
    path: str
    model: PreTrainedModel
    tokenizer: PreTrainedTokenizerBase
    eos_ids: frozenset[int]  # union of the tokenizer's and the generation config's EOS ids
    template: str
    static_cache: bool = False  # decoders run on the static-cache engine (decoding/static_kv.py)
    compile: bool = False  # ... with its fixed-shape forwards compiled
    buckets: tuple[int, ...] = ()  # ... padding blocks to these sizes (model.static_buckets)
    engines: dict = field(default_factory=dict, repr=False, compare=False)  # role -> engine (decoding.engines)

    @property
    def device(self) -> torch.device:
        return execution_device(self.model)

    @property
    def max_length(self) -> int:
        return context_length(self.model.config)


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise UserError("model.device=cuda but no CUDA device is visible: use model.device=cpu or auto")
    return torch.device(name)


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    if name == "auto":
        if device.type == "cuda":
            return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
        return torch.float32
    return DTYPES[name]


def is_local(path: str) -> bool:
    return path.startswith(("/", "./", "../", "~")) or Path(path).expanduser().exists()


def eos_set(tokenizer, model) -> frozenset[int]:
    ids: set[int] = set()
    for source in (tokenizer.eos_token_id, getattr(model.generation_config, "eos_token_id", None)):
        if isinstance(source, int):
            ids.add(source)
        elif source:
            ids.update(int(t) for t in source)
    return frozenset(ids)


def check_local(cfg: ModelConfig, path: str, role: str) -> None:
    """A local path must hold a saved model: say so before anything treats it as a hub id."""
    if is_local(path):
        folder = Path(path).expanduser()
        if not (folder / "config.json").is_file():
            raise UserError(
                f"{role}={cfg.name}: no model at {folder} (expected a save_pretrained folder with config.json); "
                f"set {role}.path=/path/to/model"
            )


def load_tokenizer(cfg: ModelConfig, path: str | None = None, role: str = "model") -> PreTrainedTokenizerBase:
    """The tokenizer alone: seconds, where the weights may take minutes (training checks its data first)."""
    path = str(path or cfg.path)
    check_local(cfg, path, role)
    try:
        return AutoTokenizer.from_pretrained(path, revision=cfg.revision, trust_remote_code=cfg.trust_remote_code)
    except OSError as err:
        raise unreachable(cfg, path, role, err) from err


def unreachable(cfg: ModelConfig, path: str, role: str, err: OSError) -> UserError:
    return UserError(
        f"{role}={cfg.name}: could not load {path!r} ({err.__class__.__name__}: {str(err).splitlines()[0]}). "
        f"Without network access download it elsewhere and set {role}.path=/local/copy"
    )


def load_model(cfg: ModelConfig, path: str | None = None, role: str = "model") -> LoadedModel:
    """Load ``path`` (default ``cfg.path``); errors say what was looked for and how to point elsewhere."""
    path = str(path or cfg.path)
    tokenizer = load_tokenizer(cfg, path, role)
    device = resolve_device(cfg.device)
    static = use_static_cache(cfg.static_cache, cfg.compile, device)
    config = model_config(cfg, path)  # what config.json alone refutes, before the weights load
    check_architecture(config, cfg.name)
    if static and (cfg.device_map is not None or cfg.tp_plan or sliding_window(config)):
        why = ("runs on one device only" if cfg.device_map is not None or cfg.tp_plan else
               f"would give {cfg.name}'s sliding-window layers transformers' rolling cache (window "
               f"{sliding_window(config)}), which it cannot crop")
        raise UserError(f"{role}.static_cache: the static engine {why}; use the dynamic engine ({role}.static_cache="
                        f"false, {role}.compile=false)")
    try:
        model = AutoModelForCausalLM.from_pretrained(
            path,
            revision=cfg.revision,
            dtype=resolve_dtype(cfg.dtype, device),
            attn_implementation=cfg.attn_implementation,
            trust_remote_code=cfg.trust_remote_code,
            **placement(cfg),
        )
    except OSError as err:
        raise unreachable(cfg, path, role, err) from err
    if cfg.device_map is None and not cfg.tp_plan:
        model.to(device)
    model.eval()
    use_numerics(model, backends=cfg.sdpa_backends)
    return LoadedModel(cfg.name, path, model, tokenizer, eos_set(tokenizer, model), cfg.template,
                       static_cache=static, compile=cfg.compile, buckets=tuple(cfg.static_buckets))


def placement(cfg: ModelConfig) -> dict:
    """from_pretrained's placement arguments: accelerate's dispatch for a device map (``max_memory`` caps per device,
    disk offload into ``offload_folder``), transformers' tensor parallel over the torchrun processes for ``tp_plan``."""
    if cfg.device_map is not None:
        memory = {int(k) if str(k).isdigit() else str(k): str(v) for k, v in (cfg.max_memory or {}).items()}
        return {"device_map": dict(cfg.device_map) if isinstance(cfg.device_map, dict) else cfg.device_map,
                "max_memory": memory or None, "offload_folder": cfg.offload_folder}
    if cfg.tp_plan:
        try:
            from transformers.distributed import DistributedConfig
        except ImportError:  # transformers before DistributedConfig took the plan directly
            return {"tp_plan": cfg.tp_plan}
        return {"distributed_config": DistributedConfig(tp_plan=cfg.tp_plan)}
    return {}


def model_config(cfg: ModelConfig, path: str | None = None):
    """The model's transformers config alone (seconds, where the weights may take minutes)."""
    from transformers import AutoConfig

    path = str(path or cfg.path)
    check_local(cfg, path, "model")
    try:
        return AutoConfig.from_pretrained(path, revision=cfg.revision, trust_remote_code=cfg.trust_remote_code)
    except OSError as err:
        raise unreachable(cfg, path, "model", err) from err


def model_context(cfg: ModelConfig, path: str | None = None) -> int:
    """The model's context (positions) from its config alone, so a budget that cannot fit fails before the weights
    load; unbounded (1 << 30) for architectures without learned or fixed positions. Refuses an architecture no
    decoder can verify."""
    config = model_config(cfg, path)
    check_architecture(config, cfg.name)
    return context_length(config)


def check_same_tokenizer(target: LoadedModel, draft: LoadedModel) -> None:
    check_same_vocab(target.tokenizer, draft.tokenizer, target.name, draft.name)


def check_same_vocab(target: PreTrainedTokenizerBase, draft: PreTrainedTokenizerBase, target_name: str,
                     draft_name: str) -> None:
    """Draft and target must map text to the same ids (vocab sizes may differ only by padding rows); checked on
    the tokenizers alone, before any weights load."""
    tv, dv = target.get_vocab(), draft.get_vocab()
    if tv != dv:
        only_t = len(set(tv.items()) - set(dv.items()))
        raise UserError(
            f"draft {draft_name!r} and target {target_name!r} use different tokenizers ({only_t} target tokens map "
            "differently): speculative decoding needs a draft that shares the target's vocabulary"
        )
