"""Lossless audit: at a decoder's first divergence from AR, a numerical near-tie or a real mismatch?

In bf16 a multi-token verify forward rounds differently from AR's one-token forward, so when AR's top two
logits are nearly equal the two can pick different tokens with both decoders exact in real arithmetic. After
timing, for every prompt turn whose tokens differ from AR's, one plain forward of AR's prompt + AR's tokens
before the divergence recomputes the target's logits there (the logits AR chose from, up to rounding), and:

  verdict = numeric_tie  if top1 - top2 <= bound  and both AR's token and the decoder's are within ``bound``
                         of the top logit (each is the top or a runner-up of a near-tie),
            mismatch     otherwise (also when one output merely stops earlier: that breaks the output contract).

``bound = TIE_BOUND[dtype] * max(|logits|)``: rounding error grows with the magnitude of the numbers, so the
bound is relative to the logit scale. For bf16 and fp16 it is 4 units in the last place of the dtype (bf16
eps 2^-7, fp16 eps 2^-10), the size of the differences a different kernel shape makes after a few rounded
layers. fp32 gets 1e-5 (~80 eps, far below any margin a random-weight test meets): an fp32 divergence is a bug.
"""

from __future__ import annotations

import torch

from specnoise.decoding.kv import DynamicEngine

TIE_BOUND = {torch.float32: 1e-5, torch.float16: 4 * 2.0**-10, torch.bfloat16: 4 * 2.0**-7}


def first_divergence(a: list[int], b: list[int]) -> int | None:
    if a == b:
        return None
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def tie_bound(logits: torch.Tensor, dtype: torch.dtype) -> float:
    return TIE_BOUND.get(dtype, TIE_BOUND[torch.float32]) * max(logits.abs().max().item(), 1.0)


def verdict(logits: torch.Tensor, ar_token: int | None, token: int | None, dtype: torch.dtype) -> dict:
    """Classify a divergence from the target's logits ``[vocab]`` at that position (computed in ``dtype``)."""
    logits = logits.float()
    top = logits.topk(2).values.tolist()
    margin, bound = top[0] - top[1], tie_bound(logits, dtype)
    near = [t is not None and top[0] - logits[t].item() <= bound for t in (ar_token, token)]
    return {"verdict": "numeric_tie" if margin <= bound and all(near) else "mismatch",
            "divergence_margin": margin, "divergence_bound": bound,
            "divergence_ar_token": ar_token, "divergence_token": token}


def audit_divergences(runs: dict, model: torch.nn.Module, reference: str = "ar") -> dict[tuple[str, str, int], dict]:
    """``runs``: decoder -> sample id -> turns (``.prompt``, ``.out.tokens``), AR's under ``reference`` ("ar"; at a
    batch size above 1 the job's AR at batch 1, and the batched AR is audited like any decoder).

    Returns (decoder, sample id, turn) -> verdict fields, for every turn that differs from AR's on the same
    prompt (a later turn asked after a different answer is not comparable). Run outside the timed regions."""
    kv, logits_at, audits = DynamicEngine(model), {}, {}
    for name, by_sample in runs.items():
        if name == reference:
            continue
        for sid, turns in by_sample.items():
            for k, (mine, ar) in enumerate(zip(turns, runs[reference][sid])):
                i = first_divergence(mine.out.tokens, ar.out.tokens)
                if i is None or mine.prompt != ar.prompt:
                    continue
                key = (tuple(ar.prompt), i)
                if key not in logits_at:  # several decoders often diverge at the same place
                    kv.reset()
                    logits_at[key] = kv.forward(ar.prompt + ar.out.tokens[:i], last=1)[-1].cpu()
                audits[(name, sid, k)] = verdict(logits_at[key], _at(ar.out.tokens, i), _at(mine.out.tokens, i),
                                                 kv.dtype)
    return audits


def _at(tokens: list[int], i: int) -> int | None:
    return tokens[i] if i < len(tokens) else None


FIELDS = ("verdict", "divergence_margin", "divergence_bound", "divergence_ar_token", "divergence_token")


def audit_fields(audit: dict | None) -> dict:
    """The per_prompt.jsonl fields of one turn (all None when it matched AR or was not checked)."""
    return {key: (audit or {}).get(key) for key in FIELDS}


def mismatch_fraction(audits: dict, decoder: str, sample_ids: list[str]) -> float:
    """Prompts with a ``mismatch`` verdict on some turn / prompts (0 when nothing diverged)."""
    bad = {sid for (name, sid, _), a in audits.items() if name == decoder and a["verdict"] == "mismatch"}
    return sum(sid in bad for sid in sample_ids) / max(len(sample_ids), 1)
