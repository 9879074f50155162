"""The generated reference (docs/reference/) and man pages (docs/man/) say what the code does:
the files in the tree are what ``python -m resourced.docs`` makes now, they name every
gpuctl command and option, every configuration key, every exit code, every bus member and
every RESOURCED_* variable, and the man pages are roff that groff reads without a warning.

The names are found here independently of the generator (the click tree, the config
checker's tables, the XML, the source), so a generator that skipped one would be caught.
"""

import re
import shutil
import subprocess
import xml.etree.ElementTree as ET
from pathlib import Path

import click
import pytest

from resourced import config, exits
from resourced.docs.build import generate
from resourced.docs.names import MAN, REFERENCE, REGENERATE

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def generated() -> dict[Path, str]:
    return generate()


def test_the_committed_reference_and_man_pages_are_up_to_date(generated):
    stale = [str(path) for path, text in generated.items()
             if not (ROOT / path).is_file() or (ROOT / path).read_text(encoding="utf-8") != text]
    extra = [str(p.relative_to(ROOT)) for d in {ROOT / path.parent for path in generated}
             if d.is_dir() for p in d.iterdir() if p.relative_to(ROOT) not in generated]
    assert not stale and not extra, (
        f"the generated docs are out of date with the code ({', '.join(stale)}"
        f"{'; not generated any more: ' + ', '.join(extra) if extra else ''}): "
        f"regenerate them with {REGENERATE}, and commit them")


def _sections(page: str) -> dict[str, str]:
    """A Markdown page's ``## `` sections by title."""
    parts = re.split(r"^## (.+)$", page, flags=re.M)
    return dict(zip(parts[1::2], parts[2::2]))


def _man(generated, name: str, section: str) -> str:
    return generated[MAN / f"man{section}" / f"{name}.{section}"]


def _roff(name: str) -> str:
    return name.replace("-", "\\-")


def test_every_gpuctl_command_and_option_is_in_the_reference(generated):
    from resourced.cli import cli

    sections = _sections(generated[REFERENCE / "gpuctl.md"])
    manual = _man(generated, "gpuctl", "1")
    seen = 0

    def walk(command, ctx, path):
        nonlocal seen
        name = " ".join(path)
        assert name in sections, f"{name} is not in {REFERENCE / 'gpuctl.md'}"
        if len(path) > 1:
            assert f'.SS "{_roff(" ".join(path[1:]))}"' in manual, f"{name} is not in gpuctl(1)"
        for param in command.get_params(ctx):
            if isinstance(param, click.Option) and not param.hidden:
                for option in (*param.opts, *param.secondary_opts):
                    assert f"`{option}`" in sections[name], f"{name} {option} is not documented"
                    assert f"\\fB{_roff(option)}\\fR" in manual, f"{name} {option}: not in man"
                    seen += 1
        if isinstance(command, click.Group):
            for sub in command.list_commands(ctx):
                child = command.get_command(ctx, sub)
                if not child.hidden:
                    walk(child, click.Context(child, info_name=sub, parent=ctx), (*path, sub))

    walk(cli, click.Context(cli, info_name="gpuctl"), ("gpuctl",))
    assert seen > 100


def test_every_configuration_key_is_in_the_reference_and_resourced_conf(generated):
    sections = _sections(generated[REFERENCE / "configuration.md"])
    manual = _man(generated, "resourced.conf", "5")
    tables = {f"[{name}]": getattr(config, f"_{name.upper()}") for name in config._TABLES}
    tables |= {f"[[{name}]]": schema for name, schema in config._ARRAYS.items()}
    for title, schema in tables.items():
        assert title in sections, f"{title} is not in the reference"
        assert f'.SH "{title}"' in manual, f"{title} is not in resourced.conf(5)"
        for key in schema:
            assert f"| `{key}` |" in sections[title], f"{title} {key} is not in the reference"
            assert f"\\fB{_roff(key)}\\fR" in manual, f"{title} {key}: not in resourced.conf(5)"


def test_every_exit_code_is_in_the_reference_and_gpuctl_1(generated):
    page = generated[REFERENCE / "exit-codes.md"]
    manual = _man(generated, "gpuctl", "1")
    for name, code in vars(exits).items():
        if name.startswith("EXIT_") and isinstance(code, int):
            assert f"| {code} | " in page and f"`{name}`" in page, name
            assert f".TP\n\\fB{code}\\fR\n" in manual, f"{name} is not in gpuctl(1)"


def test_every_bus_member_is_in_the_reference(generated):
    page = generated[REFERENCE / "dbus.md"]
    manual = _man(generated, "resourced", "8")
    sections = _sections(page)
    root = ET.parse(ROOT / "dbus" / "org.resourced.xml").getroot()
    members = 0
    for interface in root.iter("interface"):
        name = interface.get("name")
        assert name in sections and f"\\fB{_roff(name)}\\fR" in manual, name
        short = name.rsplit(".", 1)[-1]
        for member in interface:
            if member.tag in ("method", "signal"):
                assert f"#### {short}.{member.get('name')}\n" in sections[name], \
                    f"{name}.{member.get('name')} is not in the reference"
                types = ", ".join(f"{a.get('type')} {a.get('name')}" for a in member
                                  if a.tag == "arg" and a.get("direction", "in") == "in")
                assert f"{member.get('name')}({types})" in sections[name]
            elif member.tag == "property":
                assert f"| `{member.get('name')}` | `{member.get('type')}` |" in sections[name]
            else:
                continue
            members += 1
    assert members > 90


def test_every_resourced_variable_in_the_code_is_in_the_reference(generated):
    page = generated[REFERENCE / "environment.md"]
    literal = re.compile(r"""["'](RESOURCED_[A-Z0-9_]+)["']""")  # a name alone in quotes
    names = {name for path in (ROOT / "resourced").rglob("*.py")
             for name in literal.findall(path.read_text(encoding="utf-8"))}
    assert len(names) > 10
    missing = sorted(n for n in names if f"`{n}`" not in page)
    assert not missing, (f"{', '.join(missing)}: not in {REFERENCE / 'environment.md'}; say what "
                         "each means in resourced/docs/facts.py (CLIENTS), then "
                         f"{REGENERATE}")


def test_the_man_pages_are_roff_that_groff_reads_without_a_warning(generated, tmp_path):
    pages = {path: text for path, text in generated.items() if path.is_relative_to(MAN)}
    assert {p.name for p in pages} == {"gpuctl.1", "resourced-mcp.1", "resourced.conf.5",
                                      "resourced.8"}
    for path, text in pages.items():
        assert text.startswith(f'.TH "{_roff(path.stem.upper())}" "{path.suffix[1:]}" ')
        assert all(ord(c) < 127 for c in text), f"{path}: write non-ASCII as a groff escape"
        assert "\n\n" not in text and " \n" not in text, f"{path}: a blank line or trailing space"
    groff = shutil.which("groff")
    if groff is None:
        pytest.skip("groff is not installed: the pages were not rendered")
    for path, text in pages.items():
        source = tmp_path / path.name
        source.write_text(text, encoding="ascii")
        done = subprocess.run([groff, "-man", "-Tutf8", "-ww", "-z", str(source)],
                              capture_output=True, text=True, timeout=30)
        assert done.returncode == 0 and done.stderr == "", f"{path}: {done.stderr}"
