"""``model=`` and ``draft=``: which weights, on which device, in which dtype and attention."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from specnoise.config.checks import MISSING, check, one_of

# block sizes the static engine pads to (one compiled graph each); 72 fits TR-Jacobi's 69-token tree step
STATIC_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 72, 128)
DTYPES = ("float32", "float16", "bfloat16", "auto")
DEVICES = ("auto", "cpu", "cuda")
DEVICE_MAPS = ("auto", "balanced", "balanced_low_0", "sequential")  # accelerate's strategies
ATTN = ("sdpa", "sdpa_gqa", "eager")  # sdpa_gqa: SDPA without repeat_kv's cache copies (attention.py)
SDPA_BACKENDS = ("flash", "efficient", "math", "cudnn")
TEMPLATES = ("raw", "chat", "alpaca", "vicuna", "llama2-chat", "deepseek-coder", "code-instruct")

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
