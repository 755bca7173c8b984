"""Hugging Face Trainer wiring shared by sft, msn and pretrain.

Trainer brings accelerate (DDP / FSDP / DeepSpeed via ``accelerate launch --config_file conf/accelerate/...``),
checkpoints and resume, progress bars, and rank-0-only wandb logging and saving. Two additions:
held-out losses use the clean collator (MSN and SFT are compared on the same noiseless inputs), and the
collator's noise counts go into every log line.

Resume (``train.resume=true`` in the killed run's directory) continues the checkpoints, the same wandb run
(its id is kept in the run directory), and keeps the first start's ``.hydra/overrides.yaml``, which Hydra
rewrites at every start and the report reads the job's settings from.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import shutil
import time
from pathlib import Path

import torch
from omegaconf import DictConfig
from torch.optim.lr_scheduler import LambdaLR
from transformers import ProgressCallback, Trainer, TrainerCallback, TrainingArguments
from transformers.trainer_utils import get_last_checkpoint

from specnoise.config import Config, UserError
from specnoise.tracking import Tracker, start_run
from specnoise.training.collator import Collator

log = logging.getLogger("specnoise.train")

CHECKPOINTS = "checkpoints"


class TimeBudget(TrainerCallback):
    """``train.max_minutes``: stop after that much training time, with warmup + cosine over wall-clock time
    instead of steps, so a run on a shared machine anneals fully however fast its steps turn out to be."""

    def __init__(self, minutes: float, warmup: float):
        self.seconds, self.warmup, self.start = minutes * 60, warmup, None

    def fraction(self) -> float:
        return 0.0 if self.start is None else min(1.0, (time.time() - self.start) / self.seconds)

    def lr_factor(self, _step: int) -> float:
        f, w = self.fraction(), self.warmup
        return f / w if f < w else 0.5 * (1 + math.cos(math.pi * (f - w) / (1 - w)))

    def on_train_begin(self, args, state, control, **kwargs):
        self.start = time.time()

    def on_step_end(self, args, state, control, **kwargs):
        if self.fraction() >= 1.0:
            control.should_training_stop = True


class FinalEvalOnce(TrainerCallback):
    """Trainer evaluates after the last step by itself; ``fit`` evaluates the final (saved) weights anyway,
    so the held-out set is evaluated once at the end, not twice."""

    def on_step_end(self, args, state, control, **kwargs):
        if control.should_training_stop or state.global_step >= state.max_steps:
            control.should_evaluate = False


class NumericProgress(ProgressCallback):
    """transformers' progress bar prints each log line with its floats turned into strings ('loss': '3.382');
    this one prints numbers as numbers (4 significant digits), so a copied line is data."""

    def on_log(self, args, state, control, logs=None, **kwargs):
        if state.is_world_process_zero and self.training_bar is not None:
            logs = {k: float(f"{v:.4g}") if isinstance(v, float) else v for k, v in (logs or {}).items()
                    if k != "total_flos"}
            self.training_bar.write(str(logs))


class SpecnoiseTrainer(Trainer):
    def __init__(self, *args, eval_collator: Collator | None = None, budget: TimeBudget | None = None, **kwargs):
        # FinalEvalOnce after the budget: both run after DefaultFlowCallback, and it reads their decision to stop
        super().__init__(*args, callbacks=[c for c in (budget, FinalEvalOnce()) if c], **kwargs)
        if self.pop_callback(ProgressCallback) is not None:  # only where a bar was asked for
            self.add_callback(NumericProgress)
        self.eval_collator, self.budget = eval_collator, budget

    def create_scheduler(self, num_training_steps: int, optimizer=None):
        if self.budget is None or self.lr_scheduler is not None:
            return super().create_scheduler(num_training_steps, optimizer)
        self.lr_scheduler = LambdaLR(optimizer or self.optimizer, self.budget.lr_factor)
        return self.lr_scheduler

    def get_eval_dataloader(self, eval_dataset=None):
        noisy, self.data_collator = self.data_collator, self.eval_collator or self.data_collator
        try:
            return super().get_eval_dataloader(eval_dataset)
        finally:
            self.data_collator = noisy

    def log(self, logs: dict, *args, **kwargs) -> None:
        stats = getattr(self.data_collator, "stats", None)
        if stats and "loss" in logs:
            logs.update(stats)
        super().log(logs, *args, **kwargs)


def process_state():
    """accelerate's process state as Trainer will see it. Without CUDA it must be asked with ``cpu=True`` (what
    TrainingArguments(use_cpu=True) does): a plain ``PartialState()`` on a machine without GPUs reports ONE process
    even under a 2-process launch, so every rank would think it is rank 0 and collect every trajectory."""
    from accelerate import PartialState

    return PartialState(cpu=not torch.cuda.is_available())


def on_main_process() -> bool:
    return process_state().is_main_process


def keep_first_overrides(run_dir: Path, resume: bool) -> None:
    """A first start saves ``.hydra/overrides.yaml`` as ``overrides.first.yaml``; a resumed start (whose
    command Hydra has just written there) puts the first back and keeps its own as ``overrides.resume.yaml``."""
    hydra_dir = run_dir / ".hydra"
    current, first = hydra_dir / "overrides.yaml", hydra_dir / "overrides.first.yaml"
    if not current.is_file():  # not started by Hydra's app (tests, notebooks)
        return
    if not resume:
        shutil.copyfile(current, first)
    elif first.is_file():
        shutil.copyfile(current, hydra_dir / "overrides.resume.yaml")
        shutil.copyfile(first, current)


def agree_on_run_dir(run_dir: Path) -> Path:
    """Every rank composes its own timestamped Hydra directory: take rank 0's so all write to one place."""
    from accelerate.utils import broadcast_object_list

    state = process_state()
    if state.num_processes > 1:
        run_dir = Path(broadcast_object_list([str(run_dir)], from_process=0)[0])
    return run_dir


def open_tracker(conf: Config, cfg: DictConfig, run_dir: Path):
    """(tracker, Trainer's report_to): rank 0 opens the job's wandb run (specnoise.tracking), and Trainer's
    wandb callback logs the loss curves into it; the other ranks log nothing."""
    if not on_main_process():
        return Tracker(), "none"
    tracker = start_run(conf, cfg, run_dir, job_type="train", resume=conf.train.resume)
    return tracker, ["wandb"] if tracker.mode != "disabled" else "none"


# transformers 5.23 renamed gradient_checkpointing (a deprecated alias there) to activation_checkpointing;
# 5.17 knows only the old name
CHECKPOINTING = next(name for name in ("activation_checkpointing", "gradient_checkpointing")
                     if name in {f.name for f in dataclasses.fields(TrainingArguments)})


def training_args(conf: Config, run_dir: Path, report_to, has_eval: bool) -> TrainingArguments:
    t = conf.train
    return TrainingArguments(
        output_dir=str(run_dir / CHECKPOINTS),
        max_steps=t.max_steps,
        num_train_epochs=t.epochs,
        per_device_train_batch_size=t.per_device_batch_size,
        per_device_eval_batch_size=t.per_device_batch_size,
        gradient_accumulation_steps=t.gradient_accumulation_steps,
        learning_rate=t.learning_rate,
        lr_scheduler_type=t.lr_scheduler,
        warmup_steps=t.warmup_ratio,  # a float in [0, 1) is a ratio of the total steps
        weight_decay=t.weight_decay,
        bf16=t.bf16,
        seed=t.seed,
        save_strategy="steps",
        save_steps=t.save_steps,
        save_total_limit=t.save_total_limit,
        eval_strategy="steps" if has_eval else "no",
        eval_steps=t.save_steps,
        logging_steps=t.logging_steps,
        logging_first_step=True,
        report_to=report_to,
        remove_unused_columns=False,  # the collator needs prompt_len
        dataloader_num_workers=t.num_workers,
        **{CHECKPOINTING: t.gradient_checkpointing},
        include_num_input_tokens_seen="non_padding",
        use_cpu=not torch.cuda.is_available(),
        disable_tqdm=False,
    )


def last_checkpoint(run_dir: Path) -> str:
    folder = run_dir / CHECKPOINTS
    last = get_last_checkpoint(str(folder)) if folder.is_dir() else None
    if last is None:
        raise UserError(f"train.resume=true: no checkpoint under {folder}; resume reuses the killed run's "
                        "directory: add hydra.run.dir=<that run directory>")
    return last


def totals(stats, train_loss: float) -> tuple[dict, float]:
    """The collator's counts summed over all processes (each rank's collator saw only its own batches) and the mean
    training loss over them, so a many-process train_results.json reads like one process's."""
    from accelerate.utils import gather_object

    if process_state().num_processes == 1:
        return dict(stats), train_loss
    per_rank = gather_object([(dict(stats), train_loss)])
    summed: dict = {}
    for s, _ in per_rank:
        for k, v in s.items():
            summed[k] = summed.get(k, 0) + v
    return summed, sum(r[1] for r in per_rank) / len(per_rank)


def fit(model, tokenizer, train_set, eval_set, collator, conf: Config, cfg: DictConfig, run_dir: Path,
        eval_collator: Collator | None = None, trainer_class=SpecnoiseTrainer, trainer_kwargs: dict | None = None,
        summary_extra: dict | None = None) -> Path:
    """Train, evaluate on the held-out set, save the final model; returns its folder. ``eval_collator``: how
    held-out samples are batched (default: the training collator without noise)."""
    t = conf.train
    tracker, report_to = open_tracker(conf, cfg, run_dir)
    args = training_args(conf, run_dir, report_to, has_eval=bool(eval_set))
    budget = TimeBudget(t.max_minutes, t.warmup_ratio) if t.max_minutes else None
    trainer = trainer_class(model=model, args=args, train_dataset=train_set, eval_dataset=eval_set or None,
                            data_collator=collator, eval_collator=eval_collator or collator.clean(),
                            processing_class=tokenizer, budget=budget, **(trainer_kwargs or {}))
    if isinstance(collator, Collator):
        collator.model = trainer.model
    resume = last_checkpoint(run_dir) if t.resume else None
    if resume:
        log.info("resuming from %s", resume)
    start = time.time()
    result = trainer.train(resume_from_checkpoint=resume)
    seconds = time.time() - start

    model.config.use_cache = True  # Trainer turns the cache off for training; decoding wants it back
    if t.save_dtype != "float32":  # round first, so the held-out loss is the shipped weights' loss
        model.to(getattr(torch, t.save_dtype)).float()
    metrics = trainer.evaluate() if eval_set else {}
    if t.save_dtype != "float32":
        model.to(getattr(torch, t.save_dtype))
    stats, train_loss = totals(collator.stats, result.training_loss)
    final = run_dir / t.output_dir
    partial = final.with_name(final.name + ".partial")  # renamed when complete: no half-written model folder
    trainer.save_model(str(partial))  # rank 0 writes; weights + config + tokenizer (processing_class)
    if trainer.is_world_process_zero():
        model.generation_config.save_pretrained(partial)
        (partial / "training_args.bin").unlink(missing_ok=True)
        shutil.rmtree(final, ignore_errors=True)
        partial.rename(final)
        summary = {
            "stage": t.name,
            "model": str(final),
            "steps": trainer.state.global_step,
            "train_loss": train_loss,
            "heldout_loss": metrics.get("eval_loss"),
            "heldout_ppl": math.exp(metrics["eval_loss"]) if "eval_loss" in metrics else None,
            "heldout_samples": len(eval_set or []),
            "train_samples": len(train_set),
            "tokens_seen": trainer.state.num_input_tokens_seen,  # Trainer gathers it over the processes
            "train_seconds": round(seconds, 1),
            "parameters": model.num_parameters(),
            **stats,
            **(summary_extra or {}),
        }
        (run_dir / "train_results.json").write_text(json.dumps(summary, indent=2))
        tracker.summary({k: v for k, v in summary.items() if isinstance(v, (int, float))})
        log.info("saved %s; held-out loss %s", final, summary["heldout_loss"])
    tracker.finish()
    return final
