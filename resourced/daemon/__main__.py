"""``python -m resourced.daemon``: what the units of every version run."""

from .main import entry

entry()
