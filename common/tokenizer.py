"""Tokenizer: text <-> ids and the chat template, over an HF tokenizer directory."""
from __future__ import annotations

from pathlib import Path


class Tokenizer:
    def __init__(self, folder: Path):
        from transformers import AutoTokenizer
        self.hf = AutoTokenizer.from_pretrained(str(folder))
        self.vocab_size = len(self.hf)

    @property
    def eos_token_id(self) -> int | None:
        return self.hf.eos_token_id

    def encode(self, text: str) -> list[int]:
        return self.hf(text, add_special_tokens=True).input_ids

    def chat_ids(self, user_message: str, system: str | None = None) -> list[int]:
        """Token ids of a one-turn chat, ending with the assistant header."""
        if not self.hf.chat_template:
            raise ValueError("this tokenizer has no chat template; drop --chat")
        messages = ([{"role": "system", "content": system}] if system else []) + \
                   [{"role": "user", "content": user_message}]
        text = self.hf.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        return self.hf(text, add_special_tokens=False).input_ids

    def decode(self, ids: list[int]) -> str:
        """Text of `ids` without special tokens. Ids past the tokenizer's vocab (random presets
        with a larger vocab) have no text and are left out."""
        return self.hf.decode([i for i in ids if i < self.vocab_size], skip_special_tokens=True)
