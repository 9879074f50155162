"""The systemd tier: resourced under a real systemd, installed and run exactly as an
administrator would (README, "System-wide install"), through the real tools: ``systemctl show``,
``journalctl -o json``, ``busctl``, ``systemd-analyze``, ``loginctl``.

One set-up for the directory (a package-scoped fixture, see ``harness.py``): a venv under
``/opt/resourced-test-<pid>`` with this tree installed (non-editable), then systemd 252
booted as PID 1 of its own namespaces on a throw-away overlay of ``/`` (about 0.5 s), and
inside it: the access group and test users, ``gpuctl init --system`` on simulated GPUs,
a drop-in that gives the service the same simulated GPUs, and ``gpuctl service enable
--system``. The tests then drive the service with systemctl, read the journal, call it
over the system bus, and run clients as the test users.

Teardown powers the namespace off and removes the cgroups and the directory, then fails
the run if anything is left (a process, a cgroup, a mount, the directory). SIGTERM ends
the run through the teardown. A run killed with SIGKILL takes the namespace with it
(its unshare runs under ``setpriv --pdeathsig KILL``, with ``--kill-child``); the empty
cgroup and the directory it leaves are removed by the next run, from the journal in the
directory (``Namespace.recover_stale``). Runs on one machine may overlap: each has its
own directory, cgroup and namespaces, and the accounts inside have uids no host account
uses.

It needs root, systemd, util-linux, polkitd and Debian's python3-venv
(``scripts/system-deps.sh``); without them the directory skips itself, unless
RESOURCED_TESTS_REQUIRE_SYSTEM=1 (set by .ci/run) makes that a failure.
"""

import os
import time

import pytest

from .harness import (
    UNIT,
    USERS,
    Namespace,
    NamespaceError,
    boot_with_resourced,
    missing_prerequisites,
    sigterm_interrupts,
)

REQUIRED = os.environ.get("RESOURCED_TESTS_REQUIRE_SYSTEM") == "1"
"""Read at import, before the suite's autouse fixture clears RESOURCED_* variables."""

# Where `service enable --system` writes (resourced/linux/install.py), snapshotted before it and
# compared after `service disable --system`: all of /etc, and the two /usr/share places.
SNAPSHOT_PATHS = ("/etc", "/usr/share/dbus-1", "/usr/share/polkit-1")
ENABLE_STAMP = "/run/sdt-before-enable"
# What systemd-sysusers changes for the account (which `service disable` leaves, as the
# README says); kept whole before enable, to check that the account is all that changed.
ACCOUNT_FILES = ("/etc/passwd", "/etc/group", "/etc/shadow", "/etc/gshadow")

TIMINGS: dict[str, float] = {}
FIGURES: dict[str, str] = {}
NOTES: list[str] = []


class Rig:
    """The booted namespace plus what the set-up recorded for the tests."""

    def __init__(self, ns: Namespace):
        self.ns = ns
        self.before_enable: dict[str, str] = {}
        self.accounts_before: dict[str, str] = {}
        self.enable_output = ""

    def login(self, key: str) -> str:
        return USERS[key][0]

    def uid(self, key: str) -> int:
        return self.ns.ids[self.login(key)]

    def owner(self, key: str | None, name: str) -> int:
        """A long-lived process of ``key`` (None: root) inside, in a unit of its own; its
        pid (as the namespace sees it). Type=exec: it runs as that user once this returns."""
        argv = ["systemd-run", f"--unit={name}", "--collect", "--property=Type=exec"]
        if key is not None:
            argv.append(f"--uid={self.login(key)}")
        self.ns.run(*argv, "sleep", "infinity")
        return int(self.ns.show(f"{name}.service", "MainPID")["MainPID"])

    def claim(self, key: str | None, owner_pid: int, *args: str) -> str:
        user = self.login(key) if key else None
        return self.ns.gpuctl("claim", "--owner-pid", str(owner_pid), *args,
                              user=user).stdout.strip()

    def ensure_running(self) -> None:
        """Active, with systemd's start rate limit (5 starts in 10 s) counted afresh: the
        tests start and stop the unit far more often than a machine does."""
        self.ns.systemctl("reset-failed", UNIT)
        if self.ns.show(UNIT, "ActiveState")["ActiveState"] != "active":
            self.ns.systemctl("start", UNIT)

    def release_all(self) -> None:
        for ref in self.ns.claims():
            self.ns.gpuctl("release", "--allocation", ref, "--force")


@pytest.fixture(scope="package")
def rig():
    """The booted namespace with resourced enabled and running (module doc)."""
    reason = missing_prerequisites()
    if reason and REQUIRED:
        pytest.fail(f"{reason}; RESOURCED_TESTS_REQUIRE_SYSTEM=1 says they must run")
    if reason:
        pytest.skip(reason)
    with sigterm_interrupts():
        t0 = time.monotonic()
        undone = Namespace.recover_stale()
        if undone:
            print(f"removed what killed runs left: {', '.join(undone)}")
        ns = Namespace()
        r = Rig(ns)
        try:
            boot_with_resourced(ns)
            t = time.monotonic()
            ns.run("touch", ENABLE_STAMP)
            r.before_enable = ns.snapshot(*SNAPSHOT_PATHS)
            r.accounts_before = {f: ns.run("cat", f).stdout for f in ACCOUNT_FILES}
            done = ns.enable()
            r.enable_output = done.stdout + done.stderr
            ns.timings["service enable"] = time.monotonic() - t
            if ns.show(UNIT, "ActiveState")["ActiveState"] != "active":
                raise NamespaceError(f"{UNIT} is not active after enable:\n{r.enable_output}\n"
                                     + ns.run("journalctl", "-u", UNIT, "--no-pager").stdout)
            ns.timings["set-up in all"] = time.monotonic() - t0
            yield r
        finally:
            t = time.monotonic()
            problems = ns.stop()
            ns.timings["teardown"] = time.monotonic() - t
            TIMINGS.update(ns.timings)
            NOTES.extend(ns.notes)
            if problems:
                raise AssertionError("the systemd tests left things behind:\n  "
                                     + "\n  ".join(problems))


@pytest.fixture
def service(rig, request):
    """The service active at the start of the test, with no claims; owners made with
    ``rig.owner`` are stopped and every claim released at its end. On failure, the
    unit's journal is printed."""
    rig.ensure_running()
    rig.release_all()
    yield rig
    if getattr(request.node, "rep_call", None) is not None and request.node.rep_call.failed:
        print("--- journalctl -u resourced.service (last 60) ---")
        shown = rig.ns.run("journalctl", "-u", UNIT, "-n", "60", "--no-pager", check=False)
        print(shown.stdout + shown.stderr)
    rig.ensure_running()
    rig.release_all()


@pytest.fixture
def owner(service, request):
    """``owner(key)``: a long-lived process of that user (None: root); stopped after."""
    names: list[str] = []

    def make(key: str | None = None) -> int:
        name = f"sdt-owner-{len(names)}-{time.monotonic_ns()}"
        names.append(name)
        return service.owner(key, name)

    yield make
    for name in names:
        service.ns.systemctl("stop", f"{name}.service", check=False)


def pytest_terminal_summary(terminalreporter):
    if TIMINGS:
        parts = ", ".join(f"{k} {v:.1f} s" for k, v in TIMINGS.items())
        terminalreporter.write_line(f"tests/systemd set-up: {parts}")
    for key, value in FIGURES.items():
        terminalreporter.write_line(f"tests/systemd: {key}: {value}")
    for note in NOTES:
        terminalreporter.write_line(f"tests/systemd teardown: {note}")

