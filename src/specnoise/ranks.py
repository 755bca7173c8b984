"""The processes of a tensor-parallel run: ``torchrun --nproc-per-node N -m specnoise model.tp_plan=auto ...``.

transformers shards the weights over the N ranks (``tp_plan="auto"``, gloo on the CPU, NCCL on GPUs) and every forward
ends in an all-reduce, so every rank gets the same logits and runs the same decoder steps with identical inputs:
decoders need nothing of their own. Rank 0 is the job: its run directory, lock, console, progress bars, results,
per-prompt records and wandb. The other ranks run the same job silently (stdout to /dev/null, no progress bars or
warnings, ``logger=none``) in a scratch directory that is deleted when they exit; they print errors only. If rank 0's
named run directory holds a stopped run's per-prompt records, the scratch starts with a copy, so every rank skips the
same finished prompts. ``check_agree`` compares a checksum of every rank's tokens after each measured group of prompts
and fails loudly if they differ.
"""

from __future__ import annotations

import atexit
import hashlib
import os
import shutil
import sys
import tempfile
import warnings
from pathlib import Path

RESUME_FILES = ("per_prompt.jsonl", "resume.json")


def rank() -> int:
    return int(os.environ.get("RANK", "0"))


def world() -> int:
    return int(os.environ.get("WORLD_SIZE", "1"))


def tensor_parallel(args: list[str]) -> bool:
    """The command asks for tensor parallel (``model.tp_plan`` / ``draft.tp_plan`` on the command line)."""
    return any(a.split("=")[0].lstrip("+").endswith("tp_plan") and a.split("=", 1)[1] not in ("null", "")
               for a in args if "=" in a)


def quiet_rank_args(args: list[str], run_dir: Path | None) -> list[str]:
    """For a rank other than 0 of a tensor-parallel run: silence this process and return the command line that runs
    the job in a scratch directory (deleted at exit), without wandb."""
    scratch = Path(tempfile.mkdtemp(prefix=f"specnoise-rank{rank()}-"))
    atexit.register(shutil.rmtree, scratch, ignore_errors=True)
    for name in RESUME_FILES:
        if run_dir is not None and (run_dir / name).is_file():
            shutil.copyfile(run_dir / name, scratch / name)
    sys.stdout = open(os.devnull, "w")  # noqa: SIM115  (for the life of the process)
    os.environ["TQDM_DISABLE"] = "1"
    warnings.simplefilter("ignore")
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    kept = [a for a in args if a.split("=")[0].lstrip("+") not in ("hydra.run.dir", "logger", "hydra.output_subdir")]
    return [*kept, f"hydra.run.dir={scratch}", "hydra.output_subdir=null", "logger=none"]


def check_agree(token_lists: list[list[int]]) -> None:
    """Every rank must have produced the same tokens: a checksum all-gathered over the ranks (cheap: one small
    collective per measured group). A divergence is a bug or a non-deterministic kernel: stop loudly."""
    import torch
    import torch.distributed as dist

    if world() <= 1 or not dist.is_available() or not dist.is_initialized():
        return
    digest = hashlib.sha256(repr(token_lists).encode()).digest()[:7]
    mine = torch.tensor([int.from_bytes(digest, "little")], dtype=torch.long)
    if dist.get_backend() == "nccl":
        mine = mine.cuda()
    every = [torch.zeros_like(mine) for _ in range(dist.get_world_size())]
    dist.all_gather(every, mine)
    sums = [int(t.item()) for t in every]
    if len(set(sums)) > 1:
        raise RuntimeError(f"tensor-parallel ranks decoded different tokens (checksums {sums}): rank {rank()} "
                           "diverged; every rank must run the same steps on the same logits")
