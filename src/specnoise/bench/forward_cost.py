"""``task=forward_cost``: what one target forward of q new tokens costs over a cache of ``cache_len`` tokens.

The verify-cost curve t(q) bounds every draft-and-verify decoder: a step that verifies q tokens and accepts
MAT of them on average runs at most MAT x t(1) / t(q) times faster than AR. It is timed through the engine the
decoders use (the engine's ``forward`` with positions and a 4D mask, then ``crop`` back), so what it reports is what a
tree verify costs them; ``decoder.tree=auto`` calls :func:`measure_forward_costs` on its own engine.

The model is the configured one (``forward_cost.arch=model``), or random weights in the shape of ``train.arch``
(``random``) or of a ``config.json`` (``config``): built on the meta device and materialised on the target device,
so an 8B-shaped model is probed without its weights and without a CPU copy.
"""

from __future__ import annotations

import logging
import platform
import time
from dataclasses import asdict
from pathlib import Path
from statistics import median

import torch

import specnoise.attention  # noqa: F401  (registers attn_implementation=sdpa_gqa)
from specnoise.config import Config, UserError
from specnoise.decoding.cost import measure_forward_times
from specnoise.decoding.kv import DynamicEngine, sync
from specnoise.decoding.static_kv import StaticEngine
from specnoise.models import use_static_cache

log = logging.getLogger("specnoise")


def weights_bytes(model: torch.nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters())  # tied weights are counted once


def memory_floor(model: torch.nn.Module, repeats: int = 10, chunk: int = 1 << 30) -> float | None:
    """Seconds to read every weight byte once, from a timed device-to-device copy (CUDA only, else None).

    A copy reads and writes each byte, so one weights read is half a copy of the weights' size; at most
    ``chunk`` bytes are copied per call (no second copy of an 8B model in memory) and the time is scaled up."""
    device = next(model.parameters()).device
    if device.type != "cuda":
        return None
    total = weights_bytes(model)
    n = min(total, chunk)
    src = torch.empty(n, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    seconds = []
    for _ in range(repeats):
        sync(device)
        t0 = time.perf_counter()
        dst.copy_(src)
        sync(device)
        seconds.append(time.perf_counter() - t0)
    del src, dst
    return median(seconds) / 2 * total / n


# ------------------------------------------------------------------------------------------ the task
def random_model(config, conf: Config) -> torch.nn.Module:
    """Random weights in the shape of ``config`` on ``model.device`` in ``model.dtype``, never on the CPU first."""
    from transformers import AutoModelForCausalLM

    from specnoise.models import resolve_device, resolve_dtype

    device = resolve_device(conf.model.device)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=resolve_dtype(conf.model.dtype, device),
                                                 attn_implementation=conf.model.attn_implementation)
    model.to_empty(device=device)
    torch.manual_seed(conf.seed)
    model.init_weights()  # random weights, and the non-persistent buffers (RoPE frequencies) the meta device lost
    return model.eval()


def probe_model(conf: Config) -> tuple[torch.nn.Module, str]:
    """The model ``forward_cost.arch`` names, and a short description of where it came from."""
    from transformers import AutoConfig

    fc = conf.forward_cost
    if fc.arch == "model":
        from specnoise.models import load_model

        loaded = load_model(conf.model)
        return loaded.model, f"{conf.model.name} ({loaded.path})"
    if fc.arch == "random":
        arch = asdict(conf.train.arch)
        return random_model(AutoConfig.for_model(arch.pop("model_type"), **arch), conf), "random, train.arch"
    path = Path(fc.config_path).expanduser()
    if not path.exists():
        raise UserError(f"forward_cost.config_path: no file or folder at {path} (give a config.json or its folder)")
    try:
        config = AutoConfig.from_pretrained(str(path))
    except (OSError, ValueError) as err:
        raise UserError(f"forward_cost.config_path: {path} is not a transformers config.json ({err})") from err
    return random_model(config, conf), f"random, {path}"


def run_forward_cost(conf: Config, run_dir: Path) -> Path:
    """Time t(q) for ``forward_cost.q``; write forward_cost.{csv,md,png} into ``run_dir``; returns the .md path."""
    import pandas as pd

    from specnoise.files import write_atomic

    fc = conf.forward_cost
    if fc.threads:
        torch.set_num_threads(fc.threads)
    model, source = probe_model(conf)
    qs = sorted({1, *fc.q})  # t(1) is the unit of every ratio
    # the engine decoders would use (model.static_cache / model.compile); compiled: one graph per probed q only
    static = use_static_cache(conf.model.static_cache, conf.model.compile, next(model.parameters()).device)
    kv = StaticEngine(model, compile=conf.model.compile, buckets=tuple(qs)) if static else DynamicEngine(model)
    kv.reserve((fc.cache_len or 0) + qs[-1])  # a static cache sized for the probe, not more: forwards attend over it
    times = measure_forward_times(kv, qs, fc.cache_len, fc.repeats, fc.warmup, conf.seed)
    floor = memory_floor(model) if fc.memory_floor else None
    table = pd.DataFrame({"q": qs, "ms": [median(times[q]) * 1e3 for q in qs]})
    table["ms_per_token"] = table.ms / table.q
    table["ratio_to_q1"] = table.ms / table.ms[0]
    table["min_ms"] = [min(times[q]) * 1e3 for q in qs]  # the uncontended cost, for a busy machine
    meta = {
        "model": source, "parameters": sum(p.numel() for p in model.parameters()),
        "weights_GB": round(weights_bytes(model) / 1e9, 4),
        "device": str(kv.device), "dtype": str(kv.dtype).removeprefix("torch."),
        "attn_implementation": getattr(model.config, "_attn_implementation", "?"), "cache_len": fc.cache_len,
        "engine": "static" if static else "dynamic", "compile": bool(static and conf.model.compile),
        "compile_seconds": round(getattr(kv, "compile_seconds", 0.0), 1),
        "repeats": fc.repeats, "warmup": fc.warmup, "torch_threads": torch.get_num_threads(),
        "memory_floor_ms": None if floor is None else round(floor * 1e3, 3),
        "torch": torch.__version__, "platform": platform.platform(),
    }
    markdown = table.to_markdown(index=False, floatfmt=(".0f", ".3f", ".3f", ".3f", ".3f"))
    lines = ["# Forward cost: one target forward of q new tokens", ""]
    lines += [f"- {key}: {value}" for key, value in meta.items()]
    lines += ["", "t(q) (`ms`) is the median over repeats, `min_ms` the fastest; a draft-and-verify step that verifies "
              "q tokens and accepts MAT of them is at most MAT x t(1) / t(q) times faster than AR.", "", markdown, ""]
    if fc.plot:
        lines += ["![forward cost](forward_cost.png)", ""]
    run_dir.mkdir(parents=True, exist_ok=True)
    write_atomic(run_dir / "forward_cost.csv", table.to_csv(index=False))
    write_atomic(run_dir / "forward_cost.md", "\n".join(lines))
    if fc.plot:
        write_atomic(run_dir / "forward_cost.png", lambda tmp: plot(table, meta, tmp))
    print(markdown)
    if floor is not None:
        print(f"memory floor (one read of {meta['weights_GB']:.2f} GB of weights): {floor * 1e3:.3f} ms")
    log.info("forward cost: %s", run_dir / "forward_cost.md")
    return run_dir / "forward_cost.md"


def plot(table, meta: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, ratio) = plt.subplots(1, 2, figsize=(10, 4))
    ax.plot(table.q, table.ms, marker="o", label="t(q)")
    if meta["memory_floor_ms"] is not None:
        ax.axhline(meta["memory_floor_ms"], ls="--", color="gray", label="memory floor (weights read once)")
    ax.set(xlabel="new tokens q", ylabel="ms per forward", ylim=(0, None),
           title=f"cache {meta['cache_len']}, {meta['device']}, {meta['dtype']}")
    ax.set_xscale("log", base=2)
    ax.legend()
    ratio.plot(table.q, table.ratio_to_q1, marker="o")
    ratio.set_xscale("log", base=2)
    ratio.set(xlabel="new tokens q", ylabel="t(q) / t(1)", ylim=(0, None), title="cost relative to one token")
    fig.suptitle(meta["model"], fontsize=9)
    fig.tight_layout()
    fig.savefig(path, format="png", dpi=120)
    plt.close(fig)
