"""What a benchmark records about its engines: the speedup against the fastest stock AR, and the engines' meta."""

from __future__ import annotations

from specnoise.decoding.static_kv import StaticEngine

BEST_AR = ("ar", "hf_static")  # our AR and HF generate() with a static cache (compiled on CUDA)


def add_speedup_vs_best_ar(rows: list[dict]) -> list[dict]:
    """``speedup_vs_best_ar``: tokens/s against the faster of ``ar`` and ``hf_static`` in the same category; only
    when ``hf_static`` ran in the job."""
    if not any(r["decoder"] == "hf_static" for r in rows):
        return rows
    best: dict[str, float] = {}
    for r in rows:
        if r["decoder"] in BEST_AR:
            best[r["category"]] = max(best.get(r["category"], 0.0), r["tokens_per_second"])
    for r in rows:
        r["speedup_vs_best_ar"] = r["tokens_per_second"] / max(best[r["category"]], 1e-9)
    return rows


def engine_meta(decoders) -> dict:
    """The target engine in use, whether it was compiled and how long compiling took (in the warm-up, untimed)."""
    engines = {id(kv): kv for d in decoders for kv in (d.target, d.draft) if kv is not None}.values()
    static = [kv for kv in engines if isinstance(kv, StaticEngine)]
    return {"static_cache": any(isinstance(d.target, StaticEngine) for d in decoders),
            "compile": any(kv.compiled for kv in static),
            "compile_seconds": sum(kv.compile_seconds for kv in static)}
