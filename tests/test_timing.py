"""How sure a speedup is: bootstrap CI, AR's spread across repeats, the noise alarm, calibration, the cost bound,
and the result rows built from them (measured rows are made of real DecodeOutputs with chosen seconds)."""

from __future__ import annotations

import pytest

from specnoise.bench import timing
from specnoise.bench.datasets import Sample
from specnoise.bench.measure import Turn, order
from specnoise.bench.rows import Measured, summary_rows
from specnoise.config import BenchmarkConfig, Config, ConfigError, ModelConfig, PLDConfig
from specnoise.decoding.base import DecodeOutput


def test_bootstrap_ci_is_seeded_and_brackets_the_ratio_of_totals():
    ar, mine = [1.0, 2.0, 1.5, 3.0, 2.5], [0.5, 1.1, 0.7, 1.4, 1.3]
    low, high = timing.speedup_ci(ar, mine, seed=7)
    assert (low, high) == timing.speedup_ci(ar, mine, seed=7)  # seeded: the same job gives the same CI
    assert low < sum(ar) / sum(mine) < high
    steady = timing.speedup_ci(ar, [a / 2 for a in ar])  # every prompt exactly 2x: no doubt at all
    assert steady == pytest.approx((2.0, 2.0))
    assert timing.speedup_ci([1.0], [0.5]) == (None, None)  # one prompt: resampling prompts says nothing


def test_time_cv_is_the_mean_spread_across_repeats():
    assert timing.time_cv([[1.0], [2.0]]) is None  # one repeat
    assert timing.time_cv([[1.0, 1.0], [2.0, 2.0]]) == 0.0
    assert timing.time_cv([[1.0, 3.0], [2.0, 2.0]]) == pytest.approx((2 ** 0.5 / 2) / 2)  # (0.707 + 0) / 2


@pytest.mark.parametrize("low, high, cv, noisy", [
    (0.95, 1.05, 0.05, False), (0.80, 1.05, None, True), (0.95, 1.20, None, True), (0.95, 1.05, 0.25, True),
    (None, None, 0.1, False), (None, None, None, None)])
def test_noise_alarm_thresholds(low, high, cv, noisy):
    assert timing.timing_noisy(1.0, low, high, cv) is noisy


def test_calibration_warning_only_outside_the_band():
    def rows(speedup):
        return [{"decoder": "hf_greedy", "category": "all", "speedup": speedup}]

    assert timing.calibration_warning(rows(1.2)) is None and timing.calibration_warning([]) is None
    assert "3.35x our AR" in timing.calibration_warning(rows(3.35))
    assert timing.calibration_warning(rows(0.5)) is not None


def test_ab_ba_order():
    names = ["ar", "pld", "jacobi"]
    assert [order(names, i + r)[0] for i in (0, 1) for r in (0, 1, 2)] == ["ar", "pld", "ar", "pld", "ar", "pld"]
    assert order(names, 1) == ["pld", "jacobi", "ar"]


def turn(seconds: list[float], tokens: int = 10, forwards: int = 10, target: float | None = None) -> Turn:
    out = DecodeOutput(list(range(tokens)), forwards, 0, [tokens // forwards] * forwards, seconds[0])
    return Turn([1, 2, 3], out, "x", seconds, [target] * len(seconds), [None] * len(seconds),
                [tokens] * len(seconds))


def measured(ar: list[list[float]], pld: list[list[float]], pld_forwards: int = 5, bounds=None,
             stat: str = "median") -> Measured:
    conf = Config(model=ModelConfig(name="m", path="/m"), data=None, decoder=PLDConfig(),
                  benchmark=BenchmarkConfig(name="jsonl", path="x.jsonl", repeats=len(ar[0]), repeat_stat=stat))
    samples = [Sample(str(i), "c", ["q"], None) for i in range(len(ar))]
    runs = {"ar": {s.id: [turn(t, target=sum(t) / len(t) * 0.8)] for s, t in zip(samples, ar)},
            "pld": {s.id: [turn(t, forwards=pld_forwards)] for s, t in zip(samples, pld)}}
    return Measured(conf, samples, runs, 10, lossless=True, model="m", bounds=bounds or {})


def test_a_prompts_time_is_its_repeats_by_the_chosen_statistic():
    """benchmark.repeat_stat: the middle repeat by wall time (the two middle ones' mean for an even count), the mean,
    or the fastest; target and draft seconds from the same repeats. A repeat slowed by other jobs moves the mean and
    the speedup with it, not the median's; an unknown statistic is refused with the choices."""
    t = Turn([1], DecodeOutput([1], 1, 0, [1], 1.0), "x", [1.0, 5.0, 1.2], [0.8, 4.0, 1.0], [0.1, 0.5, 0.1], [1] * 3)
    assert t.timed("median") == (1.2, 1.0, 0.1) and t.timed("min") == (1.0, 0.8, 0.1)
    assert t.timed("mean") == pytest.approx((2.4, 5.8 / 3, 0.7 / 3))
    four = Turn([1], DecodeOutput([1], 1, 0, [1], 1.0), "x", [4.0, 1.0, 3.0, 2.0], [None] * 4, [None] * 4, [1] * 4)
    assert four.timed("median") == (2.5, None, None)
    ar = [[1.0, 1.0, 3.0], [2.0, 2.0, 2.0]]  # one of AR's repeats three times slower
    pld = [[0.5, 0.5, 0.5], [1.0, 1.0, 1.0]]
    speedup = {stat: next(r["speedup"] for r in summary_rows(measured(ar, pld, stat=stat))
                          if (r["decoder"], r["category"]) == ("pld", "all")) for stat in ("median", "mean")}
    assert speedup["median"] == pytest.approx(3.0 / 1.5) and speedup["mean"] == pytest.approx((5 / 3 + 2) / 1.5)
    with pytest.raises(ConfigError, match="median, mean, min"):
        BenchmarkConfig(name="jsonl", path="x.jsonl", repeat_stat="max")


def test_rows_carry_ci_cv_noise_breakdown_and_bound():
    ar = [[1.0, 1.02], [2.0, 1.98], [1.5, 1.5]]
    m = measured(ar, [[0.5, 0.5], [1.0, 1.0], [0.75, 0.76]],
                 bounds={"ar": {"all": {"verify_block": 1.0, "t1_seconds": 0.01, "tq_seconds": 0.01,
                                        "ar_seconds": 0.2, "seconds": 0.2}},
                         "pld": {"all": {"verify_block": 3.0, "t1_seconds": 0.01, "tq_seconds": 0.0125,
                                         "ar_seconds": 0.2, "seconds": 0.125}}})
    rows = {(r["decoder"], r["category"]): r for r in summary_rows(m)}
    pld, base = rows[("pld", "all")], rows[("ar", "all")]
    assert pld["speedup"] == pytest.approx(4.5 / 2.255) and pld["repeats"] == 2
    assert pld["speedup_ci_low"] <= pld["speedup"] <= pld["speedup_ci_high"]
    assert pld["ar_time_cv"] == pytest.approx(timing.time_cv([[0.1, 0.102], [0.2, 0.198], [0.15, 0.15]]))
    assert pld["timing_noisy"] is False and base["speedup_ci_low"] == base["speedup_ci_high"] == 1.0
    assert base["target_seconds"] == pytest.approx(0.8 * 4.5) and base["other_seconds"] == pytest.approx(0.2 * 4.5)
    assert pld["target_seconds"] is None and pld["other_seconds"] is None  # not attributed: not guessed
    # the bound: AR's priced time over the decoder's (their prefills included), not MAT x t(1) / t(q) (1.6 here)
    assert pld["mean_accepted_tokens"] == 2.0 and pld["cost_bound"] == pytest.approx(0.2 / 0.125)
    assert base["cost_bound"] == pytest.approx(1.0)
    assert pld["speedup_exceeds_mat"] is False and base["speedup_exceeds_mat"] is False


def test_the_why_line_says_what_a_step_costs_and_how_much_of_it_is_drafting():
    bounds = {"ar": {"all": {"verify_block": 1.0, "t1_seconds": 0.01, "tq_seconds": 0.01, "ar_seconds": 0.3,
                             "seconds": 0.3, "prefill_share": 0.1}},
              "pld": {"all": {"verify_block": 3.0, "t1_seconds": 0.01, "tq_seconds": 0.04, "draft_seconds": 0.025,
                              "ar_seconds": 0.3, "seconds": 0.6, "prefill_share": 0.1}}}
    pld = next(r for r in summary_rows(measured([[1.0, 1.0]], [[0.5, 0.5]], bounds=bounds))
               if r["decoder"] == "pld" and r["category"] == "all")
    assert pld["cost_ratio"] == pytest.approx(4.0) and pld["cost_bound"] == pytest.approx(0.5)
    assert pld["why"].startswith("pld accepts 2.00 tokens per forward, a step (a forward of 3.0 tokens and its "
                                 "drafting) costs 4.00x one token, 2.50x of it in the draft model, and the prompts' "
                                 "prefill takes 10% of AR's time: drafting cannot pay here (at best 0.50x AR)")
    bounds["pld"]["all"]["draft_seconds"] = 0.0  # no draft model: a forward's cost
    pld = next(r for r in summary_rows(measured([[1.0, 1.0]], [[0.5, 0.5]], bounds=bounds))
               if r["decoder"] == "pld" and r["category"] == "all")
    assert "a forward of 3.0 tokens costs 4.00x one token, and the prompts' prefill" in pld["why"]
    assert "prefill" not in next(r for r in summary_rows(measured([[1.0, 1.0]], [[0.5, 0.5]], bounds=bounds))
                                 if r["decoder"] == "ar" and r["category"] == "all")["why"]


def test_a_row_names_the_prompts_it_lost_time_on_and_the_slowest():
    """A decoder 2x faster on three prompts and slower on two: the row counts the two, names the slower of them with
    its speedup, and the why line says so; AR's row names none, and a decoder faster everywhere none either."""
    ar = [[1.0], [1.0], [1.0], [1.0], [1.0]]
    rows = {(r["decoder"], r["category"]): r
            for r in summary_rows(measured(ar, [[0.5], [1.25], [0.5], [1.1], [0.5]]))}
    pld, base = rows["pld", "all"], rows["ar", "all"]
    assert pld["units"] == 5 and pld["slower_units"] == 2
    assert pld["worst_unit"] == "1" and pld["worst_unit_speedup"] == pytest.approx(0.8)
    assert pld["why"].endswith("; slower than AR on 2 of 5 prompts (the slowest: 1, 0.80x)")
    assert base["worst_unit"] is None and base["slower_units"] is None and "slower" not in base["why"]
    faster = next(r for r in summary_rows(measured(ar, [[0.5]] * 5)) if (r["decoder"], r["category"]) == ("pld", "all"))
    assert faster["slower_units"] == 0 and faster["worst_unit_speedup"] == pytest.approx(2.0)
    assert "slower" not in faster["why"]


def test_a_row_faster_than_its_mat_or_with_shaky_ar_is_flagged():
    fast = measured([[1.0, 1.0], [1.0, 1.0]], [[0.3, 0.3], [0.3, 0.3]])  # 3.3x with 2 tokens per forward
    pld = next(r for r in summary_rows(fast) if r["decoder"] == "pld" and r["category"] == "all")
    assert pld["speedup_exceeds_mat"] is True
    shaky = measured([[1.0, 1.6], [1.0, 0.6]], [[0.5, 0.5], [0.5, 0.5]])
    rows = summary_rows(shaky)
    assert all(r["timing_noisy"] for r in rows) and rows[0]["ar_time_cv"] > 0.2
