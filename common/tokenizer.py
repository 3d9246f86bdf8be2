"""Tokenizer: text <-> ids and the chat template, over an HF tokenizer directory."""
from __future__ import annotations

import re
import threading
from pathlib import Path

# Preset tokenizers already loaded, per thread: {(folder, class name): HF tokenizer}. Loading one
# reads tokenizer.json's vocabulary and merges (~0.3 s), and a test process builds hundreds of
# engines on SmolLM2's tokenizer. Per thread, because an HF fast tokenizer must not be called from
# two threads at once ("Already borrowed"): a server's engine thread decodes while its event loop
# encodes, each with a copy of its own.
_loaded = threading.local()


class Tokenizer:
    def __init__(self, folder: Path, hf_class: str | None = None):
        """hf_class: the transformers tokenizer class to load the folder with, where it is known (the
        converted SmolLM2's, see common/loader.py); None lets AutoTokenizer pick one. AutoTokenizer
        reads the folder's model config to pick it, which imports transformers' config classes
        (~2.5 s of a process's start, torch._dynamo among them) in every process that decodes.
        A known class marks a folder that never changes once written (common/smollm2.py): its
        tokenizer is loaded once per thread and shared (see _loaded); a user's folder is loaded
        for each Tokenizer, and used from whichever thread calls it, as before."""
        self.folder, self.hf_class = str(folder), hf_class
        self._own = None if hf_class else self._load()
        self.vocab_size = len(self.hf)

    def _load(self):
        import transformers
        return getattr(transformers, self.hf_class or "AutoTokenizer").from_pretrained(self.folder)

    @property
    def hf(self):
        """The HF tokenizer: this Tokenizer's own, or this thread's copy of a shared one."""
        if self._own is not None:
            return self._own
        shared = _loaded.__dict__.setdefault("tokenizers", {})
        key = (self.folder, self.hf_class)
        if key not in shared:
            shared[key] = self._load()
        return shared[key]

    @property
    def eos_token_id(self) -> int | None:
        return self.hf.eos_token_id

    def encode(self, text: str) -> list[int]:
        return self.hf(text, add_special_tokens=True).input_ids

    def chat_ids(self, user_message: str, system: str | None = None) -> list[int]:
        """Token ids of a one-turn chat, ending with the assistant header."""
        return self.messages_ids(([{"role": "system", "content": system}] if system else [])
                                 + [{"role": "user", "content": user_message}])

    def messages_ids(self, messages: list[dict]) -> list[int]:
        """Token ids of a conversation ([{"role", "content"}, ...]) through the model's chat
        template, ending with the assistant header (the model writes the next turn).

        Only the template's own markers become control tokens. Message text is encoded as plain
        text, so a user who types "<|im_end|>" gets those characters, not the end-of-turn token
        (which would let them end their turn and write the assistant's or system's part)."""
        if not self.hf.chat_template:
            raise ValueError("this tokenizer has no chat template")
        holders = [f"\x00message{i}\x00" for i in range(len(messages))]   # in no template
        placed = [{"role": m["role"], "content": h} for m, h in zip(messages, holders)]
        text = self.hf.apply_chat_template(placed, add_generation_prompt=True, tokenize=False)
        return self._encode_template(text, {h: m["content"] for h, m in zip(holders, messages)})

    def _encode_template(self, text: str, fill: dict[str, str]) -> list[int]:
        """Encode a rendered template whose message texts are still placeholders. The tokenizer
        itself cuts text at control-token strings and encodes each span between them on its own;
        we do the same, but cut only at the template's markers, then put the messages back."""
        markers = sorted((t.content for t in self.hf.added_tokens_decoder.values()), key=len, reverse=True)
        ids = []
        for piece in re.split("(" + "|".join(map(re.escape, markers)) + ")", text):
            if piece in markers:
                ids.append(self.hf.convert_tokens_to_ids(piece))
            elif piece:
                for holder, content in fill.items():
                    piece = piece.replace(holder, content)
                ids += self.hf(piece, add_special_tokens=False, split_special_tokens=True).input_ids
        return ids

    def decode(self, ids: list[int]) -> str:
        """Text of `ids` without special tokens. Ids past the tokenizer's vocab (random presets
        with a larger vocab) have no text and are left out."""
        return self.hf.decode([i for i in ids if i < self.vocab_size], skip_special_tokens=True)
