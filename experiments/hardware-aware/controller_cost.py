"""What decoder.auto's controller costs per step on the host: ``select`` + ``observe`` of TR-Jacobi's 68-node template
(``decoding/tr_jacobi.py`` AUTO_TEMPLATE, 5-token retrieval chain), priced by the forward-cost curve an H100 measured
(experiments/gpu/h100/checks/cost_cache, HumanEval context), with each kept first child accepted at 60%. Three
settings: as on the CPU engines (sticky off), and as on a graph engine (auto.STICKY) with and without the
re-ranking interval (auto.RERANK). No model runs: this is the controller's Python alone.

Usage: python experiments/hardware-aware/controller_cost.py
"""

from __future__ import annotations

import json
import random
import time
from pathlib import Path
from types import SimpleNamespace

from specnoise.decoding import auto
from specnoise.decoding.auto import Controller
from specnoise.decoding.cost import CHAIN, TREE, interpolate
from specnoise.decoding.tr_jacobi import AUTO_TEMPLATE, build_tree

CURVE = Path(__file__).parents[1] / "gpu/h100/checks/cost_cache/forward-cost-f4d32e83566aaa1a.json"
STEPS, WARMUP, ROUNDS = 3000, 300, 3


def microseconds_per_step(cost, parents: list[int], sticky: float, rerank: int) -> float:
    auto.RERANK = rerank
    controller, rng = Controller(cost, sticky=sticky), random.Random(0)

    def step():
        keep = controller.select("tr_jacobi", parents, TREE, 0, None)
        path, node = [0], -1
        while True:  # the accepted path: the first kept child of the last accepted node, 60% of the time
            children = [j for j, k in enumerate(keep) if parents[k] == node]
            if not children or rng.random() > 0.6:
                break
            path.append(children[0] + 1)
            node = keep[children[0]]
        controller.observe(SimpleNamespace(accepted=len(path) - 1, path=path, shape=SimpleNamespace(nodes=len(keep))))

    for _ in range(WARMUP):
        step()
    start = time.perf_counter()
    for _ in range(STEPS):
        step()
    return (time.perf_counter() - start) / STEPS * 1e6


def main() -> None:
    seconds = json.loads(CURVE.read_text())["seconds"]
    fits = {kind: interpolate({int(q): t for q, t in times.items()}) for kind, times in seconds.items()}

    def cost(q, kind=CHAIN):
        return fits[CHAIN if q <= 1 else kind](q)

    tree = build_tree(AUTO_TEMPLATE, 10, 5)
    parents = [p - 1 for p in tree.parent[1:]]
    default = auto.RERANK
    for label, sticky, rerank in (("CPU engines (sticky off)", 0.0, default), ("graph engine, no re-rank interval",
                                  auto.STICKY, 0), (f"graph engine, RERANK={default}", auto.STICKY, default)):
        best = min(microseconds_per_step(cost, parents, sticky, rerank) for _ in range(ROUNDS))
        print(f"{label:36s} {best:6.1f} us per select + observe ({len(parents)} nodes)")
    auto.RERANK = default


if __name__ == "__main__":
    main()
