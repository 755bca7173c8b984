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

Writes ``results.json`` (config + one row per decoder and category, plus "all") and ``per_prompt.jsonl``
(one row per prompt turn and decoder), both atomically; prints a table; sends the same to wandb.
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

from specnoise.bench.datasets import Sample, dialogue_text, load_benchmark
from specnoise.bench.scoring import Answer, aggregate_row, score_answers
from specnoise.config import ARConfig, Config, DecoderConfig, UserError, config_dir
from specnoise.data.templates import encode_prompt
from specnoise.decoding.base import DecodeOutput, Decoder, build_decoder, decoder_class
from specnoise.decoding.kv import self_test
from specnoise.files import write_atomic
from specnoise.models import check_same_tokenizer, load_model
from specnoise.tracking import start_run

log = logging.getLogger("specnoise")
SHARED_FIELDS = ("max_new_tokens", "temperature", "top_p", "top_k", "seed")  # the same for every decoder
TABLE_COLUMNS = ["decoder", "category", "prompts", "new_tokens", "mean_accepted_tokens", "tokens_per_second",
                 "speedup", "lossless_fraction", "task_score", "score_metric"]


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
    answers: dict[tuple[str, str], Answer] = field(default_factory=dict)  # (decoder, sample id) -> last answer
    scores: dict[tuple[str, str], dict | None] = field(default_factory=dict)

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


def first_divergence(a: list[int], b: list[int]) -> int | None:
    if a == b:
        return None
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


# ------------------------------------------------------------------------------------------ the run
def run_benchmark(conf: Config, cfg: DictConfig, run_dir: Path, model_path: str | None = None) -> Path:
    """Benchmark ``conf.decoder`` (and ``conf.decoders``) against AR; returns the path of results.json."""
    run_dir = Path(run_dir)
    bench = conf.benchmark
    if bench.threads:  # tiny models on a shared CPU run far steadier on one thread
        torch.set_num_threads(bench.threads)
    configs = decoder_configs(conf)  # fails fast on a decoder that needs a missing draft
    template = bench.template or conf.model.template
    samples = load_benchmark(bench, template)

    target = load_model(conf.model, model_path)
    draft = load_model(conf.draft, role="draft") if conf.draft.name != "none" else None
    if draft is not None:
        check_same_tokenizer(target, draft)
    for loaded in filter(None, (target, draft)):
        self_test(loaded.model)
    decoders = {c.name: build_decoder(c, target, draft) for c in configs}
    budget = conf.decoder.max_new_tokens or bench.max_new_tokens
    context = decoders["ar"].target.max_length
    limit = min(bench.max_prompt_tokens or context, context - budget)
    tokenizer = target.tokenizer

    def encode(sample: Sample, answers: list[str]) -> list[int]:
        return encode_prompt(tokenizer, dialogue_text(sample, template, answers, tokenizer))

    fits = [len(encode(s, [])) <= limit for s in samples]
    kept = [s for s, ok in zip(samples, fits) if ok]
    skipped = [s.id for s, ok in zip(samples, fits) if not ok]
    if skipped:
        log.warning("skipping %d of %d prompts longer than %d tokens (benchmark.max_prompt_tokens, or the model's "
                    "context of %d minus max_new_tokens=%d)", len(skipped), len(samples), limit, context, budget)
    if not kept:
        raise UserError(f"no prompt of benchmark={bench.name} fits in {limit} tokens (the model's context of "
                        f"{context} minus max_new_tokens={budget}, or benchmark.max_prompt_tokens): lower "
                        "max_new_tokens, raise benchmark.max_prompt_tokens or use a model with a longer context")

    warm_up(decoders, encode(kept[0], []), budget, bench.warmup)
    names = list(decoders)  # "ar" first
    runs: dict[str, dict[str, list[Turn]]] = {name: {} for name in names}
    skipped_turns = 0
    started = time.time()
    with tqdm(total=sum(len(s.turns) for s in kept) * len(names), desc=f"bench {bench.name}", unit="gen") as bar:
        for i, sample in enumerate(kept):
            order = names if i % 2 == 0 else names[1:] + names[:1]  # AR first on even prompts, last on odd
            turns: dict[str, list[Turn]] = {name: [] for name in names}
            for k in range(len(sample.turns)):
                # each decoder continues its own dialogue
                prompts = {n: encode(sample, [t.text.strip() for t in turns[n]]) for n in names}
                if k > 0 and max(map(len, prompts.values())) > limit:
                    skipped_turns += len(sample.turns) - k
                    bar.update((len(sample.turns) - k) * len(names))
                    break
                for name in order:
                    bar.set_postfix_str(f"{sample.id} {name}", refresh=False)
                    out = decoders[name].generate(prompts[name], budget)
                    turns[name].append(Turn(prompts[name], out, completion_text(tokenizer, prompts[name], out.tokens)))
                    bar.update(1)
            for name in names:
                runs[name][sample.id] = turns[name]
    wall = time.time() - started

    m = Measured(conf, kept, runs, budget, lossless=bench.check_lossless and conf.decoder.temperature == 0)
    m.answers = {(n, s.id): Answer(s, runs[n][s.id][-1].text, sum(map(len, m.tokens(n, s))))
                 for n in names for s in kept}
    if any(s.scorer != "none" for s in kept):
        log.info("scoring %d answers (identical answers once)", len(m.answers))
    m.scores = dict(zip(m.answers, score_answers(list(m.answers.values()), bench)))
    rows, per_prompt = summary_rows(m), prompt_rows(m)
    results = {
        "config": OmegaConf.to_container(cfg, resolve=True),
        "rows": rows,
        "skipped": {"prompts": len(skipped), "ids": skipped, "turns": skipped_turns, "max_prompt_tokens": limit},
        "meta": {"max_new_tokens": budget, "template": template, "warmup": bench.warmup, "wall_seconds": wall,
                 "model_path": target.path, "device": str(target.device), "dtype": str(target.model.dtype),
                 "torch_threads": torch.get_num_threads(), "platform": platform.platform(), "torch": torch.__version__,
                 "decoders": {n: d.meta for n, d in decoders.items() if getattr(d, "meta", None)}},  # e.g. tree=auto
    }
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / "results.json"
    write_atomic(run_dir / "per_prompt.jsonl", "".join(json.dumps(r) + "\n" for r in per_prompt))
    write_atomic(path, json.dumps(results, indent=2))
    table = pd.DataFrame(rows)
    shown = table[TABLE_COLUMNS].astype(object)
    print(shown.where(shown.notna(), None).to_markdown(index=False, floatfmt=".3f", missingval="-"))
    log.info("results: %s", path)
    track(conf, cfg, run_dir, table, pd.DataFrame(per_prompt))
    return path


def warm_up(decoders: dict[str, Decoder], prompt: list[int], budget: int, times: int) -> None:
    for _ in range(times):
        for decoder in decoders.values():
            decoder.generate(prompt, budget)
    for decoder in decoders.values():
        decoder.reset_history()


# ------------------------------------------------------------------------------------------ outputs
def prompt_rows(m: Measured) -> list[dict]:
    """One row per (sample, turn, decoder); the sample's score sits on its last turn."""
    rows = []
    for s in m.samples:
        for name, by_sample in m.runs.items():
            turns = by_sample[s.id]
            for k, t in enumerate(turns):
                ar_tokens = m.runs["ar"][s.id][k].out.tokens
                score = m.scores[(name, s.id)] if k == len(turns) - 1 else None
                rows.append({
                    "id": s.id, "category": s.category, "turn": k, "decoder": name,
                    "prompt_tokens": len(t.prompt), "new_tokens": len(t.out.tokens),
                    "target_forwards": t.out.target_forwards, "draft_forwards": t.out.draft_forwards,
                    "seconds": t.out.seconds, "accepted": t.out.accepted,
                    "identical_to_ar": t.out.tokens == ar_tokens if m.lossless else None,
                    "first_divergence": first_divergence(t.out.tokens, ar_tokens) if m.lossless else None,
                    "output": t.text,
                    "score": score["score"] if score else None,
                    "score_detail": {key: v for key, v in score.items() if key != "score"} if score else None,
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
        "decoder": name, "model": conf.model.name, "draft": None if conf.draft.name == "none" else conf.draft.name,
        "benchmark": conf.benchmark.name, "category": category, "prompts": len(group), "turns": len(outs),
        "max_new_tokens": m.budget, "temperature": conf.decoder.temperature,
        "new_tokens": tokens, "target_forwards": forwards, "draft_forwards": sum(o.draft_forwards for o in outs),
        "mean_accepted_tokens": tokens / max(forwards, 1),
        "seconds": seconds, "tokens_per_second": tokens / max(seconds, 1e-9),
        "ar_new_tokens": ar_tokens, "ar_seconds": ar_seconds, "ar_tokens_per_second": ar_tokens / max(ar_seconds, 1e-9),
        "speedup": 1.0 if name == "ar" else ar_seconds / max(seconds, 1e-9),
        "lossless_fraction": sum(same) / len(same) if m.lossless else None,
        "task_score": score, "score_metric": metric, **{f"score_{k}": v for k, v in details.items()},
        "sb_tokens_per_second": sb_speed, "sb_ar_tokens_per_second": sb_ar_speed,
        "sb_speedup": 1.0 if name == "ar" else sb_speed / max(sb_ar_speed, 1e-9),
        "sb_mean_accepted_tokens": fmean(accepted) if accepted else 0.0,  # pooled over steps, as Spec-Bench's #MAT
    }


def track(conf: Config, cfg: DictConfig, run_dir: Path, table: pd.DataFrame, per_prompt: pd.DataFrame) -> None:
    """Summary metrics (``<decoder>/<metric>`` over all prompts, and the main decoder's without prefix), the
    results table and the per-prompt table. Started after the timing so wandb's process cannot disturb it."""
    metrics = ["speedup", "mean_accepted_tokens", "tokens_per_second", "lossless_fraction", "task_score",
               "sb_speedup", "sb_tokens_per_second"]
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
                                                      score_detail=per_prompt.score_detail.map(json.dumps)))
