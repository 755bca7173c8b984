"""The benchmark runner: every decoder against the AR baseline on the same prompts, timed in pairs.

Protocol (DESIGN.md, "Contracts"):
  * warm-up: ``benchmark.warmup`` generations of the first prompt with every decoder, discarded; then
    ``reset_history()`` so nothing learnt in the warm-up (Ouroboros' phrase pool) helps the measured prompts;
  * batch size 1; for every prompt AR and each decoder run back to back in this process, AR first on even
    prompts and last on odd ones, so slow drift of the machine cancels;
  * one budget for all: ``decoder.max_new_tokens`` or else ``benchmark.max_new_tokens``; tokens are counted
    as ids on both sides; ``Decoder.generate`` times the decode call itself (synchronised on GPU);
    ``benchmark.threads`` pins torch's intra-op threads (1 is far steadier for tiny models on a shared CPU);
  * multi-turn samples: turn k is asked after the decoder's *own* answer to turn k-1 (the same text as AR's
    whenever the decoder is lossless);
  * a prompt longer than ``benchmark.max_prompt_tokens`` (default: the model's context minus the budget) is
    skipped, counted in ``results.json`` ("skipped") and logged: a long benchmark should not die on one
    oversized article, and the count keeps the skip visible.

  * ``benchmark.limit`` counts the prompts that fit: over-long ones are passed over until ``limit`` fit.

Writes ``per_prompt.jsonl`` (one row per prompt turn and decoder) sample by sample as each finishes, and at the
end ``results.json`` (config + one row per decoder and category, plus "all"); prints a table; sends the same to
wandb. SIGINT / SIGTERM stop the run cleanly with a partial ``results.json`` ("complete": false); the same
command in the same run directory continues it (``progress.py``).
"""

from __future__ import annotations

import json
import logging
import platform
import time
from collections import defaultdict
from dataclasses import dataclass, field, replace
from pathlib import Path
from statistics import fmean

import pandas as pd
import torch
from omegaconf import DictConfig, OmegaConf
from tqdm.auto import tqdm

from specnoise.bench.audit import audit_divergences, audit_fields, first_divergence, mismatch_fraction
from specnoise.bench.datasets import Sample, dialogue_text, first_that_fit, load_samples
from specnoise.bench.engines import add_speedup_vs_best_ar, engine_meta
from specnoise.bench.progress import Interrupted, PromptLog, stop_on_signals
from specnoise.bench.ref_nll import RefNLL, reference_nlls, row_ref_nll
from specnoise.bench.scoring import Answer, aggregate_row, score_answers
from specnoise.config import ARConfig, Config, DecoderConfig, UserError, config_dir
from specnoise.data.templates import encode_prompt
from specnoise.decoding.base import DecodeOutput, Decoder, build_decoder, decoder_class
from specnoise.decoding.kv import self_test
from specnoise.files import write_atomic
from specnoise.models import check_same_tokenizer, load_model
from specnoise.numerics import describe, use_numerics
from specnoise.tracking import start_run

log = logging.getLogger("specnoise")
SHARED_FIELDS = ("max_new_tokens", "temperature", "top_p", "top_k", "seed")  # the same for every decoder
TABLE_COLUMNS = ["decoder", "category", "prompts", "new_tokens", "mean_accepted_tokens", "tokens_per_second",
                 "speedup", "lossless_fraction", "mismatch_fraction", "task_score", "score_metric", "ref_nll"]


@dataclass
class Turn:
    """One decoder on one turn of one sample."""

    prompt: list[int]
    out: DecodeOutput
    text: str  # the completion, decoded


@dataclass
class Measured:
    """Everything a benchmark run measured, and what the result files are computed from."""

    conf: Config
    samples: list[Sample]  # those that were run
    runs: dict[str, dict[str, list[Turn]]]  # decoder -> sample id -> turns ("ar" first)
    budget: int
    lossless: bool  # greedy and benchmark.check_lossless: compare every decoder's tokens with AR's
    model: str  # the target's name in the rows: a model this job trained is named after its run
    answers: dict[tuple[str, str], Answer] = field(default_factory=dict)  # (decoder, sample id) -> last answer
    scores: dict[tuple[str, str], dict | None] = field(default_factory=dict)
    refs: dict[str, RefNLL] = field(default_factory=dict)  # sample id -> NLL of its reference (model only)
    audits: dict[tuple[str, str, int], dict] = field(default_factory=dict)  # (decoder, sample id, turn) -> verdict

    def tokens(self, decoder: str, sample: Sample) -> list[list[int]]:
        return [t.out.tokens for t in self.runs[decoder][sample.id]]


# ------------------------------------------------------------------------------------------ set-up
def compose_decoder(name: str) -> DecoderConfig:
    """The dataclass of decoder option ``name`` as its YAML defines it (Hydra's compose API)."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    if not GlobalHydra.instance().is_initialized():  # called outside the running app (tests, notebooks)
        with initialize_config_dir(config_dir=str(config_dir()), version_base="1.3"):
            return compose_decoder(name)
    return OmegaConf.to_object(compose(config_name="config", overrides=[f"decoder={name}"]).decoder)


def decoder_configs(conf: Config) -> list[DecoderConfig]:
    """AR baseline first, then ``decoder`` and every ``decoders`` option (sharing budget, sampling and seed)."""
    shared = {k: getattr(conf.decoder, k) for k in SHARED_FIELDS}
    configs = [conf.decoder if conf.decoder.name == "ar" else ARConfig(**shared)]
    for name in dict.fromkeys([conf.decoder.name, *conf.decoders]):
        if name == "ar":
            continue
        if decoder_class(name).needs_draft and conf.draft.name == "none":
            raise UserError(f"decoder={name} needs a draft model: set draft=NAME or pair=NAME")
        configs.append(conf.decoder if name == conf.decoder.name else replace(compose_decoder(name), **shared))
    return configs


def completion_text(tokenizer, prompt: list[int], new: list[int]) -> str:
    """Decode ``new`` in the context of the prompt, so a tokenizer that drops a leading space when decoding a
    fragment on its own (SentencePiece) cannot break the indentation of generated code."""
    head = tokenizer.decode(prompt, skip_special_tokens=True)
    full = tokenizer.decode(prompt + new, skip_special_tokens=True)
    return full[len(head):] if full.startswith(head) else tokenizer.decode(new, skip_special_tokens=True)


# ------------------------------------------------------------------------------------------ the run
def run_benchmark(conf: Config, cfg: DictConfig, run_dir: Path, model_path: str | None = None) -> Path:
    """Benchmark ``conf.decoder`` (and ``conf.decoders``) against AR; returns the path of results.json.
    Raises ``Interrupted`` (after writing results.json from the finished samples) on SIGINT / SIGTERM."""
    run_dir = Path(run_dir)
    bench = conf.benchmark
    if bench.threads:  # tiny models on a shared CPU run far steadier on one thread
        torch.set_num_threads(bench.threads)
    configs = decoder_configs(conf)  # fails fast on a decoder that needs a missing draft
    template = bench.template or conf.model.template
    samples = load_samples(bench, template)

    target = load_model(conf.model, model_path)
    draft = load_model(conf.draft, role="draft") if conf.draft.name != "none" else None
    if draft is not None:
        check_same_tokenizer(target, draft)
    for loaded in filter(None, (target, draft)):
        use_numerics(loaded.model, strict=bench.strict_numerics)
        self_test(loaded.model)
    decoders = {c.name: build_decoder(c, target, draft) for c in configs}
    budget = conf.decoder.max_new_tokens or bench.max_new_tokens
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
                        "max_new_tokens, raise benchmark.max_prompt_tokens or use a model with a longer context")

    # a static cache is sized (and compiled) once, for the longest generation, before anything is timed: a later
    # turn holds the earlier turns and their answers (at most ``budget`` tokens each, a few more where text joins)
    longest = min(context, max(len(encode(s, [""] * (len(s.turns) - 1))) + (budget + 8) * len(s.turns) for s in kept))
    for decoder in decoders.values():
        decoder.reserve(longest)

    # ---- measure: samples finished by an earlier attempt in this run_dir are read back, the others run
    names = list(decoders)  # "ar" first
    run_dir.mkdir(parents=True, exist_ok=True)
    prompt_log = PromptLog(run_dir, cfg, names)  # refuses to continue a run with other settings
    label = conf.model.name if conf.train.name == "none" else f"{conf.model.name}+{conf.train.name}@{run_dir.name}"
    m = Measured(conf, kept, {name: {} for name in names}, budget,
                 lossless=bench.check_lossless and conf.decoder.temperature == 0, model=label)
    for s in kept:
        if s.id in prompt_log.finished:
            for name in names:
                m.runs[name][s.id] = restore_turns(prompt_log.finished[s.id], name, s, encode)
    todo = [(i, s) for i, s in enumerate(kept) if s.id not in m.runs["ar"]]

    started = time.time()
    total = sum(len(s.turns) for s in kept) * len(names)
    with stop_on_signals() as stop, tqdm(total=total, desc=f"bench {bench.name}", unit="gen") as bar:
        bar.update(sum(len(turns) for turns in m.runs["ar"].values()) * len(names))
        if todo:
            warm_up(decoders, encode(todo[0][1], []), budget, bench.warmup)
        for i, sample in todo:
            order = names if i % 2 == 0 else names[1:] + names[:1]  # AR first on even prompts, last on odd
            turns = run_sample(sample, decoders, order, budget, limit, encode, tokenizer, bar, stop)
            if turns is None:
                break  # stopped inside the sample: dropped, it runs again when the run continues
            for name in names:
                m.runs[name][sample.id] = turns[name]
            prompt_log.append(sample_rows(m, sample))
    wall = time.time() - started

    # ---- results of the finished samples (all of them, unless a signal stopped the loop)
    m.samples = [s for s in kept if s.id in m.runs["ar"]]
    score(m)
    # after timing: the reference likelihood (model only) and, per divergent prompt, one forward of AR's prefix
    m.refs = reference_nlls(target.model, tokenizer, m.samples, lambda s: dialogue_text(s, template, [], tokenizer))
    m.audits = audit_divergences(m.runs, target.model) if m.lossless else {}
    rows, per_prompt = add_speedup_vs_best_ar(summary_rows(m)) if m.samples else [], prompt_rows(m)
    results = {
        "config": OmegaConf.to_container(cfg, resolve=True),
        "complete": not stop.signal, "interrupted": stop.signal,
        "progress": {"prompts": len(m.samples), "of": len(kept), "resumed": len(kept) - len(todo)},
        "rows": rows,
        "skipped": {"prompts": len(skipped), "ids": skipped, "max_prompt_tokens": limit,
                    "turns": sum(len(s.turns) - len(m.runs["ar"][s.id]) for s in m.samples)},
        "meta": {"max_new_tokens": budget, "template": template, "warmup": bench.warmup, "wall_seconds": wall,
                 "model_path": target.path, "device": str(target.device), "dtype": str(target.model.dtype),
                 "torch_threads": torch.get_num_threads(), "platform": platform.platform(), "torch": torch.__version__,
                 **engine_meta(decoders.values()),
                 "decoders": {n: d.meta for n, d in decoders.items() if getattr(d, "meta", None)}},  # e.g. tree=auto
    }
    results["meta"].update(describe(target.model))  # attention backends, strict numerics, device, versions
    path = run_dir / "results.json"
    write_atomic(run_dir / "per_prompt.jsonl", "".join(json.dumps(r) + "\n" for r in per_prompt))  # with scores
    write_atomic(path, json.dumps(results, indent=2))
    if stop.signal:
        raise Interrupted(stop.signal)
    table = pd.DataFrame(rows)
    shown = table[TABLE_COLUMNS].astype(object)
    print(shown.where(shown.notna(), None).to_markdown(index=False, floatfmt=".3f", missingval="-"))
    log.info("results: %s", path)
    track(conf, cfg, run_dir, table, pd.DataFrame(per_prompt))
    return path


def score(m: Measured) -> None:
    """Each decoder's final answer to each sample, and its task score."""
    m.answers = {(n, s.id): Answer(s, m.runs[n][s.id][-1].text, sum(map(len, m.tokens(n, s))))
                 for n in m.runs for s in m.samples}
    if any(s.scorer != "none" for s in m.samples):
        log.info("scoring %d answers (identical answers once)", len(m.answers))
    m.scores = dict(zip(m.answers, score_answers(list(m.answers.values()), m.conf.benchmark))) if m.answers else {}


def run_sample(sample: Sample, decoders: dict[str, Decoder], order: list[str], budget: int, limit: int, encode,
               tokenizer, bar, stop) -> dict[str, list[Turn]] | None:
    """Every decoder on every turn of ``sample``, back to back in ``order``; None once ``stop.signal`` is set."""
    turns: dict[str, list[Turn]] = {name: [] for name in order}
    for k in range(len(sample.turns)):
        # each decoder continues its own dialogue
        prompts = {n: encode(sample, [t.text.strip() for t in turns[n]]) for n in order}
        if k > 0 and max(map(len, prompts.values())) > limit:  # later turns that no longer fit are skipped
            bar.update((len(sample.turns) - k) * len(order))
            break
        for name in order:
            if stop.signal:
                return None
            bar.set_postfix_str(f"{sample.id} {name}", refresh=False)
            out = decoders[name].generate(prompts[name], budget)
            turns[name].append(Turn(prompts[name], out, completion_text(tokenizer, prompts[name], out.tokens)))
            bar.update(1)
    return turns


def restore_turns(rows: list[dict], name: str, sample: Sample, encode) -> list[Turn]:
    """Decoder ``name``'s turns of a sample finished by an earlier run, from its per-prompt rows."""
    turns: list[Turn] = []
    for r in sorted((r for r in rows if r["decoder"] == name), key=lambda r: r["turn"]):
        out = DecodeOutput(r["tokens"], r["target_forwards"], r["draft_forwards"], r["accepted"], r["seconds"],
                           host_reads=r.get("host_reads", 0))
        turns.append(Turn(encode(sample, [t.text.strip() for t in turns]), out, r["output"]))
    return turns


def warm_up(decoders: dict[str, Decoder], prompt: list[int], budget: int, times: int) -> None:
    for _ in range(times):
        for decoder in decoders.values():
            decoder.generate(prompt, budget)
    for decoder in decoders.values():
        decoder.reset_history()


# ------------------------------------------------------------------------------------------ outputs
def prompt_rows(m: Measured) -> list[dict]:
    """One row per (sample, turn, decoder); the sample's score sits on its last turn."""
    return [row for s in m.samples for row in sample_rows(m, s)]


def sample_rows(m: Measured, s: Sample) -> list[dict]:
    """The rows of one sample: what per_prompt.jsonl holds, and all a continued run needs to count it again
    (``tokens`` included). Scores are filled in once every sample has run."""
    rows = []
    for name, by_sample in m.runs.items():
        turns = by_sample[s.id]
        for k, t in enumerate(turns):
            ar_tokens = m.runs["ar"][s.id][k].out.tokens
            score = m.scores.get((name, s.id)) if k == len(turns) - 1 else None
            rows.append({
                "id": s.id, "category": s.category, "turn": k, "decoder": name,
                "prompt_tokens": len(t.prompt), "new_tokens": len(t.out.tokens),
                "target_forwards": t.out.target_forwards, "draft_forwards": t.out.draft_forwards,
                "seconds": t.out.seconds, "accepted": t.out.accepted, "host_reads": t.out.host_reads,
                "identical_to_ar": t.out.tokens == ar_tokens if m.lossless else None,
                "first_divergence": first_divergence(t.out.tokens, ar_tokens) if m.lossless else None,
                **audit_fields(m.audits.get((name, s.id, k))),
                "output": t.text,
                "score": score["score"] if score else None,
                "score_detail": {key: v for key, v in score.items() if key != "score"} if score else None,
                "ref_nll": m.refs[s.id].mean if s.id in m.refs else None,
                "tokens": t.out.tokens, "sample_turns": len(turns),  # a continued run knows the sample is whole
            })
    return rows


def summary_rows(m: Measured) -> list[dict]:
    """One row per (decoder, category) and per decoder over "all"; AR is the row with speedup 1."""
    groups = defaultdict(list)
    for s in m.samples:
        groups[s.category].append(s)
    groups["all"] = m.samples
    return [summary_row(m, name, category, group) for name in m.runs for category, group in groups.items()]


def summary_row(m: Measured, name: str, category: str, group: list[Sample]) -> dict:
    def per_sample(decoder: str) -> list[tuple[int, float]]:  # (new tokens, seconds) over each sample's turns
        return [(sum(len(t.out.tokens) for t in turns), sum(t.out.seconds for t in turns))
                for turns in (m.runs[decoder][s.id] for s in group)]

    mine, ar = per_sample(name), per_sample("ar")
    outs = [t.out for s in group for t in m.runs[name][s.id]]
    tokens, seconds = map(sum, zip(*mine))
    ar_tokens, ar_seconds = map(sum, zip(*ar))
    forwards = sum(o.target_forwards for o in outs)
    same = [m.tokens(name, s) == m.tokens("ar", s) for s in group]
    metric, score, details = aggregate_row([m.answers[(name, s.id)] for s in group],
                                           [m.scores[(name, s.id)] for s in group], m.conf.benchmark)
    sb_speed = fmean(n / max(sec, 1e-9) for n, sec in mine)  # Spec-Bench: mean over prompts of tokens/s
    sb_ar_speed = fmean(n / max(sec, 1e-9) for n, sec in ar)
    accepted = [a for o in outs for a in o.accepted]
    conf = m.conf
    return {
        "decoder": name, "model": m.model, "draft": None if conf.draft.name == "none" else conf.draft.name,
        "benchmark": conf.benchmark.name, "category": category, "prompts": len(group), "turns": len(outs),
        "max_new_tokens": m.budget, "temperature": conf.decoder.temperature,
        "new_tokens": tokens, "target_forwards": forwards, "draft_forwards": sum(o.draft_forwards for o in outs),
        "mean_accepted_tokens": tokens / max(forwards, 1),
        "seconds": seconds, "tokens_per_second": tokens / max(seconds, 1e-9),
        "ar_new_tokens": ar_tokens, "ar_seconds": ar_seconds, "ar_tokens_per_second": ar_tokens / max(ar_seconds, 1e-9),
        "speedup": 1.0 if name == "ar" else ar_seconds / max(seconds, 1e-9),
        "lossless_fraction": sum(same) / len(same) if m.lossless else None,
        "mismatch_fraction": mismatch_fraction(m.audits, name, [s.id for s in group]) if m.lossless else None,
        "task_score": score, "score_metric": metric, **{f"score_{k}": v for k, v in details.items()},
        **row_ref_nll(m.refs, group),
        "sb_tokens_per_second": sb_speed, "sb_ar_tokens_per_second": sb_ar_speed,
        "sb_speedup": 1.0 if name == "ar" else sb_speed / max(sb_ar_speed, 1e-9),
        "sb_mean_accepted_tokens": fmean(accepted) if accepted else 0.0,  # pooled over steps, as Spec-Bench's #MAT
    }


def track(conf: Config, cfg: DictConfig, run_dir: Path, table: pd.DataFrame, per_prompt: pd.DataFrame) -> None:
    """Summary metrics (``<decoder>/<metric>`` over all prompts, and the main decoder's without prefix), the
    results table and the per-prompt table. Started after the timing so wandb's process cannot disturb it."""
    metrics = ["speedup", "mean_accepted_tokens", "tokens_per_second", "lossless_fraction", "task_score",
               "ref_nll", "sb_speedup", "sb_tokens_per_second"]
    summary = {}
    for row in table[table.category == "all"].to_dict("records"):
        for metric in metrics:
            summary[f"{row['decoder']}/{metric}"] = row[metric]
            if row["decoder"] == conf.decoder.name:
                summary[metric] = row[metric]
    with start_run(conf, cfg, run_dir, job_type="bench") as tracker:
        tracker.summary(summary)
        tracker.table("results", table)
        tracker.table("per_prompt", per_prompt.assign(accepted=per_prompt.accepted.map(json.dumps),
                                                      tokens=per_prompt.tokens.map(json.dumps),
                                                      score_detail=per_prompt.score_detail.map(json.dumps)))
