"""Every place resourced starts a program, reviewed for options that data could smuggle in.

A command line built from data someone else controls (a Slurm job's name, a label, a
path) must end its options with ``--`` or carry the value where it cannot be read as
one: a job named ``--version`` once made root's busctl print its version instead of
claiming the job's GPUs. This walk finds every call that starts a program; a new one
fails here until it is reviewed and its reason written below.
"""

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "resourced"
STARTERS = {("subprocess", "run"), ("subprocess", "Popen"), ("subprocess", "check_output"),
            ("subprocess", "call"), ("os", "execvpe"), ("os", "execvp"), ("os", "execv"),
            ("os", "posix_spawnp"), ("os", "posix_spawn"), ("os", "system"),
            ("asyncio", "create_subprocess_exec"), ("asyncio", "create_subprocess_shell")}
HELPERS = {"_spawn"}  # slurm/hooks.py's posix_spawn, whose callers build the command lines

REVIEWED = {
    ("slurm/hooks.py", "_call"): "busctl's options end with -- before the call and the "
                                 "job's arguments (its name is the user's)",
    ("slurm/hooks.py", "_spawn"): "runs what _call and _ask_job_name build",
    ("slurm/hooks.py", "_ask_job_name"): "scontrol show job -o JOB: the id slurmd sets, digits",
    ("notify/service.py", "spawn_detached"): "a terminal running gpuctl with fixed "
                                             "arguments (a bubble's action)",
    ("runner/service.py", "start"): "the booking's own command, as its owner typed it, "
                                    "run as that owner",
    ("runner/jobs.py", "_exec_command"): "the same command, exec'd by its shim",
    ("daemon/shared_bus.py", "start"): "dbus-daemon with a configuration file of ours",
    ("linux/privatebus.py", "start"): "dbus-daemon with a configuration file of ours",
    ("cli/service.py", "_run"): "systemctl and the installer's commands: unit names and "
                                "paths of the installation, chosen by the administrator",
    ("supervision/launch.py", "_exec_when_told"): "the user's own command, exec'd in place "
                                                  "of gpuctl",
    ("cli/demo.py", "start_daemon"): "the demo's own daemon",
    ("cli/demo.py", "gpuctl"): "gpuctl with the demo's fixed arguments",
    ("cli/demo.py", "spawn"): "gpuctl with the demo's fixed arguments",
    ("cli/demo.py", "shell"): "the user's $SHELL, no arguments",
    ("client/doctor.py", "_unit_state"): "systemctl is-active UNIT: our unit's name",
}


def starters() -> set[tuple[str, str]]:
    """(file, innermost enclosing function) of every call that starts a program."""
    found = set()

    class Walk(ast.NodeVisitor):
        def __init__(self, where: str):
            self.where, self.functions = where, []

        def visit_FunctionDef(self, node):
            self.functions.append(node.name)
            self.generic_visit(node)
            self.functions.pop()

        visit_AsyncFunctionDef = visit_FunctionDef

        def visit_Call(self, node):
            func = node.func
            if ((isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name)
                    and (func.value.id, func.attr) in STARTERS)
                    or (isinstance(func, ast.Name) and func.id in HELPERS)):
                found.add((self.where, self.functions[-1] if self.functions else "<module>"))
            self.generic_visit(node)

    for path in PACKAGE.rglob("*.py"):
        Walk(path.relative_to(PACKAGE).as_posix()).visit(ast.parse(path.read_text(), str(path)))
    return found


def test_every_place_that_starts_a_program_was_reviewed():
    found = starters()
    assert not found - REVIEWED.keys(), (
        f"new places start a program; review each for options that data could carry "
        f"(end them with --) and add it to REVIEWED: {sorted(found - REVIEWED.keys())}")
    assert not REVIEWED.keys() - found, f"reviewed, gone: {sorted(REVIEWED.keys() - found)}"

