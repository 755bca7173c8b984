"""Pretraining from scratch: a byte-level BPE tokenizer trained on the corpus, a model built from
``train.arch``, and the corpus cut into fixed-length chunks (documents joined by EOS)."""

from __future__ import annotations

import logging
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerFast

from specnoise.config import ArchConfig, TrainConfig, UserError

log = logging.getLogger("specnoise.train")

EOS, PAD = "<|endoftext|>", "<|pad|>"
TOKENIZER_CHARS = 15_000_000  # a BPE merge table stops improving long before the corpus ends


def train_tokenizer(texts: list[str], vocab_size: int) -> PreTrainedTokenizerFast:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[EOS, PAD], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())

    def sample():
        budget = TOKENIZER_CHARS
        for text in texts:
            if budget <= 0:
                return
            budget -= len(text)
            yield text

    tok.train_from_iterator(sample(), trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS, pad_token=PAD)


def load_or_train_tokenizer(cfg: TrainConfig, texts: list[str]):
    if cfg.tokenizer_path:
        try:
            tokenizer = AutoTokenizer.from_pretrained(cfg.tokenizer_path)
        except OSError as err:
            raise UserError(f"train.tokenizer_path: cannot load a tokenizer from {cfg.tokenizer_path!r}") from err
    else:
        log.info("training a byte-level BPE tokenizer (vocab %d) on the corpus", cfg.arch.vocab_size)
        tokenizer = train_tokenizer(texts, cfg.arch.vocab_size)
    if tokenizer.eos_token_id is None:
        raise UserError(f"train.tokenizer_path: {cfg.tokenizer_path} has no eos_token; pretraining needs one")
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def chunk(texts: list[str], tokenizer, seq_len: int) -> list[list[int]]:
    """Concatenate the documents (EOS after each) and cut the stream into ``seq_len`` chunks."""
    stream: list[int] = []
    for ids in tokenizer(texts, add_special_tokens=False)["input_ids"]:
        stream.extend(ids)
        stream.append(tokenizer.eos_token_id)
    return [stream[i:i + seq_len] for i in range(0, len(stream) - seq_len + 1, seq_len)]


def build_model(arch: ArchConfig, tokenizer, seed: int):
    import torch

    fields = {k: v for k, v in vars(arch).items() if k != "model_type"}
    fields["vocab_size"] = max(arch.vocab_size, len(tokenizer))
    try:
        config = AutoConfig.for_model(arch.model_type, eos_token_id=tokenizer.eos_token_id,
                                      pad_token_id=tokenizer.pad_token_id, bos_token_id=None, **fields)
    except ValueError as err:
        raise UserError(f"train.arch.model_type: {err}") from err
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model


def prepare(cfg: TrainConfig, texts: list[str], heldout: list[str], run_dir: Path):
    """(model, tokenizer, train chunks, held-out chunks) for train=pretrain."""
    tokenizer = load_or_train_tokenizer(cfg, texts)
    tokenizer.model_max_length = cfg.arch.max_position_embeddings
    tokenizer.save_pretrained(run_dir / "tokenizer")  # usable at once, e.g. by a draft's train.tokenizer_path
    train_chunks = chunk(texts, tokenizer, cfg.max_seq_len)
    eval_chunks = chunk(heldout, tokenizer, cfg.max_seq_len)[: cfg.eval_samples]
    if not train_chunks:
        raise UserError(f"train.max_seq_len={cfg.max_seq_len}: the corpus is shorter than one sequence")
    log.info("corpus: %d train chunks (%d tokens), %d held-out chunks of %d tokens", len(train_chunks),
             len(train_chunks) * cfg.max_seq_len, len(eval_chunks), cfg.max_seq_len)
    model = build_model(cfg.arch, tokenizer, cfg.seed)
    log.info("model: %s, %.2fM parameters", cfg.arch.model_type, model.num_parameters() / 1e6)
    return model, tokenizer, train_chunks, eval_chunks
