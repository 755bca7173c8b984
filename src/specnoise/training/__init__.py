"""Training stages: ``train=sft`` (supervised fine-tuning), ``train=msn`` (SFT with noisy inputs, Make Some
Noise) and ``train=pretrain`` (a model and tokenizer from scratch, for the shipped tiny models)."""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path

from omegaconf import DictConfig

from specnoise.config import Config
from specnoise.training.collator import Collator

log = logging.getLogger("specnoise.train")


def train(conf: Config, cfg: DictConfig, run_dir: Path) -> Path:
    """Run the configured stage; returns the folder of the saved final model (run_dir / train.output_dir)."""
    from specnoise.training.preflight import check_noise_fits, check_writable
    from specnoise.training.trainer import agree_on_run_dir, fit, keep_first_overrides, on_main_process

    run_dir = agree_on_run_dir(run_dir)
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
        # fp32 master weights on the CPU; Trainer places them and train.bf16 adds autocast
        loaded = load_model(dataclasses.replace(conf.model, dtype="float32", device="cpu"))
        model, tokenizer = loaded.model, loaded.tokenizer
        model.train()
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    collator = Collator(pad_id, noise=t.noise if t.name == "msn" else None,
                        vocab_size=len(tokenizer), seed=t.seed)
    return fit(model, tokenizer, train_set, eval_set, collator, conf, cfg, run_dir)
