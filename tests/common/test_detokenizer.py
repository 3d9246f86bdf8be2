"""Incremental detokenization: pieces released token by token add up to the whole decode, never
show half a character, and never show a stop string (common/detokenizer.py)."""
from common.detokenizer import IncrementalDetokenizer, ReplyText

TEXT = "Paris 🇫🇷 是法国的首都, café! ✅ done"


def test_pieces_add_up_to_the_whole_decode_without_broken_characters(tokenizer):
    ids = tokenizer.encode(TEXT)
    detok = IncrementalDetokenizer(tokenizer)
    pieces = [detok.add(t) for t in ids]
    assert "".join(pieces) == tokenizer.decode(ids)
    assert not any("\ufffd" in p for p in pieces)
    assert "" in pieces, "expected a token that ends mid-character (the flag or the Chinese)"


def test_reply_text_holds_back_a_stop_string_and_settles_on_the_final_text(tokenizer):
    ids = tokenizer.encode("The answer is Paris. STOP and more")
    final = tokenizer.decode(ids).split(" STOP")[0]          # what the engine returns, cut at the stop
    reply = ReplyText(tokenizer, stop=[" STOP"])
    shown = "".join(reply.add([t]) for t in ids[:-3])
    assert " STOP" not in shown and final.startswith(shown)
    assert shown + reply.finish(final) == final == reply.text
