"""How sure a speedup is: the paired bootstrap CI, AR's spread across repeats, the noise alarm, the calibration
against ``hf_greedy`` and the cost-model bound (AR's priced time over the decoder's).

Pure numpy over per-prompt seconds, so the measuring loop and the result writer share one definition:

* **speedup CI**: the speedup is AR's total seconds over the decoder's on the same prompts; its 95% interval
  resamples *prompts* with replacement (both decoders' seconds of a prompt move together: a paired bootstrap,
  seeded), because which prompts were asked is what varies most between runs, more than a repeat of one prompt;
* **ar_time_cv**: per prompt, the coefficient of variation of AR's per-token time across the R repeats, averaged
  over the prompts (None with one repeat): how much the machine itself moved while the job ran;
* **timing_noisy**: the CI reaches beyond +-15% of the speedup, or ar_time_cv exceeds 20%: the row's speedup is
  not a measurement of the decoder but of the machine (None when neither can be judged: one prompt, one repeat);
* **cost bound**: a step that verifies q tokens and accepts MAT on average can be at most MAT x t(1) / t(q) times
  faster than AR's steps, with t(q) the forward-cost curve measured on this machine (bench/bound.py); both pay the
  same prompts' prefills, so the generation is at most AR's priced time over the decoder's, prefills included; and
  never faster than MAT itself, so a row above its MAT is flagged as impossible for a real measurement.
"""

from __future__ import annotations

import numpy as np

CI_LEVEL = 0.95
NOISY_CI = 0.15  # half-width of the CI, relative to the speedup, beyond which a row is noise
NOISY_CV = 0.20  # AR's per-token time across repeats
CALIBRATION = (0.7, 1.5)  # hf_greedy vs our AR: the same work, so a ratio outside this says the timing is off
ADVICE = ("timing_noisy rows: their speedup is within this machine's timing noise, not a property of the decoder. "
          "Run on a quiet machine (nothing else on its cores or GPU), pin benchmark.threads (1 on a shared CPU), "
          "and raise benchmark.repeats (3 or more) or the number of prompts (benchmark.limit).")


def speedup_ci(ar_seconds, seconds, resamples: int = 2000, seed: int = 0) -> tuple[float | None, float | None]:
    """95% percentile interval of sum(ar) / sum(mine) over prompts resampled with replacement (pairs kept); None
    with fewer than two prompts, where resampling prompts says nothing."""
    ar, mine = np.asarray(ar_seconds, dtype=float), np.asarray(seconds, dtype=float)
    if len(ar) < 2:
        return None, None
    picks = np.random.default_rng(seed).integers(0, len(ar), size=(resamples, len(ar)))
    ratios = ar[picks].sum(axis=1) / np.maximum(mine[picks].sum(axis=1), 1e-12)
    low, high = np.quantile(ratios, [(1 - CI_LEVEL) / 2, (1 + CI_LEVEL) / 2])
    return float(low), float(high)


def time_cv(per_token_repeats: list[list[float]]) -> float | None:
    """Mean over prompts of the coefficient of variation (sample std / mean) of one prompt's per-token time across
    its repeats; None with fewer than two repeats."""
    rows = [r for r in per_token_repeats if len(r) >= 2]
    if not rows:
        return None
    times = np.asarray(rows, dtype=float)
    return float(np.mean(times.std(axis=1, ddof=1) / np.maximum(times.mean(axis=1), 1e-12)))


def timing_noisy(speedup: float, low: float | None, high: float | None, cv: float | None) -> bool | None:
    wide = None if low is None else (high > speedup * (1 + NOISY_CI) or low < speedup * (1 - NOISY_CI))
    shaky = None if cv is None else cv > NOISY_CV
    if wide is None and shaky is None:
        return None
    return bool(wide or shaky)


def noise_reasons(rows: list[dict]) -> str:
    """Why rows were flagged noisy (the two tests of ``timing_noisy``), counted: one clause each."""
    wide = sum(r.get("speedup_ci_low") is not None and r["speedup_ci_low"] == r["speedup_ci_low"] and
               (r["speedup_ci_high"] > r["speedup"] * (1 + NOISY_CI) or r["speedup_ci_low"] < r["speedup"] *
                (1 - NOISY_CI)) for r in rows)
    shaky = sum((r.get("ar_time_cv") or 0) > NOISY_CV for r in rows)
    reasons = [f"{wide} with a 95% CI wider than +-{NOISY_CI:.0%} of the speedup: too few prompts (benchmark.limit) "
               "for how much the speedup differs between them"] if wide else []
    if shaky:
        reasons.append(f"{shaky} where AR's time moved more than {NOISY_CV:.0%} between repeats: a busy machine")
    return "; ".join(reasons) or "see timing_noisy"


def calibration_warning(rows: list[dict]) -> str | None:
    """hf_greedy does AR's work through ``generate()``: its speedup over our AR far from 1 means the timing (or an
    engine) is off, whatever the other rows say."""
    peer = next((r for r in rows if r["decoder"] == "hf_greedy" and r["category"] == "all"), None)
    if peer is None or CALIBRATION[0] <= peer["speedup"] <= CALIBRATION[1]:
        return None
    return (f"hf_greedy runs at {peer['speedup']:.2f}x our AR although both decode greedily one token per forward "
            f"(expected within {CALIBRATION[0]}-{CALIBRATION[1]}x): the timings of this job are not trustworthy; "
            "see timing_noisy")


def explain(name: str, mat: float, block: float | None, ratio: float | None, bound: float | None,
            speedup: float, draft_ratio: float = 0.0, prefill_share: float = 0.0) -> str:
    """One line a reader understands: what the decoder accepts, what its forwards cost here, and what follows.
    ``ratio``: a step's priced cost over a one-token forward, ``draft_ratio`` of it in draft-model forwards,
    ``prefill_share``: AR's prefills' share of its priced time (a decoder pays them too: the bound is nearer 1 than
    MAT over the ratio)."""
    if block is None or ratio is None or bound is None:
        return f"{name} accepts {mat:.2f} tokens per target forward (no cost curve measured)"
    step = f"a step (a forward of {block:.1f} tokens and its drafting)" if draft_ratio else \
        f"a forward of {block:.1f} tokens"
    head = f"{name} accepts {mat:.2f} tokens per forward, {step} costs {ratio:.2f}x one token"
    if draft_ratio:
        head += f", {draft_ratio:.2f}x of it in the draft model"
    if prefill_share >= 0.005 and name != "ar":
        head += f", and the prompts' prefill takes {prefill_share:.0%} of AR's time"
    if name == "ar":
        return f"{head}: the baseline"
    if bound < 1:
        return f"{head}: drafting cannot pay here (at best {bound:.2f}x AR)"
    share = speedup / bound
    tail = "" if share >= 0.9 else ": host work, the draft model or the machine's load take the rest"
    return f"{head}: at best {bound:.2f}x AR, measured {speedup:.2f}x ({share:.0%} of it){tail}"


def losses(slower: int | None, units: int, worst: str | None, speedup: float | None, noun: str) -> str:
    """The ``explain`` line's tail: on how many of the ``units`` timed prompts (or groups: ``noun``) the decoder was
    slower than AR, and the slowest, ``worst``, at ``speedup`` (None for AR's own row)."""
    if not slower or units < 2:
        return ""
    return f"; slower than AR on {slower} of {units} {noun} (the slowest: {worst}, {speedup:.2f}x)"


def cost_bound(ar_seconds: float | None, seconds: float | None) -> float | None:
    """The most a decoder can gain over AR: AR's priced time for the same prompts and new tokens over the decoder's
    (bench/bound.py: its steps of q verified tokens accepting MAT of them, its drafting and its prefills)."""
    if ar_seconds is None or seconds is None or seconds <= 0:
        return None
    return ar_seconds / seconds
