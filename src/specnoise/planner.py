"""Memory planner: will the target (and the draft) fit the devices? Answered before any weight loads.

A 70B model takes minutes to load and then fails with an out-of-memory error; the numbers that decide it are known
from ``config.json`` alone. Per model: parameters (counted exactly by building the architecture on the ``meta``
device, which allocates nothing) x the bytes of its dtype, plus the KV cache: bytes per token (2 x layers x KV heads x
head dim x dtype bytes) x (prompt + budget) x batch rows. Against: the visible devices' free memory (CUDA
``mem_get_info``; on the CPU the host's available memory), or devices described with ``planner.devices=[80GB,...]``
for planning on a machine that is not the target. Each device keeps ``planner.headroom`` of its memory free for
activations, logits and the allocator.

The layout follows the model keys: one device (the default), ``model.device_map`` (accelerate spreads the weights
over every device, plus ``model.max_memory['cpu']`` of host memory, plus disk with ``model.offload_folder``), or
``model.tp_plan=auto`` (each of the ``WORLD_SIZE`` ranks holds 1/world of the weights and KV heads, and a whole
draft). When it does not fit, the error lists which settings would: a smaller dtype, tensor parallel over N devices,
or a device map over K devices (or with CPU offload).

A hub id that is neither a local folder nor in the Hugging Face cache is planned from ``KNOWN_CONFIGS``, the
architecture fields of the shipped presets' models (from their config.json), so no network is needed; any other
model without a readable config.json is not planned (a warning says so) and loading decides.
"""

from __future__ import annotations

import logging
import math
import os
import re
from dataclasses import dataclass

import torch

from specnoise.config import Config, ModelConfig, UserError
from specnoise.models import DTYPES, context_length, is_local

log = logging.getLogger("specnoise")

# The architecture of each real model a shipped preset (conf/model/*.yaml) names, copied from its config.json: the
# fields that decide parameters, KV cache and context.
_LLAMA2_7B = dict(model_type="llama", hidden_size=4096, intermediate_size=11008, num_hidden_layers=32,
                  num_attention_heads=32, num_key_value_heads=32, vocab_size=32000, max_position_embeddings=4096)
_DEEPSEEK_7B = {**_LLAMA2_7B, "vocab_size": 32256, "max_position_embeddings": 16384}
_LLAMA3_8B = {**_LLAMA2_7B, "intermediate_size": 14336, "num_key_value_heads": 8, "vocab_size": 128256,
              "max_position_embeddings": 8192}
KNOWN_CONFIGS: dict[str, dict] = {
    "meta-llama/Llama-2-7b-chat-hf": _LLAMA2_7B,
    "meta-llama/Llama-2-70b-chat-hf": dict(model_type="llama", hidden_size=8192, intermediate_size=28672,
                                           num_hidden_layers=80, num_attention_heads=64, num_key_value_heads=8,
                                           vocab_size=32000, max_position_embeddings=4096),
    "lmsys/vicuna-7b-v1.3": {**_LLAMA2_7B, "max_position_embeddings": 2048},
    "double7/vicuna-68m": dict(model_type="llama", hidden_size=768, intermediate_size=3072, num_hidden_layers=2,
                               num_attention_heads=12, num_key_value_heads=12, vocab_size=32000,
                               max_position_embeddings=2048),
    "codellama/CodeLlama-7b-hf": {**_LLAMA2_7B, "vocab_size": 32016, "max_position_embeddings": 16384},
    "codellama/CodeLlama-7b-Instruct-hf": {**_LLAMA2_7B, "vocab_size": 32016, "max_position_embeddings": 16384},
    "codellama/CodeLlama-34b-Instruct-hf": dict(model_type="llama", hidden_size=8192, intermediate_size=22016,
                                                num_hidden_layers=48, num_attention_heads=64, num_key_value_heads=8,
                                                vocab_size=32000, max_position_embeddings=16384),
    "deepseek-ai/deepseek-coder-6.7b-base": _DEEPSEEK_7B,
    "deepseek-ai/deepseek-coder-6.7b-instruct": _DEEPSEEK_7B,
    "DecoderImmortal/DeepSeek-Coder-7B-MSN": _DEEPSEEK_7B,
    "deepseek-ai/deepseek-coder-33b-instruct": dict(model_type="llama", hidden_size=7168, intermediate_size=19200,
                                                    num_hidden_layers=62, num_attention_heads=56,
                                                    num_key_value_heads=8, vocab_size=32256,
                                                    max_position_embeddings=16384),
    "01-ai/Yi-6B": {**_LLAMA2_7B, "num_key_value_heads": 4, "vocab_size": 64000},
    "01-ai/Yi-34B": dict(model_type="llama", hidden_size=7168, intermediate_size=20480, num_hidden_layers=60,
                         num_attention_heads=56, num_key_value_heads=8, vocab_size=64000, max_position_embeddings=4096),
    "meta-llama/Meta-Llama-3-8B": _LLAMA3_8B,
    "DecoderImmortal/Llama3-8B-MSN": _LLAMA3_8B,
    "Qwen/Qwen2.5-7B": dict(model_type="qwen2", hidden_size=3584, intermediate_size=18944, num_hidden_layers=28,
                            num_attention_heads=28, num_key_value_heads=4, vocab_size=152064,
                            max_position_embeddings=131072, tie_word_embeddings=False, use_sliding_window=False),
    "bigcode/starcoder2-3b": dict(model_type="starcoder2", hidden_size=3072, intermediate_size=12288,
                                  num_hidden_layers=30, num_attention_heads=24, num_key_value_heads=2,
                                  vocab_size=49152, max_position_embeddings=16384, sliding_window=4096),
}
_UNITS = {"": 1, "b": 1, "kb": 1e3, "mb": 1e6, "gb": 1e9, "tb": 1e12, "kib": 2**10, "mib": 2**20, "gib": 2**30,
          "tib": 2**40}
TP_SIZES = (2, 4, 8, 16)


def parse_size(text) -> int:
    """``80GB`` / ``80GiB`` / ``512MB`` / a number of bytes -> bytes."""
    match = re.fullmatch(r"\s*([0-9.]+)\s*([a-zA-Z]*)\s*", str(text))
    if not match or match.group(2).lower() not in _UNITS:
        raise UserError(f"memory size {text!r}: write a number with a unit, e.g. 80GB, 79GiB or 512MB")
    return int(float(match.group(1)) * _UNITS[match.group(2).lower()])


def gb(n: float) -> str:
    return f"{n / 1e9:.1f} GB"


def read_config(cfg: ModelConfig, path: str):
    """The model's transformers config without the network: a local folder, the Hugging Face cache, or the
    shipped presets' table; None when none of them has it."""
    from transformers import AutoConfig

    try:
        if is_local(path):
            return AutoConfig.from_pretrained(path, trust_remote_code=cfg.trust_remote_code)
        return AutoConfig.from_pretrained(path, revision=cfg.revision, local_files_only=True,
                                          trust_remote_code=cfg.trust_remote_code)
    except (OSError, ValueError):
        known = KNOWN_CONFIGS.get(path)
        return AutoConfig.for_model(**known) if known else None


def count_parameters(config) -> int:
    """Exact: the architecture built on the meta device (shapes only, no memory), tied weights counted once."""
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    return sum(p.numel() for p in model.parameters())


def kv_bytes_per_token(config, itemsize: int) -> int:
    text = config.get_text_config()
    heads = text.num_attention_heads
    kv_heads = getattr(text, "num_key_value_heads", None) or heads
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // heads
    return 2 * text.num_hidden_layers * kv_heads * head_dim * itemsize


@dataclass
class Footprint:
    """One model's memory: weights and the KV cache of ``tokens`` positions for ``rows`` sequences."""

    role: str
    name: str
    params: int
    itemsize: int
    kv_per_token: int
    tokens: int
    rows: int
    heads: int  # attention heads and KV heads must divide by a tensor-parallel size
    kv_heads: int

    @property
    def weights(self) -> int:
        return self.params * self.itemsize

    @property
    def kv(self) -> int:
        return self.kv_per_token * self.tokens * self.rows

    @property
    def total(self) -> int:
        return self.weights + self.kv

    def at(self, itemsize: int) -> int:
        """The total in another dtype."""
        return self.total * itemsize // self.itemsize

    def line(self) -> str:
        dtype = {4: "float32", 2: "16-bit"}.get(self.itemsize, f"{self.itemsize}-byte")
        return (f"{self.role} {self.name}: {self.params / 1e9:.2f}B parameters x {self.itemsize} B ({dtype}) = "
                f"{gb(self.weights)} weights + KV {gb(self.kv)} ({self.kv_per_token / 1e6:.3f} MB/token x "
                f"{self.tokens} tokens x {self.rows} rows)")


def footprint(cfg: ModelConfig, path: str, role: str, conf: Config, accelerator: bool) -> Footprint | None:
    config = read_config(cfg, path)
    if config is None:
        return None
    name = cfg.dtype if cfg.dtype != "auto" else ("bfloat16" if accelerator else "float32")
    itemsize = DTYPES[name].itemsize
    text = config.get_text_config()
    context = context_length(config)
    budget = conf.decoder.max_new_tokens or conf.benchmark.max_new_tokens
    prompt = conf.benchmark.max_prompt_tokens if conf.benchmark.name != "none" else None
    tokens = min(context, (prompt or context) + budget)  # the longest prompt that fits, plus the budget
    rows = conf.benchmark.batch_size if conf.benchmark.name != "none" else 1
    heads = text.num_attention_heads
    return Footprint(role, cfg.name, count_parameters(config), itemsize, kv_bytes_per_token(config, itemsize),
                     tokens, rows, heads, getattr(text, "num_key_value_heads", None) or heads)


def visible_devices(cfg: ModelConfig) -> tuple[list[tuple[str, int]], bool]:
    """(name, free bytes) per device the model may use, and whether they are accelerators."""
    if cfg.device != "cpu" and torch.cuda.is_available():
        return [(f"cuda:{i}", torch.cuda.mem_get_info(i)[0]) for i in range(torch.cuda.device_count())], True
    import psutil

    return [("cpu", psutil.virtual_memory().available)], False


@dataclass
class Plan:
    lines: list[str]
    fits: bool
    options: list[str]

    @property
    def text(self) -> str:
        return "\n".join(self.lines)


def tp_size_ok(fp: Footprint, n: int) -> bool:
    return fp.heads % n == 0 and fp.kv_heads % n == 0


def options(target: Footprint, draft: Footprint | None, size: int, count: int, accelerator: bool) -> list[str]:
    """Settings under which the models would fit devices of ``size`` usable bytes (``count`` of them here)."""
    extra = draft.total if draft else 0
    unit = f"{gb(size)} usable" if accelerator else "this host's memory"
    found = []
    if target.itemsize == 4 and target.at(2) + (draft.at(2) if draft else 0) <= size:
        found.append(f"a 16-bit dtype on one device: model.dtype=bfloat16{' draft.dtype=bfloat16' if draft else ''} "
                     f"({gb(target.at(2) + (draft.at(2) if draft else 0))})")
    if accelerator:
        for n in TP_SIZES:
            if tp_size_ok(target, n) and target.total / n + extra <= size:
                where = "" if n <= count else f" (this machine has {count})"
                found.append(f"tensor parallel over {n} devices of {unit}{where}: model.tp_plan=auto under "
                             f"torchrun --nproc-per-node {n} ({gb(target.total / n + extra)} per device)")
                break
        k = math.ceil((target.total + extra) / size)
        where = "" if k <= count else f" (this machine has {count})"
        found.append(f"a device map over {k} devices of {unit}{where}: model.device_map=auto")
        found.append("CPU (and disk) offload, slow: model.device_map=auto model.max_memory={0: ..., cpu: ...} "
                     "(model.offload_folder=DIR for disk)")
    else:  # processes of a CPU run share the host's memory: only offloading to disk adds room
        found.append(f"disk offload, slow: model.device_map=auto model.max_memory={{cpu: {int(size / 2**30)}GiB}} "
                     "model.offload_folder=DIR; or plan for accelerators with planner.devices=[80GB,...]")
    return found


def plan(conf: Config, model_path: str | None = None, devices: list[str] | None = None) -> Plan | None:
    """The plan for ``conf``'s target and draft, or None when a model's config.json cannot be read offline."""
    described = devices if devices is not None else conf.planner.devices
    if described:
        found, accelerator = [(f"device {i}", parse_size(d)) for i, d in enumerate(described)], True
    else:
        found, accelerator = visible_devices(conf.model)
    keep = 1 - conf.planner.headroom
    usable = [int(free * keep) for _, free in found]
    target = footprint(conf.model, str(model_path or conf.model.path), "target", conf, accelerator)
    draft = (footprint(conf.draft, str(conf.draft.path), "draft", conf, accelerator)
             if conf.draft.name != "none" else None)
    missing = [c.name for c, fp in ((conf.model, target), (conf.draft, draft)) if c.name != "none" and fp is None]
    if missing:
        log.warning("memory plan skipped: no config.json for %s offline (a local folder, the Hugging Face cache or "
                    "planner.KNOWN_CONFIGS)", ", ".join(missing))
        return None
    where = ", ".join(f"{name} {gb(free)} free" for name, free in found)
    lines = [f"memory plan ({'described' if described else 'visible'}: {where}; headroom "
             f"{conf.planner.headroom:.0%}):", "  " + target.line()] + (["  " + draft.line()] if draft else [])
    if conf.benchmark.name == "none" or conf.benchmark.max_prompt_tokens is None:
        lines.append("  (KV for prompts up to the context: set benchmark.max_prompt_tokens to plan for shorter ones)")
    extra = draft.total if draft else 0
    model = conf.model
    if model.tp_plan:
        world = int(os.environ.get("WORLD_SIZE", 0)) or (len(found) if described else 1)
        if not tp_size_ok(target, world):
            raise UserError(f"model.tp_plan=auto over {world} processes: {target.name} has {target.heads} attention "
                            f"and {target.kv_heads} KV heads, which must divide by the process count")
        split_draft = draft is not None and conf.draft.tp_plan
        need = target.total / world + (extra / world if split_draft else extra)
        if accelerator:
            fits = world <= len(found) and need <= min(usable)
            layout = (f"tensor parallel over {world} devices: {gb(need)} per device"
                      + ("" if draft is None or split_draft else " (the draft whole on each)"))
        else:  # every rank of a CPU run shares the host's memory
            fits, layout = world * need <= usable[0], f"tensor parallel over {world} CPU processes: {gb(world * need)}"
    elif model.device_map is not None:
        need = target.total + extra
        caps = {str(k): parse_size(v) for k, v in (model.max_memory or {}).items()}  # accelerate's per-device limits
        if accelerator:
            capacity = sum(min(free, caps.get(str(i), free)) for i, free in enumerate(usable)) + caps.get("cpu", 0)
        else:
            capacity = min(usable[0], caps.get("cpu", usable[0]))
        fits = need <= capacity or model.offload_folder is not None
        layout = (f"device map ({model.device_map}) over {len(found)} device(s): {gb(need)} of {gb(capacity)}"
                  + (", the rest offloaded to disk" if model.offload_folder and need > capacity else ""))
    else:
        need = target.total + extra
        fits = need <= usable[0]
        layout = f"one device ({found[0][0]}): {gb(need)} of {gb(usable[0])} usable"
    lines.append(f"  layout: {layout} -> {'fits' if fits else 'does NOT fit'}")
    return Plan(lines, fits, [] if fits else options(target, draft, max(usable), len(found), accelerator))


def check_memory(conf: Config, model_path: str | None = None) -> Plan | None:
    """Print the plan; a config error (exit 2) when it does not fit, naming the settings that would."""
    if not conf.planner.enabled:
        return None
    result = plan(conf, model_path)
    if result is None:
        return None
    print(result.text)
    if not result.fits:
        advice = "; or ".join(result.options) if result.options else "a machine with more memory"
        raise UserError(f"{result.lines[-1].strip()} for model={conf.model.name}"
                        f"{f' + draft={conf.draft.name}' if conf.draft.name != 'none' else ''}. What would fit: "
                        f"{advice}. (planner.enabled=false skips this check)")
    return result
