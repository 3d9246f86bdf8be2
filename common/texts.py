"""Public-domain texts the repository ships (common/texts/*.txt, each naming its source on its
first line): one to calibrate quantization with, another to measure accuracy on."""
from __future__ import annotations

from pathlib import Path

TEXTS = Path(__file__).resolve().parent / "texts"


def read_text(name: str) -> str:
    """A shipped text without its '#' header line."""
    lines = (TEXTS / name).read_text(encoding="utf-8").splitlines(keepends=True)
    return "".join(line for line in lines if not line.startswith("# "))


def calibration_text() -> str:
    """~700 SmolLM2 tokens: the opening of Alice in Wonderland's Chapter II."""
    return read_text("alice_chapter2_opening.txt")


def evaluation_text() -> str:
    """~3000 SmolLM2 tokens: Alice in Wonderland's Chapter I (never calibrated on)."""
    return read_text("alice_chapter1.txt")
