"""Reference likelihood: how well the target model predicts a benchmark's reference answer.

``ref_nll`` is the mean per-token negative log-likelihood (nats) of the reference answer (HumanEval's canonical
solution, MBPP's code, GSM8K's worked answer, the CNN/DM highlights, the WMT target, a JSONL
``benchmark.reference_field``) under the *target* model, given the first-turn prompt exactly as the decoders see
it: teacher forcing, one forward per sample. It depends on the model only, not on the decoder, and it is not
zero for a weak model where pass@1, accuracy and ROUGE are, so it tells two fine-tunes of a small model apart
(MSN's claim "same quality as SFT" becomes: MSN's ref_nll within 2% of SFT's). Rows pool samples token-weighted.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from specnoise.bench.datasets import Sample
from specnoise.data.templates import encode_prompt
from specnoise.decoding.kv import DynamicEngine


@dataclass
class RefNLL:
    nll: float  # summed over the scored reference tokens (nats)
    tokens: int

    @property
    def mean(self) -> float:
        return self.nll / self.tokens


def reference_text(sample: Sample) -> str | None:
    """What the model should write after the sample's prompt; None where there is no such text: multi-turn
    samples (turn 2's prompt holds the model's own first answer) and references that are judge notes or answer
    lists rather than an answer (MT-Bench, Spec-Bench RAG)."""
    ref = sample.reference
    if len(sample.turns) != 1 or not isinstance(ref, str) or not ref.strip():
        return None
    return ref


def reference_ids(tokenizer, prompt_text: str, prompt_ids: list[int], reference: str) -> list[int]:
    """The reference's token ids as they follow ``prompt_ids``. Tokenised together with the prompt, so a
    tokenizer that merges across the join or drops a leading space on a fragment gives the ids the model would
    write; a raw prompt that ends without a separator ("Answer:") gets a space before the answer."""
    text = reference if prompt_text[-1:].isspace() or reference[:1].isspace() else " " + reference
    joint = encode_prompt(tokenizer, prompt_text + text)
    if joint[: len(prompt_ids)] == prompt_ids:
        return joint[len(prompt_ids):]
    return tokenizer(text, add_special_tokens=False)["input_ids"]  # a merge across the join: the text alone


def sequence_nll(model: DynamicEngine, prompt: list[int], target: list[int]) -> RefNLL:
    """Teacher-forced NLL of ``target`` after ``prompt``: one forward of prompt + target[:-1], whose last
    len(target) logits predict the target tokens."""
    model.reset()
    logits = model.forward(prompt + target[:-1], last=len(target))
    model.reset()  # a fresh cache for whoever uses the model next
    nll = F.cross_entropy(logits, torch.as_tensor(target, device=logits.device), reduction="sum")
    return RefNLL(nll.item(), len(target))


def reference_nlls(model: torch.nn.Module, tokenizer, samples: list[Sample],
                   prompt_text: Callable[[Sample], str]) -> dict[str, RefNLL]:
    """sample id -> NLL of its reference for every sample that has one and whose prompt fits the model's
    context; a reference longer than the room left after the prompt is cut to fit (``tokens`` counts what was
    scored)."""
    kv = DynamicEngine(model)
    out = {}
    for sample in samples:
        reference = reference_text(sample)
        if reference is None:
            continue
        text = prompt_text(sample)
        prompt = encode_prompt(tokenizer, text)
        room = kv.max_length - len(prompt) + 1  # the last reference token is never fed in
        target = reference_ids(tokenizer, text, prompt, reference)[: max(room, 0)]
        if target:
            out[sample.id] = sequence_nll(kv, prompt, target)
    return out


def row_ref_nll(refs: dict[str, RefNLL], samples: list[Sample]) -> dict:
    """The row's token-weighted mean ref_nll over its samples that have a reference (None: none has one)."""
    scored = [refs[s.id] for s in samples if s.id in refs]
    tokens = sum(r.tokens for r in scored)
    return {"ref_nll": sum(r.nll for r in scored) / tokens if tokens else None, "ref_tokens": tokens}
