"""Tiny random models of every common decoder-only family, built offline from the installed transformers' config
classes (AutoConfig.for_model), with the sizes and peaked weights of conftest.py's Llama / Qwen2 models."""

from __future__ import annotations

import torch
from transformers import AutoConfig, AutoModelForCausalLM
from transformers.models.auto.configuration_auto import CONFIG_MAPPING

from conftest import EOS, VOCAB
from specnoise.models import LoadedModel

WINDOW = 128  # the sliding window given to sliding-window families: the suite's prompts + budgets fit inside it
GEMMA = dict(head_dim=16, query_pre_attn_scalar=16)  # Gemma's default head_dim is 256
MOE = dict(num_local_experts=4, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=64)
# family -> what its config needs beyond the common tiny sizes (a model's own defaults otherwise)
FAMILIES: dict[str, dict] = {
    "llama": {},
    "mistral": dict(sliding_window=WINDOW),
    "mixtral": dict(MOE),
    "qwen2": dict(use_sliding_window=False),
    "qwen3": dict(head_dim=16),
    "qwen3_moe": dict(MOE, head_dim=16, decoder_sparse_step=1),
    "gemma": dict(GEMMA),
    "gemma2": dict(GEMMA, sliding_window=WINDOW),
    "gemma3_text": dict(GEMMA, sliding_window=WINDOW),
    "phi3": {},
    "starcoder2": {},
    "olmo2": {},
    "olmo3": dict(sliding_window=WINDOW, initializer_range=1.0),  # 0.3 repeats one token
    "granite": {},
    "gpt_neox": dict(rotary_pct=0.5),
    "cohere": {},
    "cohere2": dict(sliding_window=WINDOW, initializer_range=1.0),
    "phi": {},
    "stablelm": {},
    "glm": dict(head_dim=16),
    "smollm3": dict(initializer_range=1.0),
    "helium": dict(head_dim=16),
}

FAMILIES = {name: extra for name, extra in FAMILIES.items() if name in CONFIG_MAPPING}  # older transformers lack some


def family_config(family: str, layers: int = 2, **overrides):
    kw = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=layers,
              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512, initializer_range=0.3,
              eos_token_id=EOS, bos_token_id=1, pad_token_id=0, tie_word_embeddings=False)
    kw.update(FAMILIES[family])
    kw.update(overrides)
    return AutoConfig.for_model(family, **kw)


def family_model(family: str, layers: int = 2, seed: int = 0, **overrides) -> LoadedModel:
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(family_config(family, layers, **overrides), dtype=torch.float32)
    model.eval()
    model.generation_config.eos_token_id = EOS
    model.generation_config.pad_token_id = 0
    return LoadedModel(f"random-{family}", "", model, None, frozenset({EOS}), "raw")
