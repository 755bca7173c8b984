"""The smallest real job: load the model, template ``prompt``, decode it with ``decoder`` and print the completion.

``python -m specnoise prompt="def add(a, b):" decoder=pld`` (with train=none and benchmark=none, the defaults).
"""

from __future__ import annotations

import logging

from omegaconf import DictConfig

from specnoise.bench.measure import completion_text
from specnoise.config import Config
from specnoise.data.templates import encode_prompt, format_prompt
from specnoise.decoding.base import build_decoder
from specnoise.decoding.kv import self_test
from specnoise.models import check_same_tokenizer, load_model

log = logging.getLogger("specnoise")


def generate_once(conf: Config, cfg: DictConfig | None = None) -> str:
    target = load_model(conf.model)
    draft = load_model(conf.draft, role="draft") if conf.draft.name != "none" else None
    if draft is not None:
        check_same_tokenizer(target, draft)
    self_test(target.model)
    decoder = build_decoder(conf.decoder, target, draft)
    template = conf.benchmark.template or target.template
    prompt = encode_prompt(target.tokenizer, format_prompt(template, conf.prompt, tokenizer=target.tokenizer))
    out = decoder.generate(prompt, conf.decoder.max_new_tokens or conf.benchmark.max_new_tokens)
    text = completion_text(target.tokenizer, prompt, out.tokens)
    print(text)
    log.info("decoder=%s: %d new tokens, %d target forwards (%.2f tokens/forward), %.1f tokens/s", decoder.name,
             len(out.tokens), out.target_forwards, out.mean_accepted, len(out.tokens) / max(out.seconds, 1e-9))
    return text
