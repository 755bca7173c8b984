"""The benchmark job: every decoder against the AR baseline on the same prompts, timed in pairs.

``run_benchmark`` reads top to bottom as its four stages:

1. **set up** (``set_up``): the decoders' configs (plain dataclasses from ``config.DECODER_SCHEMAS``: no Hydra
   here), the prompts, the budget against the model's context and the draft's tokenizer (checked on the configs
   and tokenizers, before any weights load), then the models, decoders and cache reservation;
2. **measure** (``measure.py``): warm-up, then every prompt with AR and each decoder back to back,
   ``benchmark.repeats`` times in ABAB / BABA order; each finished sample is appended to ``per_prompt.jsonl``;
3. **wrap up and write** (``wrap_up``, ``write_results``): task scores, the reference NLL, the divergence audit
   and the cost-model bound (all after the timing), then ``results.json`` with one row per decoder and category,
   each with its speedup's bootstrap CI and noise alarm (the rows: ``rows.py``; the statistics: ``timing.py``);
4. **report and track** (``print_summary``, ``track``): the console table with the noise advice, then wandb.

Protocol: batch size ``benchmark.batch_size`` (default 1; above, every decoder and the AR
baseline decode the prompts in groups of that size, AR is timed at batch 1 too, as the ``ar_bs1`` rows, and each
prompt's tokens are compared with ``ar_bs1``'s: measure.py); one budget for all (``decoder.max_new_tokens`` or else
``benchmark.max_new_tokens``); tokens are counted as ids on both sides; ``Decoder.generate`` times the decode call
itself (synchronised on GPU); ``benchmark.threads`` pins torch's intra-op threads; multi-turn samples ask turn k
after the decoder's *own* answer to turn k-1; a prompt longer than ``benchmark.max_prompt_tokens`` (default: the
model's context minus the budget) is skipped and counted (``benchmark.limit`` counts the prompts that fit).

SIGINT / SIGTERM anywhere in the job (loading, timing, scoring, audit, writing) stop it cleanly: results.json of
the finished samples ("complete": false) and ``Interrupted`` (exit 130 / 143); the same command in the same run
directory continues it (``progress.py``).
"""

from __future__ import annotations

import json
import logging
import platform
import resource
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from statistics import fmean

import torch
from omegaconf import DictConfig, OmegaConf
from tqdm.auto import tqdm

from specnoise.bench import timing
from specnoise.bench.audit import audit_divergences
from specnoise.bench.datasets import Sample, dialogue_text, first_that_fit, load_samples
from specnoise.bench.engines import add_speedup_vs_best_ar, engine_meta
from specnoise.bench.measure import REFERENCE, Turn, measure
from specnoise.bench.progress import Interrupted, PromptLog, Stop, stop_on_signals
from specnoise.bench.ref_nll import reference_nlls
from specnoise.bench.rows import Measured, by_category, prompt_rows, restore_turns, sample_rows, summary_rows
from specnoise.bench.scoring import Answer, score_answers
from specnoise.config import (
    AUTO_VARIANT,
    DECODER_SCHEMAS,
    ARConfig,
    Config,
    DecoderConfig,
    UserError,
    config_warnings,
    decoder_entry,
)
from specnoise.data.templates import encode_prompt
from specnoise.decoding.base import Decoder, build_decoder, decoder_class
from specnoise.decoding.kv import self_test
from specnoise.files import write_atomic
from specnoise.models import LoadedModel, check_same_vocab, load_model, load_tokenizer, model_context
from specnoise.numerics import describe, use_numerics
from specnoise.ranks import check_agree
from specnoise.training.reuse import model_label

log = logging.getLogger("specnoise")
SHARED_FIELDS = ("max_new_tokens", "temperature", "top_p", "top_k", "seed", "auto", "cost_cache")  # every decoder's
# the console table: what fits a terminal (every column of every row: results.json and results.csv)
BATCH_COLUMNS = ["batch_size", "speedup_vs_bs1_ar"]  # shown when benchmark.batch_size > 1
TABLE_COLUMNS = ["decoder", "category", "new_tokens", "mean_accepted_tokens", "tokens_per_second", "speedup",
                 "speedup_ci", "timing_noisy", "lossless_fraction", "task_score"]
SHORT_NAMES = {"new_tokens": "tokens", "task_score": "score", "mean_accepted_tokens": "MAT",
               "tokens_per_second": "tok/s", "speedup_ci": "95% CI", "timing_noisy": "noisy",
               "lossless_fraction": "lossless", "identical_to_ar_fraction": "same tokens",
               "speedup_vs_bs1_ar": "vs bs1 AR", "batch_size": "B"}
TRACKED = ["speedup", "speedup_ci_low", "speedup_ci_high", "ar_time_cv", "timing_noisy", "repeats",
           "mean_accepted_tokens", "tokens_per_second", "lossless_fraction", "task_score", "ref_nll", "sb_speedup",
           "sb_tokens_per_second", "target_seconds", "draft_seconds", "other_seconds", "cost_bound",
           "speedup_exceeds_mat", "batch_size", "speedup_vs_bs1_ar"]


# ------------------------------------------------------------------------------------------ set-up
def batch_skips(conf: Config) -> dict[str, str]:
    """Decoders of the job that cannot decode a batch of ``benchmark.batch_size`` prompts (the generate() peers
    whose transformers mode runs at batch size 1 only): name -> the one-line note the run prints and records."""
    size, queue = conf.benchmark.batch_size, conf.benchmark.queue
    if size <= 1:
        return {}
    if queue and (conf.model.compile or conf.model.static_cache is True):
        raise UserError(f"benchmark.queue={queue} (continuous batching) runs on the dynamic engine: set "
                        "model.static_cache=false and model.compile=false, or benchmark.queue=0")
    notes = {}
    for entry in dict.fromkeys([conf.decoder.name, *conf.decoders]):
        cls = decoder_class(decoder_entry(entry)[0])
        limit = cls.max_batch_size
        if limit is not None and size > limit:
            notes[entry] = (f"{entry} skipped at benchmark.batch_size={size}: transformers runs it at batch size "
                            f"{limit} only")
        elif queue and cls.drafter_class is None:
            notes[entry] = f"{entry} skipped at benchmark.queue={queue}: transformers' generate() does not refill rows"
    return notes


def decoder_configs(conf: Config) -> dict[str, DecoderConfig]:
    """The job's decoders by the name its results give them: the AR baseline first, then ``decoder`` and every
    ``decoders`` entry (sharing budget, sampling and seed), less those ``batch_skips`` names.

    A ``decoders`` entry is a schema name (Config checks it), built from its dataclass's defaults, which are what
    its YAML option sets (tests/test_config.py holds them equal); ``NAME+auto`` is that decoder with decoder.auto=true
    (config/decoders.py ``AUTO_VARIANT``), so a job times a drafter faithful and hardware-aware side by side."""
    shared = {k: getattr(conf.decoder, k) for k in SHARED_FIELDS}
    configs: dict[str, DecoderConfig] = {"ar": conf.decoder if conf.decoder.name == "ar" else ARConfig(**shared)}
    skipped = batch_skips(conf)
    entries = list(dict.fromkeys([conf.decoder.name, *conf.decoders]))
    asked = [n for n in entries if n != "ar"]
    if asked and all(n in skipped for n in asked):  # the job would time AR alone and exit 0
        raise UserError(f"{'; '.join(skipped[n] for n in asked)}, and nothing else is measured: set "
                        "benchmark.batch_size=1, or choose a decoder that decodes batches")
    for entry in entries:
        name, variant = decoder_entry(entry)
        if entry == "ar" or entry in skipped:
            continue
        if decoder_class(name).needs_draft and conf.draft.name == "none":
            raise UserError(f"decoder={name} needs a draft model: set draft=NAME or pair=NAME")
        if variant and decoder_class(name).drafter_class is None:
            raise UserError(f"decoders[]={entry}: {name} has no drafter whose proposals decoder.auto sizes; "
                            f"{AUTO_VARIANT} applies to the drafters ({', '.join(auto_drafters())})")
        base = conf.decoder if name == conf.decoder.name else replace(DECODER_SCHEMAS[name](), **shared)
        configs[entry] = replace(base, auto=True) if variant else base
    return configs


def auto_drafters() -> list[str]:
    """The decoders that ``decoder.auto`` sizes: those with a drafter."""
    return [name for name in DECODER_SCHEMAS if decoder_class(name).drafter_class is not None]


@dataclass
class Setup:
    """What the measurement needs: the loaded decoders and the prompts that fit, encoded on demand."""

    conf: Config
    target: LoadedModel
    decoders: dict[str, Decoder]  # "ar" first
    samples: list[Sample]  # the prompts that fit, at most benchmark.limit
    skipped: list[str]  # ids of over-long prompts
    budget: int
    limit: int  # the longest prompt that fits
    template: str
    encode: Callable[[Sample, list[str]], list[int]]  # a sample's prompt after the given answers
    decoder_notes: dict[str, str] = field(default_factory=dict)  # decoders skipped at this batch size, and why


def check_before_loading(conf: Config, model_path: str | None, budget: int) -> None:
    """What the configs and tokenizers alone can refute, before any weights load (minutes for a large model)."""
    context = model_context(conf.model, model_path)
    if budget >= context:
        raise UserError(f"benchmark.max_new_tokens={budget} does not fit the context of model={conf.model.name} "
                        f"({context} tokens, from its config.json), which must also hold the prompt: lower "
                        f"benchmark.max_new_tokens below {context}")
    if conf.draft.name != "none":  # the draft's path and its tokenizer, not after the target's weights
        check_same_vocab(load_tokenizer(conf.model, model_path), load_tokenizer(conf.draft, role="draft"),
                         conf.model.name, conf.draft.name)


def set_up(conf: Config, model_path: str | None) -> Setup:
    bench = conf.benchmark
    if bench.threads:  # tiny models on a shared CPU run far steadier on one thread
        torch.set_num_threads(bench.threads)
    configs = decoder_configs(conf)  # fails fast on a decoder that needs a missing draft
    notes = batch_skips(conf)
    for note in notes.values():
        print(f"NOTE: {note}")  # not an error: the job runs without it (also in results.json meta)
    template = bench.template or conf.model.template
    samples = load_samples(bench, template)
    budget = conf.decoder.max_new_tokens or bench.max_new_tokens
    check_before_loading(conf, model_path, budget)

    target = load_model(conf.model, model_path)
    draft = load_model(conf.draft, role="draft") if conf.draft.name != "none" else None
    for loaded in filter(None, (target, draft)):
        use_numerics(loaded.model, strict=bench.strict_numerics)
        self_test(loaded.model)
    decoders = {name: build_decoder(c, target, draft) for name, c in configs.items()}
    context = decoders["ar"].target.max_length
    limit = min(bench.max_prompt_tokens or context, context - budget)
    tokenizer = target.tokenizer

    def encode(sample: Sample, answers: list[str]) -> list[int]:
        return encode_prompt(tokenizer, dialogue_text(sample, template, answers, tokenizer))

    kept, skipped = first_that_fit(samples, bench.limit, lambda s: len(encode(s, [])) <= limit)
    skipped = [s.id for s in skipped]
    if skipped:
        log.warning("skipping %d of %d prompts longer than %d tokens (benchmark.max_prompt_tokens, or the model's "
                    "context of %d minus max_new_tokens=%d)", len(skipped), len(skipped) + len(kept), limit, context,
                    budget)
    if not kept:
        raise UserError(f"no prompt of benchmark={bench.name} fits in {limit} tokens (the model's context of "
                        f"{context} minus max_new_tokens={budget}, or benchmark.max_prompt_tokens): lower "
                        "benchmark.max_new_tokens, or raise benchmark.max_prompt_tokens if it is below that")

    # a static cache is sized (and compiled) once, for the longest generation, before anything is timed: a later
    # turn holds the earlier turns and their answers (at most ``budget`` tokens each, a few more where text joins)
    longest = min(context, max(len(encode(s, [""] * (len(s.turns) - 1))) + (budget + 8) * len(s.turns) for s in kept))
    for decoder in decoders.values():
        decoder.reserve(longest)
    return Setup(conf, target, decoders, kept, skipped, budget, limit, template, encode, notes)


# ------------------------------------------------------------------------------------------ the run
def run_benchmark(conf: Config, cfg: DictConfig, run_dir: Path, model_path: str | None = None) -> Path:
    """Benchmark ``conf.decoder`` (and ``conf.decoders``) against AR; returns the path of results.json.
    Raises ``Interrupted`` (after writing results.json from the finished samples) on SIGINT / SIGTERM."""
    run_dir = Path(run_dir)
    with stop_on_signals() as stop:
        setup = set_up(conf, model_path)
        m = run_measurement(setup, cfg, run_dir, stop)
        wrap_up(setup, m, stop)
        path, rows, per_prompt = write_results(setup, m, cfg, run_dir, stop)
        if stop.signal:
            raise Interrupted(stop.signal)
        print_summary(rows, path)
        track(conf, cfg, run_dir, rows, per_prompt)
        if stop.signal:  # during tracking: results.json is whole, but the job was asked to stop
            raise Interrupted(stop.signal)
    return path


def run_measurement(setup: Setup, cfg: DictConfig, run_dir: Path, stop: Stop) -> Measured:
    """Samples finished by an earlier attempt in ``run_dir`` are read back, the others measured."""
    conf, bench = setup.conf, setup.conf.benchmark
    size = bench.batch_size
    decoders = dict(setup.decoders)
    if size > 1:
        decoders[REFERENCE] = setup.decoders["ar"]  # AR once more, one prompt at a time
    names = list(decoders)
    run_dir.mkdir(parents=True, exist_ok=True)
    prompt_log = PromptLog(run_dir, cfg, names)  # refuses to continue a run with other settings
    label = conf.model.name if conf.train.name == "none" else model_label(conf.model.name, conf.train.name, run_dir)
    m = Measured(conf, setup.samples, {name: {} for name in names}, setup.budget,
                 lossless=bench.check_lossless and conf.decoder.temperature == 0, model=label, batch_size=size)
    for s in setup.samples:
        if s.id in prompt_log.finished:
            for name in names:
                m.runs[name][s.id] = restore_turns(prompt_log.finished[s.id], name, s, setup.encode)
    # the groups are fixed by the prompts (and benchmark.group_by_length), so a continued run measures a group again
    # whole
    ordered = setup.samples
    if size > 1 and bench.group_by_length:
        ordered = sorted(ordered, key=lambda s: len(setup.encode(s, [])))
    per_group = bench.queue or size  # (continuous batching: a group is a queue of prompts for ``size`` rows)
    groups = [ordered[i:i + per_group] for i in range(0, len(ordered), per_group)]
    m.group_of = {s.id: g for g, group in enumerate(groups) for s in group}
    todo = [(g, group) for g, group in enumerate(groups) if any(s.id not in m.runs["ar"] for s in group)]
    m.resumed = len(m.runs["ar"])

    def finished(done: list[tuple[Sample, dict[str, list[Turn]]]]) -> None:
        new = [(sample, turns) for sample, turns in done if sample.id not in m.runs["ar"]]
        check_agree([t.out.tokens for _, turns in new for name in names for t in turns[name]])  # tensor parallel
        for sample, turns in new:
            for name in names:
                m.runs[name][sample.id] = turns[name]
        prompt_log.append([row for sample, _ in new for row in sample_rows(m, sample)])  # one write per group

    m.rss_before_timing = peak_memory()["peak_rss_mib"]
    started = time.time()
    total = sum(len(s.turns) for s in setup.samples) * len(names) * bench.repeats
    with tqdm(total=total, desc=f"bench {bench.name}", unit="gen") as bar:
        bar.update(sum(len(turns) for turns in m.runs["ar"].values()) * len(names) * bench.repeats)
        measure(todo, decoders, setup.budget, setup.limit, bench.repeats, bench.warmup, setup.encode,
                setup.target.tokenizer, finished, bar, stop, size, size if bench.queue else None)
    m.wall = time.time() - started
    m.samples = [s for s in setup.samples if s.id in m.runs["ar"]]
    return m


def wrap_up(setup: Setup, m: Measured, stop: Stop) -> None:
    """After the timing: scores, reference NLL, the divergence audit and the cost-model bound, for the finished
    samples (also when a signal stopped the timing). A signal that arrives *during* the wrap-up skips what is left
    (results.json then says "complete": false, and the continued run does the wrap-up again); a second one stops
    the stage in flight."""
    target, tokenizer = setup.target, setup.target.tokenizer
    stages = [  # (what the log says, whether it runs, the stage): every stage after the progress bar says it runs
        ("scoring the answers", True, lambda: score(m)),
        ("the reference NLL", True, lambda: setattr(m, "refs", reference_nlls(
            target.model, tokenizer, m.samples, lambda s: dialogue_text(s, setup.template, [], tokenizer)))),
        ("the divergence audit", m.lossless,
         lambda: setattr(m, "audits", audit_divergences(m.runs, target.model, m.reference))),
        ("each decoder's verify block" + (" and the cost-bound probe t(1), t(q)" if m.batch_size == 1 else ""),
         wants_bounds(setup), lambda: setattr(m, "bounds", measure_bounds(setup, m) if not stop.signal else {})),
    ]
    stages = [(what, stage) for what, runs, stage in stages if runs]
    timing_stopped = stop.signal
    try:
        for what, stage in stages:
            if not m.samples or stop.signal != timing_stopped:
                return
            log.info("after the timing: %s", what)
            stage()
    except Interrupted as second:
        stop.signal = stop.signal or second.name


def wants_bounds(setup: Setup) -> bool:
    """Whether bound.py's bound is computed: not switched off, and not on a compiled engine (its forwards are logged as
    anywhere, but the bound over a bucketed, graph-replaying curve has not been checked on a GPU yet: off, as it was
    while a forward hook counted forwards and could not see replayed graphs). At batch size > 1 it counts the verify
    blocks only: a batched row's step is a forward of B x q tokens, which t(q) at batch 1 does not price, so timing
    t(q) there would be thrown away."""
    return setup.conf.benchmark.cost_bound and not engine_meta(setup.decoders.values())["compile"]


def measure_bounds(setup: Setup, m: Measured) -> dict[str, dict[str, dict]]:
    """bound.py's bound (``wants_bounds`` decides whether it runs): per decoder and category (and "all"), the forwards
    of the generations whose tokens give the row's MAT (each turn's first repeat), as their engines logged them."""
    from specnoise.bench.bound import bounds

    groups = by_category(m.samples)
    groups["all"] = m.samples
    logs = {name: {category: [(t.out.forward_log, t.out.draft_forward_log, len(t.out.tokens), len(t.prompt))
                              for s in group for t in m.runs[name][s.id]]
                   for category, group in groups.items()} for name in m.runs}
    decoders = {name: setup.decoders.get(name, setup.decoders["ar"]) for name in m.runs}  # REFERENCE is AR's
    lengths = [len(setup.encode(s, [])) for s in m.samples]
    return bounds(logs, setup.decoders["ar"].target, {n: getattr(d, "draft", None) for n, d in decoders.items()},
                  cache_len=int(fmean(lengths)) + setup.budget // 2, cache_dir=setup.conf.decoder.cost_cache,
                  timed=m.batch_size == 1)


def score(m: Measured) -> None:
    """Each decoder's final answer to each sample, and its task score."""
    m.answers = {(n, s.id): Answer(s, m.runs[n][s.id][-1].text, sum(map(len, m.tokens(n, s))))
                 for n in m.runs for s in m.samples}
    if any(s.scorer != "none" for s in m.samples):
        log.info("scoring %d answers (identical answers once)", len(m.answers))
    m.scores = dict(zip(m.answers, score_answers(list(m.answers.values()), m.conf.benchmark))) if m.answers else {}


# ------------------------------------------------------------------------------------------ outputs
def write_results(setup: Setup, m: Measured, cfg: DictConfig, run_dir: Path, stop: Stop
                  ) -> tuple[Path, list[dict], list[dict]]:
    """results.json and the final per_prompt.jsonl (now with scores and audits); returns their rows."""
    conf = setup.conf
    rows = add_speedup_vs_best_ar(summary_rows(m)) if m.samples else []
    per_prompt = prompt_rows(m)
    decoders = setup.decoders.values()
    differing = sum(not t.same_tokens for by in m.runs.values() for turns in by.values() for t in turns)
    if differing and m.lossless:
        log.warning("%d generations gave different tokens in different repeats (nondeterministic kernels?): "
                    "their timings compare different work", differing)
    results = {
        "config": OmegaConf.to_container(cfg, resolve=True),
        "complete": not stop.signal, "interrupted": stop.signal,
        "progress": {"prompts": len(m.samples), "of": len(setup.samples), "resumed": m.resumed},
        "rows": rows,
        "skipped": {"prompts": len(setup.skipped), "ids": setup.skipped, "max_prompt_tokens": setup.limit,
                    "turns": sum(len(s.turns) - len(m.runs["ar"][s.id]) for s in m.samples)},
        "meta": {"max_new_tokens": setup.budget, "template": setup.template, "warmup": conf.benchmark.warmup,
                 "repeats": conf.benchmark.repeats, "bootstrap": conf.benchmark.bootstrap, "ci_seed": conf.seed,
                 "repeat_token_mismatches": differing if m.lossless else None,
                 "calibration_warning": timing.calibration_warning(rows),
                 "wall_seconds": m.wall, "model_path": setup.target.path, "device": str(setup.target.device),
                 "batch_size": m.batch_size, "skipped_decoders": setup.decoder_notes,
                 "config_warnings": config_warnings(conf),  # e.g. top_p at temperature 0 (also logged at start)
                 **peak_memory(), "peak_rss_before_timing_mib": m.rss_before_timing,
                 "dtype": str(setup.target.model.dtype), "torch_threads": torch.get_num_threads(),
                 "platform": platform.platform(), "torch": torch.__version__,
                 **engine_meta(decoders),
                 "decoders": {n: d.meta for n, d in setup.decoders.items() if getattr(d, "meta", None)},  # tree=auto
                 "cost_curve": m.bounds.get("ar", {}).get("all", {}).get("curve")},  # the bound's t(q) (bound.py)
    }
    results["meta"].update(describe(setup.target.model))  # attention backends, strict numerics, device, versions
    path = run_dir / "results.json"
    write_atomic(run_dir / "per_prompt.jsonl", "".join(json.dumps(r) + "\n" for r in per_prompt))  # with scores
    write_atomic(path, json.dumps(results, indent=2))
    if rows:  # the same rows for a spreadsheet or pandas
        import pandas as pd

        write_atomic(path.with_suffix(".csv"), lambda tmp: pd.DataFrame(rows).to_csv(tmp, index=False))
    return path, rows, per_prompt


def peak_memory() -> dict:
    """The job's peak resident set (``getrusage(RUSAGE_SELF).ru_maxrss``: the whole process, loading included, in
    MiB; results.json also holds its value before the first generation, so the growth while decoding is the
    difference) and, on CUDA, torch's peak allocated GPU memory."""
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / (1024 * 1024 if sys.platform == "darwin" else 1024)
    cuda = torch.cuda.max_memory_allocated() / 2**20 if torch.cuda.is_available() and torch.cuda.is_initialized() \
        else None
    return {"peak_rss_mib": rss, "cuda_peak_allocated_mib": cuda}


# ------------------------------------------------------------------------------------------ report, track
def print_summary(rows: list[dict], path: Path) -> None:
    """The console table (category rows too), then what a reader must know before quoting a speedup."""
    import pandas as pd

    batched = any(r.get("batch_size", 1) > 1 for r in rows)
    columns = TABLE_COLUMNS[:1] + BATCH_COLUMNS + TABLE_COLUMNS[1:] if batched else list(TABLE_COLUMNS)
    if any(r["identical_to_ar_fraction"] is not None for r in rows):  # sampling: the token check that applies
        columns[columns.index("lossless_fraction")] = "identical_to_ar_fraction"
    table = pd.DataFrame(rows)
    if table["category"].nunique() == 2:  # one category and `all`: the same numbers twice
        table = table[table["category"] == "all"].copy()
    table["speedup_ci"] = [f"{lo:.2f}-{hi:.2f}" if pd.notna(lo) and pd.notna(hi) else None
                           for lo, hi in zip(table["speedup_ci_low"], table["speedup_ci_high"])]
    shown = table[columns].astype(object).rename(columns=SHORT_NAMES)
    print(shown.where(shown.notna(), None).to_markdown(index=False, floatfmt=".3f", missingval="-"))
    print(f"(every column: {path} and {path.with_suffix('.csv').name})")
    noisy = [r for r in rows if r["timing_noisy"]]
    if noisy:  # one line; the rows are results.json's timing_noisy
        judged = sum(r["timing_noisy"] is not None for r in rows)
        print(f"\nNOISY TIMING: {len(noisy)} of {judged} rows ({timing.noise_reasons(noisy)}). {timing.ADVICE}")
    notes = defaultdict(list)
    for r in rows:
        if r.get("timing_note"):
            notes[r["timing_note"]].append(r)
    for note, noted in notes.items():  # one line per kind (the rows: results.json's timing_note)
        print(f"\nNOTE ({len(noted)} rows, e.g. {noted[0]['decoder']}/{noted[0]['category']}): {note}")
    warning = timing.calibration_warning(rows)
    if warning:
        print(f"\nCALIBRATION: {warning}")
    above = [r["decoder"] for r in rows if r["speedup_exceeds_mat"] and r["category"] == "all"]
    if above:
        print(f"\nIMPOSSIBLE: speedup above mean accepted tokens for {', '.join(above)}: a timing artefact")
    log.info("results: %s", path)


def track(conf: Config, cfg: DictConfig, run_dir: Path, rows: list[dict], per_prompt: list[dict]) -> None:
    """Summary metrics (``<decoder>/<metric>`` over all prompts, and the main decoder's without prefix), the
    results table and the per-prompt table. Started after the timing so wandb's process cannot disturb it."""
    import pandas as pd

    from specnoise.tracking import start_run

    summary: dict = {}
    for row in (r for r in rows if r["category"] == "all"):
        for metric in TRACKED:
            summary[f"{row['decoder']}/{metric}"] = row[metric]
            if row["decoder"] == conf.decoder.name:
                summary[metric] = row[metric]
    if any(r["timing_noisy"] for r in rows):
        summary["timing_advice"] = timing.ADVICE
    warning = timing.calibration_warning(rows)
    if warning:
        summary["calibration_warning"] = warning
    table, prompts = pd.DataFrame(rows), pd.DataFrame(per_prompt)
    with start_run(conf, cfg, run_dir, job_type="bench") as tracker:
        tracker.summary(summary)
        tracker.table("results", table)
        # wandb tables hold scalars: lists and dicts (tokens, accepted, the forward logs, ...) as JSON text
        listed = [c for c in prompts if prompts[c].map(lambda v: isinstance(v, (list, dict))).any()]
        tracker.table("per_prompt", prompts.assign(**{c: prompts[c].map(json.dumps) for c in listed}))
