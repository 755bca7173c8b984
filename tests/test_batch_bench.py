"""benchmark.batch_size: prompts decoded in groups by every decoder and AR, per-prompt rows against AR at batch 1,
the batched Hugging Face peers, the batch-1-only peers skipped with a note, batch size as a report axis.

Tiny saved models (tests/helpers_models.py) and the tiny random models of two families (conftest.py), no mocks.
The decoders' own ``generate_batch`` is whatever base.py holds (a sequential placeholder until the batched
verifier lands); these tests hold the benchmark's side of the contract.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from conftest import prompts as random_prompts
from helpers_models import save_tiny_model, save_tiny_pair, write_jsonl
from specnoise.bench import timing
from specnoise.bench.measure import REFERENCE
from specnoise.bench.runner import batch_skips, decoder_configs, run_benchmark, set_up
from specnoise.config import DECODER_SCHEMAS, BenchmarkConfig, ConfigError, UserError, config_dir
from specnoise.decoding.base import Decoder, build_decoder
from specnoise.report import build_report

PROMPTS = [
    {"text": "def add(a, b):", "cat": "code"},
    {"text": ["Translate German to English: Der Hund schläft.", "Now say it again."], "cat": "prose"},
    {"text": "Summarize the article: the quick brown fox jumps over the lazy dog, twice.", "cat": "prose"},
    {"text": "for i in range(10):", "cat": "code"},
]


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, Path]:
    return save_tiny_pair(tmp_path_factory.mktemp("models"))


@pytest.fixture(scope="module")
def prompt_file(tmp_path_factory) -> Path:
    return write_jsonl(tmp_path_factory.mktemp("data") / "prompts.jsonl", PROMPTS)


def configure(models, prompt_file, *overrides):
    base = [f"model.path={models['target']}", "logger=none", "benchmark.max_new_tokens=8", "benchmark.warmup=0",
            "benchmark=jsonl", f"benchmark.path={prompt_file}", "benchmark.prompt_field=text",
            "benchmark.category_field=cat", "benchmark.cost_bound=false"]
    with initialize_config_dir(config_dir=str(config_dir()), version_base="1.3"):
        cfg = compose("config", overrides=base + list(overrides))
    return OmegaConf.to_object(cfg), cfg


def run(models, prompt_file, tmp_path, *overrides):
    conf, cfg = configure(models, prompt_file, *overrides)
    path = run_benchmark(conf, cfg, tmp_path)
    results = json.loads(path.read_text())
    per_prompt = [json.loads(line) for line in (tmp_path / "per_prompt.jsonl").read_text().splitlines()]
    return results, per_prompt


@pytest.fixture
def batch_calls(monkeypatch) -> list[tuple[str, int]]:
    """Every ``generate_batch`` call of the job: (decoder, prompts) and, with rows refilled, (decoder, prompts,
    rows)."""
    calls: list[tuple] = []
    real = Decoder.generate_batch

    def spy(self, prompts, max_new_tokens, seed=None, slots=None):
        calls.append((self.name, len(prompts)) + ((slots,) if slots is not None else ()))
        return real(self, prompts, max_new_tokens, seed, slots)

    monkeypatch.setattr(Decoder, "generate_batch", spy)
    return calls


# ------------------------------------------------------------------------------------------ config
@pytest.mark.parametrize("bad", [0, -2])
def test_batch_size_is_validated(bad):
    with pytest.raises(ConfigError, match="benchmark.batch_size: got .*must be an integer >= 1"):
        BenchmarkConfig(batch_size=bad)
    assert BenchmarkConfig().batch_size == 1


def test_batch_size_from_the_command_line_is_validated(models, prompt_file):
    with pytest.raises(Exception, match="batch_size"):
        configure(models, prompt_file, "benchmark.batch_size=0")


# ------------------------------------------------------------------------------------------ the runner
def test_continuous_batching_queues_each_group_for_b_rows(models, prompt_file, tmp_path, batch_calls):
    """``benchmark.queue=Q``: groups of Q prompts, each decoded by B refilled rows; every prompt lossless against AR
    at batch 1, timed by its own share (not the group's equal one), and the CI resamples prompts."""
    results, per_prompt = run(models, prompt_file, tmp_path, "decoder=jacobi", "decoders=[pld]",
                              "benchmark.batch_size=2", "benchmark.queue=3", "benchmark.group_by_length=false")
    for name in ("ar", "jacobi", "pld"):  # group [0, 1, 2] for two rows, the second turn, group [3]
        assert [c[1:] for c in batch_calls if c[0] == name] == [(3, 2), (1, 2), (1, 2)]
    for r in per_prompt:
        assert r["identical_to_ar"] is True and r["batch_size"] == (1 if r["decoder"] == REFERENCE else 2)
    first_group = [r for r in per_prompt if r["decoder"] == "jacobi" and r["turn"] == 0 and r["id"] in "012"]
    assert len({round(r["seconds"], 12) for r in first_group}) == 3 and all(r["seconds"] > 0 for r in first_group)
    rows = {(r["decoder"], r["category"]): r for r in results["rows"]}
    assert rows[("jacobi", "all")]["lossless_fraction"] == 1.0


def test_groups_of_b_with_a_partial_last_group(models, prompt_file, tmp_path, batch_calls):
    """4 prompts at B = 3: groups [0, 1, 2] and [3]; the two-turn prompt's second turn is a batch of its own;
    AR at batch 1 (``ar_bs1``) is the reference, and every row is lossless against it."""
    results, per_prompt = run(models, prompt_file, tmp_path, "decoder=jacobi", "decoders=[pld]",
                              "benchmark.batch_size=3", "benchmark.group_by_length=false")
    # turn 0 of group 0 (3 rows), turn 1 of the two-turn prompt (1 row), group 1 (1 row); per batched decoder
    for name in ("ar", "jacobi", "pld"):
        assert [n for n, _ in batch_calls if n == name] == [name] * 3
        assert [rows for n, rows in batch_calls if n == name] == [3, 1, 1]
    assert {r["decoder"] for r in per_prompt} == {"ar", "jacobi", "pld", REFERENCE}
    assert len(per_prompt) == 5 * 4  # five prompt turns, four runs
    for r in per_prompt:
        assert r["batch_size"] == (1 if r["decoder"] == REFERENCE else 3)
        full = r["decoder"] != REFERENCE and r["id"] in "012" and r["turn"] == 0
        assert r["group_rows"] == (3 if full else 1)  # the last group and the second turn: one row each
        assert r["identical_to_ar"] is True and r["first_divergence"] is None
    # the group's rows share its time equally
    first_group = [r for r in per_prompt if r["decoder"] == "jacobi" and r["turn"] == 0 and r["id"] in "012"]
    assert len({round(r["seconds"], 12) for r in first_group}) == 1

    rows = {(r["decoder"], r["category"]): r for r in results["rows"]}
    assert set(rows) == {(d, c) for d in ("ar", "jacobi", "pld", REFERENCE) for c in ("code", "prose", "all")}
    for (name, _), row in rows.items():
        assert row["batch_size"] == (1 if name == REFERENCE else 3)
        assert row["lossless_fraction"] == 1.0 and row["mismatch_fraction"] == 0
        assert row["tokens_per_second"] == pytest.approx(row["new_tokens"] / row["seconds"])
    ar, bs1, jacobi = rows[("ar", "all")], rows[(REFERENCE, "all")], rows[("jacobi", "all")]
    assert ar["speedup"] == 1.0 and bs1["speedup"] == 1.0 and bs1["speedup_vs_bs1_ar"] == 1.0
    assert jacobi["speedup"] == pytest.approx(ar["seconds"] / jacobi["seconds"])  # against AR at the same B
    assert jacobi["speedup_vs_bs1_ar"] == pytest.approx(bs1["seconds"] / jacobi["seconds"])
    assert ar["speedup_vs_bs1_ar"] == pytest.approx(bs1["seconds"] / ar["seconds"])
    assert results["meta"]["batch_size"] == 3 and results["meta"]["skipped_decoders"] == {}
    # the CI resamples the two groups (a group's prompts share one timing), not the four prompts
    def group_seconds(name):
        return [sum(r["seconds"] for r in per_prompt if r["decoder"] == name and (r["id"] in "012") == first)
                for first in (True, False)]
    ci = timing.speedup_ci(group_seconds("ar"), group_seconds("jacobi"), 2000, 0)
    assert (jacobi["speedup_ci_low"], jacobi["speedup_ci_high"]) == pytest.approx(ci)
    # ... and names the slowest of them as a group
    slowest = min((0, 1), key=lambda g: group_seconds("ar")[g] / group_seconds("jacobi")[g])
    assert jacobi["units"] == 2 and jacobi["worst_unit"] == f"group {slowest}"
    assert jacobi["timing_note"] is None and bs1["timing_note"] is None
    prose = rows[("jacobi", "prose")]  # both prose prompts sit in group 0, with a code prompt
    assert prose["speedup_ci_low"] is None and prose["timing_noisy"] is None
    assert prose["timing_note"].startswith("timed in 1 batch: no speedup CI")
    assert "decoded in batches with other categories' prompts" in prose["timing_note"]
    assert rows[("ar", "prose")]["timing_note"] is None
    meta = results["meta"]
    assert meta["peak_rss_mib"] >= meta["peak_rss_before_timing_mib"] > 0


def test_one_group_has_no_ci_and_says_why(models, prompt_file, tmp_path, capsys):
    """All prompts in one batch: one timing, nothing to resample, so no CI and no CI verdict (never a zero-width
    interval that looks certain)."""
    results, _ = run(models, prompt_file, tmp_path, "decoder=pld", "benchmark.batch_size=4", "benchmark.limit=2")
    pld = next(r for r in results["rows"] if r["decoder"] == "pld" and r["category"] == "all")
    assert pld["speedup_ci_low"] is None and pld["speedup_ci_high"] is None and pld["timing_noisy"] is None
    assert pld["timing_note"].startswith("timed in 1 batch: no speedup CI")
    assert "timed in 1 batch" in capsys.readouterr().out


def test_groups_of_similar_length_by_default(models, prompt_file, tmp_path, batch_calls):
    """benchmark.group_by_length (the default): the groups are the prompts sorted by length, here the two shortest
    and the two longest, timed together; every row's tokens and forwards are those of the dataset-order job."""
    conf, _ = configure(models, prompt_file, "decoder=pld")
    assert conf.benchmark.group_by_length
    setup = set_up(conf, None)
    lengths = {s.id: len(setup.encode(s, [])) for s in setup.samples}
    order = sorted(lengths, key=lambda i: (lengths[i], int(i)))
    assert order != sorted(lengths, key=int)  # the data's order is not its length order: the test can tell them apart
    expected = [set(order[:2]), set(order[2:])]

    _, grouped = run(models, prompt_file, tmp_path / "grouped", "decoder=pld", "benchmark.batch_size=2")
    # a group's rows share its time: turn 0's shared times say which prompts were decoded together
    shared: dict[float, set[str]] = {}
    for r in grouped:
        if r["decoder"] == "pld" and r["turn"] == 0:
            shared.setdefault(round(r["seconds"], 12), set()).add(r["id"])
    assert sorted(shared.values(), key=sorted) == sorted(expected, key=sorted)
    firsts = [rows for n, rows in batch_calls if n == "pld"]
    assert firsts[0] == 2  # the shortest group first
    # each batched row names its group, the shortest first; AR at batch 1 none
    groups = {r["id"]: r["group"] for r in grouped if r["decoder"] == "pld"}
    assert {i: groups[i] for i in order} == {i: (0 if i in expected[0] else 1) for i in order}
    assert all(r["group"] is None for r in grouped if r["decoder"] == REFERENCE)

    _, in_order = run(models, prompt_file, tmp_path / "in-order", "decoder=pld", "benchmark.batch_size=2",
                      "benchmark.group_by_length=false")
    key = lambda r: (r["decoder"], r["id"], r["turn"])  # noqa: E731
    same = {key(r): (r["tokens"], r["target_forwards"]) for r in in_order}
    assert {key(r): (r["tokens"], r["target_forwards"]) for r in grouped} == same


def test_batch_size_one_is_the_unbatched_job(models, prompt_file, tmp_path, batch_calls):
    """B = 1: no generate_batch, no ar_bs1 rows, the same tokens and forwards per prompt as at B = 3 (the rows of a
    batched job equal AR-alone's and each decoder's own batch-1 run), speedup_vs_bs1_ar = speedup."""
    one, per_one = run(models, prompt_file, tmp_path / "one", "decoder=jacobi", "decoders=[pld]")
    assert batch_calls == []
    assert {r["decoder"] for r in one["rows"]} == {"ar", "jacobi", "pld"}
    for row in one["rows"]:
        assert row["batch_size"] == 1 and row["speedup_vs_bs1_ar"] == pytest.approx(row["speedup"])
    assert all(r["batch_size"] == 1 for r in per_one)
    _, per_three = run(models, prompt_file, tmp_path / "three", "decoder=jacobi", "decoders=[pld]",
                       "benchmark.batch_size=3")
    key = lambda r: (r["decoder"], r["id"], r["turn"])  # noqa: E731
    three = {key(r): r for r in per_three}
    for r in per_one:
        other = three[key(r)]
        assert (other["tokens"], other["target_forwards"]) == (r["tokens"], r["target_forwards"])
        assert three[(REFERENCE, r["id"], r["turn"])]["tokens"] == r["tokens"]


@pytest.mark.parametrize("by_length", ["true", "false"])
def test_a_batched_run_continues_group_by_group(models, prompt_file, tmp_path, by_length):
    """A continued batched run reads the finished groups back and measures only the rest (the groups are the same
    again: dataset order, or length order)."""
    grouping = f"benchmark.group_by_length={by_length}"
    results, per_prompt = run(models, prompt_file, tmp_path, "decoder=ar", "benchmark.batch_size=2", grouping)
    path = tmp_path / "per_prompt.jsonl"
    # the group of prompt "0": the prompts whose batched turn 0 shares its time
    time_of = {r["id"]: round(r["seconds"], 12) for r in per_prompt if r["decoder"] == "ar" and r["turn"] == 0}
    group = {i for i, t in time_of.items() if t == time_of["0"]}
    assert len(group) == 2 and (group == {"0", "1"}) == (by_length == "false")
    kept = [r for r in per_prompt if r["id"] in group]
    path.write_text("".join(json.dumps(r) + "\n" for r in kept))
    again, per_again = run(models, prompt_file, tmp_path, "decoder=ar", "benchmark.batch_size=2", grouping)
    assert again["progress"]["resumed"] == 2 and again["progress"]["prompts"] == 4
    assert sorted((r["decoder"], r["id"], r["turn"]) for r in per_again) == \
        sorted((r["decoder"], r["id"], r["turn"]) for r in per_prompt)


def test_sampling_at_b_above_one_runs_without_the_lossless_check(models, prompt_file, tmp_path):
    results, per_prompt = run(models, prompt_file, tmp_path, "decoder=pld", "decoder.temperature=0.8",
                              "benchmark.batch_size=2", "benchmark.limit=3")
    assert {r["decoder"] for r in results["rows"]} == {"ar", "pld", REFERENCE}
    assert all(r["lossless_fraction"] is None for r in results["rows"])
    # guesses as drafts: each prompt's tokens are compared with AR's at batch 1 (same seed), not asserted lossless
    assert all(isinstance(r["identical_to_ar"], bool) and r["batch_size"] in (1, 2) for r in per_prompt)
    assert all(r["sampling_check"] == "tokens" and r["identical_to_ar_fraction"] is not None for r in results["rows"])


def test_batch_1_only_peers_are_skipped_with_a_note(models, prompt_file, tmp_path, capsys):
    results, per_prompt = run(models, prompt_file, tmp_path, "decoder=hf_greedy", "decoders=[hf_pld,hf_assisted]",
                              "draft.name=tiny-draft", f"draft.path={models['draft']}", "benchmark.batch_size=2",
                              "benchmark.limit=2")
    assert {r["decoder"] for r in results["rows"]} == {"ar", "hf_greedy", REFERENCE}
    notes = results["meta"]["skipped_decoders"]
    assert set(notes) == {"hf_pld", "hf_assisted"} and all("batch size 1 only" in n for n in notes.values())
    out = capsys.readouterr().out
    assert "NOTE: hf_pld skipped at benchmark.batch_size=2" in out and "NOTE: hf_assisted skipped" in out
    rows = {(r["decoder"], r["category"]): r for r in results["rows"]}
    assert rows[("hf_greedy", "all")]["lossless_fraction"] == 1.0 and rows[("hf_greedy", "all")]["batch_size"] == 2


def test_only_skipped_decoders_asked_is_refused_before_loading(models, prompt_file):
    conf, _ = configure(models, prompt_file, "decoder=hf_assisted", "draft.name=tiny-draft",
                        f"draft.path={models['draft']}", "benchmark.batch_size=2", "model.path=/nonexistent/model")
    with pytest.raises(UserError, match="hf_assisted skipped at benchmark.batch_size=2.*nothing else is measured"):
        set_up(conf, None)  # before the (missing) model is looked for
    conf.decoders = ["jacobi"]  # something else measured: runs without it
    assert list(decoder_configs(conf)) == ["ar", "jacobi"]


def test_batch_skips_only_above_one(models, prompt_file):
    conf, _ = configure(models, prompt_file, "decoder=hf_pld")
    assert batch_skips(conf) == {}
    conf.benchmark.batch_size = 4
    assert list(batch_skips(conf)) == ["hf_pld"]


# ------------------------------------------------------------------------------------------ the peers
@pytest.mark.parametrize("name", ["hf_greedy", "hf_static"])
def test_batched_peers_equal_their_batch_one_tokens(target, name):
    """One left-padded generate() over prompts of different lengths gives each row its batch-1 tokens (fp32), one
    row stopping at EOS early included."""
    decoder = build_decoder(DECODER_SCHEMAS[name](), target)
    found_eos = False
    for seed in range(6):
        ps = random_prompts(3, seed=seed, min_len=2, max_len=20)
        alone = [decoder.generate(p, 16) for p in ps]
        together = decoder.generate_batch(ps, 16)
        assert [o.tokens for o in together] == [o.tokens for o in alone]
        assert [o.target_forwards for o in together] == [o.target_forwards for o in alone]
        assert all(o.batch_size == 3 and sum(o.accepted) == len(o.tokens) for o in together)
        assert len({o.seconds for o in together}) == 1  # equal shares of the group's time
        found_eos |= any(len(o.tokens) < 16 for o in alone) and len({len(o.tokens) for o in alone}) > 1
        if found_eos and len({len(p) for p in ps}) > 1:
            break
    assert found_eos, "no group with a row ending at EOS early among the seeds tried"


def test_batch_1_only_peer_refuses_a_batch(target, draft):
    decoder = build_decoder(DECODER_SCHEMAS["hf_pld"](), target)
    with pytest.raises(Exception, match="batch size 1 only"):
        decoder.generate_batch(random_prompts(2), 8)
    assert len(decoder.generate_batch(random_prompts(1), 8)) == 1


# ------------------------------------------------------------------------------------------ the report
def test_batch_size_sweep_reports_as_an_axis(models, prompt_file, tmp_path):
    for b in (1, 2):
        job = tmp_path / "sweep" / str(b)
        run(models, prompt_file, job, "decoder=pld", f"benchmark.batch_size={b}", "benchmark.limit=2")
        (job / ".hydra").mkdir()
        (job / ".hydra" / "overrides.yaml").write_text(f"- decoder=pld\n- benchmark.batch_size={b}\n")
    out = tmp_path / "report"
    md = build_report([tmp_path / "sweep"], out).read_text()
    assert (out / "sweep_benchmark.batch_size.png").is_file() and (out / "batch_scaling.png").is_file()
    import pandas as pd

    table = pd.read_csv(out / "report.csv")
    assert {"benchmark.batch_size", "batch_size", "speedup_vs_bs1_ar"} <= set(table.columns)
    assert "batch_size" in md


# ------------------------------------------------------------------------------------------ forward cost t(B·q)
def test_batched_forward_cost_curve(tmp_path):
    from specnoise.bench.batch_cost import main

    model = save_tiny_model(tmp_path / "model")
    md = main([f"model.path={model}", "--batch", "1,2", "--q", "1,4", "--repeats", "1", "--warmup", "0",
               "--cache-len", "8", "--out", str(tmp_path / "cost")])
    import pandas as pd

    df = pd.read_csv(tmp_path / "cost" / "batch_cost.csv")
    assert sorted(zip(df.batch_size, df.q)) == [(1, 1), (1, 4), (2, 1), (2, 4)]
    assert (df.tokens == df.batch_size * df.q).all() and (df.ms > 0).all()
    assert (df[df.q == 1].ratio_to_bq1 == 1.0).all()
    assert (tmp_path / "cost" / "batch_cost.png").is_file() and "t(B·q)" in md.read_text()
    assert torch.get_num_threads() == 1


def test_wandb_tags_a_batched_run(models, prompt_file):
    from specnoise.bench.runner import TRACKED
    from specnoise.tracking import run_tags

    conf, _ = configure(models, prompt_file, "decoder=pld")
    assert not any(t.startswith("batch_size:") for t in run_tags(conf))
    conf.benchmark.batch_size = 8
    assert "batch_size:8" in run_tags(conf)
    assert {"batch_size", "speedup_vs_bs1_ar"} <= set(TRACKED)  # <decoder>/batch_size in every run's summary


def test_the_warm_up_leaves_no_history_in_a_batchs_row_slots(target, draft):
    """Ouroboros keeps a phrase pool per row slot: the batched warm-up's must not help the measured prompts."""
    from specnoise.bench.measure import warm_up

    decoder = build_decoder(DECODER_SCHEMAS["ouroboros"](), target, draft)
    warm_up({"ouroboros": decoder}, random_prompts(3, seed=5, min_len=8), 24, 1, sizes=(3,))
    assert len(decoder.row_slots) == 3
    assert not decoder.drafter.pool and not any(row.drafter.pool for row in decoder.row_slots)


def test_the_warm_up_shows_each_decoder_and_ends_on_a_signal(target):
    """The warm-up's generations come before the first timed one, and compiling engines spend minutes there: the
    progress bar names the decoder warming up (each once: REFERENCE is AR again), and a signal ends the warm-up
    between two decoders instead of after all of them."""
    from specnoise.bench.measure import warm_up
    from specnoise.bench.progress import Stop

    class Bar:  # what the runner's tqdm bar is told
        def __init__(self):
            self.said = []

        def set_postfix_str(self, text):
            self.said.append(text)

    ar, pld = (build_decoder(DECODER_SCHEMAS[name](), target) for name in ("ar", "pld"))
    bar, stop, ran = Bar(), Stop(), []
    for name, decoder in (("ar", ar), ("pld", pld)):
        generate = decoder.generate
        decoder.generate = lambda *a, _g=generate, _n=name, **k: ran.append(_n) or _g(*a, **k)
    prompts = random_prompts(1, seed=3, min_len=8)
    warm_up({"ar": ar, "pld": pld, REFERENCE: ar}, prompts, 8, 1, bar=bar, stop=stop)
    assert bar.said == ["warm-up ar", "warm-up pld"] and ran == ["ar", "pld"]
    ran.clear()
    generate = ar.generate
    ar.generate = lambda *a, **k: (setattr(stop, "signal", "SIGTERM"), generate(*a, **k))[1]  # a signal meanwhile
    warm_up({"ar": ar, "pld": pld}, prompts, 8, 1, bar=bar, stop=stop)
    assert ran == ["ar"]


def test_batched_wrap_up_says_each_stage_and_times_no_probe_it_discards(models, prompt_file, tmp_path, monkeypatch,
                                                                          caplog):
    from specnoise.bench import bound

    def no_timing(*args, **kwargs):
        raise AssertionError("t(q) timed at batch 1 for a batched job: its rows could not use it")

    monkeypatch.setattr(bound, "Curve", no_timing)  # the curve a batch-1 bound would probe
    with caplog.at_level("INFO", logger="specnoise"):
        results, _ = run(models, prompt_file, tmp_path, "decoder=pld", "benchmark.batch_size=2", "benchmark.limit=2",
                         "benchmark.cost_bound=true")
    said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("after the timing: ")]
    assert said == ["after the timing: scoring the answers", "after the timing: the reference NLL",
                    "after the timing: the divergence audit", "after the timing: each decoder's verify block"]
    pld = next(r for r in results["rows"] if r["decoder"] == "pld" and r["category"] == "all")
    assert pld["verify_block"] >= 1.0 and pld["cost_bound"] is None
