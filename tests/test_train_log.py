"""New-user finding 9: the training progress lines print numbers, not strings of numbers."""

from __future__ import annotations

import ast

from tqdm.auto import tqdm
from transformers import TrainerState

from specnoise.training.trainer import NumericProgress


def test_training_log_lines_print_numbers_as_numbers(capsys):
    progress = NumericProgress()
    progress.training_bar = tqdm(total=1, disable=False)
    progress.on_log(None, TrainerState(), None, logs={"loss": 3.382194, "epoch": 0.0017889, "step_tokens": 1381})
    progress.training_bar.close()
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("{"))
    assert ast.literal_eval(line) == {"loss": 3.382, "epoch": 0.001789, "step_tokens": 1381}
