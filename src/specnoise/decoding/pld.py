"""PLD, prompt lookup decoding: draft the continuation of an earlier occurrence of the newest n-gram.

No draft model: inputs that quote or edit their context (summaries, code edits, RAG) repeat long spans,
and each step verifies the looked-up span in one causal forward. With no match a step is a plain AR step
(Spec-Bench's PLD feeds a dummy token instead).
"""

from __future__ import annotations

from specnoise.decoding.cost import CHAIN
from specnoise.decoding.drafter import Drafter
from specnoise.decoding.ngram import prompt_lookup


class PLD(Drafter):
    name = "pld"

    def propose(self, room: int):
        draft = prompt_lookup(self.seq, self.cfg.max_ngram_size, self.cfg.num_pred_tokens)[:room] if room else []
        return self.chain(draft[:self.cut(len(draft), kind=CHAIN)])  # decoder.auto: maybe a shorter prefix
