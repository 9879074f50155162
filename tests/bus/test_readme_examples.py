"""The documentation's examples, typed as written in the demo's shell (`gpuctl demo --shell`).

Every shell line of the README and of the docs pages (``documentation()``: in the order
docs/index.md lists them) that talks to the daemon is typed, in that order,
into a bash started by ``gpuctl demo --shell``; every Python example runs there too. An
option renamed, a form the documentation shows and the parser refuses, or a traceback fails.
A refusal for capacity (exit 3) is an answer, not a failure: the earlier examples hold
GPUs; so is an exit code the line's own comment gives ("exit 6: no command"). Square
brackets mark options: each line is typed without them, and once more with those that
need no value of the reader's.
"""

import os
import re
import subprocess
import sys

from ..conftest import documentation

BOOKING, CLAIM = "b3x9k2q", "c4x9k2a"     # the documentation's sample references
STARTS = ("gpuctl ", "ref=$(gpuctl ", 'eval "$(gpuctl ', "busctl --user ", "resourced-mcp ",
          "export RESOURCED_SESSION=")
# Lines not typed, and why: they run until stopped (runner, notify, top, logs --follow, a
# Claim that waits its turn), set up a machine (service, init, connect, sudo), or belong to
# another shell (completion).
NOT_TYPED = ("gpuctl runner", "gpuctl notify", "gpuctl top", "gpuctl service ", "gpuctl init",
             "gpuctl connect", "_GPUCTL_COMPLETE", "gpuctl shell init", "ReplyWhenGranted")
# A block about isolation needs the system service (tests/system types it there); on the
# demo's session bus the documentation says it is refused.
NEEDS_SYSTEM = "--isolate"


def _sh_blocks(text: str) -> list[str]:
    return re.findall(r"^```sh\n(.*?)^```", text, re.S | re.M)


def _forms(line: str) -> list[str]:
    """The line without its [options], then with those that take no value of the reader's."""
    groups = re.findall(r"\s*\[([^\]]*)\]", line)
    base = re.sub(r"\s*\[[^\]]*\]", "", line)
    full = base
    for group in groups:
        if not re.search(r"(?<![\w-])[A-Z][A-Z_]*\b|\||\.\.\.|--follow", group):
            full += " " + group
    return [base] if full == base else [base, full]


def shell_examples(text: str) -> list[tuple[str, set[int]]]:
    """Each line to type, with the exit codes its comment gives beside 0 and 3."""
    out = []
    for block in _sh_blocks(text):
        if NEEDS_SYSTEM in block:
            continue
        for raw in block.replace("\\\n", " ").splitlines():
            line, _, comment = raw.partition("  #")
            line = line.strip()
            codes = {0, 3} | {int(c) for c in re.findall(r"\bexit (\d+)", comment)}
            if not line.startswith(STARTS) or any(n in line for n in NOT_TYPED):
                continue
            for form in _forms(line):
                if "..." in form or " | " in form:
                    continue
                out.append((form.replace(BOOKING, '"$booking"').replace(CLAIM, '"$claim"'),
                            codes))
    return out


def python_examples(text: str) -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", text, re.S | re.M)


# Runs each Python example with stand-ins for the reader's own functions and for torch.
PYTHON_RUNNER = r'''
import ast, asyncio, sys
from unittest import mock

sys.modules["torch"] = mock.MagicMock()


class Enough(Exception):
    """Ends the training example's loop after a few steps."""


def train_step(step):
    if step == 3:
        raise Enough


async def run_inference():
    return None


stubs = dict(run_whisper=lambda env: None, do_work=lambda: None, load_model=lambda: None,
             unload_model=lambda: None, run_inference=run_inference, train_step=train_step,
             save_checkpoint=lambda step: None)
for i, path in enumerate(sys.argv[1:]):
    ns = dict(stubs)
    code = compile(open(path).read(), path, "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
    result = eval(code, ns)
    if asyncio.iscoroutine(result):
        asyncio.run(result)
    if "train" in ns:
        try:
            asyncio.run(ns["train"]())
        except Enough:
            pass
    print(f"python example {i}: ok", flush=True)
'''


def test_the_readme_forms_are_found():
    """The parsing itself: what the walk types (a walk that found nothing would pass)."""
    codes = dict(shell_examples(documentation()))
    examples = list(codes)
    assert 'gpuctl release "$ref"' in examples
    assert codes['gpuctl logs "$booking"'] == {0, 3, 6}
    assert "gpuctl queue" in examples and "gpuctl queue --json" in examples
    assert 'gpuctl cancel "$booking"' in examples
    assert "gpuctl bookings --all --json" in examples
    assert not any("[" in e or "#" in e for e in examples)
    assert len(examples) > 50
    assert len(python_examples(documentation())) >= 5


def test_every_readme_example_works_in_the_demo_shell(tmp_path):
    text = documentation()
    for name in ("train.py", "smoke.py", "infer.py"):
        (tmp_path / name).write_text(
            "import os\nprint('on', os.environ.get('CUDA_VISIBLE_DEVICES'))\n")
    (tmp_path / "solve").write_text("#!/bin/sh\necho solved\n")
    (tmp_path / "solve").chmod(0o755)
    (tmp_path / "runner.py").write_text(PYTHON_RUNNER)
    blocks = []
    for i, block in enumerate(python_examples(text)):
        (tmp_path / f"example{i}.py").write_text(block)
        blocks.append(f"example{i}.py")

    examples = shell_examples(text)
    script = [
        "set +e",
        "exec 2>&1",
        f"cd {tmp_path}",
        # the sample references stand for a booking that has not started and a claim
        "booking=$(gpuctl book -G 1 -t 1h --at 'tomorrow 09:00' --json | python3 -c "
        "'import json,sys; print(json.load(sys.stdin)[\"booking\"][\"id\"])')",
        # the Python examples first, while the machine is free (acquire waits its turn)
        f"{sys.executable} runner.py {' '.join(blocks)}", "echo \"@@ python exit $?\"",
        "claim=$(gpuctl claim -G 1 --owner-pid $$)",
    ]
    for i, (example, _) in enumerate(examples):
        script += [f"echo '@@ {i} start'", example, f"echo \"@@ {i} exit $?\""]

    env = {**os.environ, "SHELL": "/bin/bash", "HOME": str(tmp_path),
           "PATH": os.pathsep.join([os.path.dirname(sys.executable), os.environ["PATH"]])}
    typed = tmp_path / "typed.sh"
    typed.write_text("\n".join(script) + "\n")
    try:
        with typed.open() as stdin:
            r = subprocess.run([sys.executable, "-m", "resourced.cli", "demo", "--shell"],
                               stdin=stdin, capture_output=True, text=True, timeout=180,
                               env=env, cwd=tmp_path)
    except subprocess.TimeoutExpired as exc:
        raise AssertionError(f"the walk hung after: {(exc.stdout or b'')[-2000:]!r}") from None
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-3000:]
    said = {int(i): (int(code), chunk) for i, chunk, code in re.findall(
        r"^@@ (\d+) start\n(.*?)^@@ \1 exit (\d+)$", r.stdout, re.S | re.M)}
    assert sorted(said) == list(range(len(examples))), r.stdout[-3000:]
    failed = []
    for i, (example, codes) in enumerate(examples):
        code, chunk = said[i]
        if code not in codes or "Traceback" in chunk:
            failed.append(f"exit {code}: {example}\n{chunk}")
    assert not failed, "\n".join(failed)
    python = r.stdout.split("@@ python exit")[0]
    assert re.search(r"^@@ python exit 0$", r.stdout, re.M) and "Traceback" not in python, python
    assert r.stdout.count("python example") == len(blocks)
    at = out.find("Traceback")
    assert at < 0, out[max(0, at - 1500):at + 2500]  # (what ran before it, and all of it)
