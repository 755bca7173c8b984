"""The peers users would pick instead: Hugging Face ``generate()`` greedy (with a dynamic or a static cache), with
prompt lookup, and assisted.

They run through the same runner and output contract as our decoders, with a ``decode`` of their own instead of a
drafter. ``generate()`` keeps its own cache, so the engines of the base class only keep count: a forward hook
(removed afterwards) counts target and draft calls, and a streamer receives each target forward's accepted tokens,
which go to ``out.emit`` as one block each, exactly like our decoders' steps. Their ``target_seconds`` is not
measured (None).

Batches (``generate_batch``, ``benchmark.batch_size`` > 1): ``hf_greedy`` and ``hf_static`` decode a group in one
``generate()`` call over the prompts left-padded to the longest (``attention_mask`` zero on the padding, from which
generate() derives each row's positions, so every row sees only its own prompt); each row's tokens are cut at its
first EOS (generate() keeps a finished row in the batch, filling it with padding) and count one target forward per
token, as at batch 1. ``hf_pld`` and ``hf_assisted`` run at batch 1 only (``max_batch_size``: transformers' prompt
lookup and assisted generation refuse a batch): the runner skips them at ``batch_size`` > 1 with a note.
"""

from __future__ import annotations

import time

import torch
from transformers import GenerationConfig, StaticCache
from transformers.generation.streamers import BaseStreamer

from specnoise.decoding.base import DecodeOutput, Decoder, Output
from specnoise.decoding.kv import Engine, sync
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

    def generation_config(self, budget: int) -> GenerationConfig:
        eos = sorted(self.eos_ids) or None
        return GenerationConfig(**GREEDY, max_new_tokens=budget, eos_token_id=eos, pad_token_id=self.pad_id(),
                                **self.options())

    def pad_id(self) -> int:
        eos = sorted(self.eos_ids)
        pad = self.target_model.model.generation_config.pad_token_id
        return pad if pad is not None else (eos[0] if eos else 0)

    def run(self, ids: torch.Tensor, mask: torch.Tensor, budget: int, streamer=None) -> torch.Tensor:
        """One generate() call over ``ids`` (rows left-padded, ``mask`` 0 on the padding); the sequences it returns."""
        model = self.target_model.model
        hooks = [_count_forwards(kv) for kv in (self.target, self.draft) if kv is not None and self.hooked]
        try:
            with numerics(model):  # the same attention-backend policy as our engine's calls
                return model.generate(ids, attention_mask=mask, generation_config=self.generation_config(budget),
                                      streamer=streamer, **self.models())
        finally:
            for hook in hooks:
                hook.remove()

    def decode(self, prompt: list[int], out: Output, seed: int = 0) -> None:
        ids = torch.tensor([prompt], device=self.target.device)
        blocks = _Blocks()
        self.run(ids, torch.ones_like(ids), out.budget, blocks)
        for block in blocks.blocks or []:
            out.emit(block)
        if not self.hooked:  # greedy: one target forward per streamed token
            self.target.forwards = len(blocks.blocks or [])

    def generate_batch(self, prompts: list[list[int]], max_new_tokens: int,
                       seed: int | None = None) -> list[DecodeOutput]:
        """The group in one generate() call, left-padded (module docstring); a group of one is ``generate``."""
        if self.max_batch_size is not None and len(prompts) > self.max_batch_size:
            raise UserError(f"decoder={self.name} decodes one prompt at a time (transformers supports it at batch "
                            "size 1 only): use benchmark.batch_size=1")
        if len(prompts) <= 1:
            return [self.generate(p, max_new_tokens, seed) for p in prompts]
        prompts = [self.check_prompt(p, max_new_tokens) for p in prompts]
        width = max(map(len, prompts))
        for kv in filter(None, (self.target, self.draft)):
            kv.reset()
        self.reserve(width + max_new_tokens)
        pad, device = self.pad_id(), self.target.device
        ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts], device=device)
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=device)
        sync(device)
        start = time.perf_counter()
        if max_new_tokens > 0:
            with torch.inference_mode():
                new = self.run(ids, mask, max_new_tokens)[:, width:].tolist()
        else:
            new = [[] for _ in prompts]
        sync(device)
        share = (time.perf_counter() - start) / len(prompts)
        outs = []
        for row in new:
            out = Output(self.eos_ids, max_new_tokens)
            for tok in row:  # greedy: one token per target forward; a finished row's padding is cut
                if out.done:
                    break
                out.emit([tok])
            outs.append(DecodeOutput(tokens=out.tokens, target_forwards=len(out.tokens), accepted=out.accepted,
                                     seconds=share, batch_size=len(prompts)))
        return outs


class HFStatic(HFGreedy):
    """generate() greedy with a static cache, compiled as transformers does on CUDA: the fastest stock AR, the peer
    of ``speedup_vs_best_ar``. One cache per batch size (a static cache keeps the batch size it was first filled
    with), sized by ``reserve`` (a benchmark reserves for its longest prompt) and reset per call, so the compiled
    graphs are built once per group size (in the warm-up) instead of whenever a longer prompt makes generate()
    allocate a new cache."""

    name = "hf_static"
    hooked = False

    def __init__(self, cfg, target, draft=None):
        super().__init__(cfg, target, draft)
        self.capacity = 0
        self.caches: dict[int, StaticCache] = {}  # rows -> its own cache (a cache keeps its first batch size)
        self.cache: StaticCache | None = None  # the current call's

    def models(self) -> dict:
        return {self.target.cache_kw: self.cache}  # `cache` since transformers 5.24, `past_key_values` before

    def reserve(self, n: int) -> None:
        super().reserve(n)
        if n > self.capacity:  # a new cache shape: generate() compiles again, in the next (untimed) warm-up
            self.capacity = capacity_for(n, self.target.max_length, block=0)
            self.caches = {}

    def run(self, ids: torch.Tensor, mask: torch.Tensor, budget: int, streamer=None) -> torch.Tensor:
        rows = ids.shape[0]
        if rows not in self.caches:  # built in the warm-up of this group size
            self.caches[rows] = StaticCache(config=self.target.model.config, max_cache_len=self.capacity)
        self.cache = self.caches[rows]
        self.cache.reset()
        return super().run(ids, mask, budget, streamer)


class HFPLD(HFGreedy):
    name = "hf_pld"
    max_batch_size = 1  # transformers' prompt lookup decodes one sequence at a time

    def options(self) -> dict:
        return dict(prompt_lookup_num_tokens=self.cfg.prompt_lookup_num_tokens,
                    max_matching_ngram_size=self.cfg.max_matching_ngram_size)


class HFAssisted(HFGreedy):
    """Assisted generation; generate() reads the draft length and its schedule from the draft's own config."""

    name = "hf_assisted"
    needs_draft = True
    max_batch_size = 1  # transformers' assisted generation decodes one sequence at a time

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
