"""Consistency training on the HF Trainer: ``train=cllm`` (CLLM, Kou et al. 2024) and ``train=jacobi_forcing``
(Jacobi Forcing, hao-ai-lab 2025), both on Jacobi trajectories of the model being trained (trajectories.py).

**CLLM.** One training sample per (prompt, block k): the prefix (prompt + fixed points of blocks < k), the block's
Jacobi states and its fixed point. Each time a sample is seen the collator draws one state at random (as the
reference). Loss per batch = ``ar_weight`` x AR cross-entropy (label smoothing ``label_smoothing``) + consistency:
the soft cross-entropy ``-sum softmax(target) * log_softmax(student)`` between the student's logits on
prefix + state and the detached target logits on prefix + fixed point (``consistency=global``, the released code)
or on prefix + the next state of the trajectory (``consistency=local``, the paper's local consistency loss, Eq. 5:
it is well defined on stored trajectories, each state mapped to its successor), averaged over the compared
positions. The AR labels are the collected output up to block k (``ar_labels=fixed_point``; then one forward with
gradient on prefix + fixed point gives both the AR loss and, detached, the global target) or the data's gold
response (``ar_labels=gold``, its own forward on prompt + gold).

**Jacobi Forcing.** One sample per prompt: prompt, then per block k a noisy block (the trajectory state whose
unconverged fraction is nearest the ratio r_k rising linearly from ``min_noisy_ratio`` to ``max_noisy_ratio`` over
``window`` blocks, 0 = all the sample's blocks) followed by its clean block (the fixed point), packed in one
sequence. Noisy and clean block k share position ids; an additive 4D mask lets a noisy token see the prompt, the
clean blocks < k and the noisy block k up to itself, and a clean token the prompt and the clean blocks <= k up to
itself (never a noisy token). The stock model takes that mask and the position ids, so one forward gives the AR
loss on the clean tokens (next clean token, label smoothing) and the consistency loss of noisy token i against
the detached logits of clean token i.

**Where this departs from the reference code** (hao-ai-lab/Consistency_LLM ``cllm/cllm_trainer_global.py``,
``data/generate_trajectory.py``; hao-ai-lab/JacobiForcing ``train/soft_flexattn_cllm_trainer_multiblock*.py``):

* Trajectories are greedy (the issue and the CLLM paper); the released CLLM collector samples from the top 2.
  Collection runs on the project's KV-cached engine, one block forward per Jacobi iteration, not full-sequence
  forwards; the fixed point is the greedy AR continuation either way.
* Batch > 1 (right padding, per-sample masks); the CLLM reference is batch 1 per device.
* Compared positions: every position whose context differs between student and target. The reference masks the
  converged prefix too, but keeps the one position right after it, whose context is identical (a zero gradient
  term that only changes the mean's denominator).
* ``ar_labels=gold`` runs AR on prompt + gold response; the reference scores gold labels against the logits of the
  fixed-point sequence, which misaligns them once the model's output differs from the gold text.
* The CLLM reference's trajectory augmentation (extra states with a few tokens corrected) is not done.
* Repetition filter: an output (up to EOS) in which one ``repeat_ngram``-gram occurs ``repeat_count`` times is
  dropped (our rule; the reference has its own post-processing of low-quality generations).
* Jacobi Forcing: FlexAttention's block mask is an additive 4D mask through the stock model (same attention);
  the noisy state is chosen from the stored trajectory by nearest unconverged fraction (the fixed point itself
  is never a noisy state); ``window=0`` spreads the schedule over each sample's own blocks; AR labels are the
  fixed points (the model's own output).
"""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from specnoise.config import CLLMConfig, JacobiForcingConfig
from specnoise.training.trainer import SpecnoiseTrainer

IGNORE = -100


def soft_cross_entropy(student: torch.Tensor, target: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean over ``mask`` positions of -sum_v softmax(target) log_softmax(student); 0 when nothing is compared."""
    if not bool(mask.any()):
        return student.sum() * 0.0  # keeps every parameter in the graph (DDP needs a gradient for each)
    s, t = student[mask].float(), target[mask].float()
    return -(F.softmax(t, -1) * F.log_softmax(s, -1)).sum(-1).mean()


def first_difference(a: list[int], b: list[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), len(a))


def pad(rows: list[list], value, width: int | None = None, dtype=torch.long) -> torch.Tensor:
    width = width or max(len(r) for r in rows)
    out = torch.full((len(rows), width), value, dtype=dtype)
    for i, r in enumerate(rows):
        out[i, : len(r)] = torch.as_tensor(r, dtype=dtype)
    return out


# ------------------------------------------------------------------------------------------------------ CLLM
def cllm_samples(records: list[dict], max_seq_len: int) -> tuple[list[dict], int]:
    """One sample per (prompt, block) that has states and fits ``max_seq_len``; (samples, blocks cut)."""
    samples, cut = [], 0
    for r in records:
        prefix = list(r["prompt"])
        for b in r["blocks"]:
            if len(prefix) + len(b["fixed"]) > max_seq_len:
                cut += 1
                break
            if b["states"]:
                samples.append({"prompt_len": len(r["prompt"]), "prefix": list(prefix), "states": b["states"],
                                "fixed": b["fixed"], "gold": r["gold"][: max_seq_len - len(r["prompt"])]})
            prefix += b["fixed"]
    return samples, cut


@dataclass
class CLLMCollator:
    pad_id: int
    eos_id: int
    cfg: CLLMConfig
    seed: int = 0
    stats: Counter = field(default_factory=Counter)

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)

    def __call__(self, features: list[dict]) -> dict[str, torch.Tensor]:
        students, targets, compare, ar_ids, ar_labels = [], [], [], [], []
        for f in features:
            prefix, P, n = f["prefix"], len(f["prefix"]), len(f["fixed"])
            j = self.rng.randrange(len(f["states"]))
            state = f["states"][j]
            if self.cfg.consistency == "local":  # the next state of the trajectory (the fixed point after the last)
                target = f["states"][j + 1] if j + 1 < len(f["states"]) else f["fixed"]
            else:
                target = f["fixed"]
            students.append(prefix + state)
            targets.append(prefix + target)
            # logits at P-1+i see state[:i]: compared once that context differs from the target's
            d = first_difference(state, target)
            compare.append([False] * (P - 1) + [i > d for i in range(n)])
            if self.cfg.ar_labels == "gold":
                seq, start = prefix[: f["prompt_len"]] + f["gold"], f["prompt_len"]
            else:
                seq, start = prefix + f["fixed"], f["prompt_len"]
            labels = [IGNORE] * start + seq[start:]
            if self.eos_id in seq[start:]:  # nothing after the first EOS is an answer
                cut = start + seq[start:].index(self.eos_id) + 1
                labels = labels[:cut] + [IGNORE] * (len(seq) - cut)
            ar_ids.append(seq)
            ar_labels.append(labels)
        width = max(len(s) for s in students)
        self.stats["consistency/positions"] += sum(map(sum, compare))
        return {
            "input_ids": pad(ar_ids, self.pad_id),
            "attention_mask": pad([[1] * len(s) for s in ar_ids], 0),
            "labels": pad(ar_labels, IGNORE),
            "student_ids": pad(students, self.pad_id, width),
            "target_ids": pad(targets, self.pad_id, width),
            "student_mask": pad([[1] * len(s) for s in students], 0, width),
            "compare": pad(compare, False, width, torch.bool),
        }


# ------------------------------------------------------------------------------------------- Jacobi Forcing
def jf_samples(records: list[dict], max_seq_len: int) -> tuple[list[dict], int]:
    """One sample per prompt with the blocks that fit ``max_seq_len`` packed twice (noisy + clean)."""
    samples, cut = [], 0
    for r in records:
        n = len(r["blocks"][0]["fixed"])
        fit = max(0, (max_seq_len - len(r["prompt"])) // (2 * n))
        blocks = r["blocks"][:fit]
        cut += len(r["blocks"]) - len(blocks)
        if any(b["states"] for b in blocks):
            samples.append({"prompt": r["prompt"], "blocks": blocks})
    return samples, cut


def noise_ratio(k: int, blocks: int, cfg: JacobiForcingConfig) -> float:
    w = cfg.window or blocks
    return cfg.min_noisy_ratio + (cfg.max_noisy_ratio - cfg.min_noisy_ratio) * (k % w) / max(w - 1, 1)


def pick_state(block: dict, ratio: float) -> list[int]:
    """The state whose unconverged fraction is nearest ``ratio`` (the clean block when there is none)."""
    fixed = block["fixed"]
    if not block["states"]:
        return fixed
    return min(block["states"], key=lambda s: abs(sum(a != b for a, b in zip(s, fixed)) / len(fixed) - ratio))


def pack(prompt: list[int], blocks: list[dict], cfg: JacobiForcingConfig, eos_id: int | None = None):
    """(ids, positions, allow [T, T] bool, labels, student positions, teacher positions) of one packed sample."""
    P, K = len(prompt), len(blocks)
    ids, pos, kind, blk = list(prompt), list(range(P)), [0] * P, [-1] * P  # kind 0 prompt, 1 noisy, 2 clean
    student, teacher = [], []
    for k, b in enumerate(blocks):
        n = len(b["fixed"])
        noisy = pick_state(b, noise_ratio(k, K, cfg))
        d = first_difference(noisy, b["fixed"])
        base = len(ids)
        for i in range(n):
            if i >= d:  # noisy token i's context (noisy[:i+1]) differs from clean token i's
                student.append(base + i)
                teacher.append(base + n + i)
        ids += noisy + b["fixed"]
        pos += list(range(P + k * n, P + (k + 1) * n)) * 2
        kind += [1] * n + [2] * n
        blk += [k] * (2 * n)
    T = len(ids)
    kind_t, blk_t, idx = torch.tensor(kind), torch.tensor(blk), torch.arange(T)
    causal = idx[None, :] <= idx[:, None]
    q_kind, k_kind, q_blk, k_blk = kind_t[:, None], kind_t[None, :], blk_t[:, None], blk_t[None, :]
    sees_prompt = k_kind == 0
    sees_clean_before = (k_kind == 2) & (k_blk < q_blk)
    same_block = (k_kind == q_kind) & (k_blk == q_blk)  # noisy k sees noisy k, clean k sees clean k
    allow = causal & (sees_prompt | sees_clean_before | same_block | ((q_kind == 0) & (k_kind == 0)))
    # AR labels: a clean token (or the prompt's last) predicts the next clean token
    clean = [i for i in range(T) if kind[i] == 2]
    labels = [IGNORE] * T
    chain = [P - 1] + clean
    for a, b in zip(chain, chain[1:]):
        labels[a] = ids[b]
        if ids[b] == eos_id:  # nothing after the first EOS is an answer
            break
    return ids, pos, allow, labels, student, teacher


@dataclass
class JFCollator:
    pad_id: int
    eos_id: int
    cfg: JacobiForcingConfig
    stats: Counter = field(default_factory=Counter)

    def __call__(self, features: list[dict]) -> dict[str, torch.Tensor]:
        packed = [pack(f["prompt"], f["blocks"], self.cfg, self.eos_id) for f in features]
        T = max(len(p[0]) for p in packed)
        B = len(packed)
        allow = torch.zeros(B, 1, T, T, dtype=torch.bool)
        allow[:, 0] = torch.eye(T, dtype=torch.bool)  # padding rows see themselves: no all-masked row (NaN)
        for b, p in enumerate(packed):
            t = len(p[0])
            allow[b, 0, :t, :t] = p[2]
        M = max(1, max(len(p[4]) for p in packed))
        self.stats["consistency/positions"] += sum(len(p[4]) for p in packed)
        return {
            "input_ids": pad([p[0] for p in packed], self.pad_id, T),
            "attention_mask": pad([[1] * len(p[0]) for p in packed], 0, T),  # padding only (token counting)
            "position_ids": pad([p[1] for p in packed], 0, T),
            "allow": allow,
            "labels": pad([p[3] for p in packed], IGNORE, T),
            "student_pos": pad([p[4] for p in packed], 0, M),
            "teacher_pos": pad([p[5] for p in packed], 0, M),
            "compare": pad([[True] * len(p[4]) for p in packed], False, M, torch.bool),
        }


# ------------------------------------------------------------------------------------------------ trainers
class ConsistencyTrainer(SpecnoiseTrainer):
    """Trainer whose training batches carry a consistency loss; held-out batches (the plain SFT collator: clean
    prompt + gold response) keep the model's own loss, so held-out losses compare with SFT's and MSN's."""

    def __init__(self, *args, method: str, cfg, **kwargs):
        super().__init__(*args, **kwargs)
        self.method, self.cfg, self.parts = method, cfg, Counter()

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        if "compare" not in inputs:
            return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
        ar, cons = self.cllm_loss(model, inputs) if self.method == "cllm" else self.jf_loss(model, inputs)
        loss = self.cfg.ar_weight * ar + cons
        self.parts["ar_loss"] += float(ar.detach())
        self.parts["consistency_loss"] += float(cons.detach())
        self.parts["n"] += 1
        return (loss, None) if return_outputs else loss

    def ar_loss(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten(), ignore_index=IGNORE,
                               label_smoothing=self.cfg.label_smoothing)

    def cllm_loss(self, model, x):
        out = model(input_ids=x["input_ids"], attention_mask=x["attention_mask"]).logits
        ar = self.ar_loss(out[:, :-1], x["labels"][:, 1:])
        reuse = self.cfg.consistency == "global" and self.cfg.ar_labels == "fixed_point"  # same sequence
        if reuse:
            target = out.detach()
        else:
            with torch.no_grad():
                target = model(input_ids=x["target_ids"], attention_mask=x["student_mask"]).logits
        student = model(input_ids=x["student_ids"], attention_mask=x["student_mask"]).logits
        width = x["student_ids"].shape[1]
        return ar, soft_cross_entropy(student, target[:, :width], x["compare"])

    def jf_loss(self, model, x):
        dtype = next(model.parameters()).dtype
        mask = torch.zeros(x["allow"].shape, dtype=dtype, device=x["allow"].device)
        mask.masked_fill_(~x["allow"], torch.finfo(dtype).min)
        logits = model(input_ids=x["input_ids"], attention_mask=mask, position_ids=x["position_ids"]).logits
        ar = self.ar_loss(logits, x["labels"])
        rows = torch.arange(len(logits), device=logits.device)[:, None]
        student, teacher = logits[rows, x["student_pos"]], logits[rows, x["teacher_pos"]].detach()
        return ar, soft_cross_entropy(student, teacher, x["compare"])

    def log(self, logs: dict, *args, **kwargs) -> None:
        if "loss" in logs and self.parts["n"]:
            n = self.parts.pop("n")
            logs.update({k: v / n for k, v in self.parts.items()})
            self.parts.clear()
        super().log(logs, *args, **kwargs)
