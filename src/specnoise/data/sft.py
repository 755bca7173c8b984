"""Instruction (SFT) data: Alpaca-style rows or conversations -> ``{"input_ids", "prompt_len"}`` features.

Rows come from a local ``data.path`` (.json list or .jsonl) or a hub dataset (``data.hub``, via
``datasets``). A row is Alpaca-style (``instruction``, optional ``input``, ``output`` or ``response``) or,
like LIMA, a ``conversations`` list of alternating user / assistant turns: every turn but the last answer
goes into the prompt, the last answer is the response. The prompt is the model's template
(data/templates.py; ``chat`` = the tokenizer's chat template) tokenised as at inference; the response is
tokenised on its own and followed by EOS, so the model learns to stop.

Over-long samples (``train.max_seq_len``): ``train.truncation=right`` cuts the response's end (the EOS may
go); a sample whose prompt alone leaves no room for a response token is dropped, counted, and more than
half the data dropped is an error. ``train.truncation=error`` refuses any over-long sample.

Held-out samples (``train.eval_samples``) are a fixed draw (seed ``HELDOUT_SEED``, not ``train.seed``), so
runs with different seeds or noise settings are scored on the same rows, never trained on.
"""

from __future__ import annotations

import logging
import random
from pathlib import Path

from specnoise.config import DataConfig, TrainConfig, UserError
from specnoise.data.templates import encode_prompt, format_dialogue
from specnoise.files import read_json_rows

log = logging.getLogger("specnoise.data")

HELDOUT_SEED = 1234


def read_rows(data: DataConfig) -> list[dict]:
    if data.path:
        path = Path(data.path).expanduser()
        rows = [row for _, row in read_json_rows(path, "data.path")]  # key, file, line and column on an error
        source = str(path)
    else:
        rows, source = read_hub(data), data.hub
    if not rows:
        raise UserError(f"data: {source} holds no samples")
    return rows


def read_hub(data: DataConfig) -> list[dict]:
    import datasets

    try:
        return list(datasets.load_dataset(data.hub, split=data.split))
    except Exception as err:  # noqa: BLE001 - offline, missing, gated: all mean "use a local copy"
        raise UserError(
            f"data={data.name}: could not load hub dataset {data.hub!r} ({type(err).__name__}: "
            f"{str(err).splitlines()[0] if str(err) else ''}). Without network access download it elsewhere "
            "and set data.path=/local/file.json (or .jsonl)") from err


def to_dialogue(row: dict, index: int, data: DataConfig) -> tuple[list[tuple[str, str | None]], str]:
    """(turns with the last answer None, that answer) for one row."""
    if not isinstance(row, dict):
        raise UserError(f"data: sample {index} is a {type(row).__name__}, expected an object with fields")
    conv = row.get(data.conversation_field)
    if isinstance(conv, list) and conv:
        texts = [t if isinstance(t, str) else t.get("content", t.get("value", "")) for t in conv]
        if len(texts) % 2:
            texts = texts[:-1]  # a trailing unanswered user turn teaches nothing
        if not texts:
            raise UserError(f"data.{data.conversation_field}: sample {index} has no answered turn")
        turns = [(texts[i], texts[i + 1]) for i in range(0, len(texts), 2)]
        return turns[:-1] + [(turns[-1][0], None)], turns[-1][1]
    missing = [f for f in (data.instruction_field,) if f not in row]
    out_field = data.output_field if data.output_field in row else "response" if "response" in row else None
    if missing or out_field is None:
        need = missing + ([] if out_field else [f"{data.output_field} (or response)"])
        raise UserError(f"data: sample {index} lacks field(s) {', '.join(need)} (it has {', '.join(row)}); set "
                        "data.instruction_field / data.output_field to this file's names")
    user = row[data.instruction_field]
    extra = row.get(data.input_field) or ""
    if extra:
        user = f"{user}\n\n{extra}"
    return [(user, None)], row[out_field]


def encode(turns, answer: str, tokenizer, template: str) -> tuple[list[int], list[int]]:
    prompt = encode_prompt(tokenizer, format_dialogue(template, turns, tokenizer))
    response = tokenizer(answer, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    return prompt, response


def fit_length(prompt: list[int], response: list[int], max_len: int, truncation: str, index: int):
    """The feature for one sample, or None when it cannot keep a single response token."""
    if len(prompt) + len(response) <= max_len:
        return {"input_ids": prompt + response, "prompt_len": len(prompt)}
    if truncation == "error":
        raise UserError(f"data: sample {index} has {len(prompt) + len(response)} tokens > train.max_seq_len="
                        f"{max_len}; raise train.max_seq_len or set train.truncation=right")
    if len(prompt) >= max_len:
        return None
    return {"input_ids": (prompt + response)[:max_len], "prompt_len": len(prompt)}


def tokenize(rows: list[dict], data: DataConfig, tokenizer, template: str, train: TrainConfig) -> list[dict]:
    if tokenizer.eos_token_id is None:
        raise UserError("the model's tokenizer has no eos_token: SFT needs one to end responses")
    features, cut, dropped = [], 0, 0
    for index, row in rows:
        prompt, response = encode(*to_dialogue(row, index, data), tokenizer, template)
        feature = fit_length(prompt, response, train.max_seq_len, train.truncation, index)
        if feature is None:
            dropped += 1
            continue
        cut += len(feature["input_ids"]) < len(prompt) + len(response)
        features.append(feature)
    if dropped * 2 > len(rows):
        raise UserError(f"data: {dropped} of {len(rows)} prompts alone exceed train.max_seq_len={train.max_seq_len}; "
                        "raise train.max_seq_len")
    if cut or dropped:
        log.warning("data: %d of %d samples cut at train.max_seq_len=%d (truncation=right), %d dropped (prompt "
                    "too long)", cut, len(rows), train.max_seq_len, dropped)
    return features


def load_sft(data: DataConfig, tokenizer, template: str, train: TrainConfig) -> tuple[list[dict], list[dict]]:
    """(train features, held-out features)."""
    rows = list(enumerate(read_rows(data)))
    n_eval = min(train.eval_samples, len(rows) // 10)  # never hold out more than a tenth
    held = set(random.Random(HELDOUT_SEED).sample(range(len(rows)), n_eval))
    train_rows = [r for r in rows if r[0] not in held]
    if data.max_samples is not None:
        train_rows = train_rows[: data.max_samples]
    eval_rows = [r for r in rows if r[0] in held]
    train_set = tokenize(train_rows, data, tokenizer, template, train)
    eval_set = tokenize(eval_rows, data, tokenizer, template, train)
    log.info("data %s: %d training samples, %d held out", data.name, len(train_set), len(eval_set))
    return train_set, eval_set
