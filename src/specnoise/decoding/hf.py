"""The peers users would pick instead: Hugging Face ``generate()`` greedy (with a dynamic or a static cache), with
prompt lookup, and assisted.

They run through the same runner and output contract as our decoders, with a ``decode`` of their own instead of a
drafter. ``generate()`` keeps its own cache, so the engines of the base class only keep count: a forward hook
(removed afterwards) counts target and draft calls, and a streamer receives each target forward's accepted tokens,
which go to ``out.emit`` as one block each, exactly like our decoders' steps. Their ``target_seconds`` is not
measured (None).
"""

from __future__ import annotations

import torch
from transformers import GenerationConfig, StaticCache
from transformers.generation.streamers import BaseStreamer

from specnoise.decoding.base import Decoder, Output
from specnoise.decoding.kv import Engine
from specnoise.decoding.static_kv import capacity_for
from specnoise.errors import UserError
from specnoise.numerics import numerics

# generate() fills every field left None from the model's own generation_config, so the knobs that change
# greedy choices are pinned to neutral values: the peers must stay the plain greedy oracle
GREEDY = dict(do_sample=False, num_beams=1, repetition_penalty=1.0, encoder_repetition_penalty=1.0,
              no_repeat_ngram_size=0, min_length=0, temperature=1.0, top_p=1.0, top_k=50)


class _Blocks(BaseStreamer):
    """generate() streams the prompt first, then the tokens each target forward accepted."""

    def __init__(self):
        self.blocks: list[list[int]] | None = None

    def put(self, value: torch.Tensor) -> None:
        if self.blocks is None:
            self.blocks = []  # the prompt
        else:
            self.blocks.append(value.view(-1).tolist())

    def end(self) -> None:
        pass


def _count_forwards(kv: Engine):
    def hook(*_):
        kv.forwards += 1

    return kv.model.register_forward_hook(hook)


class HFGreedy(Decoder):
    name = "hf_greedy"
    hooked = True  # count forwards with a hook (not under compilation: the hook would be traced into the graph)

    def options(self) -> dict:
        """GenerationConfig fields beyond greedy decoding and the budget."""
        return {}

    def models(self) -> dict:
        """generate() arguments naming other models (the assistant)."""
        return {}

    def decode(self, prompt: list[int], out: Output, seed: int = 0) -> None:
        model = self.target_model.model
        eos = sorted(self.eos_ids) or None
        pad = model.generation_config.pad_token_id
        config = GenerationConfig(**GREEDY, max_new_tokens=out.budget, eos_token_id=eos,
                                  pad_token_id=pad if pad is not None else (eos[0] if eos else 0), **self.options())
        ids = torch.tensor([prompt], device=self.target.device)
        blocks = _Blocks()
        hooks = [_count_forwards(kv) for kv in (self.target, self.draft) if kv is not None and self.hooked]
        try:
            with numerics(model):  # the same attention-backend policy as our engine's calls
                model.generate(ids, attention_mask=torch.ones_like(ids), generation_config=config, streamer=blocks,
                               **self.models())
        finally:
            for hook in hooks:
                hook.remove()
        for block in blocks.blocks or []:
            out.emit(block)
        if not self.hooked:  # greedy: one target forward per streamed token
            self.target.forwards = len(blocks.blocks or [])


class HFStatic(HFGreedy):
    """generate() greedy with a static cache, compiled as transformers does on CUDA: the fastest stock AR, the peer
    of ``speedup_vs_best_ar``. One cache, sized by ``reserve`` (a benchmark reserves for its longest prompt) and reset
    per call, so the compiled graphs are built once (in the warm-up) instead of whenever a longer prompt makes
    generate() allocate a new cache."""

    name = "hf_static"
    hooked = False

    def __init__(self, cfg, target, draft=None):
        super().__init__(cfg, target, draft)
        self.cache, self.capacity = None, 0

    def models(self) -> dict:
        return {self.target.cache_kw: self.cache}  # `cache` since transformers 5.24, `past_key_values` before

    def reserve(self, n: int) -> None:
        super().reserve(n)
        if n > self.capacity:  # a new cache shape: generate() compiles again, in the next (untimed) warm-up
            self.capacity = capacity_for(n, self.target.max_length, block=0)
            self.cache = StaticCache(config=self.target.model.config, max_cache_len=self.capacity)

    def decode(self, prompt: list[int], out: Output, seed: int = 0) -> None:
        self.cache.reset()
        super().decode(prompt, out, seed)


class HFPLD(HFGreedy):
    name = "hf_pld"

    def options(self) -> dict:
        return dict(prompt_lookup_num_tokens=self.cfg.prompt_lookup_num_tokens,
                    max_matching_ngram_size=self.cfg.max_matching_ngram_size)


class HFAssisted(HFGreedy):
    """Assisted generation; generate() reads the draft length and its schedule from the draft's own config."""

    name = "hf_assisted"
    needs_draft = True

    def models(self) -> dict:
        target, draft = self.target_model, self.draft_model
        if target.model.config.get_text_config().vocab_size == draft.model.config.get_text_config().vocab_size:
            return dict(assistant_model=draft.model)
        # same tokenizer, vocabularies padded differently: generate() then wants both tokenizers
        if target.tokenizer is None or draft.tokenizer is None:
            raise UserError("hf_assisted: target and draft vocabulary sizes differ and no tokenizers are loaded; "
                            "use decoder=speculative, which compares ids over the shared vocabulary")
        return dict(assistant_model=draft.model, tokenizer=target.tokenizer, assistant_tokenizer=draft.tokenizer)

    def decode(self, prompt: list[int], out: Output, seed: int = 0) -> None:
        config = self.draft_model.model.generation_config
        wanted = dict(num_assistant_tokens=self.cfg.num_assistant_tokens,
                      num_assistant_tokens_schedule=self.cfg.schedule,
                      assistant_confidence_threshold=0.0)  # off: exactly num_assistant_tokens drafts a step
        saved = {key: getattr(config, key, None) for key in wanted}
        # set on every call: the heuristic schedule writes its last draft length back into the config
        config.update(**wanted)
        try:
            super().decode(prompt, out, seed)
        finally:
            config.update(**saved)
