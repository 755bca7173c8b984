"""train=cllm and train=jacobi_forcing: the Jacobi trajectories (states are Jacobi updates of each other, the fixed
point is greedy AR's output), the Jacobi Forcing packing (one packed forward gives the logits of the separate plain
forwards), the CLLM batches, the trajectory cache (reuse, resume, another model refused), the errors raised before
any work, and a few real training steps through ``train()`` that leave a loadable model."""

from __future__ import annotations

import json
import math
import os
import random
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf
from transformers import AutoModelForCausalLM

from helpers_models import save_tiny_model
from specnoise.config import CLLMConfig, ConfigError, JacobiForcingConfig, UserError, config_dir
from specnoise.decoding.kv import DynamicEngine
from specnoise.training import train
from specnoise.training.consistency import CLLMCollator, JFCollator, cllm_samples, jf_samples, pack
from specnoise.training.trajectories import jacobi_trajectory, repetitive

EOS = 2


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    return save_tiny_model(tmp_path_factory.mktemp("base"), layers=1, hidden=32)


@pytest.fixture(scope="module")
def other(tmp_path_factory):
    return save_tiny_model(tmp_path_factory.mktemp("other"), layers=1, hidden=32, seed=1)


@pytest.fixture(scope="module")
def sft_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("data") / "sft.jsonl"
    rows = [{"instruction": f"Write add{i}.", "output": f"def add{i}(a, b):\n    return a + b + {i}\n"}
            for i in range(24)]
    path.write_text("\n".join(json.dumps(r) for r in rows))
    return path


@pytest.fixture(scope="module")
def model(base):
    return AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32).eval()


def run(tmp_path, stage, base, sft_file, *extra, run_dir="run"):
    overrides = [f"train={stage}", "model=small-code", f"model.path={base}", "data=jsonl", f"data.path={sft_file}",
                 "logger=none", "train.per_device_batch_size=3", "train.max_seq_len=96", "train.eval_samples=4",
                 "train.max_steps=2", "train.logging_steps=1", f"train.{stage}.block=4",
                 f"train.{stage}.max_new_tokens=12", f"train.{stage}.prompts=6", f"train.{stage}.repeat_count=1000",
                 f"train.{stage}.cache_dir={tmp_path / 'trajectories'}", *extra]
    with initialize_config_dir(config_dir=str(config_dir()), version_base="1.3"):
        cfg = compose("config", overrides=overrides)
    conf = OmegaConf.to_object(cfg)
    final = train(conf, cfg, tmp_path / run_dir)
    return final, json.loads((tmp_path / run_dir / "train_results.json").read_text())


def plain_argmax(model, ids: list[int]) -> list[int]:
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].argmax(-1).tolist()


def test_trajectory_states_are_jacobi_steps_and_the_fixed_point_is_greedy_ar(model):
    prompt = [5, 9, 17, 5, 30, 41, 9]
    cfg = CLLMConfig(block=4, max_new_tokens=12)
    traj = jacobi_trajectory(DynamicEngine(model), prompt, cfg, eos=set(), rng=random.Random(0))
    assert len(traj["blocks"]) == 3
    context = list(prompt)
    for block in traj["blocks"]:
        chain = block["states"] + [block["fixed"]]
        assert chain[0] != block["fixed"]
        for state, successor in zip(chain, chain[1:] + [block["fixed"]]):
            # s'_i = argmax after context + s_<i, computed here by a plain forward without any cache
            logits = plain_argmax(model, context + state)
            assert logits[len(context) - 1: len(context) + 3] == successor
        context += block["fixed"]
    greedy = model.generate(torch.tensor([prompt]), max_new_tokens=12, do_sample=False, eos_token_id=None)
    assert context[len(prompt):] == greedy[0, len(prompt):].tolist()


def test_repetitive_outputs_are_recognised():
    assert repetitive([1, 2, 3] * 5, n=3, count=3)
    assert not repetitive(list(range(30)), n=3, count=2)


def records(model, n_prompts=3, block=4, new=12):
    cfg = CLLMConfig(block=block, max_new_tokens=new)
    out = []
    for i in range(n_prompts):
        prompt = [5 + i, 9, 17, 30 + i, 41]
        rec = jacobi_trajectory(DynamicEngine(model), prompt, cfg, eos=set(), rng=random.Random(i))
        out.append({"index": i, "prompt": prompt, "gold": [7, 8, 9, EOS], **rec})
    return out


def test_jacobi_forcing_packed_forward_equals_the_separate_forwards(model):
    cfg = JacobiForcingConfig(block=4, max_new_tokens=12, min_noisy_ratio=0.2, max_noisy_ratio=1.0)
    rec = records(model, 1)[0]
    ids, pos, allow, labels, student, teacher = pack(rec["prompt"], rec["blocks"], cfg)
    mask = torch.zeros(1, 1, len(ids), len(ids)).masked_fill(~allow, torch.finfo(torch.float32).min)
    with torch.no_grad():
        packed = model(torch.tensor([ids]), attention_mask=mask, position_ids=torch.tensor([pos])).logits[0]
    P, n = len(rec["prompt"]), 4
    clean = list(rec["prompt"])
    for k, block in enumerate(rec["blocks"]):
        noisy_at, clean_at = P + 2 * k * n, P + 2 * k * n + n
        noisy = ids[noisy_at: noisy_at + n]
        assert noisy in block["states"] and ids[clean_at: clean_at + n] == block["fixed"]
        with torch.no_grad():
            alone_noisy = model(torch.tensor([clean + noisy])).logits[0, -n:]
            alone_clean = model(torch.tensor([clean + block["fixed"]])).logits[0, -n:]
        torch.testing.assert_close(packed[noisy_at: noisy_at + n], alone_noisy, atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(packed[clean_at: clean_at + n], alone_clean, atol=1e-4, rtol=1e-4)
        clean += block["fixed"]
    out = [t for b in rec["blocks"] for t in b["fixed"]]
    assert [t for t in labels if t != -100] == out  # the prompt's last and every clean token: the next clean token
    assert student and all(t == s + n for s, t in zip(student, teacher))  # noisy slot i vs clean slot i


def test_noise_schedule_rises_over_the_blocks(model):
    rec = records(model, 1, block=8, new=32)[0]
    cfg = JacobiForcingConfig(block=8, max_new_tokens=32, min_noisy_ratio=0.0, max_noisy_ratio=1.0)
    ids, *_ = pack(rec["prompt"], rec["blocks"], cfg)
    P = len(rec["prompt"])
    wrong = [sum(a != b for a, b in zip(ids[P + 16 * k: P + 16 * k + 8], ids[P + 16 * k + 8: P + 16 * k + 16]))
             for k in range(4)]
    assert wrong == sorted(wrong) and wrong[-1] > wrong[0]


def test_cllm_batches(model):
    recs = records(model, 3)
    samples, cut = cllm_samples(recs, max_seq_len=96)
    assert cut == 0 and len(samples) == sum(len([b for b in r["blocks"] if b["states"]]) for r in recs)
    for consistency in ("global", "local"):
        collator = CLLMCollator(0, EOS, CLLMConfig(block=4, consistency=consistency), seed=0)
        batch = collator(samples[:4])
        assert batch["student_ids"].shape == batch["target_ids"].shape == batch["compare"].shape
        for row, f in enumerate(samples[:4]):
            P = len(f["prefix"])
            state = batch["student_ids"][row, P: P + 4].tolist()
            target = batch["target_ids"][row, P: P + 4].tolist()
            j = f["states"].index(state)
            expected = f["fixed"] if consistency == "global" or j + 1 == len(f["states"]) else f["states"][j + 1]
            assert target == expected
            compared = batch["compare"][row].nonzero().flatten().tolist()
            # a position is compared iff its context (state[:i]) differs from the target's
            assert compared == [P - 1 + i for i in range(4) if state[:i] != target[:i]]
        labels = batch["labels"][0].tolist()
        assert labels[: samples[0]["prompt_len"]] == [-100] * samples[0]["prompt_len"]


def test_block_size_one_is_a_config_error():
    with pytest.raises(ConfigError, match="train.cllm.block"):
        CLLMConfig(block=1)
    with pytest.raises(ConfigError, match="train.jacobi_forcing.block"):
        JacobiForcingConfig(block=1)


@pytest.mark.parametrize("stage", ["cllm", "jacobi_forcing"])
def test_train_leaves_a_loadable_model_and_reuses_the_cache(tmp_path, base, sft_file, stage):
    final, summary = run(tmp_path, stage, base, sft_file)
    assert summary["stage"] == stage and summary["steps"] == 2 and math.isfinite(summary["heldout_loss"])
    assert summary["trajectory_prompts"] == 6 and summary["collected_prompts_here"] == 6
    # collection ran here: one record per prompt in the trajectory file, blocks collected (not a timing: a fast
    # machine collects in under the 0.1 s that collect_seconds rounds to)
    records = Path(summary["trajectory_file"]).read_text().splitlines()
    assert len(records) == 6 and summary["trajectory_blocks"] > 0
    AutoModelForCausalLM.from_pretrained(final)
    _, again = run(tmp_path, stage, base, sft_file, run_dir="again")
    assert again["collected_prompts_here"] == 0 and again["trajectory_blocks"] == summary["trajectory_blocks"]
    assert again["trajectory_file"] == summary["trajectory_file"]


def test_interrupted_collection_resumes(tmp_path, base, sft_file):
    _, first = run(tmp_path, "cllm", base, sft_file, "train.max_steps=1")
    path = first["trajectory_file"]
    lines = open(path).read().splitlines()
    # a killed collection: part of the records in a part file, its last line cut mid-write, no final file
    part = path.replace(".jsonl", ".part0.jsonl")
    open(part, "w").write("\n".join(lines[:4]) + "\n" + lines[4][:10])
    os.unlink(path)
    _, resumed = run(tmp_path, "cllm", base, sft_file, "train.max_steps=1", run_dir="resumed")
    assert resumed["collected_prompts_here"] == 2
    assert open(path).read().splitlines() == lines  # the same records as one uninterrupted collection


def test_errors_before_any_work(tmp_path, base, other, sft_file):
    with pytest.raises(UserError, match=r"train.cllm.prompts=500: the training split has only \d+ samples"):
        run(tmp_path, "cllm", base, sft_file, "train.cllm.prompts=500")
    _, summary = run(tmp_path, "cllm", base, sft_file, "train.max_steps=1")
    with pytest.raises(UserError, match="collected on another model"):
        run(tmp_path, "cllm", other, sft_file, f"train.cllm.trajectories={summary['trajectory_file']}",
            run_dir="other")
    with pytest.raises(UserError, match="other settings"):
        run(tmp_path, "cllm", base, sft_file, f"train.cllm.trajectories={summary['trajectory_file']}",
            "train.cllm.max_new_tokens=8", run_dir="settings")
    assert not (tmp_path / "other" / "model").exists()


def test_jf_samples_fit_max_seq_len(model):
    recs = records(model, 2)
    samples, cut = jf_samples(recs, max_seq_len=5 + 2 * 4 * 2)
    assert cut == 2 and all(len(s["blocks"]) == 2 for s in samples)
    batch = JFCollator(0, EOS, JacobiForcingConfig(block=4))(samples)
    assert batch["allow"].shape == (2, 1, 21, 21) and batch["input_ids"].shape == (2, 21)
