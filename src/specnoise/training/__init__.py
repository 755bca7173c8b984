"""Training stages: ``train=sft`` (supervised fine-tuning), ``train=msn`` (SFT with noisy inputs, Make Some
Noise), ``train=pretrain`` (a model and tokenizer from scratch, for the shipped tiny models), ``train=cllm`` and
``train=jacobi_forcing`` (consistency training on the model's own Jacobi trajectories: consistency.py)."""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path

from omegaconf import DictConfig

from specnoise.config import Config, UserError
from specnoise.training.collator import Collator

log = logging.getLogger("specnoise.train")


def train(conf: Config, cfg: DictConfig, run_dir: Path) -> Path:
    """Run the configured stage; returns the folder of the saved final model (run_dir / train.output_dir), or with
    ``train.cache_dir`` the model an earlier job of the same training saved (reuse.py)."""
    from specnoise.training.trainer import agree_on_run_dir, process_state

    run_dir = agree_on_run_dir(run_dir)
    if not conf.train.cache_dir:
        return train_here(conf, cfg, run_dir)
    from specnoise.training.preflight import check_writable
    from specnoise.training.reuse import TrainedModels, reuse_into, training_key

    if process_state().num_processes > 1:  # one rank holding the lock while the others train would deadlock
        raise UserError("train.cache_dir works in one process: drop it (train.cache_dir=null) for an accelerate run")
    # before its lock is taken (an OSError there would name no setting), and before any model loads
    check_writable(Path(conf.train.cache_dir).expanduser(), "train.cache_dir", "the folder the run started in")
    cache, (key, what) = TrainedModels(conf.train.cache_dir), training_key(conf)
    with cache.lock(key):  # a job of the same training started beside this one waits here, then reuses
        found = cache.find(key)
        if found:
            return reuse_into(found, run_dir)
        model = train_here(conf, cfg, run_dir)
        cache.record(key, what, model)
        return model


def train_here(conf: Config, cfg: DictConfig, run_dir: Path) -> Path:
    """Train the configured stage in this job's folder."""
    from specnoise.training.preflight import check_noise_fits, check_writable
    from specnoise.training.trainer import fit, keep_first_overrides, on_main_process

    t = conf.train
    if on_main_process():
        check_writable(run_dir / t.output_dir)
        keep_first_overrides(run_dir, t.resume)
    if t.name == "pretrain":
        from specnoise.data.corpus import load_corpus
        from specnoise.training.pretrain import prepare

        texts, heldout = load_corpus(conf.data)
        model, tokenizer, train_chunks, eval_chunks = prepare(t, texts, heldout, run_dir)
        train_set = [{"input_ids": c, "prompt_len": 0} for c in train_chunks]
        eval_set = [{"input_ids": c, "prompt_len": 0} for c in eval_chunks]
    else:
        from specnoise.data.sft import load_sft
        from specnoise.models import load_model, load_tokenizer

        # data first: a bad data / noise setting fails before minutes of loading weights
        train_set, eval_set = load_sft(conf.data, load_tokenizer(conf.model), conf.model.template, t)
        if t.name == "msn":
            check_noise_fits(train_set, t.noise)
        if t.name in ("cllm", "jacobi_forcing"):
            return train_consistency(conf, cfg, run_dir, train_set, eval_set)
        # fp32 master weights on the CPU; Trainer places them and train.bf16 adds autocast
        loaded = load_model(dataclasses.replace(conf.model, dtype="float32", device="cpu"))
        model, tokenizer = loaded.model, loaded.tokenizer
        model.train()
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    collator = Collator(pad_id, noise=t.noise if t.name == "msn" else None,
                        vocab_size=len(tokenizer), seed=t.seed)
    return fit(model, tokenizer, train_set, eval_set, collator, conf, cfg, run_dir)


def train_consistency(conf: Config, cfg: DictConfig, run_dir: Path, train_set: list[dict], eval_set: list[dict]):
    """CLLM / Jacobi Forcing: collect (or reuse) the model's Jacobi trajectories, then train on them."""
    from specnoise.models import load_model
    from specnoise.training.consistency import CLLMCollator, ConsistencyTrainer, JFCollator, cllm_samples, jf_samples
    from specnoise.training.trainer import fit
    from specnoise.training.trajectories import TrajectoryStore, collect, model_fingerprint, select_prompts

    t = conf.train
    tcfg = t.cllm if t.name == "cllm" else t.jacobi_forcing
    # every check that needs no weights first: prompt count, and that a given trajectory file is this model's
    prompts = select_prompts(train_set, tcfg)
    fingerprint = model_fingerprint(conf.model.path, conf.model.revision)
    TrajectoryStore(tcfg, fingerprint, prompts).check()
    loaded = load_model(dataclasses.replace(conf.model, dtype="float32", device="cpu"))
    model, tokenizer = loaded.model, loaded.tokenizer
    records, stats = collect(model, tokenizer, prompts, tcfg, fingerprint)
    model.to("cpu").train()  # Trainer places it
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    if t.name == "cllm":
        samples, cut = cllm_samples(records, t.max_seq_len)
        collator = CLLMCollator(pad_id, tokenizer.eos_token_id, tcfg, seed=t.seed)
    else:
        samples, cut = jf_samples(records, t.max_seq_len)
        collator = JFCollator(pad_id, tokenizer.eos_token_id, tcfg)
    if not samples:
        raise UserError(f"train={t.name}: no training sample fits train.max_seq_len={t.max_seq_len} (prompt + "
                        f"{'2 x ' if t.name == 'jacobi_forcing' else ''}block); raise train.max_seq_len")
    if cut:
        log.warning("%d blocks beyond train.max_seq_len=%d left out", cut, t.max_seq_len)
    stats.update(consistency_samples=len(samples), blocks_beyond_max_seq_len=cut)
    log.info("%s: %d training samples from %d prompts", t.name, len(samples), len(records))
    return fit(model, tokenizer, samples, eval_set, collator, conf, cfg, run_dir,
               eval_collator=Collator(pad_id), trainer_class=ConsistencyTrainer,
               trainer_kwargs={"method": t.name, "cfg": tcfg}, summary_extra=stats)
