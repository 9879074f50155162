"""Where the generated files go, and what to run to make them again."""

from pathlib import Path

REFERENCE = Path("docs", "reference")
MAN = Path("docs", "man")
REGENERATE = "./dev docs (or: python -m resourced.docs)"
"""What the failure of the up-to-date test tells you to run."""
