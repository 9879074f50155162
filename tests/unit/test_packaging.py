"""What the project says it supports is what CI tests: the Pythons of ``./dev``'s
test-pythons are those pyproject.toml admits, and the README names them."""

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _dev_list(name: str) -> list[str]:
    found = re.search(rf'^{name}="([^"]*)"$', (ROOT / "dev").read_text(), re.M)
    assert found, f"{name} not set in ./dev"
    return found.group(1).split()


def _admitted() -> list[str]:
    spec = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["requires-python"]
    low = re.search(r">=\s*3\.(\d+)", spec)
    high = re.search(r"<\s*3\.(\d+)", spec)
    assert low and high, f"requires-python {spec!r} has no lower and upper bound"
    return [f"3.{minor}" for minor in range(int(low.group(1)), int(high.group(1)))]


def test_ci_tests_every_python_that_pyproject_admits():
    assert _dev_list("SUPPORTED_PYTHONS") == _admitted()
    assert set(_dev_list("REQUIRED_PYTHONS")) <= set(_admitted())


def test_the_readme_names_the_supported_pythons():
    readme = (ROOT / "README.md").read_text()
    line = re.search(r"^Python: (.*)$", readme, re.M)
    assert line, "the README has no 'Python: ...' line"
    assert re.findall(r"3\.\d+", line.group(1)) == _admitted()
