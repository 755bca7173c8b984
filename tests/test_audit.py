"""The lossless audit (numeric tie vs mismatch) and the numerics policy (attention backends, strict numerics)."""

from __future__ import annotations

import json

import pytest
import torch
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from conftest import make_model, prompts
from helpers_models import save_tiny_model, tiny_tokenizer
from specnoise.bench.audit import audit_divergences, mismatch_fraction, verdict
from specnoise.bench.measure import Turn
from specnoise.bench.runner import run_benchmark
from specnoise.config import ARConfig, ConfigError, config_dir
from specnoise.decoding.base import DecodeOutput, Decoder, build_decoder, decoder_class
from specnoise.decoding.kv import DynamicEngine
from specnoise.numerics import Numerics, numerics, policy, use_numerics


# ------------------------------------------------------------------------------------------ verdicts
def test_verdict_from_logits():
    logits = torch.tensor([5.0, 5.0 - 1e-6, 1.0, -3.0])
    assert verdict(logits, 0, 1, torch.float32)["verdict"] == "numeric_tie"  # runner-up within 1e-5 x 5
    near = torch.tensor([5.0, 4.99, 1.0, -3.0])
    assert verdict(near, 0, 1, torch.float32)["verdict"] == "mismatch"  # fp32: a 0.01 margin is no tie
    tie = verdict(near, 0, 1, torch.bfloat16)  # bf16: bound 4 * 2^-7 * 5 = 0.156
    assert tie["verdict"] == "numeric_tie" and tie["divergence_bound"] == pytest.approx(0.15625)
    assert tie["divergence_margin"] == pytest.approx(0.01, abs=1e-6)
    assert (tie["divergence_ar_token"], tie["divergence_token"]) == (0, 1)
    assert verdict(near, 0, 2, torch.bfloat16)["verdict"] == "mismatch"  # the decoder's token is far from the top
    assert verdict(torch.tensor([5.0, 4.0, 1.0]), 0, 1, torch.bfloat16)["verdict"] == "mismatch"  # clear margin
    assert verdict(near, 0, None, torch.bfloat16)["verdict"] == "mismatch"  # stopped early: a contract bug


# ------------------------------------------------------------------------------------------ end to end
def turns(decoder, prompt_list, budget) -> dict[str, list[Turn]]:
    return {str(i): [Turn(p, decoder.generate(p, budget), "")] for i, p in enumerate(prompt_list)}


def plant(runs: dict[str, list[Turn]], position: int, token) -> dict[str, list[Turn]]:
    """A copy of AR's outputs with the token at ``position`` replaced by ``token(old)``."""
    out = {}
    for sid, (t,) in runs.items():
        tokens = list(t.out.tokens)
        tokens[position] = token(tokens[position])
        out[sid] = [Turn(t.prompt, DecodeOutput(tokens, t.out.target_forwards), "")]
    return out


def test_planted_wrong_token_is_a_mismatch():
    target = make_model("llama")
    prompt_list = prompts(3, seed=4)
    ar = turns(build_decoder(ARConfig(), target), prompt_list, 12)
    vocab = target.model.config.vocab_size
    runs = {"ar": ar, "bad": plant(ar, 3, lambda t: (t + 7) % vocab), "same": ar}
    audits = audit_divergences(runs, target.model)
    assert set(audits) == {("bad", str(i), 0) for i in range(3)}  # identical outputs are not audited
    assert all(a["verdict"] == "mismatch" and a["divergence_margin"] > a["divergence_bound"] for a in audits.values())
    assert mismatch_fraction(audits, "bad", list(ar)) == 1.0
    assert mismatch_fraction(audits, "same", list(ar)) == 0.0


def test_near_tie_is_a_numeric_tie():
    """Two tokens whose lm_head rows are equal tie exactly wherever one of them is the top: a decoder that picks
    the twin there is exact in real arithmetic, and the audit says so."""
    target = make_model("llama", seed=3)
    prompt = prompts(1, seed=5)[0]
    decoder = build_decoder(ARConfig(), target)
    twin = target.model.config.vocab_size - 1
    a = next(t for t in decoder.generate(prompt, 12).tokens if t not in target.eos_ids | {twin})
    assert twin > a  # argmax picks the lower index of an exact tie, so AR keeps choosing ``a``
    with torch.no_grad():
        target.model.lm_head.weight[twin] = target.model.lm_head.weight[a]
    ar = turns(decoder, [prompt], 12)
    i = ar["0"][0].out.tokens.index(a)
    runs = {"ar": ar, "twin": plant(ar, i, lambda _: twin)}
    (found,) = audit_divergences(runs, target.model).values()
    assert found["verdict"] == "numeric_tie" and found["divergence_margin"] == 0.0
    assert (found["divergence_ar_token"], found["divergence_token"]) == (a, twin)
    assert mismatch_fraction({("twin", "0", 0): found}, "twin", ["0"]) == 0.0


# ------------------------------------------------------------------------------------------ the runner
@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    root = tmp_path_factory.mktemp("audit")
    tok = tiny_tokenizer()
    data = root / "prompts.jsonl"
    data.write_text("".join(json.dumps({"text": t}) + "\n" for t in ("def add(a, b):", "for i in range(10):")))
    return {"target": save_tiny_model(root / "target", tokenizer=tok),
            "draft": save_tiny_model(root / "draft", layers=1, hidden=32, seed=1, tokenizer=tok), "data": data}


def bench(saved, tmp_path, *overrides):
    base = [f"model.path={saved['target']}", "logger=none", "benchmark.max_new_tokens=10", "benchmark.warmup=0",
            "benchmark=jsonl", f"benchmark.path={saved['data']}", "benchmark.prompt_field=text",
            "draft.name=tiny-draft", f"draft.path={saved['draft']}"]
    with initialize_config_dir(config_dir=str(config_dir()), version_base="1.3"):
        cfg = compose("config", overrides=base + list(overrides))
    run_benchmark(OmegaConf.to_object(cfg), cfg, tmp_path)
    results = json.loads((tmp_path / "results.json").read_text())
    return results, [json.loads(line) for line in (tmp_path / "per_prompt.jsonl").read_text().splitlines()]


ALL = "decoders=[tr_jacobi,pld,lookahead,speculative,ouroboros,hf_greedy,hf_pld,hf_assisted]"


@pytest.mark.parametrize("strict", [False, True])
def test_lossless_run_has_no_mismatch_and_records_its_numerics(saved, tmp_path, strict):
    results, per_prompt = bench(saved, tmp_path, "decoder=jacobi", ALL, f"benchmark.strict_numerics={strict}")
    assert len({r["decoder"] for r in results["rows"]}) == 10
    for row in results["rows"]:
        assert row["lossless_fraction"] == 1.0 and row["mismatch_fraction"] == 0.0, row["decoder"]
    assert all(r["verdict"] is None and r["divergence_margin"] is None for r in per_prompt)
    meta = results["meta"]
    assert meta["strict_numerics"] is strict and meta["attn_implementation"] == "sdpa_gqa"
    assert meta["sdpa_backends"] == (["math"] if strict else ["flash", "efficient", "math"])
    assert meta["transformers"] and meta["device_name"] and meta["torch"] == torch.__version__


def test_runner_flags_a_decoder_with_a_planted_wrong_token(saved, tmp_path, monkeypatch):
    def flipped(self, prompt, max_new_tokens):
        out = Decoder.generate(self, prompt, max_new_tokens)
        out.tokens[2] = (out.tokens[2] + 1) % self.target.vocab_size
        return out

    monkeypatch.setattr(decoder_class("jacobi"), "generate", flipped)
    results, per_prompt = bench(saved, tmp_path, "decoder=jacobi")
    row = next(r for r in results["rows"] if r["decoder"] == "jacobi" and r["category"] == "all")
    assert row["lossless_fraction"] == 0.0 and row["mismatch_fraction"] == 1.0
    mine = [r for r in per_prompt if r["decoder"] == "jacobi"]
    assert all(r["verdict"] == "mismatch" and r["first_divergence"] == 2 for r in mine)
    assert all(r["divergence_token"] != r["divergence_ar_token"] is not None for r in mine)


def test_sampling_has_no_mismatch_fraction(saved, tmp_path):
    results, _ = bench(saved, tmp_path, "decoder=ar", "decoder.temperature=0.8", "benchmark.limit=1")
    assert all(r["mismatch_fraction"] is None for r in results["rows"])


# ------------------------------------------------------------------------------------------ numerics
def sdpa_flags() -> tuple[bool, ...]:
    return (torch.backends.cuda.flash_sdp_enabled(), torch.backends.cuda.mem_efficient_sdp_enabled(),
            torch.backends.cuda.math_sdp_enabled(), torch.backends.cuda.cudnn_sdp_enabled())


def strict_flags() -> tuple:
    return (torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction,
            torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction, torch.get_float32_matmul_precision())


def test_policy_is_applied_inside_the_context_and_restored_after():
    model = make_model("llama").model
    torch.set_float32_matmul_precision("high")  # a caller's own setting, which strict overrides only inside
    before, strict_before = sdpa_flags(), strict_flags()
    assert policy(model) == Numerics()  # a model loaded elsewhere gets the default
    with numerics(model):
        assert sdpa_flags() == (True, True, True, False)  # everything but cuDNN
    use_numerics(model, backends=["efficient"])
    with numerics(model):
        assert sdpa_flags() == (False, True, True, False)  # math always stays as the fallback
    use_numerics(model, strict=True)
    assert policy(model) == Numerics(("efficient",), strict=True)
    with numerics(model):
        assert sdpa_flags() == (False, False, True, False)
        assert strict_flags() == (False, False, "highest")
    use_numerics(model, backends=[], strict=False)
    with numerics(model):
        assert sdpa_flags() == before  # torch's own choice: nothing touched
    assert sdpa_flags() == before and strict_flags() == strict_before == (True, True, "high")
    torch.set_float32_matmul_precision("highest")


def test_strict_and_backend_choice_keep_fp32_logits():
    model = make_model("qwen2").model
    ids = prompts(1, seed=6)[0]
    reference = DynamicEngine(model).forward(ids)
    for backends, strict in ((["efficient", "math"], False), (["math"], True)):
        use_numerics(model, backends=backends, strict=strict)
        assert torch.allclose(DynamicEngine(model).forward(ids), reference, atol=1e-5)
    use_numerics(model, backends=["flash", "efficient", "math"], strict=False)


def test_bad_backend_name_is_a_config_error():
    with initialize_config_dir(config_dir=str(config_dir()), version_base="1.3"):
        cfg = compose("config", overrides=["model.sdpa_backends=[flash,fast]"])
    with pytest.raises(ConfigError, match=r"model.sdpa_backends\[\]: got 'fast'"):
        OmegaConf.to_object(cfg)


@pytest.mark.parametrize("engine", ["dynamic", "static"])
def test_every_engine_runs_the_model_under_its_policy(engine):
    """The backend / strict policy is entered around the model call by both engines, not just the dynamic one."""
    from specnoise.decoding.static_kv import StaticEngine

    model = make_model("llama").model
    use_numerics(model, strict=True)
    seen = []
    hook = model.register_forward_pre_hook(lambda *_: seen.append(sdpa_flags()))
    try:
        kv = DynamicEngine(model) if engine == "dynamic" else StaticEngine(model, buckets=(1, 8))
        kv.forward(prompts(1, seed=2)[0][:5])
        kv.forward([3])
    finally:
        hook.remove()
        use_numerics(model, backends=["flash", "efficient", "math"], strict=False)
    assert seen and all(flags == (False, False, True, False) for flags in seen)  # math only, every call
