"""Every generated file, made in memory: what ``python -m resourced.docs`` writes and the
tests compare with the tree."""

from pathlib import Path

from . import facts, markdown, roff
from .names import MAN, REFERENCE


def generate() -> dict[Path, str]:
    """Every generated file: its path relative to the source tree, and its text."""
    known = facts.gather()
    files = {REFERENCE / name: text for name, text in markdown.pages(known).items()}
    files |= {MAN / f"man{section}" / f"{name}.{section}": text
              for (name, section), text in roff.pages(known).items()}
    return files
