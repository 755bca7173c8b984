"""Checks of the ``accelerate launch`` configs (``conf/accelerate/*.yaml``) before a many-process run starts.

    python -m specnoise.training.launch conf/accelerate/ddp.yaml [more.yaml ...]

Each file is read by accelerate's own ``ClusterConfig`` (what ``accelerate launch --config_file`` reads), then
checked for what accelerate leaves to fail later, or silently: no ``num_processes`` (accelerate reads -1),
fewer processes than machines, a distributed type this project does not use, FSDP / DeepSpeed without their
sections, a ZeRO stage outside 0-3, and ``use_cpu`` with several processes (accelerate then starts one process).
A bad file is a UserError with one line saying what to change; a good one prints its summary.
"""

from __future__ import annotations

import sys
from pathlib import Path

from specnoise.config import UserError

TYPES = ("NO", "MULTI_CPU", "MULTI_GPU", "FSDP", "DEEPSPEED")
PRECISIONS = ("no", "fp16", "bf16", "fp8")


def check_accelerate_config(path: str | Path):
    """accelerate's ``ClusterConfig`` of ``path``, or a UserError naming the key to fix."""
    from accelerate.commands.config.config_args import ClusterConfig

    path = Path(path)
    if not path.is_file():
        raise UserError(f"accelerate config: no file at {path} (see conf/accelerate/)")
    try:
        cfg = ClusterConfig.from_yaml_file(str(path))
    except Exception as err:  # noqa: BLE001 - yaml errors, unknown keys: all mean "fix this file"
        raise UserError(f"accelerate config {path}: accelerate cannot read it ({type(err).__name__}: {err})") from err
    kind = str(getattr(cfg.distributed_type, "value", cfg.distributed_type))
    if kind not in TYPES:
        raise UserError(f"accelerate config {path}: distributed_type={kind}, expected one of {', '.join(TYPES)}")
    if cfg.num_processes is None or cfg.num_processes < 1:
        raise UserError(f"accelerate config {path}: no num_processes (got {cfg.num_processes}); set num_processes "
                        "to the total number of processes (GPUs over all machines), e.g. num_processes: 8")
    if cfg.num_machines is None or cfg.num_machines < 1 or cfg.num_processes < cfg.num_machines:
        raise UserError(f"accelerate config {path}: num_machines={cfg.num_machines} with num_processes="
                        f"{cfg.num_processes}; num_processes counts every process on every machine (>= num_machines)")
    if str(cfg.mixed_precision) not in PRECISIONS:
        raise UserError(f"accelerate config {path}: mixed_precision={cfg.mixed_precision}, expected one of "
                        f"{', '.join(PRECISIONS)}")
    if kind == "FSDP" and not cfg.fsdp_config:
        raise UserError(f"accelerate config {path}: distributed_type FSDP without an fsdp_config section")
    if kind == "DEEPSPEED":
        stage = (cfg.deepspeed_config or {}).get("zero_stage")
        if stage not in (0, 1, 2, 3):
            raise UserError(f"accelerate config {path}: deepspeed_config.zero_stage={stage}, expected 0, 1, 2 or 3")
    if cfg.use_cpu and cfg.num_processes > 1 and not getattr(cfg, "mpirun_config", None):
        # accelerate's --cpu / use_cpu path is its simple launcher: one process, whatever num_processes says
        raise UserError(f"accelerate config {path}: use_cpu=true with num_processes={cfg.num_processes} starts ONE "
                        "process (more CPU processes need mpirun); for processes on the CPU use "
                        "conf/accelerate/cpu.yaml (MULTI_GPU, use_cpu: false: torchrun + gloo when there is no GPU)")
    return cfg


def main(argv: list[str] | None = None) -> int:
    paths = sys.argv[1:] if argv is None else argv
    if not paths:
        print(__doc__.strip().splitlines()[2].strip())
        return 2
    status = 0
    for p in paths:
        try:
            cfg = check_accelerate_config(p)
        except UserError as err:
            print(f"error: {err}")
            status = 2
            continue
        print(f"{p}: {cfg.distributed_type} x {cfg.num_processes} processes on {cfg.num_machines} machine(s), "
              f"mixed precision {cfg.mixed_precision}")
    return status


if __name__ == "__main__":
    sys.exit(main())
