"""Tests wait on events or the clock they are given, not on fixed sleeps.

A fixed sleep is a call of ``time.sleep``, ``asyncio.sleep`` or a bare ``sleep`` with a
constant of ``LONG`` seconds or more: a poll's short interval is not one.  The few that
must stay prove that nothing happens within a while; each says why in a comment on its
line or the line before.  Scripts the tests run as processes are text, not looked at:
their sleeps keep a process alive, they do not hold the test.
"""

import ast
import io
import tokenize
from pathlib import Path

TESTS = Path(__file__).resolve().parent.parent
LONG = 0.1
"""Seconds from which a constant sleep is a fixed wait."""
MOST = 10
"""Fixed sleeps the tests may keep."""


def fixed_sleeps(root: Path) -> list[tuple[str, int, float, bool]]:
    """Every fixed sleep under ``root``: (file, line, seconds, has a reason)."""
    found = []
    for path in sorted(root.rglob("*.py")):
        text = path.read_text()
        comments = {tok.start[0] for tok in tokenize.generate_tokens(io.StringIO(text).readline)
                    if tok.type == tokenize.COMMENT}
        for node in ast.walk(ast.parse(text)):
            if not (isinstance(node, ast.Call) and _is_sleep(node.func) and node.args):
                continue
            seconds = node.args[0]
            if (isinstance(seconds, ast.Constant) and type(seconds.value) in (int, float)
                    and seconds.value >= LONG):
                reason = bool(comments & {node.lineno, node.lineno - 1})
                found.append((str(path.relative_to(root)), node.lineno, seconds.value, reason))
    return found


def _is_sleep(func: ast.expr) -> bool:
    if isinstance(func, ast.Name):
        return func.id == "sleep"
    return (isinstance(func, ast.Attribute) and func.attr == "sleep"
            and isinstance(func.value, ast.Name) and func.value.id in ("time", "asyncio"))


def test_at_most_a_few_fixed_sleeps_remain_and_each_says_why():
    sleeps = fixed_sleeps(TESTS)
    shown = "\n".join(f"{f}:{line}: sleep({s:g})" + ("" if why else "  (no reason given)")
                      for f, line, s, why in sleeps)
    assert len(sleeps) <= MOST, f"{len(sleeps)} fixed sleeps, at most {MOST}:\n{shown}"
    assert all(why for *_, why in sleeps), f"a fixed sleep without its reason:\n{shown}"


def test_a_fixed_sleep_is_found_and_a_poll_is_not(tmp_path):
    (tmp_path / "test_x.py").write_text(
        "import asyncio, time\n"
        "def test_it(procs):\n"
        "    time.sleep(0.5)\n"
        "    # proves nothing comes\n"
        "    asyncio.sleep(1)\n"
        "    time.sleep(0.02)\n"
        "    procs.sleep(60)\n"
        "    time.sleep(interval)\n")
    assert fixed_sleeps(tmp_path) == [("test_x.py", 3, 0.5, False), ("test_x.py", 5, 1, True)]
