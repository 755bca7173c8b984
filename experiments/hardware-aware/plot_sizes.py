"""The sizes decoder.auto chose over a generation: per decoder of a run's auto jobs, the nodes proposed at each step
of the last generation it timed (results.json meta.decoders.<name>.auto.streams.<stream>.sizes), one panel per
benchmark. Usage: python experiments/hardware-aware/plot_sizes.py SWEEP_DIR OUT.png"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main(sweep: Path, out: Path) -> None:
    jobs = []
    for results in sorted(sweep.glob("*/results.json")):
        data = json.loads(results.read_text())
        decoders = data["meta"].get("decoders", {})
        if any("auto" in d for d in decoders.values()):
            jobs.append((data["rows"][0]["benchmark"], decoders))
    fig, axes = plt.subplots(1, len(jobs), figsize=(7 * len(jobs), 4.5), squeeze=False)
    for ax, (benchmark, decoders) in zip(axes[0], jobs):
        for name, meta in decoders.items():
            for stream, info in meta.get("auto", {}).get("streams", {}).items():
                label = name if stream == name else f"{name} ({stream})"
                ax.step(range(len(info["sizes"])), info["sizes"], where="post", label=label, alpha=0.8)
        ax.set(title=f"{benchmark}: nodes verified per step (last generation)", xlabel="step",
               ylabel="proposal size (0 = AR step)")
        ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    print(out)


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
