"""Benchmark data: each ``benchmark`` option becomes a list of ``Sample``s; a sample becomes prompt text.

A sample holds the user turns and what its scorer needs. Turn k (k > 0) is asked after the model's own
answer to turn k-1, so prompt text is built per decoder while it runs (``dialogue_text``). Shipped data
(Spec-Bench, HumanEval, CNN/DM) is read through ``benchmark.path`` like any local file; hub data sets (MBPP,
GSM8K, WMT16) go through ``datasets.load_dataset`` unless ``benchmark.path`` points at a local copy.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from specnoise.config import BenchmarkConfig, UserError
from specnoise.data.templates import format_dialogue
from specnoise.files import read_json_rows

MT_BENCH_CATEGORIES = {"writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities"}
# benchmark.scorer=per_category (Spec-Bench): categories without an entry get no score
CATEGORY_SCORERS = {"translation": "bleu", "summarization": "rouge", "math_reasoning": "gsm8k", "mt_bench": "length"}
# shipped data that stands in for a hub data set offline
OFFLINE_STAND_INS = {"wmt16": "benchmark=spec_bench benchmark.categories=[translation] benchmark.scorer=bleu "
                              "benchmark.max_new_tokens=64 (Spec-Bench's WMT14 DE-EN sentences)"}


@dataclass
class Sample:
    id: str
    category: str
    turns: list[str]  # user messages, asked one after the other
    reference: Any = None  # str (what the model should write: scorers and ref_nll), or a list (multi-turn)
    scorer: str = "none"
    response_prefix: str = ""  # text the first answer starts with (code benchmarks pre-fill the function)
    fields: dict = field(default_factory=dict)  # what the scorer needs: tests, entry point, ...


def dialogue_text(sample: Sample, template: str, answers: list[str], tokenizer=None) -> str:
    """Prompt text for turn ``len(answers)``, given the model's own answers to the earlier turns."""
    k = len(answers)
    turns = list(zip(sample.turns[:k], answers)) + [(sample.turns[k], None)]
    return format_dialogue(template, turns, tokenizer) + (sample.response_prefix if k == 0 else "")


# ------------------------------------------------------------------------------------------ raw records
Record = tuple[str, dict]  # (where it came from, for error messages; the row)


def read_records(path: str) -> list[Record]:
    """Rows of a local .jsonl / .json / .parquet file (optionally .gz); errors name the file and line."""
    p = Path(path).expanduser()
    if p.name.removesuffix(".gz").endswith(".parquet") and p.is_file():
        import pandas as pd

        table = pd.read_parquet(p).to_dict("records")
        plain = [{k: v.tolist() if hasattr(v, "tolist") else v for k, v in row.items()} for row in table]  # numpy
        rows = [(f"{p}, row {i}", row) for i, row in enumerate(plain, 1)]
    else:
        rows = read_json_rows(p, "benchmark.path")
    for where, row in rows:
        if not isinstance(row, dict):
            raise UserError(f"benchmark.path: {where}: expected a JSON object, got {type(row).__name__}")
    if not rows:
        raise UserError(f"benchmark.path: {p}: no records (empty file)")
    return rows


def hub_records(cfg: BenchmarkConfig) -> list[Record]:
    if not cfg.hub:
        raise UserError(f"benchmark={cfg.name}: no data: set benchmark.path=FILE (or benchmark.hub=NAME)")
    import datasets

    try:
        ds = datasets.load_dataset(cfg.hub, cfg.hub_config, split=cfg.split)
    except Exception as err:  # noqa: BLE001 - offline, gated, renamed: all mean "use a local copy"
        first = (str(err).splitlines() or [""])[0]
        raise UserError(
            f"benchmark={cfg.name}: could not load hub dataset {cfg.hub!r} (config {cfg.hub_config}, split "
            f"{cfg.split}): {type(err).__name__}: {first}. Without network access download it elsewhere and set "
            f"benchmark.path=FILE (a local JSONL, JSON or Parquet copy with the hub's fields)"
            + (f"; or run the shipped stand-in: {OFFLINE_STAND_INS[cfg.name]}" if cfg.name in OFFLINE_STAND_INS else "")
        ) from err
    return [(f"{cfg.hub}[{i}]", dict(row)) for i, row in enumerate(ds)]


def records(cfg: BenchmarkConfig) -> list[Record]:
    return read_records(cfg.path) if cfg.path else hub_records(cfg)


def need(row: dict, key: str, where: str, setting: str | None = None) -> Any:
    if row.get(key) is None:
        hint = f" (set benchmark.{setting}=FIELD)" if setting else ""
        raise UserError(f"{where}: missing field {key!r}{hint}")
    if isinstance(row[key], str) and not row[key].strip():
        raise UserError(f"{where}: field {key!r} is empty")
    return row[key]


def turns_of(row: dict, key: str, where: str, n: int, setting: str | None = None) -> list[str]:
    """The user turns of prompt ``n`` (1-based): a string, or a list of strings for a multi-turn sample."""
    value = row.get(key)
    if value is None:
        need(row, key, where, setting)  # says which field is missing
    turns = [value] if isinstance(value, str) else value
    if not isinstance(turns, list) or not turns or not all(isinstance(t, str) for t in turns):
        raise UserError(f"{where}: field {key!r} must be a non-empty string or a list of strings")
    empty = [k for k, t in enumerate(turns, 1) if not t.strip()]
    if empty:
        which = f"turn {empty[0]} of prompt {n}" if len(turns) > 1 else f"prompt {n}"
        raise UserError(f"{where}: {which} is empty (field {key!r})")
    return turns


def single(reference: Any) -> Any:
    """Single-turn references are often stored as a one-element list."""
    return reference[0] if isinstance(reference, list) and len(reference) == 1 else reference


# ------------------------------------------------------------------------------------- one per option
def spec_bench(cfg: BenchmarkConfig, raw: bool) -> Iterable[Sample]:
    """Spec-Bench rows (also CNN/DM and MT-Bench): question_id, category, turns, optional reference."""
    for i, (where, row) in enumerate(records(cfg)):
        category = str(row.get("category", cfg.name))
        yield Sample(
            id=str(row.get("question_id", i)),
            category="mt_bench" if category in MT_BENCH_CATEGORIES else category,
            turns=turns_of(row, "turns", where, i + 1),
            reference=single(row.get("reference")),
            fields={"subcategory": category},
        )


def humaneval(cfg: BenchmarkConfig, raw: bool) -> Iterable[Sample]:
    """Completion of a function body. Instruct templates get the function pre-filled as the answer's start,
    so every model continues the body and the same post-processing applies."""
    for where, row in records(cfg):
        prompt = need(row, "prompt", where)
        yield Sample(
            id=str(need(row, "task_id", where)),
            category="humaneval",
            turns=[prompt if raw else f"Complete the following Python function.\n```python\n{prompt}```"],
            response_prefix="" if raw else f"```python\n{prompt}",
            reference=row.get("canonical_solution"),  # the body after the prompt (for ref_nll)
            fields={"prompt": prompt, "test": need(row, "test", where), "entry_point": need(row, "entry_point", where)},
        )


def mbpp(cfg: BenchmarkConfig, raw: bool) -> Iterable[Sample]:
    """A task description and its asserts; the model writes the whole program."""
    for where, row in records(cfg):
        text = row.get("text") or need(row, "prompt", where)  # "full" config: text; "sanitized": prompt
        tests = list(need(row, "test_list", where))
        shown = "\n".join(tests)
        ask = f'"""\n{text}\n{tests[0]}\n"""\n' if raw else f"{text}\nYour code should pass these tests:\n{shown}"
        yield Sample(
            id=str(need(row, "task_id", where)),
            category="mbpp",
            turns=[ask],
            response_prefix="" if raw else "```python\n",
            reference=row.get("code"),  # the reference solution (for ref_nll)
            fields={"test_list": tests, "test_setup_code": row.get("test_setup_code") or ""},
        )


def gsm8k(cfg: BenchmarkConfig, raw: bool) -> Iterable[Sample]:
    for i, (where, row) in enumerate(records(cfg)):
        question = need(row, "question", where)
        yield Sample(
            id=str(row.get("id", i)),
            category="gsm8k",
            turns=[f"Question: {question}\nAnswer:" if raw else question],
            reference=need(row, "answer", where),  # worked solution ending in "#### <number>"
        )


def wmt16(cfg: BenchmarkConfig, raw: bool) -> Iterable[Sample]:
    """German -> English; rows as on the hub ({"translation": {"de", "en"}}) or flat {"de", "en"}."""
    for i, (where, row) in enumerate(records(cfg)):
        pair = row.get("translation") or row
        yield Sample(
            id=str(row.get("id", i)),
            category="wmt16",
            turns=[f"Translate German to English: {need(pair, 'de', where)}"],  # Spec-Bench's wording
            reference=need(pair, "en", where),
        )


def jsonl(cfg: BenchmarkConfig, raw: bool) -> Iterable[Sample]:
    for i, (where, row) in enumerate(read_records(cfg.path)):
        yield Sample(
            id=str(need(row, cfg.id_field, where, "id_field") if cfg.id_field else i),
            category=str(need(row, cfg.category_field, where, "category_field") if cfg.category_field else "jsonl"),
            turns=turns_of(row, cfg.prompt_field, where, i + 1, "prompt_field"),
            reference=single(row.get(cfg.reference_field)) if cfg.reference_field else None,
        )


LOADERS: dict[str, Callable[[BenchmarkConfig, bool], Iterable[Sample]]] = {
    "spec_bench": spec_bench, "mt_bench": spec_bench, "cnndm": spec_bench, "humaneval": humaneval,
    "mbpp": mbpp, "gsm8k": gsm8k, "wmt16": wmt16, "jsonl": jsonl,
}


def first_per_category(samples: list[Sample], n: int) -> list[Sample]:
    seen: Counter = Counter()
    kept = []
    for s in samples:
        seen[s.category] += 1
        if seen[s.category] <= n:
            kept.append(s)
    return kept


def load_benchmark(cfg: BenchmarkConfig, template: str) -> list[Sample]:
    """The samples of ``cfg`` after ``categories``, ``limit_per_category`` and ``limit``, each with its scorer."""
    return first_that_fit(load_samples(cfg, template), cfg.limit)[0]


def load_samples(cfg: BenchmarkConfig, template: str) -> list[Sample]:
    """The samples of ``cfg`` after ``categories`` and ``limit_per_category`` (not ``limit``: that counts the
    prompts that fit the model, see ``first_that_fit``), each with its scorer."""
    if cfg.name not in LOADERS:
        raise UserError(f"benchmark={cfg.name}: no loader; choose one of {', '.join(LOADERS)}")
    samples = list(LOADERS[cfg.name](cfg, template == "raw"))
    if cfg.categories:
        known = sorted({s.category for s in samples})
        missing = set(cfg.categories) - set(known)
        if missing:
            raise UserError(f"benchmark.categories: {sorted(missing)} not in the data; it has {known}")
        samples = [s for s in samples if s.category in cfg.categories]
    if cfg.limit_per_category:
        samples = first_per_category(samples, cfg.limit_per_category)
    repeated = [i for i, n in Counter(s.id for s in samples).items() if n > 1]
    if repeated:
        raise UserError(f"benchmark={cfg.name}: ids {repeated[:5]} occur more than once: point benchmark.id_field at a "
                        "unique field, or leave it unset to number the prompts")
    for s in samples:
        s.scorer = CATEGORY_SCORERS.get(s.category, "none") if cfg.scorer == "per_category" else cfg.scorer
    return samples


def first_that_fit(samples: list[Sample], limit: int | None, fits: Callable[[Sample], bool] = lambda s: True
                   ) -> tuple[list[Sample], list[Sample]]:
    """The first ``limit`` samples (all with None) for which ``fits`` holds, and those passed over on the way:
    ``benchmark=cnndm benchmark.limit=4`` runs 4 articles even when the first ones are too long."""
    kept, skipped = [], []
    for s in samples:
        if limit is not None and len(kept) == limit:
            break
        (kept if fits(s) else skipped).append(s)
    return kept, skipped
