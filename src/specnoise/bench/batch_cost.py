"""The batched forward-cost curve t(B·q): one target forward of B rows x q new tokens each, over a cache of
``cache_len`` tokens per row, for every batch size B and block q.

Why: a draft-and-verify decoder at batch size B verifies B blocks of q tokens in one forward, and AR at batch size
B runs B x 1. Its speedup over batched AR is at most MAT x t(B·1) / t(B·q): while B x q stays in the range where a
forward costs about as much as a one-token one (the weights are read once whatever the rows), verifying is nearly
free and the speedup survives batching; once B x q passes the knee of the curve (compute-bound: the CPU at once,
a GPU at hundreds to thousands of tokens), a forward costs about B x q and the speedup falls to MAT / q, below 1
for wide trees. ``experiments/batch-scaling`` reads the measured curve next to each decoder's speedup vs B.

It times the forward a lock-step batch runs (``decoding/cost.py`` ``measure_forward_times`` with ``rows=B``: the
batched cache of ``decoding/batch.py`` prefilled with random tokens, the block fed with its 4D mask, every logit row
kept, as a verify), the same for every decoder; at B = 1 the single-row engine's. Sizes take turns within each
round, so a machine's drift spreads over all of them; the median (``ms``) and the fastest (``min_ms``) of
``repeats`` are reported, and the ratios use the fastest: the uncontended cost, steadier on a shared machine. (The
dynamic engine's eager forward: a compiled static engine on a GPU shaves launch overhead off small forwards.)

    python -m specnoise.bench.batch_cost model=small-code-msn --batch 1,2,4,8,16,32 --q 1,2,4,8,16,32,64 \\
        --out experiments/batch-scaling/tiny/forward_cost

(the ``key=value`` arguments are Hydra overrides of the model, e.g. ``model.device=cuda model.dtype=bfloat16``).
"""

from __future__ import annotations

import argparse
import json
import platform
from pathlib import Path
from statistics import median

import torch

from specnoise.decoding.cost import measure_forward_times
from specnoise.decoding.kv import DynamicEngine


def measure_batch_costs(model, batches: list[int], qs: list[int], cache_len: int = 128, repeats: int = 5,
                        warmup: int = 2, seed: int = 0) -> dict[tuple[int, int], list[float]]:
    """(B, q) -> ``repeats`` timings (seconds) of one forward of B rows x q new tokens after ``cache_len`` each."""
    engine = DynamicEngine(model)
    return {(b, q): times for b in batches
            for q, times in measure_forward_times(engine, qs, cache_len, repeats, warmup, seed, rows=b).items()}


def table(times: dict[tuple[int, int], list[float]]):
    import pandas as pd

    rows = [{"batch_size": b, "q": q, "tokens": b * q, "ms": median(t) * 1e3, "min_ms": min(t) * 1e3}
            for (b, q), t in sorted(times.items())]
    df = pd.DataFrame(rows)
    one = df[(df.batch_size == 1) & (df.q == 1)].min_ms.iloc[0]
    df["ratio_to_b1_q1"] = df.min_ms / one  # against one token of one row
    ar = df[df.q == 1].set_index("batch_size").min_ms
    df["ratio_to_bq1"] = df.min_ms / df.batch_size.map(ar)  # against AR's forward at the same B: t(B·q) / t(B·1)
    df["ms_per_token"] = df.ms / df.tokens
    return df


def plot(df, meta: dict, path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, ratio) = plt.subplots(1, 2, figsize=(11, 4.2))
    for q, part in df.groupby("q"):
        ax.plot(part.tokens, part.ms, marker="o", label=f"q={q}")
        ratio.plot(part.batch_size, part.ratio_to_bq1, marker="o", label=f"q={q}")
    ax.set(xscale="log", yscale="log", xlabel="tokens per forward B·q", ylabel="ms per forward (median)",
           title=f"t(B·q), cache {meta['cache_len']}/row, {meta['device']}, {meta['dtype']}")
    ax.legend(fontsize=7, ncol=2)
    ratio.set_xscale("log", base=2)
    ratio.set(xlabel="batch size B", ylabel="t(B·q) / t(B·1) (fastest timings)", yscale="log",
              title="a q-token verify against batched AR's forward")
    ratio.axhline(1.0, color="grey", ls="--", lw=0.8)
    ratio.legend(fontsize=7, ncol=2)
    fig.suptitle(meta["model"], fontsize=9)
    fig.tight_layout()
    fig.savefig(path, format="png", dpi=110)
    plt.close(fig)


def load(overrides: list[str]):
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from specnoise.conf_store import register
    from specnoise.config import config_dir
    from specnoise.models import load_model

    register()
    with initialize_config_dir(config_dir=str(config_dir()), version_base="1.3"):
        conf = OmegaConf.to_object(compose("config", overrides=overrides))
    loaded = load_model(conf.model)
    return loaded.model.eval(), f"{conf.model.name} ({loaded.path})"


def main(argv: list[str] | None = None) -> Path:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("overrides", nargs="*", help="Hydra overrides naming the model (model=NAME model.dtype=...)")
    parser.add_argument("--batch", default="1,2,4,8,16,32", help="batch sizes B")
    parser.add_argument("--q", default="1,2,4,8,16,32,64", help="new tokens per row q")
    parser.add_argument("--cache-len", type=int, default=128, help="cached tokens per row before the block")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads (0: torch's default)")
    parser.add_argument("--out", default="outputs/batch_cost", help="folder for batch_cost.{csv,md,json,png}")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    batches = sorted({int(b) for b in args.batch.split(",")} | {1})
    qs = sorted({int(q) for q in args.q.split(",")} | {1})
    model, source = load(args.overrides)
    param = next(model.parameters())
    times = measure_batch_costs(model, batches, qs, args.cache_len, args.repeats, args.warmup)
    df = table(times)
    meta = {"model": source, "device": str(param.device), "dtype": str(param.dtype).removeprefix("torch."),
            "cache_len": args.cache_len, "repeats": args.repeats, "warmup": args.warmup,
            "torch_threads": torch.get_num_threads(), "torch": torch.__version__, "platform": platform.platform()}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    df.to_csv(out / "batch_cost.csv", index=False)
    (out / "batch_cost.json").write_text(json.dumps(meta, indent=2))
    pivot = df.pivot(index="batch_size", columns="q", values="ms")
    ratio = df.pivot(index="batch_size", columns="q", values="ratio_to_bq1")
    lines = ["# Batched forward cost t(B·q): one forward of B rows x q new tokens", ""]
    lines += [f"- {k}: {v}" for k, v in meta.items()]
    lines += ["", "## ms per forward (median; rows: B, columns: q)", "", pivot.to_markdown(floatfmt=".3f"), "",
              "## t(B·q) / t(B·1): a q-token verify step against batched AR's step, from the fastest timings (the "
              "bound on a decoder's speedup over AR at batch B is MAT x t(B·1) / t(B·q))", "",
              ratio.to_markdown(floatfmt=".2f"), "",
              "![t(B·q)](batch_cost.png)", ""]
    (out / "batch_cost.md").write_text("\n".join(lines))
    plot(df, meta, out / "batch_cost.png")
    print(pivot.to_markdown(floatfmt=".3f"))
    return out / "batch_cost.md"


if __name__ == "__main__":
    main()
