"""Two copies of a batch's KV cache, each timed as it is now against the form it replaced, side by side (2026-11-30):

- **a drop**: finished rows leave the dynamic engine's cache, ``BatchKV._drop`` gathering the live rows of every layer:
  by ``index_select`` now, by advanced indexing (``keys[index]``) before. AR and TR-Jacobi with ``decoder.auto=true``
  on the first 16 HumanEval problems as one batch (the rows end at different steps).
- **a left-out forward's cache**: a draft forward that only some rows ask for runs over theirs alone
  (``BatchKV._rows_cache``): the layers made empty and handed the gathered rows now; before, a ``DynamicCache`` built
  from the gathered rows, which concatenates them onto an empty tensor (a second copy). Faithful Ouroboros in groups
  of ``--batch`` (4) of the same 16 problems.

64 new tokens, fp32, one thread, the shipped small-code-msn (+ small-code-draft); one untimed generation, then
``--repeats`` generations per form, alternating. Per form: the calls per generation, ms per call, and their share of
the generations' time; every generation's tokens equal between the forms.

Usage: python experiments/batch-scaling/cache_copies.py [--batch 4] [--repeats 3]
"""

from __future__ import annotations

import time

from row_host import cli, humaneval_batch  # (run as a script: its folder is on the path)
from transformers.cache_utils import DynamicCache

from specnoise.config import ASSETS_DIR, DECODER_SCHEMAS, ModelConfig
from specnoise.decoding import base, batch
from specnoise.models import load_model


def drop_before(self) -> None:
    """``BatchKV._drop`` on the dynamic engine as it was: the live rows gathered by advanced indexing."""
    live = sorted(r for r in self.at if r not in self.done)
    for r in [r for r in self.at if r in self.done]:
        del self.at[r]
    self.done.clear()
    if not self.phys:
        self.at = {r: i for i, r in enumerate(live)}
        return
    index = batch.upload([self.at[r] for r in live], self.device)
    for layer in self.cache.layers:
        layer.keys, layer.values = layer.keys[index], layer.values[index]
    self.at = {r: i for i, r in enumerate(live)}


def rows_cache_before(self, index):
    """``BatchKV._rows_cache`` as it was: a DynamicCache built from the gathered rows."""
    return DynamicCache(ddp_cache_data=[(layer.keys[index], layer.values[index]) for layer in self.cache.layers])


def compare(label: str, attr: str, before, run, repeats: int) -> None:
    """``run()`` (one generation, returning its tokens) with ``BatchKV.attr`` as now and as ``before``, alternating."""
    now = getattr(batch.BatchKV, attr)
    spent = {"now": [0.0, 0, 0.0], "before": [0.0, 0, 0.0]}  # seconds in the calls, calls, generation seconds
    tokens = {}

    def timed(fn, form):
        def wrapper(self, *args):
            start = time.perf_counter()
            try:
                return fn(self, *args)
            finally:
                spent[form][0] += time.perf_counter() - start
                spent[form][1] += 1
        return wrapper

    run()  # warm-up
    try:
        for i in range(2 * repeats):
            form = ("now", "before")[i % 2]
            setattr(batch.BatchKV, attr, timed(now if form == "now" else before, form))
            start = time.perf_counter()
            tokens.setdefault(form, []).append(run())
            spent[form][2] += time.perf_counter() - start
    finally:
        setattr(batch.BatchKV, attr, now)
    same = tokens["now"] == tokens["before"]
    for form, (inside, calls, total) in spent.items():
        print(f"| {label} | {form} | {calls / repeats:.0f} | {1e3 * inside / max(calls, 1):.2f} | "
              f"{inside / total:.1%} | {same} |")


def main(names: list[str], rows: int, repeats: int) -> None:
    target, prompts = humaneval_batch(16)
    draft = load_model(ModelConfig(name="small-code-draft", path=str(ASSETS_DIR / "models" / "small-code-draft")))
    print(f"humaneval, the first 16 problems, 64 new tokens, {repeats} generations per form, alternating\n")
    print("| decoder: the copy | form | calls per generation | ms per call | share of the time | same tokens |")
    print("|---|---|---|---|---|---|")
    for name in ("ar", "tr_jacobi"):
        decoder = base.build_decoder(DECODER_SCHEMAS[name](auto=name != "ar"), target)
        compare(f"{name} (B = 16): a drop", "_drop", drop_before,
                lambda d=decoder: [o.tokens for o in d.generate_batch(prompts, 64)], repeats)
    decoder = base.build_decoder(DECODER_SCHEMAS["ouroboros"](), target, draft)
    # each generation from an empty phrase pool: the forms then run the same forwards
    compare(f"ouroboros (B = {rows}): a left-out forward's cache", "_rows_cache", rows_cache_before,
            lambda: decoder.reset_history() or [o.tokens for g in range(0, 16, rows)
                                                for o in decoder.generate_batch(prompts[g:g + rows], 64)], repeats)


if __name__ == "__main__":
    cli(main, None, batch=4, repeats=3)
