"""PLD, prompt lookup decoding: draft the continuation of an earlier occurrence of the newest n-gram.

No draft model: inputs that quote or edit their context (summaries, code edits, RAG) repeat long spans,
and each step verifies the looked-up span in one causal forward. With no match a step is a plain AR step
(Spec-Bench's PLD feeds a dummy token instead).
"""

from __future__ import annotations

from specnoise.decoding.base import Decoder, Output
from specnoise.decoding.ngram import prompt_lookup


class PLD(Decoder):
    name = "pld"

    def decode(self, prompt: list[int], out: Output) -> None:
        seq = list(prompt)  # prompt + accepted tokens, the lookup's haystack
        pending = list(prompt)  # accepted tokens without KV yet; the first step is fused with prefill
        while True:
            room = out.budget - len(out.tokens) - 1  # a step emits at most len(draft) + 1 tokens
            draft = prompt_lookup(seq, self.cfg.max_ngram_size, self.cfg.num_pred_tokens)[:room] if room else []
            block, _ = self.verify_chain(pending, draft)
            out.emit(block)
            if out.done:
                return
            seq += block
            pending = block[-1:]
