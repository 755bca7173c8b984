"""Benchmark data: every option loads, categories and limits, templates, multi-turn text, bad files."""

from __future__ import annotations

import json
from collections import Counter

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from specnoise.bench.datasets import dialogue_text, first_that_fit, load_benchmark, load_samples
from specnoise.config import BenchmarkConfig, UserError, config_dir


def bench(option: str, *overrides: str) -> BenchmarkConfig:
    with initialize_config_dir(config_dir=str(config_dir()), version_base="1.3"):
        cfg = compose("config", overrides=[f"benchmark={option}", *overrides])
    return OmegaConf.to_object(cfg.benchmark)


def write_jsonl(path, rows) -> str:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return str(path)


def test_spec_bench_categories_and_scorers():
    samples = load_benchmark(bench("spec_bench"), "vicuna")
    assert len(samples) == 480
    counts = Counter(s.category for s in samples)
    assert counts == {c: 80 for c in ("mt_bench", "translation", "summarization", "qa", "math_reasoning", "rag")}
    assert all(len(s.turns) == 2 for s in samples if s.category == "mt_bench")
    assert {s.category: s.scorer for s in samples} == {
        "mt_bench": "length", "translation": "bleu", "summarization": "rouge", "math_reasoning": "gsm8k",
        "qa": "none", "rag": "none"}
    assert [s.id for s in samples][:2] == ["81", "82"]


def test_spec_bench_subsets():
    samples = load_benchmark(bench("spec_bench", "benchmark.limit_per_category=2"), "raw")
    assert Counter(s.category for s in samples) == {c: 2 for c in
                                                    ("mt_bench", "translation", "summarization", "qa",
                                                     "math_reasoning", "rag")}
    samples = load_benchmark(bench("spec_bench", "benchmark.categories=[qa,rag]", "benchmark.limit=3"), "raw")
    assert [s.category for s in samples] == ["qa"] * 3
    with pytest.raises(UserError, match="not in the data"):
        load_benchmark(bench("spec_bench", "benchmark.categories=[nope]"), "raw")


def test_shipped_benchmarks():
    mt = load_benchmark(bench("mt_bench"), "vicuna")
    assert len(mt) == 80 and all(len(s.turns) == 2 and s.scorer == "length" for s in mt)
    cnn = load_benchmark(bench("cnndm"), "raw")
    assert len(cnn) == 80 and all(isinstance(s.reference, str) and s.reference for s in cnn)
    assert cnn[0].turns[0].startswith("Summarize: ") and cnn[0].scorer == "rouge"
    he = load_benchmark(bench("humaneval"), "raw")
    assert len(he) == 164 and he[0].id == "HumanEval/0" and he[0].scorer == "pass_at_1"


def test_humaneval_prompt_under_templates():
    raw = load_benchmark(bench("humaneval", "benchmark.limit=1"), "raw")[0]
    assert dialogue_text(raw, "raw", []) == raw.fields["prompt"]  # base models continue the code itself
    inst = load_benchmark(bench("humaneval", "benchmark.limit=1"), "code-instruct")[0]
    text = dialogue_text(inst, "code-instruct", [])
    # instruct models get the function pre-filled, so they too continue the body
    assert text.startswith("### Instruction:\n") and text.endswith("### Response:\n```python\n" + inst.fields["prompt"])


def test_multi_turn_text_uses_the_model_answer():
    sample = load_benchmark(bench("mt_bench", "benchmark.limit=1"), "vicuna")[0]
    first = dialogue_text(sample, "vicuna", [])
    second = dialogue_text(sample, "vicuna", ["MY OWN ANSWER"])
    assert first.endswith(f"USER: {sample.turns[0]} ASSISTANT:")
    assert second.startswith(first) and "ASSISTANT: MY OWN ANSWER</s>" in second
    assert second.endswith(f"USER: {sample.turns[1]} ASSISTANT:")


def test_hub_benchmarks_from_local_files(tmp_path):
    mbpp = write_jsonl(tmp_path / "mbpp.jsonl", [{"task_id": 11, "text": "Remove first and last occurrence.",
                                                  "code": "", "test_list": ["assert f(1) == 1", "assert f(2) == 2"],
                                                  "test_setup_code": ""}])
    s = load_benchmark(bench("mbpp", f"benchmark.path={mbpp}"), "code-instruct")[0]
    assert s.id == "11" and s.fields["test_list"] == ["assert f(1) == 1", "assert f(2) == 2"]
    assert "assert f(2) == 2" in s.turns[0] and s.response_prefix == "```python\n"

    gsm = tmp_path / "gsm8k.json"
    gsm.write_text(json.dumps([{"question": "2+2?", "answer": "2+2=4\n#### 4"}]))
    s = load_benchmark(bench("gsm8k", f"benchmark.path={gsm}"), "raw")[0]
    assert s.turns == ["Question: 2+2?\nAnswer:"] and s.reference.endswith("#### 4") and s.scorer == "gsm8k"

    import pandas as pd  # a hub download is Parquet, with list columns read back as numpy arrays

    pd.DataFrame([{"task_id": 12, "prompt": "Square.", "test_list": ["assert sq(2) == 4"], "test_setup_code": ""}]
                 ).to_parquet(tmp_path / "mbpp.parquet")
    s = load_benchmark(bench("mbpp", f"benchmark.path={tmp_path / 'mbpp.parquet'}"), "raw")[0]
    assert s.id == "12" and s.fields["test_list"] == ["assert sq(2) == 4"] and "Square." in s.turns[0]

    wmt = write_jsonl(tmp_path / "wmt.jsonl", [{"translation": {"de": "Der Hund.", "en": "The dog."}}])
    s = load_benchmark(bench("wmt16", f"benchmark.path={wmt}"), "raw")[0]
    assert s.turns == ["Translate German to English: Der Hund."] and s.reference == "The dog." and s.scorer == "bleu"


def test_unreachable_hub_names_benchmark_path(monkeypatch):
    import datasets.config
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)  # this machine has no hub access anyway
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    with pytest.raises(UserError, match=r"could not load hub dataset 'openai/gsm8k'.*benchmark\.path=FILE"):
        load_benchmark(bench("gsm8k"), "raw")
    with pytest.raises(UserError, match=r"benchmark\.path=FILE.*stand-in: benchmark=spec_bench benchmark\.categories"):
        load_benchmark(bench("wmt16"), "raw")


def test_jsonl_fields_and_multi_turn(tmp_path):
    path = write_jsonl(tmp_path / "p.jsonl", [
        {"q": "one", "key": "a", "cat": "x", "ref": ["r1"]},
        {"q": ["two", "and then?"], "key": "b", "cat": "y"},
    ])
    cfg = bench("jsonl", f"benchmark.path={path}", "benchmark.prompt_field=q", "benchmark.id_field=key",
                "benchmark.category_field=cat", "benchmark.reference_field=ref")
    a, b = load_benchmark(cfg, "raw")
    assert (a.id, a.category, a.turns, a.reference) == ("a", "x", ["one"], "r1")
    assert (b.id, b.turns, b.reference) == ("b", ["two", "and then?"], None)
    numbered = load_benchmark(bench("jsonl", f"benchmark.path={path}", "benchmark.prompt_field=q"), "raw")
    assert [s.id for s in numbered] == ["0", "1"] and {s.category for s in numbered} == {"jsonl"}


@pytest.mark.parametrize("rows, message", [
    (['{"prompt": "ok"}', '{"prompt": broken'], r"p\.jsonl, line 2, column 12: not valid JSON"),
    (['{"prompt": "ok"}', "", '{"text": "no prompt"}'], r"p\.jsonl, line 3: missing field 'prompt' .*prompt_field"),
    (['["a list"]'], r"line 1: expected a JSON object"),
    (['{"prompt": "ok"}', '{"prompt": "  "}'], r"line 2: prompt 2 is empty \(field 'prompt'\)"),
    (['{"prompt": ["first", ""]}'], r"line 1: turn 2 of prompt 1 is empty"),
    ([], r"p\.jsonl: no records"),
])
def test_malformed_jsonl(tmp_path, rows, message):
    path = write_jsonl(tmp_path / "p.jsonl", rows)
    with pytest.raises(UserError, match=message):
        load_benchmark(bench("jsonl", f"benchmark.path={path}"), "raw")


def test_missing_file_and_duplicate_ids(tmp_path):
    with pytest.raises(UserError, match="benchmark.path: no file at"):
        load_benchmark(bench("jsonl", f"benchmark.path={tmp_path}/nope.jsonl"), "raw")
    path = write_jsonl(tmp_path / "p.jsonl", [{"prompt": "a", "id": 1}, {"prompt": "b", "id": 1}])
    with pytest.raises(UserError, match="more than once.*id_field"):
        load_benchmark(bench("jsonl", f"benchmark.path={path}", "benchmark.id_field=id"), "raw")


def test_limit_counts_the_prompts_that_fit(tmp_path):
    rows = [{"prompt": "x" * 50}, {"prompt": "y" * 60}, {"prompt": "a"}, {"prompt": "z" * 70}, {"prompt": "b"},
            {"prompt": "c"}]
    cfg = bench("jsonl", f"benchmark.path={write_jsonl(tmp_path / 'p.jsonl', rows)}", "benchmark.limit=2")
    samples = load_samples(cfg, "raw")
    assert len(samples) == 6  # `limit` is not applied before the fit is known
    kept, skipped = first_that_fit(samples, cfg.limit, lambda s: len(s.turns[0]) < 10)
    assert [s.id for s in kept] == ["2", "4"] and [s.id for s in skipped] == ["0", "1", "3"]
    kept, skipped = first_that_fit(samples, None, lambda s: len(s.turns[0]) < 10)
    assert len(kept) == 3 and len(skipped) == 3
    assert [s.id for s in load_benchmark(cfg, "raw")] == ["0", "1"]  # without a fit test: the first `limit`
