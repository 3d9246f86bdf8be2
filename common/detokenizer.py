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


class ReplyText:
    """The text of one streamed reply, released piece by piece, adding up to the final text.

    Pieces come from the incremental detokenizer. With stop strings the last len(longest stop) - 1
    characters are held back: they may be the start of a stop string, which the engine cuts from
    the final text and which must never be shown. finish(final text) releases what is left: the
    held-back characters, or a character the reply's last token left unfinished."""

    def __init__(self, tokenizer, stop: list[str] = ()):
        self.detokenizer = IncrementalDetokenizer(tokenizer)
        self.hold = max((len(s) for s in stop), default=1) - 1
        self.text = ""                  # released so far

    @property
    def num_tokens(self) -> int:
        return len(self.detokenizer.ids)

    def add(self, token_ids: list[int]) -> str:
        """New tokens of the reply; returns the text they release (may be "")."""
        for token in token_ids:
            self.detokenizer.add(token)
        text = self.detokenizer.text
        return self._release(text[:len(text) - self.hold])

    def finish(self, final_text: str) -> str:
        return self._release(final_text)

    def _release(self, text: str) -> str:
        if len(text) <= len(self.text) or not text.startswith(self.text):
            return ""
        piece, self.text = text[len(self.text):], text
        return piece
