"""Training stages end to end on a tiny tokenizer and model made here: a few real steps of sft, msn and
pretrain through ``train()``, the saved folder loaded back with from_pretrained, resume, and data errors."""

from __future__ import annotations

import json
import math
import shutil

import pytest
import torch
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM

from specnoise.config import ConfigError, DataConfig, TrainConfig, UserError, config_dir
from specnoise.data.sft import load_sft
from specnoise.training import train
from specnoise.training.pretrain import train_tokenizer
from specnoise.training.trainer import SpecnoiseTrainer

TINY = ["train.arch.hidden_size=32", "train.arch.intermediate_size=64", "train.arch.num_hidden_layers=1",
        "train.arch.num_attention_heads=2", "train.arch.num_key_value_heads=1", "train.arch.vocab_size=300"]


def texts(n: int) -> list[str]:
    return [f"def f{i}(x):\n    return x * {i} + {i % 7}\n\n\nprint(f{i}({i}))\n" for i in range(n)]


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    """A random 1-layer Llama with a byte-level BPE tokenizer trained on a few lines of code."""
    folder = tmp_path_factory.mktemp("base")
    tokenizer = train_tokenizer(texts(200), vocab_size=300)
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64,
                                         num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                                         eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id))
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def sft_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("data") / "sft.jsonl"
    rows = [{"instruction": f"Write f{i}.", "input": "" if i % 2 else f"x={i}", "output": t}
            for i, t in enumerate(texts(30))]
    path.write_text("\n".join(json.dumps(r) for r in rows))
    return path


def run(tmp_path, overrides: list[str], run_dir: str = "run"):
    with initialize_config_dir(config_dir=str(config_dir()), version_base="1.3"):
        cfg = compose("config", overrides=["logger=none", "train.logging_steps=1", *overrides])
    conf = OmegaConf.to_object(cfg)
    return train(conf, cfg, tmp_path / run_dir), tmp_path / run_dir


def fine_tune(stage, base, sft_file, *extra):
    return [f"train={stage}", "model=small-code", f"model.path={base}", "data=jsonl", f"data.path={sft_file}",
            "train.per_device_batch_size=4", "train.max_seq_len=64", "train.eval_samples=4", *extra]


@pytest.fixture
def evaluations(monkeypatch) -> list[int]:
    """The global step of every held-out evaluation (in-training ones and the final one)."""
    steps = []
    evaluate = SpecnoiseTrainer.evaluate

    def counted(self, *args, **kwargs):
        steps.append(self.state.global_step)
        return evaluate(self, *args, **kwargs)

    monkeypatch.setattr(SpecnoiseTrainer, "evaluate", counted)
    return steps


def loads(folder):
    model = AutoModelForCausalLM.from_pretrained(folder)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    # transformers 5.17's Trainer saves the generation config's EOS as a one-element list, 5.23 as an int
    assert tokenizer.eos_token_id is not None
    assert model.generation_config.eos_token_id in (tokenizer.eos_token_id, [tokenizer.eos_token_id])
    out = model.generate(torch.tensor([tokenizer("def f(")["input_ids"]]), max_new_tokens=3, do_sample=False)
    assert out.shape[1] >= 4
    return model


@pytest.mark.parametrize("stage", ["sft", "msn"])
def test_fine_tune_saves_a_loadable_model(tmp_path, base, sft_file, stage, evaluations):
    final, run_dir = run(tmp_path, fine_tune(stage, base, sft_file, "train.max_steps=3", "train.save_steps=2"))
    assert evaluations == [2, 3]  # every save_steps, and once at the end (Trainer's own final one is skipped)
    assert final == run_dir / "model"
    loads(final)
    summary = json.loads((run_dir / "train_results.json").read_text())
    assert summary["steps"] == 3 and summary["heldout_samples"] == 3 and math.isfinite(summary["heldout_loss"])
    assert (summary.get("noise/samples", 0) > 0) == (stage == "msn")
    assert (run_dir / "checkpoints" / "checkpoint-2").is_dir()


def test_pretrain_trains_tokenizer_and_model(tmp_path):
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("\n".join(json.dumps({"text": t}) for t in texts(120)))
    final, run_dir = run(tmp_path, ["train=pretrain", "data=jsonl", "data.format=text", f"data.path={corpus}",
                                    "train.max_steps=2", "train.max_seq_len=32", "train.per_device_batch_size=4",
                                    "train.save_dtype=bfloat16", *TINY])
    model = loads(final)
    assert model.config.num_hidden_layers == 1 and model.config.tie_word_embeddings
    assert json.loads((final / "config.json").read_text())["dtype"] == "bfloat16"  # the compact shipped form
    assert (run_dir / "tokenizer" / "tokenizer.json").is_file()


def hydra_wrote(run_dir, *overrides: str) -> None:
    """What Hydra's app does at every job start, before any of our code runs."""
    (run_dir / ".hydra").mkdir(parents=True, exist_ok=True)
    (run_dir / ".hydra" / "overrides.yaml").write_text("".join(f"- {o}\n" for o in overrides))


def test_resume_continues_from_the_checkpoint(tmp_path, base, sft_file, evaluations):
    steps = fine_tune("msn", base, sft_file, "train.save_steps=2", "train.per_device_batch_size=2")
    with pytest.raises(UserError, match="hydra.run.dir"):
        run(tmp_path, [*steps, "train.max_steps=2", "train.resume=true"], run_dir="fresh")
    hydra_wrote(tmp_path / "run", "train=msn", "train.max_steps=3")
    run(tmp_path, [*steps, "train.max_steps=2"])  # "killed" after its checkpoint at step 2
    evaluations.clear()
    hydra_wrote(tmp_path / "run", "train=msn", "train.max_steps=3", "train.resume=true")
    final, run_dir = run(tmp_path, [*steps, "train.max_steps=3", "train.resume=true"])
    assert evaluations == [3]  # the held-out set once, at the end
    hydra = run_dir / ".hydra"
    assert (hydra / "overrides.yaml").read_text() == "- train=msn\n- train.max_steps=3\n"  # what the report reads
    assert "train.resume=true" in (hydra / "overrides.resume.yaml").read_text()
    summary = json.loads((run_dir / "train_results.json").read_text())
    state = json.loads((run_dir / "checkpoints" / "checkpoint-3" / "trainer_state.json").read_text())
    assert summary["steps"] == 3 and state["global_step"] == 3
    assert [e["step"] for e in state["log_history"] if "loss" in e] == [1, 2, 3]  # steps 1-2 from the first run
    assert summary["noise/samples"] < 3 * 2  # the resumed run trained one step, not three
    loads(final)


def test_sft_data_errors_and_formats(tmp_path, base):
    tokenizer = AutoTokenizer.from_pretrained(base)
    cfg = TrainConfig(name="sft", max_seq_len=128, eval_samples=0)

    def load(rows, **kw):
        path = tmp_path / "d.json"
        path.write_text(json.dumps(rows))
        return load_sft(DataConfig(name="t", path=str(path), **kw), tokenizer, "code-instruct", cfg)[0]

    with pytest.raises(UserError, match="no samples"):
        load([])
    with pytest.raises(UserError, match="lacks field"):
        load([{"instruction": "a"}])
    (feature,) = load([{"instruction": "a", "response": "b"}])  # GPTeacher's field name
    assert feature["input_ids"][-1] == tokenizer.eos_token_id
    prompt = tokenizer("### Instruction:\na\n### Response:\n")["input_ids"]
    assert feature["input_ids"][: feature["prompt_len"]] == prompt
    (conv,) = load([{"conversations": ["hi", "hello", "more", "sure"]}])  # LIMA: last answer is the response
    assert tokenizer.decode(conv["input_ids"][conv["prompt_len"]:]).startswith("sure")
    assert "hello" in tokenizer.decode(conv["input_ids"][: conv["prompt_len"]])
    long = [{"instruction": "a", "output": "x = 1\n" * 400}]
    assert len(load(long)[0]["input_ids"]) == 128  # truncation=right
    cfg.truncation = "error"
    with pytest.raises(UserError, match="max_seq_len"):
        load(long)


def test_unreachable_hub_dataset_names_data_path(monkeypatch, base):
    import datasets
    import huggingface_hub

    # what a machine without network sees, without waiting for connection time-outs (read at import time)
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    tokenizer = AutoTokenizer.from_pretrained(base)
    with pytest.raises(UserError, match="data.path"):
        load_sft(DataConfig(name="x", hub="no-such-user/no-such-set"), tokenizer, "raw", TrainConfig(name="sft"))


def test_noise_longer_than_the_responses_stops_before_the_model_loads(tmp_path, base, sft_file, monkeypatch):
    import specnoise.models

    def no_loading(*args, **kwargs):
        raise AssertionError("the model was loaded before the noise check")

    monkeypatch.setattr(specnoise.models, "load_model", no_loading)
    for rule, reason in (("skip", "no sample would be noised"), ("shrink", "most samples would get a shrunk")):
        with pytest.raises(ConfigError, match=f"train.noise.length=60: {reason}.*of 27 training samples 0 fit"):
            run(tmp_path, fine_tune("msn", base, sft_file, "train.noise.length=60",
                                    f"train.noise.short_response={rule}"), run_dir=rule)
        assert not (tmp_path / rule / "checkpoints").exists()


def test_unwritable_output_dir_fails_before_training(tmp_path, base, sft_file):
    (tmp_path / "a-file").write_text("")
    with pytest.raises(ConfigError, match="train.output_dir: cannot write to .*a-file/model"):
        run(tmp_path, fine_tune("sft", base, sft_file, f"train.output_dir={tmp_path}/a-file/model"))
    assert not (tmp_path / "run" / "checkpoints").exists()
    with pytest.raises(ConfigError, match="train.cache_dir: cannot write to .*a-file/trained"):
        run(tmp_path, fine_tune("sft", base, sft_file, f"train.cache_dir={tmp_path}/a-file/trained"))
    assert not (tmp_path / "run" / "checkpoints").exists()
    final, _ = run(tmp_path, fine_tune("sft", base, sft_file, "train.max_steps=1", "train.output_dir=out/model",
                                       "train.eval_samples=0"))
    assert final == tmp_path / "run" / "out" / "model" and (final / "config.json").is_file()


def test_a_data_files_fingerprint_is_its_whole_contents(tmp_path):
    """train.cache_dir keys a data file by file_fingerprint: a copy elsewhere keeps it, and a same-size edit in the
    middle of a file of several MiB changes it (a hash of the first and last MiB only would miss that edit)."""
    from specnoise.training.trajectories import file_fingerprint

    data = bytes(range(256)) * (3 << 12)  # 3 MiB
    first, copy, edited = tmp_path / "a.jsonl", tmp_path / "b" / "a.jsonl", tmp_path / "c.jsonl"
    copy.parent.mkdir()
    first.write_bytes(data)
    copy.write_bytes(data)
    middle = len(data) // 2
    edited.write_bytes(data[:middle] + bytes([data[middle] ^ 1]) + data[middle + 1:])
    assert file_fingerprint(first) == file_fingerprint(copy) != file_fingerprint(edited)


def test_jobs_of_the_same_training_share_one_model(tmp_path, base, sft_file, evaluations):
    """train.cache_dir: the first job trains and records its model; a job of the same training (bookkeeping aside)
    trains nothing and takes that model and its training record; another training setting trains anew."""
    from specnoise.training.reuse import model_label

    cache = f"train.cache_dir={tmp_path / 'trained'}"
    steps = fine_tune("msn", base, sft_file, "train.max_steps=2", cache)
    first, first_dir = run(tmp_path, steps, run_dir="0")
    assert evaluations == [2]
    again, again_dir = run(tmp_path, [*steps, "train.logging_steps=5", "train.save_steps=7"], run_dir="1")
    assert again == first and evaluations == [2]  # nothing trained or evaluated
    mine, theirs = (json.loads((d / "train_results.json").read_text()) for d in (again_dir, first_dir))
    assert mine.pop("reused_from") == str(first_dir.resolve()) and mine == theirs
    assert not (again_dir / "model").exists() and not (again_dir / "checkpoints").exists()
    assert model_label("b", "msn", again_dir) == model_label("b", "msn", first_dir) == "b+msn@0"  # one label
    other, _ = run(tmp_path, [*steps, "train.noise.length=2"], run_dir="2")
    assert other == tmp_path / "2" / "model" and evaluations == [2, 2]
    assert len(list((tmp_path / "trained").glob("*.json"))) == 2
    shutil.rmtree(first)  # a recorded model that is gone is trained again
    retrained, _ = run(tmp_path, steps, run_dir="3")
    assert retrained == tmp_path / "3" / "model" and evaluations == [2, 2, 2]
    # the data are keyed by their contents, not their path: a copy elsewhere is the same training, an edit is not
    copy = tmp_path / "elsewhere" / sft_file.name
    copy.parent.mkdir()
    shutil.copy(sft_file, copy)
    moved, _ = run(tmp_path, fine_tune("msn", base, copy, "train.max_steps=2", cache), run_dir="4")
    assert moved == retrained and evaluations == [2, 2, 2]
    copy.write_text(copy.read_text().replace("Write f1.", "Write g1."))
    edited, _ = run(tmp_path, fine_tune("msn", base, copy, "train.max_steps=2", cache), run_dir="5")
    assert edited == tmp_path / "5" / "model" and evaluations == [2, 2, 2, 2]
