"""Many processes: every ``conf/accelerate`` config passes the launch check (read by accelerate's own parser), a
config without processes is refused with a one-line error, and (slow) two training stages run under
``accelerate launch --num_processes 2`` on the CPU with the result files of one process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from helpers_models import save_tiny_model
from specnoise.config import UserError
from specnoise.training.launch import check_accelerate_config, main

REPO = Path(__file__).resolve().parents[1]
CONFIGS = sorted((REPO / "conf" / "accelerate").glob("*.yaml"))


def test_there_are_configs_for_ddp_fsdp_deepspeed_and_cpu():
    assert {p.stem for p in CONFIGS} >= {"ddp", "fsdp", "deepspeed", "cpu"}


@pytest.mark.parametrize("path", CONFIGS, ids=[p.stem for p in CONFIGS])
def test_every_shipped_accelerate_config_is_valid(path):
    cfg = check_accelerate_config(path)
    assert cfg.num_processes >= cfg.num_machines >= 1
    kind = str(cfg.distributed_type.value)
    expected = {"ddp": "MULTI_GPU", "fsdp": "FSDP", "deepspeed": "DEEPSPEED", "cpu": "MULTI_GPU"}
    assert expected.get(path.stem, kind) == kind
    if path.stem != "cpu":
        assert cfg.mixed_precision == "bf16"
    else:  # --cpu / use_cpu would start one process (tested below)
        assert not cfg.use_cpu and cfg.num_processes == 2


BASE = "compute_environment: LOCAL_MACHINE\ndistributed_type: {kind}\nnum_machines: 1\nmixed_precision: bf16\n"


@pytest.mark.parametrize("body, message", [
    (BASE.format(kind="MULTI_GPU"), "no num_processes"),
    (BASE.format(kind="MULTI_GPU") + "num_processes: 0\n", "no num_processes"),
    (BASE.format(kind="MULTI_GPU").replace("num_machines: 1", "num_machines: 4") + "num_processes: 2\n",
     "num_machines=4"),
    (BASE.format(kind="FSDP") + "num_processes: 2\n", "without an fsdp_config"),
    (BASE.format(kind="DEEPSPEED") + "num_processes: 2\ndeepspeed_config:\n  zero_stage: 5\n", "zero_stage=5"),
    (BASE.format(kind="MULTI_CPU") + "num_processes: 2\nuse_cpu: true\n", "starts ONE process"),
])
def test_bad_accelerate_configs_are_refused_with_one_line(tmp_path, body, message, capsys):
    path = tmp_path / "bad.yaml"
    path.write_text(body)
    with pytest.raises(UserError, match=message):
        check_accelerate_config(path)
    assert main([str(path)]) == 2
    out = capsys.readouterr().out
    assert out.startswith("error: ") and len(out.strip().splitlines()) == 1


def launch(tmp_path, run_dir, overrides, processes: int):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO / "src")}
    cpu = str(REPO / "conf/accelerate/cpu.yaml")
    head = ([sys.executable, "-m", "accelerate.commands.launch", "--config_file", cpu, "--num_processes",
             str(processes)]
            if processes > 1 else [sys.executable])
    cmd = [*head, "-m", "specnoise", *overrides, "logger=none", f"hydra.run.dir={run_dir}"]
    done = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads((run_dir / "train_results.json").read_text())


@pytest.mark.slow
def test_two_processes_on_the_cpu_match_one(tmp_path):
    base = save_tiny_model(tmp_path / "base", layers=1, hidden=32)
    data = tmp_path / "sft.jsonl"
    data.write_text("\n".join(json.dumps({"instruction": f"Write add{i}.", "output": f"def add{i}(a, b):\n    "
                                          f"return a + b + {i}\n"}) for i in range(40)))
    common = ["model=small-code", f"model.path={base}", "data=jsonl", f"data.path={data}", "train.max_seq_len=96",
              "train.eval_samples=4", "train.max_steps=4", "train.save_steps=100000"]
    for stage, extra in [("msn", []), ("cllm", ["train.cllm.block=4", "train.cllm.max_new_tokens=8",
                                                "train.cllm.prompts=6", "train.cllm.repeat_count=1000",
                                                f"train.cllm.cache_dir={tmp_path / 'traj'}"])]:
        # the same global batch: 1 x 4 and 2 x 2
        one = launch(tmp_path, tmp_path / f"{stage}-1", [f"train={stage}", *common, *extra,
                                                         "train.per_device_batch_size=4"], 1)
        two = launch(tmp_path, tmp_path / f"{stage}-2", [f"train={stage}", *common, *extra,
                                                         "train.per_device_batch_size=2"], 2)
        names = sorted(p.name for p in (tmp_path / f"{stage}-1").iterdir() if p.name not in ("checkpoints",))
        assert names == sorted(p.name for p in (tmp_path / f"{stage}-2").iterdir() if p.name not in ("checkpoints",))
        assert one["steps"] == two["steps"] == 4
        assert one["tokens_seen"] == two["tokens_seen"]  # the same samples, counted over both processes
        assert two["train_samples"] == one["train_samples"]
        if stage == "msn":  # counted by each rank's collator, summed (4 steps, and the batch fetched ahead)
            assert one["noise/samples"] == two["noise/samples"] == 5 * 4
        assert abs(two["heldout_loss"] - one["heldout_loss"]) <= 0.02 * one["heldout_loss"]
        if stage == "cllm":  # the second run found the first one's trajectories; a fresh split collects anew below
            assert two["collected_prompts_here"] == 0
    # trajectory collection split over two processes gives the one-process file
    traj = launch(tmp_path, tmp_path / "split", ["train=cllm", *common, "train.per_device_batch_size=2",
                                                 "train.cllm.block=4", "train.cllm.max_new_tokens=8",
                                                 "train.cllm.prompts=6", "train.cllm.repeat_count=1000",
                                                 f"train.cllm.cache_dir={tmp_path / 'traj2'}"], 2)
    assert 0 < traj["collected_prompts_here"] < 6  # this rank's share
    assert Path(traj["trajectory_file"]).read_text() == Path(one["trajectory_file"]).read_text()
