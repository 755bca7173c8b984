"""ref_nll: the teacher-forced NLL of each benchmark's reference answer under the target model."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

from helpers_models import save_tiny_model, tiny_tokenizer
from specnoise.bench.datasets import Sample, dialogue_text, load_benchmark
from specnoise.bench.ref_nll import RefNLL, reference_ids, reference_nlls, reference_text, row_ref_nll, sequence_nll
from specnoise.bench.runner import run_benchmark
from specnoise.config import ASSETS_DIR, BenchmarkConfig, config_dir
from specnoise.data.templates import encode_prompt
from specnoise.decoding.kv import DynamicEngine

SHIPPED_SFT = ASSETS_DIR / "models" / "small-code-sft"
HUMANEVAL = str(ASSETS_DIR / "data" / "humaneval" / "HumanEval.jsonl.gz")


@pytest.fixture(scope="module")
def random_model(tmp_path_factory) -> Path:
    # the test tokenizer spends ~1 token per byte: a long context lets CNN/DM articles fit
    return save_tiny_model(tmp_path_factory.mktemp("models") / "tiny", max_position_embeddings=8192)


def configure(model: Path, *overrides: str):
    base = [f"model.path={model}", "logger=none", "benchmark.warmup=0", "benchmark.max_new_tokens=4"]
    with initialize_config_dir(config_dir=str(config_dir()), version_base="1.3"):
        cfg = compose("config", overrides=base + list(overrides))
    return OmegaConf.to_object(cfg), cfg


def random_llama(vocab_size: int, **kw):
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(AutoConfig.for_model(
        "llama", vocab_size=vocab_size, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
        num_attention_heads=4, num_key_value_heads=2, initializer_range=0.3, **kw)).eval()


def test_sequence_nll_is_the_mean_log_loss_of_the_reference_tokens():
    """Checked against a plain full forward: an off-by-one in the teacher forcing would score the wrong logits."""
    model = random_llama(len(tiny_tokenizer()))
    prompt, target = [5, 9, 17, 33], [40, 2, 71]
    got = sequence_nll(DynamicEngine(model), prompt, target)
    with torch.no_grad():
        logp = model(torch.tensor([prompt + target])).logits[0].float().log_softmax(-1)
    want = -sum(logp[len(prompt) - 1 + i, t].item() for i, t in enumerate(target))
    assert got.tokens == 3 and got.nll == pytest.approx(want, rel=1e-5) and got.mean == pytest.approx(want / 3)


def test_reference_ids_follow_the_prompt_as_the_decoders_see_it():
    tok = tiny_tokenizer()
    text = "def add(a, b):\n"
    prompt = encode_prompt(tok, text)
    ids = reference_ids(tok, text, prompt, "    return a + b\n")
    assert tok.decode(prompt + ids) == text + "    return a + b\n"
    # a raw prompt without a separator gets a space before the answer
    text = "Question: Tom has 3 apples. Answer:"
    ids = reference_ids(tok, text, encode_prompt(tok, text), "7 #### 7")
    assert tok.decode(ids) == " 7 #### 7"


def test_prompts_over_the_context_are_not_scored_and_long_references_are_cut():
    tok = tiny_tokenizer()
    model = random_llama(len(tok), max_position_embeddings=16)
    samples = [Sample("fits", "c", ["def f"], reference=" return 1" * 20), Sample("long", "c", ["x = 1\n" * 20],
                                                                               reference="y")]
    refs = reference_nlls(model, tok, samples, lambda s: s.turns[0])
    assert set(refs) == {"fits"}
    assert len(encode_prompt(tok, "def f")) + refs["fits"].tokens == 16 + 1  # the last token is never fed in


def test_which_samples_have_a_reference_text():
    assert reference_text(Sample("a", "gsm8k", ["q"], reference="He pays 5.\n#### 5")) == "He pays 5.\n#### 5"
    assert reference_text(Sample("b", "mt_bench", ["q1", "q2"], reference=["note 1", "note 2"])) is None
    assert reference_text(Sample("c", "rag", ["q"], reference=["a source of lumber", "recreation"])) is None
    assert reference_text(Sample("d", "qa", ["q"])) is None


def test_shipped_benchmarks_carry_their_reference_answers():
    humaneval = load_benchmark(BenchmarkConfig(name="humaneval", path=HUMANEVAL, limit=2), "code-instruct")
    assert all(reference_text(s).startswith("    ") for s in humaneval)  # the body that follows the signature
    cnndm = load_benchmark(BenchmarkConfig(name="cnndm", path=str(ASSETS_DIR / "data/cnndm/question.jsonl"),
                                           limit=2), "raw")
    assert all(len(reference_text(s)) > 50 for s in cnndm)
    spec = load_benchmark(BenchmarkConfig(name="spec_bench", path=str(ASSETS_DIR / "data/spec_bench/question.jsonl"),
                                          limit_per_category=1), "raw")
    with_text = {s.category for s in spec if reference_text(s)}
    assert with_text == {"translation", "summarization", "math_reasoning"}  # not qa, rag, mt_bench


def test_rows_pool_samples_token_weighted():
    refs = {"a": RefNLL(10.0, 5), "b": RefNLL(3.0, 1)}
    samples = [Sample(i, "c", ["q"]) for i in ("a", "b", "none")]
    assert row_ref_nll(refs, samples) == {"ref_nll": pytest.approx(13 / 6), "ref_tokens": 6}
    assert row_ref_nll(refs, samples[2:]) == {"ref_nll": None, "ref_tokens": 0}


@pytest.mark.parametrize("benchmark", ["humaneval", "cnndm"])
def test_results_carry_ref_nll_for_every_decoder(random_model, tmp_path, benchmark):
    conf, cfg = configure(random_model, f"benchmark={benchmark}", "benchmark.limit=2", "decoder=ar",
                          "decoders=[jacobi]", "benchmark.scorer=none")
    run_benchmark(conf, cfg, tmp_path)
    rows = json.loads((tmp_path / "results.json").read_text())["rows"]
    values = {r["ref_nll"] for r in rows if r["category"] == "all"}
    assert len(values) == 1  # a property of the model, the same on every decoder's row
    (value,) = values
    assert math.isfinite(value) and value > 0
    assert {r["decoder"] for r in rows} == {"ar", "jacobi"} and all(r["ref_tokens"] > 10 for r in rows)
    per_prompt = [json.loads(line) for line in (tmp_path / "per_prompt.jsonl").read_text().splitlines()]
    assert all(math.isfinite(r["ref_nll"]) and r["ref_nll"] > 0 for r in per_prompt)


@pytest.mark.skipif(not (SHIPPED_SFT / "config.json").is_file(), reason="shipped small-code-sft not present")
def test_a_trained_code_model_predicts_humaneval_solutions_better_than_a_random_one():
    """The shipped SFT model against a random model of the same shape and tokenizer, on the same prompts."""
    tok = AutoTokenizer.from_pretrained(SHIPPED_SFT)
    trained = AutoModelForCausalLM.from_pretrained(SHIPPED_SFT, dtype=torch.float32).eval()
    torch.manual_seed(0)
    random = AutoModelForCausalLM.from_config(trained.config).eval()
    samples = load_benchmark(BenchmarkConfig(name="humaneval", path=HUMANEVAL, limit=3), "code-instruct")

    def score(model):
        refs = reference_nlls(model, tok, samples, lambda s: dialogue_text(s, "code-instruct", [], tok))
        return row_ref_nll(refs, samples)["ref_nll"]

    trained_nll, random_nll = score(trained), score(random)
    assert 0 < trained_nll < 0.6 * random_nll, (trained_nll, random_nll)
