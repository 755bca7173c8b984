"""The benchmark runner on tiny saved models: files and their meanings, multi-turn, skips, scoring, the CLI."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from helpers_models import save_tiny_model, save_tiny_pair, tiny_tokenizer, write_jsonl
from specnoise.bench.audit import first_divergence
from specnoise.bench.datasets import dialogue_text, load_benchmark
from specnoise.bench.rows import sampled_drafts
from specnoise.bench.runner import decoder_configs, run_benchmark
from specnoise.config import DECODER_SCHEMAS, JacobiConfig, UserError, config_dir
from specnoise.data.templates import encode_prompt
from specnoise.decoding.base import DECODER_MODULES, decoder_class
from specnoise.generate import generate_once

PROMPTS = [
    {"text": "def add(a, b):", "cat": "code"},
    {"text": ["Translate German to English: Der Hund schläft.", "Now say it again."], "cat": "prose"},
    {"text": "Summarize the article: the quick brown fox.", "cat": "prose"},
    {"text": "for i in range(10):", "cat": "code"},
]


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """Tiny models gain nothing from intra-op threads, and on a shared 2-core machine two OpenMP threads that
    wait for each other make every matmul ~20x slower; restored afterwards for other test files."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def available(name: str) -> bool:
    try:
        decoder_class(name)
        return True
    except Exception:  # noqa: BLE001 - a decoder still being written is skipped, not failed
        return False


@pytest.fixture(scope="session")
def models(tmp_path_factory) -> dict[str, Path]:
    return save_tiny_pair(tmp_path_factory.mktemp("models"))


@pytest.fixture(scope="session")
def prompt_file(tmp_path_factory) -> Path:
    return write_jsonl(tmp_path_factory.mktemp("data") / "prompts.jsonl", PROMPTS)


def configure(models, *overrides):
    base = [f"model.path={models['target']}", "logger=none", "benchmark.max_new_tokens=8", "benchmark.warmup=0"]
    with initialize_config_dir(config_dir=str(config_dir()), version_base="1.3"):
        cfg = compose("config", overrides=base + list(overrides))
    return OmegaConf.to_object(cfg), cfg


def jsonl_args(prompt_file):
    return ["benchmark=jsonl", f"benchmark.path={prompt_file}", "benchmark.prompt_field=text",
            "benchmark.category_field=cat"]


def run(models, tmp_path, *overrides):
    conf, cfg = configure(models, *overrides)
    path = run_benchmark(conf, cfg, tmp_path)
    results = json.loads(path.read_text())
    per_prompt = [json.loads(line) for line in (tmp_path / "per_prompt.jsonl").read_text().splitlines()]
    return conf, results, per_prompt


def test_results_files_and_their_meanings(models, prompt_file, tmp_path, capsys):
    conf, results, per_prompt = run(models, tmp_path, "decoder=ar", *jsonl_args(prompt_file), "benchmark.warmup=1")
    assert results["config"]["benchmark"]["path"] == str(prompt_file)  # a plain dict of the composed config
    rows = {(r["decoder"], r["category"]): r for r in results["rows"]}
    assert set(rows) == {("ar", "code"), ("ar", "prose"), ("ar", "all")}
    every = rows[("ar", "all")]
    assert every["prompts"] == 4 and every["turns"] == 5 and every["model"] == "small-code-msn"
    assert every["draft"] is None and every["benchmark"] == "jsonl" and every["max_new_tokens"] == 8
    assert every["speedup"] == 1.0 and every["lossless_fraction"] == 1.0 and every["sb_speedup"] == 1.0
    assert every["task_score"] is None and every["score_metric"] is None  # jsonl has no scorer
    assert every["new_tokens"] == sum(r["new_tokens"] for r in per_prompt)
    assert every["target_forwards"] == sum(r["target_forwards"] for r in per_prompt)
    assert every["mean_accepted_tokens"] == pytest.approx(every["new_tokens"] / every["target_forwards"])
    assert every["seconds"] == pytest.approx(sum(r["seconds"] for r in per_prompt))
    assert every["tokens_per_second"] == pytest.approx(every["new_tokens"] / every["seconds"])
    assert rows[("ar", "code")]["prompts"] == 2 and rows[("ar", "prose")]["turns"] == 3

    assert len(per_prompt) == 5  # one row per prompt turn and decoder
    for r in per_prompt:
        assert set(r) >= {"id", "category", "turn", "decoder", "new_tokens", "target_forwards", "draft_forwards",
                          "seconds", "accepted", "identical_to_ar", "first_divergence", "output", "score"}
        assert 1 <= r["new_tokens"] <= 8 and sum(r["accepted"]) == r["new_tokens"]
        assert r["identical_to_ar"] is True and r["first_divergence"] is None and isinstance(r["output"], str)
    assert [(r["id"], r["turn"]) for r in per_prompt] == [("0", 0), ("1", 0), ("1", 1), ("2", 0), ("3", 0)]
    assert results["skipped"]["prompts"] == 0 and results["meta"]["max_new_tokens"] == 8
    assert not list(tmp_path.glob(".*.tmp"))  # atomic writes leave no temp files
    table = capsys.readouterr().out
    assert "| decoder" in table and "lossless" in table
    assert max(len(line) for line in table.splitlines() if line.startswith("|")) <= 120  # fits a terminal
    csv = pd.read_csv(tmp_path / "results.csv")  # every column of every row
    assert len(csv) == len(results["rows"]) and {"prompts", "ref_nll", "mismatch_fraction"} <= set(csv.columns)


def test_second_turn_is_asked_after_the_models_own_answer(models, prompt_file, tmp_path):
    conf, _, per_prompt = run(models, tmp_path, "decoder=ar", *jsonl_args(prompt_file))
    first, second = [r for r in per_prompt if r["id"] == "1"]
    sample = load_benchmark(conf.benchmark, conf.model.template)[1]
    tokenizer = tiny_tokenizer()
    text = dialogue_text(sample, conf.model.template, [first["output"].strip()], tokenizer)
    expected = encode_prompt(tokenizer, text)
    assert second["prompt_tokens"] == len(expected) > first["prompt_tokens"] + 3


DECODERS = [n for n in DECODER_MODULES if n != "ar"]


@pytest.mark.parametrize("name", DECODERS)
def test_every_decoder_is_lossless_through_the_runner(models, prompt_file, tmp_path, name):
    if not available(name):
        pytest.skip(f"decoder {name} not importable yet")
    draft = ["draft.name=tiny-draft", f"draft.path={models['draft']}"] if decoder_class(name).needs_draft else []
    _, results, per_prompt = run(models, tmp_path, f"decoder={name}", *draft, *jsonl_args(prompt_file),
                                 "benchmark.limit=2")  # one single-turn and one two-turn prompt
    mine = {r["category"]: r for r in results["rows"] if r["decoder"] == name}
    assert mine["all"]["lossless_fraction"] == 1.0 and mine["all"]["prompts"] == 2
    assert mine["all"]["speedup"] == pytest.approx(mine["all"]["ar_seconds"] / mine["all"]["seconds"])
    assert all(r["identical_to_ar"] for r in per_prompt)
    assert {r["decoder"] for r in per_prompt} == {"ar", name}


def test_several_decoders_in_one_job_share_the_budget(models):
    conf, _ = configure(models, "decoder=ar", "decoder.max_new_tokens=7", "decoder.seed=3", "decoders=[jacobi,ar]")
    configs = decoder_configs(conf)
    assert list(configs) == ["ar", "jacobi"]  # the AR baseline once, no duplicates
    assert all(c.max_new_tokens == 7 and c.seed == 3 for c in configs.values())
    assert isinstance(configs["jacobi"], JacobiConfig) and configs["jacobi"].draft_len == 4


def test_a_plus_auto_entry_times_the_drafter_with_auto_beside_its_faithful_setting(models, prompt_file, tmp_path):
    """decoders=[pld, pld+auto]: both in one job against one AR, the second with decoder.auto=true (its controller's
    record in meta), both lossless; the variant keeps the main decoder's own settings."""
    _, results, per_prompt = run(models, tmp_path, "decoder=pld", "decoder.num_pred_tokens=3",
                                 "decoders=[pld,pld+auto]", *jsonl_args(prompt_file), "benchmark.limit=2")
    rows = {r["decoder"]: r for r in results["rows"] if r["category"] == "all"}
    assert set(rows) == {"ar", "pld", "pld+auto"}
    assert all(rows[n]["lossless_fraction"] == 1.0 and rows[n]["prompts"] == 2 for n in ("pld", "pld+auto"))
    assert {r["decoder"] for r in per_prompt} == {"ar", "pld", "pld+auto"}
    meta = results["meta"]["decoders"]
    assert "auto" in meta["pld+auto"] and "auto" not in meta.get("pld", {})
    assert results["config"]["decoders"] == ["pld", "pld+auto"]
    conf, _ = configure(models, "decoder=pld", "decoder.num_pred_tokens=3", "decoders=[pld+auto]")
    variant = decoder_configs(conf)["pld+auto"]
    assert variant.auto and variant.num_pred_tokens == 3 and not decoder_configs(conf)["pld"].auto


def test_a_plus_auto_entry_that_cannot_mean_anything_is_refused_before_loading(models):
    with pytest.raises(UserError, match="hf_greedy has no drafter.*applies to the drafters"):
        decoder_configs(configure(models, "decoders=[hf_greedy+auto]")[0])
    with pytest.raises(Exception, match="duplicates pld when decoder.auto=true"):
        configure(models, "decoder=pld", "decoder.auto=true", "decoders=[pld+auto]")
    with pytest.raises(Exception, match="decoders"):
        configure(models, "decoders=[nonsense+auto]")


@pytest.mark.parametrize("name", sorted(DECODER_SCHEMAS))
def test_a_decoders_entry_built_from_its_schema_equals_its_yaml_option(name):
    """The runner builds `decoders=[...]` entries from the dataclasses, without Hydra: that is only right while
    each option's YAML sets exactly its schema's defaults."""
    with initialize_config_dir(config_dir=str(config_dir()), version_base="1.3"):
        composed = OmegaConf.to_object(compose("config", overrides=[f"decoder={name}"]).decoder)
    assert composed == DECODER_SCHEMAS[name]()


def test_the_measuring_loop_needs_neither_pandas_nor_wandb():
    code = ("import sys, specnoise.bench.measure; "
            "print(sorted({m.split('.')[0] for m in sys.modules} & {'pandas', 'wandb', 'matplotlib'}))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "[]"


def test_draft_decoder_without_draft_is_a_clear_error(models, prompt_file, tmp_path):
    conf, cfg = configure(models, "decoder=ar", "decoders=[speculative]", *jsonl_args(prompt_file))
    with pytest.raises(UserError, match="decoder=speculative needs a draft model: set draft=NAME or pair=NAME"):
        run_benchmark(conf, cfg, tmp_path)


def test_long_prompts_are_skipped_and_counted(models, prompt_file, tmp_path):
    conf, _ = configure(models, *jsonl_args(prompt_file))
    tokenizer = tiny_tokenizer()
    lengths = [len(encode_prompt(tokenizer, dialogue_text(s, conf.model.template, [], tokenizer)))
               for s in load_benchmark(conf.benchmark, conf.model.template)]
    limit = sorted(lengths)[1]  # the two shortest prompts fit
    _, results, per_prompt = run(models, tmp_path, "decoder=ar", *jsonl_args(prompt_file),
                                 f"benchmark.max_prompt_tokens={limit}")
    skipped = results["skipped"]
    assert skipped["prompts"] == sum(n > limit for n in lengths) >= 1 and skipped["max_prompt_tokens"] == limit
    assert {r["id"] for r in per_prompt}.isdisjoint(skipped["ids"])
    every = next(r for r in results["rows"] if r["category"] == "all")
    assert every["prompts"] == 4 - skipped["prompts"]
    with pytest.raises(UserError, match="max_prompt_tokens"):
        run(models, tmp_path, "decoder=ar", *jsonl_args(prompt_file), "benchmark.max_prompt_tokens=2")


def test_sampling_checks_tokens_where_drafts_are_guesses_and_names_the_check(models, prompt_file, tmp_path):
    """Under sampling no lossless check, but with one seed a decoder whose drafts are guesses draws AR's very tokens
    (identical_to_ar_fraction 1.0); speculative decoding's sampled drafts keep the distribution, not the tokens."""
    _, results, per_prompt = run(models, tmp_path, "decoder=speculative", "decoders=[pld]", "decoder.temperature=0.8",
                                 "draft.name=tiny-draft", f"draft.path={models['draft']}", *jsonl_args(prompt_file),
                                 "benchmark.limit=2")
    rows = {r["decoder"]: r for r in results["rows"] if r["category"] == "all"}
    assert all(r["lossless_fraction"] is None and r["mismatch_fraction"] is None for r in results["rows"])
    assert rows["pld"]["identical_to_ar_fraction"] == 1.0 and rows["pld"]["sampling_check"] == "tokens"
    spec = rows["speculative"]
    assert spec["identical_to_ar_fraction"] is None and spec["sampling_check"] == "distribution"
    assert all(r["identical_to_ar"] is (None if r["decoder"] == "speculative" else True) for r in per_prompt)
    assert all(r["first_divergence"] is None for r in per_prompt)
    assert results["meta"]["config_warnings"] == []


def test_which_sampling_check_applies_follows_each_decoders_config(models):
    """Ouroboros' drafts are greedy guesses unless its config samples them (decoder=ouroboros_sampled): the check
    follows the config, not the decoder's name; the entries of ``decoders`` are their schema defaults."""
    for overrides, expected in [(["decoder=ouroboros"], False), (["decoder=ouroboros_sampled"], True),
                                (["decoder=ouroboros", "decoder.sampled_drafts=true"], True),
                                (["decoder=pld", "decoders=[speculative,ouroboros]"], None)]:
        conf, _ = configure(models, *overrides)
        if expected is None:
            assert [sampled_drafts(conf, n) for n in ("ar", "pld", "speculative", "ouroboros")] == [
                False, False, True, False]
        else:
            assert sampled_drafts(conf, "ouroboros") is expected


def test_sampling_keys_at_temperature_zero_are_warned_in_the_results(models, prompt_file, tmp_path, caplog):
    _, results, _ = run(models, tmp_path, "decoder=ar", "decoder.top_p=0.9", *jsonl_args(prompt_file),
                        "benchmark.limit=1")
    (warning,) = results["meta"]["config_warnings"]
    assert warning.startswith("decoder.top_p=0.9 ignored: decoder.temperature=0 decodes greedily")
    assert all(r["identical_to_ar_fraction"] is None and r["sampling_check"] is None for r in results["rows"])


def test_scored_benchmark_fills_task_score(models, tmp_path):
    extra = ["decoders=[pld]"] if available("pld") else []
    _, results, per_prompt = run(models, tmp_path, "decoder=ar", *extra, "benchmark=humaneval", "benchmark.limit=2",
                                 "benchmark.template=raw",
                                 "benchmark.max_new_tokens=8", "benchmark.exec_timeout=5")
    every = [r for r in results["rows"] if r["category"] == "all"]
    assert {r["score_metric"] for r in every} == {"pass@1"}
    assert len({r["task_score"] for r in every}) == 1  # lossless decoders score exactly as AR
    assert all(r["score"] in (0.0, 1.0) and r["score_detail"]["status"] for r in per_prompt)


def test_wandb_gets_the_summary_and_both_tables(models, prompt_file, tmp_path):
    conf, cfg = configure(models, "decoder=ar", *jsonl_args(prompt_file), "benchmark.limit=2")
    conf.logger.name, conf.logger.mode = "wandb", "offline"
    run_benchmark(conf, cfg, tmp_path)
    (run,) = (tmp_path / "wandb").glob("offline-run-*")
    assert list(run.glob("run-*.wandb"))
    tables = sorted(p.name for p in run.glob("files/media/table/*.table.json"))
    assert len(tables) == 2 and tables[0].startswith("per_prompt_") and tables[1].startswith("results_")


def test_bad_data_file_is_a_user_error(models, tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "ok"}\n{"text": \n')
    conf, cfg = configure(models, "decoder=ar", "benchmark=jsonl", f"benchmark.path={bad}",
                          "benchmark.prompt_field=text")
    with pytest.raises(UserError, match=r"bad\.jsonl, line 2, column 11: not valid JSON \(Expecting value\)"):
        run_benchmark(conf, cfg, tmp_path / "run")
    assert not (tmp_path / "run" / "results.json").exists()
    bad.write_text('{"text": "a\tb"}\n')  # json's message ends in "at", meant to be followed by the position
    with pytest.raises(UserError, match=r"line 1, column 12: not valid JSON \(Invalid control character\); "):
        run_benchmark(conf, cfg, tmp_path / "run")


def test_first_divergence():
    assert first_divergence([1, 2, 3], [1, 2, 3]) is None
    assert first_divergence([1, 2, 3], [1, 5, 3]) == 1
    assert first_divergence([1, 2], [1, 2, 3]) == 2


def test_generate_once(models, capsys):
    conf, cfg = configure(models, "decoder=ar", "decoder.max_new_tokens=6", "prompt='def add(a, b):'")
    text = generate_once(conf, cfg)
    assert isinstance(text, str) and text in capsys.readouterr().out


def test_command_line_end_to_end(models, prompt_file, tmp_path):
    run_dir = tmp_path / "run"
    cmd = [sys.executable, "-m", "specnoise", "decoder=ar", "benchmark=jsonl", f"benchmark.path={prompt_file}",
           "benchmark.prompt_field=text", "benchmark.limit=3", "benchmark.max_new_tokens=8", "logger=none",
           f"model.path={models['target']}", f"hydra.run.dir={run_dir}"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads((run_dir / "results.json").read_text())
    assert next(r for r in results["rows"] if r["category"] == "all")["prompts"] == 3
    assert len((run_dir / "per_prompt.jsonl").read_text().splitlines()) == 4  # prompt 1 has two turns


def test_rerun_in_the_same_directory_continues_and_refuses_other_settings(models, prompt_file, tmp_path):
    old = os.umask(0o022)
    try:
        _, first, rows = run(models, tmp_path, "decoder=ar", *jsonl_args(prompt_file))
    finally:
        os.umask(old)
    for name in ("results.json", "per_prompt.jsonl", "resume.json"):  # the umask's mode, not mkstemp's 0600
        assert (tmp_path / name).stat().st_mode & 0o777 == 0o644, name
    assert first["complete"] is True and first["progress"] == {"prompts": 4, "of": 4, "resumed": 0}
    assert all(r["tokens"] and len(r["tokens"]) == r["new_tokens"] for r in rows)

    # a hard kill inside prompt "1" (two turns): its second turn is missing, and half a line follows
    kept = [r for r in rows if (r["id"], r["turn"]) != ("1", 1)]
    (tmp_path / "per_prompt.jsonl").write_text("".join(json.dumps(r) + "\n" for r in kept) + '{"id": "3", "tu')
    _, second, again = run(models, tmp_path, "decoder=ar", *jsonl_args(prompt_file))
    assert second["progress"] == {"prompts": 4, "of": 4, "resumed": 3}  # prompt 1 ran again, the others did not
    assert [(r["id"], r["turn"], r["seconds"]) for r in again if r["id"] != "1"] == \
        [(r["id"], r["turn"], r["seconds"]) for r in rows if r["id"] != "1"]
    assert [r["tokens"] for r in again] == [r["tokens"] for r in rows]  # greedy: the rerun prompt is the same
    assert [r["prompts"] for r in second["rows"]] == [r["prompts"] for r in first["rows"]]

    with pytest.raises(UserError, match=r"other settings \(benchmark.max_new_tokens: 8 -> 6\)"):
        run(models, tmp_path, "decoder=ar", *jsonl_args(prompt_file), "benchmark.max_new_tokens=6")
    with pytest.raises(UserError, match=r"other settings \(decoders: \[\] -> \['pld'\]\)"):
        run(models, tmp_path, "decoder=ar", "decoders=[pld]", *jsonl_args(prompt_file))


def test_limit_counts_prompts_that_fit(models, tmp_path):
    article = "The quick brown fox jumps over the lazy dog. " * 40
    path = tmp_path / "long_first.jsonl"
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in [article, article, "def add(a, b):", article,
                                                                      "for i in range(10):", "print(i)"]))
    _, results, per_prompt = run(models, tmp_path / "run", "decoder=ar", "benchmark=jsonl", f"benchmark.path={path}",
                                 "benchmark.prompt_field=text", "benchmark.limit=2", "benchmark.max_prompt_tokens=64")
    assert results["skipped"]["prompts"] == 3 and results["skipped"]["ids"] == ["0", "1", "3"]
    assert [r["id"] for r in per_prompt] == ["2", "4"]  # `limit` counts the prompts that fit
    assert results["rows"][-1]["prompts"] == 2


def test_a_trained_model_is_named_after_its_run(models, prompt_file, tmp_path):
    conf, cfg = configure(models, "decoder=ar", "train=msn", *jsonl_args(prompt_file), "benchmark.limit=1")
    run_dir = tmp_path / "7"
    run_benchmark(conf, cfg, run_dir, model_path=str(models["target"]))  # as if job 7 had trained it
    rows = json.loads((run_dir / "results.json").read_text())["rows"]
    assert {r["model"] for r in rows} == {f"{conf.model.name}+msn@7"}  # never the base model's name


def test_repeats_time_every_prompt_r_times_and_bound_each_speedup(models, prompt_file, tmp_path):
    _, results, per_prompt = run(models, tmp_path, "decoder=pld", *jsonl_args(prompt_file), "benchmark.repeats=3")
    for r in per_prompt:
        # benchmark.repeat_stat=median: the middle repeat by wall time, its target seconds with it
        middle = sorted(range(3), key=r["repeat_seconds"].__getitem__)[1]
        assert len(r["repeat_seconds"]) == 3 and r["seconds"] == r["repeat_seconds"][middle]
        assert r["target_seconds"] == r["repeat_target_seconds"][middle]
        assert r["same_tokens_across_repeats"] is True
    rows = {(r["decoder"], r["category"]): r for r in results["rows"]}
    pld = rows[("pld", "all")]
    assert pld["repeats"] == 3 and results["meta"]["repeats"] == 3 and results["meta"]["repeat_token_mismatches"] == 0
    assert pld["speedup_ci_low"] <= pld["speedup"] <= pld["speedup_ci_high"] and pld["ar_time_cv"] >= 0
    assert isinstance(pld["timing_noisy"], bool)
    assert rows[("ar", "all")]["verify_block"] == 1.0 and pld["verify_block"] >= 1.0
    # the bound: AR's priced time over PLD's for the same prompts and tokens, prefills included (bound.py)
    assert pld["cost_bound"] == pytest.approx(rows[("ar", "all")]["priced_seconds"] / pld["priced_seconds"])
    assert rows[("ar", "all")]["cost_bound"] == pytest.approx(1.0)
    # the bound's blocks are the timed generations' own forwards, as per_prompt.jsonl logs them (prefill as 1 token)
    blocks = [q for r in per_prompt if r["decoder"] == "pld" for q in [1] + [q for q, *_ in r["forward_log"][1:]]]
    assert len(blocks) == pld["target_forwards"] and pld["verify_block"] == pytest.approx(sum(blocks) / len(blocks))


def test_tokens_that_change_between_repeats_are_recorded(models, prompt_file, tmp_path, monkeypatch):
    """A decoder whose second repeat answers differently (as nondeterministic kernels would): its rows say so."""
    import specnoise.bench.runner as runner

    def flaky(cfg, target, draft):
        decoder = build(cfg, target, draft)
        if cfg.name == "pld":
            calls, generate = [], decoder.generate

            def generate_differently(prompt, budget):
                calls.append(1)
                return generate(prompt, budget - 1 if len(calls) % 2 == 0 else budget)

            decoder.generate = generate_differently
        return decoder

    build = runner.build_decoder
    monkeypatch.setattr(runner, "build_decoder", flaky)
    _, results, per_prompt = run(models, tmp_path, "decoder=pld", *jsonl_args(prompt_file), "benchmark.repeats=2",
                                 "benchmark.limit=1", "benchmark.cost_bound=false")
    assert [r["same_tokens_across_repeats"] for r in per_prompt if r["decoder"] == "pld"] == [False]
    assert results["meta"]["repeat_token_mismatches"] == 1


def test_max_new_tokens_beyond_the_context_fails_before_loading(models, prompt_file, tmp_path, monkeypatch):
    import specnoise.bench.runner as runner

    def never(*args, **kwargs):
        raise AssertionError("weights loaded")

    monkeypatch.setattr(runner, "load_model", never)
    with pytest.raises(UserError, match=r"max_new_tokens=100000 does not fit the context of model=small-code-msn "
                                        r"\(1024 tokens.*lower benchmark.max_new_tokens below 1024$"):
        run(models, tmp_path, "decoder=ar", *jsonl_args(prompt_file), "benchmark.max_new_tokens=100000")


def test_a_draft_with_another_tokenizer_fails_before_the_target_loads(models, prompt_file, tmp_path, monkeypatch):
    import specnoise.bench.runner as runner

    other = save_tiny_model(tmp_path / "other", tokenizer=tiny_tokenizer(vocab_size=300), layers=1, hidden=32)
    monkeypatch.setattr(runner, "load_model", lambda *a, **k: (_ for _ in ()).throw(AssertionError("loaded")))
    with pytest.raises(UserError, match="use different tokenizers"):
        run(models, tmp_path / "run", "decoder=speculative", "draft.name=other", f"draft.path={other}",
            *jsonl_args(prompt_file))
    with pytest.raises(UserError, match=r"draft=nowhere: no model at /nope"):
        run(models, tmp_path / "run", "decoder=speculative", "draft.name=nowhere", "draft.path=/nope",
            *jsonl_args(prompt_file))


def test_a_signal_during_the_wrap_up_follows_the_interrupt_contract(models, prompt_file, tmp_path, monkeypatch):
    """New-user finding 2: SIGINT after the last prompt (here while the reference NLL is computed) ends in a partial
    results.json and Interrupted (exit 130), and the same command finishes the job."""
    import signal

    import specnoise.bench.runner as runner
    from specnoise.bench.progress import Interrupted

    real = runner.reference_nlls

    def interrupted_nlls(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGINT)  # the handler only sets the flag: this stage still finishes
        return real(*args, **kwargs)

    monkeypatch.setattr(runner, "reference_nlls", interrupted_nlls)
    with pytest.raises(Interrupted) as stop:
        run(models, tmp_path, "decoder=pld", *jsonl_args(prompt_file), "benchmark.limit=2")
    assert stop.value.exit_code == 130
    partial = json.loads((tmp_path / "results.json").read_text())
    assert partial["complete"] is False and partial["interrupted"] == "SIGINT"
    assert partial["progress"]["prompts"] == 2 and partial["rows"]  # every prompt was measured
    monkeypatch.setattr(runner, "reference_nlls", real)
    _, again, _ = run(models, tmp_path, "decoder=pld", *jsonl_args(prompt_file), "benchmark.limit=2")
    assert again["complete"] is True and again["progress"]["resumed"] == 2  # nothing timed twice


def test_console_table_shows_one_category_once(capsys, tmp_path):
    from specnoise.bench.runner import print_summary

    def row(decoder, category):
        return dict(decoder=decoder, category=category, new_tokens=64, mean_accepted_tokens=1.5,
                    tokens_per_second=100.0, speedup=1.2, speedup_ci_low=1.1, speedup_ci_high=1.3, timing_noisy=False,
                    lossless_fraction=1.0, identical_to_ar_fraction=None, task_score=None, speedup_exceeds_mat=False,
                    timing_note=None, batch_size=1)
    print_summary([row(d, c) for d in ("ar", "pld") for c in ("humaneval", "all")], tmp_path / "results.json")
    table = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| ")]
    assert [line.split("|")[2].strip() for line in table[1:]] == ["all", "all"]  # not humaneval and all again
    print_summary([row(d, c) for d in ("ar", "pld") for c in ("qa", "math", "all")], tmp_path / "results.json")
    assert len([line for line in capsys.readouterr().out.splitlines() if line.startswith("| ")]) == 1 + 6
