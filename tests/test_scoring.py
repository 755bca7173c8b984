"""Scorers on known answers: canonical HumanEval solutions pass, bad completions fail and cost only their sample."""

from __future__ import annotations

import pytest

from specnoise.bench.datasets import Sample, load_benchmark
from specnoise.bench.execution import run_program
from specnoise.bench.scoring import Answer, aggregate_row, final_number, program_for, score_answers
from specnoise.config import BenchmarkConfig

ASSETS = BenchmarkConfig(name="humaneval", scorer="pass_at_1", exec_timeout=3.0)


@pytest.fixture(scope="module")
def humaneval():
    from specnoise.config import ASSETS_DIR

    return load_benchmark(BenchmarkConfig(name="humaneval", path=str(ASSETS_DIR / "data/humaneval/HumanEval.jsonl.gz"),
                                          scorer="pass_at_1"), "raw")


def canonical(sample: Sample) -> str:
    import gzip
    import json

    from specnoise.config import ASSETS_DIR

    rows = {r["task_id"]: r for r in map(json.loads, gzip.open(ASSETS_DIR / "data/humaneval/HumanEval.jsonl.gz", "rt"))}
    return rows[sample.id]["canonical_solution"]


def pass_at_1(answers: list[Answer], cfg: BenchmarkConfig = ASSETS) -> list[float]:
    return [s["score"] for s in score_answers(answers, cfg)]


def test_canonical_humaneval_solutions_all_pass(humaneval):
    # all 164 in a few seconds (two processes at a time)
    answers = [Answer(s, canonical(s), 0) for s in humaneval]
    scores = score_answers(answers, ASSETS)
    assert [a.sample.id for a, s in zip(answers, scores) if s["score"] != 1.0] == []
    metric, score, _ = aggregate_row(answers, scores, ASSETS)
    assert (metric, score) == ("pass@1", 1.0)


def test_empty_and_wrong_completions_score_zero(humaneval):
    assert pass_at_1([Answer(s, "", 0) for s in humaneval[:3]]) == [0.0, 0.0, 0.0]
    assert pass_at_1([Answer(humaneval[2], "    return -1\n", 0)]) == [0.0]


def test_non_terminating_completion_times_out(humaneval):
    cfg = BenchmarkConfig(name="humaneval", scorer="pass_at_1", exec_timeout=1.5)
    (score,) = score_answers([Answer(humaneval[0], "    while True:\n        pass\n", 0)], cfg)
    assert score["score"] == 0.0 and score["status"] == "timeout"  # killed at exec_timeout (a hang never returns)


def test_hostile_completions_cost_only_their_sample(humaneval):
    s = humaneval[0]
    good = canonical(s)
    bad = [
        "    import sys\n    sys.exit(0)\n",  # exits "successfully" before the tests
        "    import os\n    os._exit(0)\n",
        "    x = [0] * (10 ** 10)\n",  # huge allocation: MemoryError under the address-space limit
        "    raise SystemExit(0)\n",
        "    import os\n    os.system('echo hi')\n",  # disabled: fails, never runs
    ]
    answers = [Answer(s, good, 0)] + [Answer(Sample(f"x{i}", "c", [], scorer="pass_at_1", fields=s.fields), b, 0)
                                      for i, b in enumerate(bad)] + [Answer(humaneval[1], canonical(humaneval[1]), 0)]
    assert pass_at_1(answers) == [1.0] + [0.0] * len(bad) + [1.0]


def test_sys_exit_at_module_level_cannot_fake_a_pass():
    assert not run_program("import sys\nsys.exit(0)").passed
    assert run_program("x = 1").passed
    assert run_program("open('big', 'w').write('x' * (64 << 20))", timeout=5).status == "failed"  # file size limit


def test_humaneval_completion_post_processing(humaneval):
    s = humaneval[0]
    body = canonical(s)
    for tail in ("\ndef unrelated():\n    return 1/0\n", "\nif __name__ == '__main__':\n    raise SystemExit(1)\n",
                 "\nprint(undefined)\n", "\n```\nSome explanation.", "\n# done\nassert False\n"):
        assert pass_at_1([Answer(s, body + tail, 0)]) == [1.0], tail
    program = program_for(s, body + "\ndef unrelated(): pass")
    assert "unrelated" not in program and program.rstrip().endswith(f"check({s.fields['entry_point']})")


def test_mbpp_programs():
    fields = {"test_list": ["assert add(1, 2) == 3", "assert add(-1, 1) == 0"], "test_setup_code": "import math"}
    sample = Sample("1", "mbpp", ["Write add."], scorer="pass_at_1", fields=fields)
    right = "def add(a, b):\n    return a + b\n```\nThat's it."
    wrong = "def add(a, b):\n    return a - b\n"
    cfg = BenchmarkConfig(name="mbpp", scorer="pass_at_1")
    assert pass_at_1([Answer(sample, right, 0), Answer(sample, wrong, 0)], cfg) == [1.0, 0.0]


@pytest.mark.parametrize("text, number", [
    ("Tom has 3+4=7 apples.\n#### 7", 7.0),
    ("so 1,000 + 200 = 1,200. The answer is $1,200.", 1200.0),
    ("First 2, then 5, finally 12.5", 12.5),
    ("The answer is: -3", -3.0),
    ("We get 18.\nQuestion: Another one with 99 apples?", 18.0),
    ("no digits here", None),
])
def test_gsm8k_final_number(text, number):
    assert final_number(text) == number


def test_gsm8k_accuracy():
    cfg = BenchmarkConfig(name="gsm8k", scorer="gsm8k")
    sample = Sample("0", "gsm8k", ["q"], reference="2 + 5 = 7\n#### 7", scorer="gsm8k")
    scores = score_answers([Answer(sample, "It is 7.", 0), Answer(sample, "#### 8", 0)], cfg)
    assert [s["score"] for s in scores] == [1.0, 0.0]
    assert aggregate_row([Answer(sample, "", 0)] * 2, scores, cfg)[:2] == ("accuracy", 0.5)


def test_rouge_and_bleu():
    rouge_cfg = BenchmarkConfig(name="cnndm", scorer="rouge")
    ref = "The cat sat on the mat near the door."
    s = Sample("0", "summarization", ["Summarize: ..."], reference=ref, scorer="rouge")
    exact, other = score_answers([Answer(s, ref, 0), Answer(s, "Stocks fell sharply today.", 0)], rouge_cfg)
    assert exact["rouge1"] == exact["rouge2"] == exact["rougeL"] == pytest.approx(1.0)
    assert other["rougeL"] < 0.2
    metric, score, details = aggregate_row([Answer(s, ref, 0), Answer(s, "x", 0)], [exact, other], rouge_cfg)
    assert metric == "rougeL" and score == pytest.approx((1.0 + other["rougeL"]) / 2) and set(details) == {"rouge1",
                                                                                                         "rouge2"}

    bleu_cfg = BenchmarkConfig(name="wmt16", scorer="bleu")
    t = Sample("1", "wmt16", ["Translate ..."], reference="The dog sleeps in the garden today.", scorer="bleu")
    answers = [Answer(t, "\nThe dog sleeps in the garden today.\nExtra chatter.", 0), Answer(t, "Nothing alike", 0)]
    perfect, poor = score_answers(answers, bleu_cfg)
    assert perfect["score"] == pytest.approx(100.0) and poor["score"] < 10  # first non-empty line is the translation
    assert 10 < aggregate_row(answers, [perfect, poor], bleu_cfg)[1] < 100  # corpus BLEU of the row


def test_length_and_mixed_rows():
    cfg = BenchmarkConfig(name="spec_bench", scorer="per_category")
    mt = Sample("0", "mt_bench", ["a", "b"], scorer="length")
    qa = Sample("1", "qa", ["c"], scorer="none")
    scores = score_answers([Answer(mt, "text", 40), Answer(qa, "x", 3)], cfg)
    assert scores == [{"score": 40.0}, None]
    assert aggregate_row([Answer(mt, "text", 40)], scores[:1], cfg)[:2] == ("length_tokens", 40.0)
    assert aggregate_row([Answer(mt, "", 40), Answer(qa, "", 3)], scores, cfg) == (None, None, {})  # mixed metrics


def test_identical_answers_are_scored_once(humaneval):
    s = humaneval[0]
    answers = [Answer(s, canonical(s), 0) for _ in range(3)]  # e.g. AR and two lossless decoders
    scores = score_answers(answers, ASSETS)
    assert scores[0] is scores[1] is scores[2] and scores[0]["score"] == 1.0


def test_rouge_scoring_is_quiet(caplog):
    cfg = BenchmarkConfig(name="cnndm", scorer="rouge")
    s = Sample("0", "summarization", ["Summarize: ..."], reference="The cat sat.", scorer="rouge")
    with caplog.at_level("INFO"):
        score_answers([Answer(s, "The cat sat.", 0)], cfg)
    assert not [r for r in caplog.records if r.name == "absl"]  # rouge_score's "Using default tokenizer."
