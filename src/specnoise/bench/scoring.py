"""Task scores, per answer and per row of results: pass@1 (HumanEval, MBPP), final-number accuracy (GSM8K),
ROUGE-1/2/L (CNN/DM), BLEU (WMT16) and, for MT-Bench, the answer length only: the papers judge MT-Bench with
GPT-4, and no judge is reachable offline, so "length" is a size figure, not a quality score.

Scales: pass@1, accuracy and ROUGE in [0, 1]; BLEU in [0, 100] as sacrebleu reports it; length in tokens.
Identical answers are scored once, so lossless decoders cost no extra execution and score exactly as AR.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from statistics import fmean

from specnoise.bench.datasets import Sample
from specnoise.bench.execution import run_programs
from specnoise.config import BenchmarkConfig


@dataclass
class Answer:
    sample: Sample
    text: str  # completion of the last turn (decoded, special tokens dropped)
    new_tokens: int  # over all turns


# ------------------------------------------------------------------------------------------- code
# A completion ends where a top-level statement after the function begins (the Codex paper's stop list).
HUMANEVAL_STOPS = ("\n```", "\ndef ", "\nclass ", "\nif __name__", "\nprint(", "\nassert ", "\n#", '\n"""')
MBPP_STOPS = ("\n```", "\nif __name__", "\nprint(", "\nassert ", '\n"""')


def truncate(text: str, stops: tuple[str, ...]) -> str:
    cut = min((i for i in (text.find(s) for s in stops) if i >= 0), default=len(text))
    return text[:cut]


def program_for(sample: Sample, completion: str) -> str:
    """The program that passes iff the completion solves the task: code, then the task's tests."""
    f = sample.fields
    if "entry_point" in f:  # HumanEval: the prompt holds the signature, the completion the body
        body = truncate(completion, HUMANEVAL_STOPS)
        return f"{f['prompt']}{body}\n\n{f['test']}\n\ncheck({f['entry_point']})\n"
    code = truncate(completion, MBPP_STOPS)
    return f"{code}\n\n{f['test_setup_code']}\n" + "\n".join(f["test_list"]) + "\n"


# ------------------------------------------------------------------------------------------- GSM8K
NUMBER = r"-?\d[\d,]*(?:\.\d+)?"


def final_number(text: str) -> float | None:
    """The answer after '####', else after 'answer is', else the last number (a base model may go on to
    invent the next question, so text from a new 'Question:' on is ignored)."""
    text = text.split("\nQuestion:")[0]
    match = re.search(rf"####\s*\$?\s*({NUMBER})", text) or re.search(rf"answer is\s*:?\s*\$?\s*({NUMBER})", text, re.I)
    found = match.group(1) if match else (re.findall(NUMBER, text) or [None])[-1]
    if found is None:
        return None
    try:
        return float(found.replace(",", "").rstrip("."))
    except ValueError:
        return None


# ------------------------------------------------------------------------------------------ scorers
class Scorer:
    metric = "none"

    def __init__(self, cfg: BenchmarkConfig):
        self.cfg = cfg

    def score(self, answers: list[Answer]) -> list[dict]:
        """One dict per answer with at least "score"."""
        raise NotImplementedError

    def aggregate(self, answers: list[Answer], scores: list[dict]) -> dict:
        """The row's numbers; ``metric`` is the task score, the rest are details."""
        return {self.metric: fmean(s["score"] for s in scores)}


class PassAt1(Scorer):
    metric = "pass@1"

    def score(self, answers):
        results = run_programs([program_for(a.sample, a.text) for a in answers],
                               timeout=self.cfg.exec_timeout, memory_mb=self.cfg.exec_memory_mb)
        return [{"score": float(r.passed), "status": r.status, "detail": r.detail} for r in results]


class GSM8K(Scorer):
    metric = "accuracy"

    def score(self, answers):
        out = []
        for a in answers:
            got, want = final_number(a.text), final_number(str(a.sample.reference))
            out.append({"score": float(got is not None and want is not None and abs(got - want) < 1e-6),
                        "prediction": got})
        return out


class Rouge(Scorer):
    metric = "rougeL"
    KINDS = ("rouge1", "rouge2", "rougeL")

    def score(self, answers):
        from rouge_score.rouge_scorer import RougeScorer

        logging.getLogger("absl").setLevel(logging.WARNING)  # rouge_score logs "Using default tokenizer." at INFO
        scorer = RougeScorer(list(self.KINDS), use_stemmer=True)
        out = []
        for a in answers:
            f = {k: v.fmeasure for k, v in scorer.score(str(a.sample.reference), a.text).items()}
            out.append({"score": f[self.metric], **f})
        return out

    def aggregate(self, answers, scores):
        return {k: fmean(s[k] for s in scores) for k in self.KINDS}


class BLEU(Scorer):
    """Sentence BLEU per answer, corpus BLEU per row; a translation is the answer's first non-empty line."""

    metric = "bleu"

    @staticmethod
    def hypothesis(text: str) -> str:
        return next((line.strip() for line in text.splitlines() if line.strip()), "")

    def score(self, answers):
        import sacrebleu

        return [{"score": sacrebleu.sentence_bleu(self.hypothesis(a.text), [str(a.sample.reference)]).score}
                for a in answers]

    def aggregate(self, answers, scores):
        import sacrebleu

        hyps = [self.hypothesis(a.text) for a in answers]
        return {self.metric: sacrebleu.corpus_bleu(hyps, [[str(a.sample.reference) for a in answers]]).score}


class Length(Scorer):
    metric = "length_tokens"  # no judge offline: answer length only

    def score(self, answers):
        return [{"score": float(a.new_tokens)} for a in answers]


SCORERS: dict[str, type[Scorer]] = {"pass_at_1": PassAt1, "gsm8k": GSM8K, "rouge": Rouge, "bleu": BLEU,
                                    "length": Length}


def _key(a: Answer) -> tuple:
    return a.sample.id, a.text, a.new_tokens


def score_answers(answers: list[Answer], cfg: BenchmarkConfig) -> list[dict | None]:
    """Per-answer scores (None where the sample has no scorer); each distinct answer is scored once."""
    scored: dict[tuple, dict] = {}
    for name, scorer_cls in SCORERS.items():
        distinct = list({_key(a): a for a in answers if a.sample.scorer == name}.values())
        if distinct:
            scored.update(zip(map(_key, distinct), scorer_cls(cfg).score(distinct)))
    return [scored.get(_key(a)) for a in answers]


RowScore = tuple[str | None, float | None, dict]  # (metric, task score, details)


def aggregate_row(answers: list[Answer], scores: list[dict | None], cfg: BenchmarkConfig) -> RowScore:
    """The row's score; none when its samples have no scorer or mixed ones (Spec-Bench's "all")."""
    names = {a.sample.scorer for a in answers}
    if len(names) != 1 or "none" in names or not answers:
        return None, None, {}
    scorer = SCORERS[names.pop()](cfg)
    numbers = scorer.aggregate(answers, scores)
    return scorer.metric, numbers.pop(scorer.metric), numbers
