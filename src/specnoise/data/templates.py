"""Prompt templates: one table for every model family, used by training and by benchmarks alike.

A dialogue is a list of (user, assistant) turns whose last assistant is None (the model answers it).
``chat`` defers to the tokenizer's own chat template.
"""

from __future__ import annotations

from dataclasses import dataclass

from specnoise.config import UserError

VICUNA_SYSTEM = ("A chat between a curious user and an artificial intelligence assistant. "
                 "The assistant gives helpful, detailed, and polite answers to the user's questions.")
LLAMA2_SYSTEM = ("You are a helpful, respectful and honest assistant. Always answer as helpfully as possible, "
                 "while being safe.")
ALPACA_SYSTEM = ("Below is an instruction that describes a task. "
                 "Write a response that appropriately completes the request.\n\n")
DEEPSEEK_SYSTEM = ("You are an AI programming assistant, utilizing the DeepSeek Coder model, developed by DeepSeek "
                   "Company, and you only answer questions related to computer science.\n")


@dataclass(frozen=True)
class Template:
    system: str  # text before the first turn
    user: str  # before each user message
    assistant: str  # between a user message and the answer
    turn_end: str  # after each answered turn


TEMPLATES: dict[str, Template] = {
    "raw": Template("", "", "", "\n"),
    "code-instruct": Template("", "### Instruction:\n", "\n### Response:\n", "\n"),
    "alpaca": Template(ALPACA_SYSTEM, "### Instruction:\n", "\n\n### Response:\n", "\n\n"),
    "vicuna": Template(VICUNA_SYSTEM + " ", "USER: ", " ASSISTANT:", "</s>"),
    "llama2-chat": Template(f"[INST] <<SYS>>\n{LLAMA2_SYSTEM}\n<</SYS>>\n\n", "", " [/INST]", " </s><s>[INST] "),
    "deepseek-coder": Template(DEEPSEEK_SYSTEM, "### Instruction:\n", "\n### Response:\n", "\n<|EOT|>\n"),
}


def join_instruction(instruction: str, input_text: str = "") -> str:
    return f"{instruction}\n\n{input_text}" if input_text else instruction


def format_dialogue(template: str, turns: list[tuple[str, str | None]], tokenizer=None) -> str:
    """The prompt text for ``turns``; the last turn's answer must be None (the model writes it)."""
    if not turns or turns[-1][1] is not None:
        raise ValueError("the last turn of a dialogue must be unanswered")
    if template == "chat":
        if tokenizer is None or not getattr(tokenizer, "chat_template", None):
            raise UserError("template=chat needs a tokenizer with a chat template: pick another model.template")
        messages = []
        for user, answer in turns:
            messages.append({"role": "user", "content": user})
            if answer is not None:
                messages.append({"role": "assistant", "content": answer})
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    if template not in TEMPLATES:
        raise UserError(f"unknown template {template!r}: choose chat or one of {', '.join(TEMPLATES)}")
    t = TEMPLATES[template]
    text = t.system
    lead = " " if template == "vicuna" else ""  # FastChat writes "ASSISTANT: answer"
    for user, answer in turns:
        text += t.user + user + t.assistant
        if answer is not None:
            text += lead + answer + t.turn_end
    return text


def format_prompt(template: str, instruction: str, input_text: str = "", tokenizer=None) -> str:
    return format_dialogue(template, [(join_instruction(instruction, input_text), None)], tokenizer)


def encode_prompt(tokenizer, text: str) -> list[int]:
    """Prompt text -> ids with the tokenizer's default special tokens (BOS where the model uses one)."""
    return tokenizer(text, add_special_tokens=True)["input_ids"]
