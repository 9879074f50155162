"""The pure core and the protocol load nothing beyond the standard library and resourced."""

import json
import subprocess
import sys

import pytest

from ..conftest import ROOT

FORBIDDEN = ("dbus_fast", "jeepney", "psutil", "pynvml", "click", "asyncio")

PROBE = """
import json, sys
before = set(sys.modules)
import {module}
print(json.dumps(sorted(set(sys.modules) - before)))
print(json.dumps(sorted(sys.modules)))
"""


CORE = sorted(f"resourced.core.{p.stem}" for p in (ROOT / "resourced" / "core").glob("*.py")
              if p.stem != "__init__")
PROTOCOL = sorted(f"resourced.protocol.{p.stem}"
                  for p in (ROOT / "resourced" / "protocol").glob("*.py") if p.stem != "__init__")


def test_every_core_module_is_probed():
    assert {"resourced.core.ledger", "resourced.core.health"} <= set(CORE)


@pytest.mark.parametrize("module", [*CORE, *PROTOCOL, "resourced.errors"])
def test_core_imports_only_the_standard_library(module):
    done = subprocess.run([sys.executable, "-c", PROBE.format(module=module)],
                          capture_output=True, text=True, timeout=30, check=True)
    new_lines, all_lines = done.stdout.splitlines()[-2:]
    new, loaded = json.loads(new_lines), json.loads(all_lines)

    assert module in new
    foreign = [m for m in new if m.split(".")[0] not in sys.stdlib_module_names | {"resourced"}]
    assert foreign == []
    assert [m for m in loaded if m.split(".")[0] in FORBIDDEN] == []
