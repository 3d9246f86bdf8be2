"""Incremental detokenization: text for a growing list of token ids, one piece per new token.

Decoding token by token and concatenating is wrong: a multi-byte character (an emoji, most CJK
characters) spans several byte-level tokens, and each alone decodes to the replacement character
"\ufffd". Decoding the whole list every time is right but costs O(n) per token. Like vLLM, we
decode a short window instead: the ids since the last emitted boundary. A piece is emitted only
when the window no longer ends mid-character, so the pieces concatenate to exactly
decode(all ids).
"""
from __future__ import annotations

REPLACEMENT = "\ufffd"


class IncrementalDetokenizer:
    def __init__(self, tokenizer):
        self.tokenizer = tokenizer      # anything with decode(ids) -> str (common.tokenizer.Tokenizer)
        self.ids: list[int] = []
        self.start = 0                  # ids[start:read] decode to text already emitted
        self.read = 0
        self.text = ""                  # everything emitted so far

    def add(self, token_id: int) -> str:
        """Append one id; return the new text it completes ("" while a character is unfinished)."""
        self.ids.append(token_id)
        window = self.tokenizer.decode(self.ids[self.start:])
        if window.endswith(REPLACEMENT):
            return ""                   # wait for the rest of the character's bytes
        done = self.tokenizer.decode(self.ids[self.start:self.read])
        piece = window[len(done):]
        self.start, self.read = self.read, len(self.ids)
        self.text += piece
        return piece
