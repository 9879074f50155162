"""The Prometheus text exposition format (version 0.0.4), written from plain values.

Pure: families in, text out.  What node_exporter's textfile collector and
``prometheus_client``'s parser read: a ``# HELP`` and a ``# TYPE`` line per family, then a
line per sample, label values escaped (backslash, double quote, newline).
"""

import math
from dataclasses import dataclass, field

GAUGE, COUNTER = "gauge", "counter"


@dataclass
class Family:
    """One metric: ``name`` (a counter's ends in ``_total``), its kind, a line of help and
    its samples, (labels, value) pairs."""

    name: str
    kind: str
    help: str
    samples: list[tuple[dict[str, str], float]] = field(default_factory=list)

    def add(self, value: float, **labels: str) -> "Family":
        self.samples.append((labels, value))
        return self


def render(families: list[Family]) -> str:
    """The exposition text of ``families``, in their order, ending with a newline."""
    lines = []
    for family in families:
        lines.append(f"# HELP {family.name} {_escape_help(family.help)}")
        lines.append(f"# TYPE {family.name} {family.kind}")
        for labels, value in family.samples:
            lines.append(f"{family.name}{_labels(labels)} {_value(value)}")
    return "\n".join(lines) + "\n"


def _labels(labels: dict[str, str]) -> str:
    if not labels:
        return ""
    return "{" + ",".join(f'{k}="{_escape_label(str(v))}"' for k, v in labels.items()) + "}"


def _escape_help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def _escape_label(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _value(value: float) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, int):
        return str(value)
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value))
