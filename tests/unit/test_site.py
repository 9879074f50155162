"""docs/ builds as a static site (mkdocs.yml) in MkDocs' strict mode, where every warning
fails: a broken link or anchor, or a page left out of the nav. Without mkdocs (the docs
extra) it is skipped, unless RESOURCED_TESTS_REQUIRE_SYSTEM=1 (CI) says it must run."""

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
LINK = re.compile(r"\]\(([^)\s#]+)(?:#[^)]*)?\)")
# Read at import: tests/conftest.py hides every RESOURCED_ variable from the tests.
REQUIRED = os.environ.get("RESOURCED_TESTS_REQUIRE_SYSTEM") == "1"


@pytest.fixture(autouse=True)
def _mkdocs():
    if importlib.util.find_spec("mkdocs") is None:
        reason = "mkdocs is not installed (the docs extra: pip install -e '.[docs]')"
        if not REQUIRED:
            pytest.skip(reason)
        pytest.fail(f"{reason}; RESOURCED_TESTS_REQUIRE_SYSTEM=1 says it must run")


def _nav_pages(entries) -> list[str]:
    pages = []
    for entry in entries:
        if isinstance(entry, str):
            pages.append(entry)
        elif isinstance(entry, dict):
            for value in entry.values():
                pages += _nav_pages(value) if isinstance(value, list) else [value]
    return pages


def _nav() -> list[str]:
    import yaml  # (mkdocs's own dependency)

    return _nav_pages(yaml.safe_load((ROOT / "mkdocs.yml").read_text())["nav"])


def test_the_site_builds_in_strict_mode(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict",
         "--config-file", str(ROOT / "mkdocs.yml"), "--site-dir", str(tmp_path / "site")],
        capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, f"mkdocs build --strict failed:\n{done.stdout}{done.stderr}"
    assert (tmp_path / "site" / "index.html").is_file()


def test_the_nav_holds_every_page_but_the_man_pages_once():
    nav = _nav()
    written = sorted(str(p.relative_to(DOCS)) for p in DOCS.rglob("*.md")
                     if p.relative_to(DOCS).parts[0] != "man")
    assert sorted(set(nav)) == written, "pages of docs/ not in mkdocs.yml's nav, or not in docs/"
    assert len(nav) == len(set(nav)), "a page twice in the nav"


def test_the_nav_follows_the_index():
    """The nav's order is docs/index.md's, which links each page but the reference's."""
    linked = [str((DOCS / target).resolve().relative_to(DOCS))
              for target in LINK.findall((DOCS / "index.md").read_text())]
    nav = _nav()
    assert nav[0] == "index.md"
    assert [page for page in nav if page in linked] == linked
