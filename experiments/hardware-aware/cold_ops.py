"""What a small op costs on the CPU right after a model forward (where every step's host work runs) vs warm.

A decode step's host work is a few dozen small ops on tensors of a handful of rows. Timed alone in a loop each takes
1-5 us; inside a run the same steps take several times that. This script shows why: after a forward of the shipped
small-code-msn (fp32, one thread, 28 MB of weights streamed through the caches) an op's first call pays for bringing
its code and tables back. For each op: its time as the first call after a forward ("cold"), as the first call of its
kind after one other op ran ("second"), and called again at once ("warm"); median of ``ROUNDS`` forwards, in us.

Usage: python experiments/hardware-aware/cold_ops.py
"""

from __future__ import annotations

import statistics
import time

import torch

from specnoise.config import ASSETS_DIR, ModelConfig
from specnoise.models import load_model

ROUNDS = 60


def main() -> None:
    torch.set_num_threads(1)
    model = load_model(ModelConfig(name="small-code-msn", path=str(ASSETS_DIR / "models" / "small-code-msn"))).model
    ids = torch.randint(0, model.config.vocab_size, (1, 100), generator=torch.Generator().manual_seed(0))
    small = torch.arange(12)
    rows = torch.tensor([2, 5, 7])
    sees = torch.rand(11, 10) < 0.3
    ops = {
        "a + 1 (12 ints)": lambda out: small + 1,
        "index_select (12 ints)": lambda out: small.index_select(0, rows),
        "eq (12 ints)": lambda out: small == small,
        "(sees <= right).all(-1), 11 x 10": lambda out: (sees <= (small[:10] > 3)).all(-1),
        "~(sees & ~right).any(-1), 11 x 10": lambda out: ~(sees & ~(small[:10] > 3)).any(-1),
        "tolist (12 ints)": lambda out: small.tolist(),
        "torch.tensor(list of 12)": lambda out: torch.tensor(list(range(12))),
        "torch argmax, 1 row": lambda out: out[:1].argmax(-1),
        "numpy argmax, 1 row": lambda out: torch.from_numpy(out[:1].numpy().argmax(-1)),
        "torch argmax, 10 rows": lambda out: out.argmax(-1),
        "numpy argmax, 10 rows": lambda out: torch.from_numpy(out.numpy().argmax(-1)),
        "topk 10 of 3 rows": lambda out: out.index_select(0, rows).topk(10, dim=-1).indices,
    }
    print(f"small ops on the CPU after a forward of {model.config.num_hidden_layers} layers, hidden "
          f"{model.config.hidden_size}, vocabulary {model.config.vocab_size} (us, median of {ROUNDS})")
    print(f"{'op':36s} {'cold':>7s} {'second':>7s} {'warm':>7s}")
    with torch.inference_mode():
        for name, op in ops.items():
            cold, second, warm = [], [], []
            for _ in range(ROUNDS):
                out = model(ids, logits_to_keep=10).logits[0]
                start = time.perf_counter()
                op(out)
                cold.append(time.perf_counter() - start)
                out = model(ids, logits_to_keep=10).logits[0]
                _ = out[0, 0] + 1  # another op first: the dispatcher is warm, this op's own code is not
                start = time.perf_counter()
                op(out)
                second.append(time.perf_counter() - start)
                start = time.perf_counter()
                op(out)
                warm.append(time.perf_counter() - start)
            print(f"{name:36s} " + " ".join(f"{statistics.median(t) * 1e6:7.1f}" for t in (cold, second, warm)))


if __name__ == "__main__":
    main()
