"""A tiny random model saved with ``save_pretrained`` together with a tiny byte-level BPE tokenizer, so tests
load it through the same ``from_pretrained`` path as any hub model (and through the Hydra entry point)."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

TEXTS = [
    "def add(a, b):\n    return a + b\n",
    "def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + fibonacci(n - 2)\n",
    "for i in range(10):\n    print(i)\n",
    "The quick brown fox jumps over the lazy dog. Summarize the article in one sentence.",
    "Translate German to English: Der Hund schläft. The dog sleeps.",
    "### Instruction:\nWrite a function.\n### Response:\n```python\nclass Stack:\n    pass\n```\n",
    "Question: Tom has 3 apples and buys 4 more. How many apples? Answer: 7 #### 7",
]


def tiny_tokenizer(vocab_size: int = 320) -> PreTrainedTokenizerFast:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<pad>", "<s>", "</s>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(TEXTS * 4, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>")


def save_tiny_model(path: Path, family: str = "llama", seed: int = 0, layers: int = 2, hidden: int = 64,
                    tokenizer: PreTrainedTokenizerFast | None = None, **config) -> Path:
    """Save a random model of ``family`` (llama | qwen2) with its tokenizer into ``path``; returns ``path``."""
    tokenizer = tokenizer or tiny_tokenizer()
    kw = dict(vocab_size=len(tokenizer), hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024, initializer_range=0.3,
              bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
              pad_token_id=tokenizer.pad_token_id, tie_word_embeddings=False)
    kw.update(config)
    torch.manual_seed(seed)
    if family == "llama":
        model = LlamaForCausalLM(LlamaConfig(**kw))
    elif family == "qwen2":
        model = Qwen2ForCausalLM(Qwen2Config(use_sliding_window=False, **kw))
    else:
        raise ValueError(family)
    path = Path(path)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def save_tiny_pair(root: Path) -> dict[str, Path]:
    """A saved tiny target and a smaller draft sharing one tokenizer (the runner tests' models)."""
    tok = tiny_tokenizer()
    return {"target": save_tiny_model(root / "target", tokenizer=tok),
            "draft": save_tiny_model(root / "draft", layers=1, hidden=32, seed=1, tokenizer=tok)}


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path
