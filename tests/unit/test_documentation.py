"""The documentation holds together: docs/index.md reaches every page (the example walk
types them in its order), and no relative link is broken."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
LINK = re.compile(r"\]\(([^)\s#]+)(?:#[^)]*)?\)")


def _pages() -> list[Path]:
    return [ROOT / "README.md", *sorted(DOCS.rglob("*.md"))]


def test_the_index_links_every_page_but_the_generated_reference():
    linked = {(DOCS / target).resolve() for target in LINK.findall((DOCS / "index.md").read_text())}
    written = {p.resolve() for p in DOCS.rglob("*.md")
               if p.name != "index.md" and "reference" not in p.relative_to(DOCS).parts}
    assert written - linked == set(), "pages docs/index.md does not link"


def test_every_relative_link_leads_to_a_file():
    broken = [f"{page.relative_to(ROOT)}: {target}" for page in _pages()
              for target in LINK.findall(page.read_text())
              if "://" not in target and not (page.parent / target).exists()]
    assert not broken, "broken links:\n" + "\n".join(broken)


def test_the_readme_is_short_and_starts_with_what_to_type():
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= 200
    assert any(line.startswith("./dev demo") for line in lines[:20])
    install = next(i for i, line in enumerate(lines) if line == "## Install")
    assert install < 120 and "service enable --system" in "\n".join(lines[install:120])
