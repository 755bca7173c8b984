"""What a benchmark job's result files say: the measurement (``Measured``: every decoder's turns of every sample
that ran, and what the wrap-up added to them) turned into rows, and rows turned back into turns.

* ``sample_rows``: one row per (sample, turn, decoder), what ``per_prompt.jsonl`` holds: tokens, forwards, each
  repeat's seconds, the lossless check and the audit's verdict, the answer and its score; a continued run reads a
  finished sample back from them (``restore_turns``);
* ``summary_rows``: one row per (decoder, category) and per decoder over "all", what ``results.json`` and
  ``results.csv`` hold: the speedup over AR with its bootstrap CI and noise alarm (``timing.py``), MAT, the task
  score, where the time went and the cost-model bound, and the one line that says why the decoder runs at its speed.

Pure bookkeeping over finished measurements: nothing here times or loads a model (runner.py does).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from statistics import fmean

from specnoise.bench import timing
from specnoise.bench.audit import audit_fields, first_divergence, mismatch_fraction
from specnoise.bench.datasets import Sample
from specnoise.bench.measure import REFERENCE, Turn
from specnoise.bench.ref_nll import RefNLL, row_ref_nll
from specnoise.bench.scoring import Answer, aggregate_row
from specnoise.config import DECODER_SCHEMAS, Config, decoder_entry
from specnoise.decoding.base import DecodeOutput, decoder_class


@dataclass
class Measured:
    """Everything a benchmark run measured, and what the result files are computed from."""

    conf: Config
    samples: list[Sample]  # those that were run
    runs: dict[str, dict[str, list[Turn]]]  # decoder -> sample id -> turns ("ar" first; REFERENCE last at B > 1)
    budget: int
    lossless: bool  # greedy and benchmark.check_lossless: compare every decoder's tokens with AR's
    model: str  # the target's name in the rows: a model this job trained is named after its run
    resumed: int = 0  # samples read back from an earlier attempt
    wall: float = 0.0
    answers: dict[tuple[str, str], Answer] = field(default_factory=dict)  # (decoder, sample id) -> last answer
    scores: dict[tuple[str, str], dict | None] = field(default_factory=dict)
    refs: dict[str, RefNLL] = field(default_factory=dict)  # sample id -> NLL of its reference (model only)
    audits: dict[tuple[str, str, int], dict] = field(default_factory=dict)  # (decoder, sample id, turn) -> verdict
    bounds: dict[str, dict] = field(default_factory=dict)  # decoder -> category -> verify block, t(1), t(q) (bound.py)
    batch_size: int = 1  # benchmark.batch_size
    group_of: dict[str, int] = field(default_factory=dict)  # sample id -> the group it was decoded (and timed) in
    rss_before_timing: float | None = None  # peak resident MiB once loaded, before the first generation

    @property
    def reference(self) -> str:
        """Whose tokens every decoder's are compared with: AR at batch 1 (AR itself when the job is at batch 1)."""
        return REFERENCE if self.batch_size > 1 else "ar"

    def baseline(self, name: str) -> str:
        """The AR run a decoder's ``speedup`` is against: AR at the same batch size (``ar_bs1`` is its own)."""
        return name if name == REFERENCE else "ar"

    def batch_of(self, name: str) -> int:
        return 1 if name == REFERENCE else self.batch_size

    @property
    def sampling(self) -> bool:
        return self.conf.decoder.temperature > 0

    def same_tokens_check(self, name: str) -> bool:
        """Whether ``name``'s tokens must equal the reference's: under greedy decoding every decoder's (lossless); under
        sampling those whose drafts are guesses, not draws (the verifier then draws AR's own tokens for a seed)."""
        if not self.conf.benchmark.check_lossless:
            return False
        return self.lossless or (self.sampling and not sampled_drafts(self.conf, name))

    def timed_unit(self, name: str, sample: Sample) -> str | int:
        """What one timing covered: a prompt at batch 1, else its whole group (whose rows share the group's time); with
        continuous batching (``benchmark.queue``) a prompt again, timed by its share of the group's (``lockstep``'s
        ``spent``: its row's own work and an equal share of every batched request it was served in)."""
        if self.batch_of(name) == 1 or self.conf.benchmark.queue:
            return sample.id
        return self.group_of[sample.id]

    def tokens(self, decoder: str, sample: Sample) -> list[list[int]]:
        return [t.out.tokens for t in self.runs[decoder][sample.id]]


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
            ar_tokens = m.runs[m.reference][s.id][k].out.tokens
            score = m.scores.get((name, s.id)) if k == len(turns) - 1 else None
            rows.append({
                "id": s.id, "category": s.category, "turn": k, "decoder": name,
                "prompt_tokens": len(t.prompt), "new_tokens": len(t.out.tokens),
                "target_forwards": t.out.target_forwards, "draft_forwards": t.out.draft_forwards,
                # over the repeats by benchmark.repeat_stat, and each repeat's
                **dict(zip(("seconds", "target_seconds", "draft_seconds"), t.timed(m.conf.benchmark.repeat_stat))),
                "repeat_seconds": t.seconds, "repeat_target_seconds": t.target_seconds,
                "repeat_draft_seconds": t.draft_seconds,
                "same_tokens_across_repeats": t.same_tokens if m.lossless else None,
                "accepted": t.out.accepted, "host_reads": t.out.host_reads,
                # each forward (tokens fed, with a mask): what the cost bound prices
                "forward_log": t.out.forward_log, "draft_forward_log": t.out.draft_forward_log,
                "identical_to_ar": t.out.tokens == ar_tokens if m.same_tokens_check(name) else None,
                "first_divergence": first_divergence(t.out.tokens, ar_tokens) if m.lossless else None,
                **audit_fields(m.audits.get((name, s.id, k))),
                "output": t.text,
                "score": score["score"] if score else None,
                "score_detail": {key: v for key, v in score.items() if key != "score"} if score else None,
                "ref_nll": m.refs[s.id].mean if s.id in m.refs else None,
                "tokens": t.out.tokens, "sample_turns": len(turns),  # a continued run knows the sample is whole
                # the job's batch size, the group this sample was decoded in (benchmark.group_by_length decides which
                # prompts share one) and the rows this turn was decoded with (fewer in a last partial group, or in a
                # later turn that only some of the group's samples have)
                "batch_size": m.batch_of(name), "group": m.group_of.get(s.id) if m.batch_of(name) > 1 else None,
                "group_rows": t.out.batch_size,
            })
    return rows


def sampled_drafts(conf: Config, name: str) -> bool:
    """Whether decoder ``name`` of this job samples its drafts (rejection sampling; the peers and AR never do)."""
    base = decoder_entry(name)[0]
    drafter = None if name in ("ar", REFERENCE) else decoder_class(base).drafter_class
    if drafter is None:
        return False
    return drafter.draws_drafts(conf.decoder if base == conf.decoder.name else DECODER_SCHEMAS[base]())


def by_category(samples: list[Sample]) -> dict[str, list[Sample]]:
    groups = defaultdict(list)
    for s in samples:
        groups[s.category].append(s)
    return groups


def summary_rows(m: Measured) -> list[dict]:
    """One row per (decoder, category) and per decoder over "all"; AR is the row with speedup 1."""
    groups = by_category(m.samples)
    groups["all"] = m.samples
    return [summary_row(m, name, category, group) for name in m.runs for category, group in groups.items()]


def summary_row(m: Measured, name: str, category: str, group: list[Sample]) -> dict:
    stat = m.conf.benchmark.repeat_stat

    def per_sample(decoder: str) -> list[tuple[int, float]]:  # (new tokens, seconds) over a sample's turns
        return [(sum(len(t.out.tokens) for t in turns), sum(t.timed(stat)[0] for t in turns))
                for turns in (m.runs[decoder][s.id] for s in group)]

    base = m.baseline(name)
    mine, ar = per_sample(name), per_sample(base)
    turns = [t for s in group for t in m.runs[name][s.id]]
    outs = [t.out for t in turns]
    tokens, seconds = map(sum, zip(*mine))
    ar_tokens, ar_seconds = map(sum, zip(*ar))
    forwards = sum(o.target_forwards for o in outs)
    mat = tokens / max(forwards, 1)
    speedup = 1.0 if name == base else ar_seconds / max(seconds, 1e-9)
    bs1_seconds = sum(sec for _, sec in per_sample(m.reference))  # AR at batch 1 (AR itself at batch size 1)
    conf = m.conf
    # the bootstrap resamples what was timed: prompts at batch 1 (and with benchmark.queue), groups above (a group's
    # prompts share one timing, so resampling them resamples nothing); with fewer than two units there is no
    # interval, and it says why
    units: dict = defaultdict(lambda: [0.0, 0.0])
    for s, (_, ar_sec), (_, sec) in zip(group, ar, mine):
        units[m.timed_unit(name, s)][0] += ar_sec
        units[m.timed_unit(name, s)][1] += sec
    low, high = timing.speedup_ci([a for a, _ in units.values()], [b for _, b in units.values()],
                                  conf.benchmark.bootstrap, conf.seed)
    # the units the decoder lost time on, and the worst: a CI as wide as one of HumanEval-10's (0.86-1.18 for a
    # decoder at 1.02x) comes from a few prompts the decoder loses on beside others it wins, not from a uniform spread
    ratios = {unit if isinstance(unit, str) else f"group {unit}": a / max(b, 1e-9) for unit, (a, b) in units.items()}
    worst = min(ratios, key=ratios.get) if ratios and name != base else None
    slower = None if worst is None else sum(r < 1.0 for r in ratios.values())
    notes = []
    if low is None and name != base:
        noun = ("batch", "batches") if m.batch_of(name) > 1 else ("prompt", "prompts")
        notes.append(f"timed in {len(units)} {noun[len(units) != 1]}: no speedup CI (the bootstrap resamples "
                     f"{noun[1]}: two or more)")
    mine_ids = {s.id for s in group}
    if category != "all" and name != base and m.batch_of(name) > 1 and any(
            s.id not in mine_ids and m.group_of[s.id] in units for s in m.samples):
        notes.append("decoded in batches with other categories' prompts: its speedup is those batches' speedup")
    if name == base and low is not None:
        low = high = 1.0  # AR against itself, pair by pair
    ar_cv = timing.time_cv([per_token_repeats(m.runs[base][s.id]) for s in group])
    same = [m.tokens(name, s) == m.tokens(m.reference, s) for s in group]
    metric, score, details = aggregate_row([m.answers[(name, s.id)] for s in group if (name, s.id) in m.answers],
                                           [m.scores.get((name, s.id)) for s in group], conf.benchmark)
    sb_speed = fmean(n / max(sec, 1e-9) for n, sec in mine)  # Spec-Bench: mean over prompts of tokens/s
    sb_ar_speed = fmean(n / max(sec, 1e-9) for n, sec in ar)
    accepted = [a for o in outs for a in o.accepted]
    _, target_each, draft_each = zip(*(t.timed(stat) for t in turns))  # (each turn's repeats sorted once)
    target_s, draft_s = _total(list(target_each)), _total(list(draft_each))
    bound = m.bounds.get(name, {}).get(category, {})
    # bound.py times t(1), t(q) at batch 1: no bound for a batched row (its step is a forward of B x q tokens; the
    # batched curve t(B·q) is bench/batch_cost.py's), but its verify block q still holds
    t1, tq = (bound.get("t1_seconds"), bound.get("tq_seconds")) if m.batch_of(name) == 1 else (None, None)
    ratio = tq / t1 if t1 and tq else None  # a step's priced cost over a one-token forward
    # AR's priced time over the decoder's, prefills included (bound.py); None where the bound was not computed
    cost_bound = timing.cost_bound(bound.get("ar_seconds"), bound.get("seconds")) if t1 else None
    return {
        "decoder": name, "model": m.model, "draft": None if conf.draft.name == "none" else conf.draft.name,
        "benchmark": conf.benchmark.name, "category": category, "prompts": len(group), "turns": len(outs),
        "max_new_tokens": m.budget, "temperature": conf.decoder.temperature,
        "new_tokens": tokens, "target_forwards": forwards, "draft_forwards": sum(o.draft_forwards for o in outs),
        "mean_accepted_tokens": mat,
        "seconds": seconds, "tokens_per_second": tokens / max(seconds, 1e-9),
        "ar_new_tokens": ar_tokens, "ar_seconds": ar_seconds, "ar_tokens_per_second": ar_tokens / max(ar_seconds, 1e-9),
        "speedup": speedup, "speedup_ci_low": low, "speedup_ci_high": high, "repeats": conf.benchmark.repeats,
        "ar_time_cv": ar_cv, "timing_noisy": timing.timing_noisy(speedup, low, high, ar_cv),
        "timing_note": "; ".join(notes) or None,  # why a CI is missing, or a category's timing is not its own
        "units": len(units), "slower_units": slower, "worst_unit": worst,
        "worst_unit_speedup": None if worst is None else ratios[worst],
        "lossless_fraction": sum(same) / len(same) if m.lossless else None,
        # under sampling: the share of prompts with AR's very tokens (same seed), for decoders whose drafts are guesses;
        # a sampled draft keeps AR's distribution, not its tokens: `sampling_check` says which check a row answers to
        "identical_to_ar_fraction": sum(same) / len(same) if m.sampling and m.same_tokens_check(name) else None,
        "sampling_check": None if not m.sampling else "distribution" if sampled_drafts(m.conf, name) else "tokens",
        "mismatch_fraction": mismatch_fraction(m.audits, name, [s.id for s in group]) if m.lossless else None,
        "task_score": score, "score_metric": metric, **{f"score_{k}": v for k, v in details.items()},
        **row_ref_nll(m.refs, group),
        "sb_tokens_per_second": sb_speed, "sb_ar_tokens_per_second": sb_ar_speed,
        "sb_speedup": 1.0 if name == base else sb_speed / max(sb_ar_speed, 1e-9),
        "sb_mean_accepted_tokens": fmean(accepted) if accepted else 0.0,  # pooled over steps, as Spec-Bench's #MAT
        # where the time goes (over repeats by benchmark.repeat_stat, summed over the group's turns)
        "target_seconds": target_s, "draft_seconds": draft_s,
        "other_seconds": None if target_s is None else seconds - target_s - (draft_s or 0.0),
        # the curve's price of the same forwards (the first repeat's, prefills as they ran): beside target_seconds +
        # draft_seconds, how well the cost model predicts this run; cost_bound is AR's over it (bound.py)
        "priced_seconds": bound.get("seconds") if t1 else None,
        "verify_block": bound.get("verify_block"), "cost_ratio": ratio, "cost_bound": cost_bound,
        "why": timing.explain(name, mat, bound.get("verify_block"), ratio, cost_bound, speedup,
                              (bound.get("draft_seconds") or 0.0) / t1 if ratio else 0.0,
                              bound.get("prefill_share") or 0.0)
               + timing.losses(slower, len(units), worst, ratios.get(worst),
                               "groups" if m.batch_of(name) > 1 else "prompts"),
        "speedup_exceeds_mat": speedup > mat * 1.0001 if name != base else False,  # impossible for a real timing
        # batching: rows decoded together, and the speedup against AR at batch 1 (the group's tokens per second
        # against AR's one prompt at a time; equal to `speedup` at batch size 1)
        "batch_size": m.batch_of(name),
        "speedup_vs_bs1_ar": 1.0 if name == m.reference else bs1_seconds / max(seconds, 1e-9),
    }


def per_token_repeats(turns: list[Turn]) -> list[float]:
    """A sample's per-token time in each repeat (its turns together)."""
    repeats = len(turns[0].seconds)
    return [sum(t.seconds[r] for t in turns) / max(sum(t.new_tokens[r] for t in turns), 1) for r in range(repeats)]


def _total(values: list[float | None]) -> float | None:
    return None if not values or any(v is None for v in values) else sum(values)


def logged(fed: list | None) -> list[tuple] | None:
    """A forward log read back from per_prompt.jsonl (JSON lists: tokens, with a mask, and the tokens cached before
    the forward; a run logged before that last field was kept gives pairs, which the bound prices at its curve's
    context)."""
    return None if fed is None else [(int(f[0]), bool(f[1]), *map(int, f[2:3])) for f in fed]


def restore_turns(rows: list[dict], name: str, sample: Sample, encode) -> list[Turn]:
    """Decoder ``name``'s turns of a sample finished by an earlier run, from its per-prompt rows."""
    turns: list[Turn] = []
    for r in sorted((r for r in rows if r["decoder"] == name), key=lambda r: r["turn"]):
        out = DecodeOutput(r["tokens"], r["target_forwards"], r["draft_forwards"], r["accepted"], r["seconds"],
                           host_reads=r.get("host_reads", 0), batch_size=r.get("group_rows", 1),
                           forward_log=logged(r.get("forward_log")),
                           draft_forward_log=logged(r.get("draft_forward_log")))
        seconds = r.get("repeat_seconds") or [r["seconds"]]
        n = len(seconds)  # (a run written before each repeat's target and draft seconds were kept: their one value)
        turns.append(Turn(encode(sample, [t.text.strip() for t in turns]), out, r["output"], seconds,
                          r.get("repeat_target_seconds") or [r.get("target_seconds")] * n,
                          r.get("repeat_draft_seconds") or [r.get("draft_seconds")] * n,
                          [len(r["tokens"])] * n, r.get("same_tokens_across_repeats") is not False))
    return turns

