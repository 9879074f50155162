"""The system service's life under systemd: start (READY=1), status, directories, restart,
reload, stop, bus activation and the watchdog; each seen through systemctl, journalctl
and busctl, as an administrator sees it."""

import json
import os
import re
import signal
import time
from pathlib import Path

from .conftest import FIGURES
from .harness import BUS_NAME, CONFIG, DROPIN_DIR, MANAGER, NGPUS, UNIT

SERVICE_OBJECT = "/org/freedesktop/systemd1/unit/resourced_2eservice"


def _now_usec() -> int:
    """CLOCK_MONOTONIC, which the namespace shares (there is no time namespace)."""
    return time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000


def _active(ns) -> bool:
    return ns.show(UNIT, "ActiveState")["ActiveState"] == "active"


def _invocation(ns) -> str:
    return ns.show(UNIT, "InvocationID")["InvocationID"]


def _daemon_lines(ns, invocation: str) -> list[str]:
    return [e.get("MESSAGE", "") for e in ns.journal(f"_SYSTEMD_INVOCATION_ID={invocation}")]


def _unit_messages(ns, invocation: str) -> list[dict]:
    """What systemd itself logged about that run of the unit."""
    return ns.journal(f"UNIT={UNIT}", f"INVOCATION_ID={invocation}")


def test_start_reaches_active_only_after_the_daemons_ready(service):
    """Type=notify: while the daemon has not sent READY=1 the unit stays activating, even
    with its process running; it turns active only after READY=1, which comes from the
    daemon's own pid with its STATUS=."""
    ns = service.ns
    ns.systemctl("stop", UNIT)
    assert not ns.name_owned()
    ns.systemctl("log-level", "debug")  # systemd logs each notification it gets
    host_pid = None
    try:
        for _ in range(3):
            ns.systemctl("start", "--no-block", UNIT)
            pid = ns.wait_for(lambda: int(ns.show(UNIT, "MainPID")["MainPID"]), 20,
                              "the daemon's process", interval=0.01)
            host_pid = ns.wait_for(lambda p=pid: ns.host_pid(p), 5, "its host pid",
                                   interval=0.01)
            os.kill(host_pid, signal.SIGSTOP)
            if ns.show(UNIT, "ActiveState")["ActiveState"] == "activating":
                break
            os.kill(host_pid, signal.SIGCONT)  # READY came first: once more
            ns.systemctl("stop", UNIT)
            ns.systemctl("reset-failed", UNIT)
        else:
            raise AssertionError("the daemon was always ready before it could be held")
        time.sleep(1.5)  # proves it stays activating while the daemon cannot send READY
        held = ns.show(UNIT, "ActiveState", "SubState", "MainPID")
        assert (held["ActiveState"], held["SubState"]) == ("activating", "start"), held
        assert held["MainPID"] == str(pid)
        released = _now_usec()
        os.kill(host_pid, signal.SIGCONT)
        ns.wait_for(lambda: _active(ns), 30, "the unit active")
    finally:
        if host_pid is not None:  # never leave it stopped, whatever failed
            try:
                os.kill(host_pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
        ns.systemctl("log-level", "info")
    props = ns.show(UNIT, "ActiveEnterTimestampMonotonic", "StatusText", "ExecMainPID",
                    "Type", "NotifyAccess", "InvocationID")
    assert props["Type"] == "notify" and props["NotifyAccess"] == "main"
    assert int(props["ActiveEnterTimestampMonotonic"]) > released
    assert ns.name_owned()
    # systemd's own account: the notification with READY=1 came from the daemon's pid,
    # before the unit was declared started.
    def order():
        messages = _unit_messages(ns, props["InvocationID"])
        ready = [i for i, e in enumerate(messages) if re.search(
            rf"Got notification message from PID {pid} \(.*READY=1", e.get("MESSAGE", ""))]
        started = [i for i, e in enumerate(messages) if e.get("JOB_TYPE") == "start"
                   and e.get("JOB_RESULT") == "done"]
        return (ready[0], started[0]) if ready and started else None

    ready, started = ns.wait_for(order, 10, "systemd's notification and start messages")
    assert ready < started
    assert props["ExecMainPID"] == str(pid)


def test_status_main_pid_and_directories(service, owner):
    ns = service.ns
    props = ns.show(UNIT, "ActiveState", "SubState", "StatusText", "ExecMainPID", "MainPID",
                    "RuntimeDirectoryMode", "StateDirectoryMode", "InvocationID")
    assert (props["ActiveState"], props["SubState"]) == ("active", "running")
    assert props["StatusText"] == f"{NGPUS} GPU(s), {NGPUS} free, 0 claim(s)"
    ref = service.claim("alice", owner("alice"), "--gpus", "1")
    ns.wait_for(lambda: ns.show(UNIT, "StatusText")["StatusText"]
                == f"{NGPUS} GPU(s), {NGPUS - 1} free, 1 claim(s)", 10, "StatusText updated")

    # ExecMainPID is the daemon: our interpreter, run as the service account, and the
    # owner of the bus name.
    pid = props["ExecMainPID"]
    assert pid == props["MainPID"] != "0"
    cmdline = ns.run("cat", f"/proc/{pid}/cmdline").stdout.split("\0")
    assert cmdline[:6] == [str(ns.venv / "bin/python"), "-m", "resourced.daemon", "--system",
                           "--config", CONFIG], cmdline
    assert ns.run("stat", "-c", "%U", f"/proc/{pid}").stdout.strip() == "resourced"
    owner_pid = ns.run("busctl", "call", "org.freedesktop.DBus", "/org/freedesktop/DBus",
                       "org.freedesktop.DBus", "GetConnectionUnixProcessID", "s", BUS_NAME)
    assert owner_pid.stdout.split() == ["u", pid]

    # The account is the one sysusers made from resourced.sysusers (on the access group
    # created beforehand, whose gid it takes as uid too).
    account = ns.run("getent", "passwd", "resourced").stdout.strip().split(":")
    gid = str(ns.ids["resourced"])
    assert account[2:5] == [gid, gid, "resourced daemon"], account
    # The directories, with the unit's modes, the account's.
    assert props["RuntimeDirectoryMode"] == "0700" and props["StateDirectoryMode"] == "0700"
    for path in ("/run/resourced", "/var/lib/resourced"):
        assert ns.run("stat", "-c", "%a %U %G", path).stdout.split() == \
            ["700", "resourced", "resourced"], path
    # UMask=0077: what the daemon writes there is its own.
    files = ns.run("find", "/run/resourced", "/var/lib/resourced", "-type", "f",
                   "-printf", "%m %u\\n").stdout.splitlines()
    assert files and set(files) == {"600 resourced"}, files
    # No start had to repair a directory mode (systemd and the daemon agree on it).
    lines = ns.journal(f"_SYSTEMD_UNIT={UNIT}")
    assert not [e["MESSAGE"] for e in lines if "was mode" in e.get("MESSAGE", "")]
    # Its stderr lines and its native audit events go by one name. (What systemd's
    # child logs before it executes the daemon says "(python)": not the daemon's.)
    def mine():
        found = [e for e in ns.journal(f"_SYSTEMD_UNIT={UNIT}", f"_PID={pid}")
                 if not e.get("SYSLOG_IDENTIFIER", "").startswith("(")]
        return found if {e.get("_TRANSPORT") for e in found} >= {"stdout", "journal"} else None

    found = ns.wait_for(mine, 10, "the daemon's stderr lines and audit events")
    assert {e.get("SYSLOG_IDENTIFIER") for e in found} == {"resourced"}
    assert ref in ns.claims()


def test_restart_keeps_claims(service, owner):
    ns = service.ns
    alice = service.claim("alice", owner("alice"), "--gpus", "2", "--task-name", "train")
    root = service.claim(None, owner(), "--vram", "20G")
    before = ns.claims()
    props = ns.show(UNIT, "MainPID", "NRestarts")
    ns.systemctl("restart", UNIT)
    after_props = ns.show(UNIT, "MainPID", "NRestarts", "StatusText", "InvocationID")
    assert after_props["MainPID"] != props["MainPID"]
    assert after_props["NRestarts"] == props["NRestarts"]  # asked for, not a failure
    after = ns.claims()
    assert set(after) == {alice, root}
    for ref in (alice, root):
        for key in ("gpus", "uid", "user", "owner_pid", "vram_bytes", "task_name", "mode"):
            assert after[ref][key] == before[ref][key], (ref, key)
        assert after[ref]["owner_alive"]
    assert after_props["StatusText"].endswith("2 claim(s)")
    ns.wait_for(lambda: "restored 2 claim(s)" in _daemon_lines(ns, after_props["InvocationID"]),
                10, "the restore in the journal")


def _checks(ns) -> list[dict]:
    return json.loads(ns.gpuctl("resources", "--json").stdout)["checks"]


def test_reload_applies_a_changed_threshold(service):
    ns = service.ns
    original = ns.run("cat", CONFIG).stdout
    pid = ns.show(UNIT, "MainPID")["MainPID"]
    invocation = _invocation(ns)

    def reload_lines() -> list[str]:
        return [m for m in _daemon_lines(ns, invocation) if m.startswith("configuration reloaded")]

    earlier = len(reload_lines())  # an earlier test may have reloaded this daemon too

    def with_check(limit: float) -> str:
        return original + f'\n[[check]]\nname = "ram"\ntype = "ram"\nwarn_used_pct = {limit}\n'

    def limits():
        checks = _checks(ns)
        return checks[0]["limits"] if checks else None

    try:
        for limit in (99.5, 98.0):
            ns.write(CONFIG, with_check(limit))
            ns.systemctl("reload", UNIT)
            ns.wait_for(lambda lim=limit: limits() == {"warn_used_pct": lim}, 10,
                        f"the threshold {limit} in force")
        # A broken file is refused, and the running configuration kept.
        ns.write(CONFIG, original + "\n[daemon\n")
        ns.systemctl("reload", UNIT)
        refused = ns.wait_for(lambda: [
            e for e in ns.journal(f"_SYSTEMD_INVOCATION_ID={invocation}")
            if "reload refused" in e.get("MESSAGE", "")], 10, "the refusal")
        assert refused[-1]["PRIORITY"] == "3"  # an error
        assert limits() == {"warn_used_pct": 98.0}
    finally:
        ns.write(CONFIG, original)
        ns.systemctl("reload", UNIT)
        ns.wait_for(lambda: _checks(ns) == [], 10, "the original configuration back")
    props = ns.show(UNIT, "MainPID", "ActiveState", "SubState")
    assert (props["MainPID"], props["ActiveState"], props["SubState"]) == \
        (pid, "active", "running")  # reloaded in place

    def reloads():
        found = reload_lines()[earlier:]
        return found if len(found) >= 3 else None

    reloaded = ns.wait_for(reloads, 10, "the three reloads logged")
    assert "applied: check" in reloaded[0], reloaded


def test_reload_says_what_needs_a_restart(service):
    """A ``[[pool]]`` is fixed for the life of a daemon: the reload leaves the running pools
    and logs that the change waits for a restart; putting the file back needs none."""
    ns = service.ns
    original = ns.run("cat", CONFIG).stdout
    invocation = _invocation(ns)

    def reloads() -> list[dict]:
        return [e for e in ns.journal(f"_SYSTEMD_INVOCATION_ID={invocation}")
                if e.get("MESSAGE", "").startswith("configuration reloaded")]

    before = len(reloads())
    try:
        ns.write(CONFIG, original + '\n[[pool]]\nname = "sdt-licenses"\ncapacity = 2\n')
        ns.systemctl("reload", UNIT)
        pending = ns.wait_for(lambda: reloads()[before:], 10, "the reload logged")[0]
        assert pending["MESSAGE"].endswith("; applied: nothing; needs a restart: pool"), pending
        assert pending["PRIORITY"] == "6"  # info
        assert "sdt-licenses" not in {pool["name"] for pool in ns.status()["pools"]}
    finally:
        ns.write(CONFIG, original)
        ns.systemctl("reload", UNIT)
    back = ns.wait_for(lambda: reloads()[before + 1:], 10, "the reload back logged")[0]
    assert back["MESSAGE"].endswith("; applied: nothing; needs a restart: nothing"), back


def test_stop_ends_cleanly_within_timeout_stop_sec(service):
    """The daemon says STOPPING=1 (systemd's debug log shows the notification from its pid),
    and exits 0 on SIGTERM well within TimeoutStopSec, nothing left to kill."""
    ns = service.ns
    timeout_usec = int(ns.run("busctl", "get-property", "org.freedesktop.systemd1",
                              SERVICE_OBJECT, "org.freedesktop.systemd1.Service",
                              "TimeoutStopUSec").stdout.split()[1])
    invocation = _invocation(ns)
    pid = ns.show(UNIT, "MainPID")["MainPID"]
    ns.systemctl("log-level", "debug")  # systemd logs each notification it gets
    try:
        t = time.monotonic()
        ns.systemctl("stop", UNIT, timeout=timeout_usec / 1e6 + 30)
        took = time.monotonic() - t
    finally:
        ns.systemctl("log-level", "info")
    FIGURES["systemctl stop"] = f"{took:.2f} s (TimeoutStopSec {timeout_usec / 1e6:g} s)"
    props = ns.show(UNIT, "ActiveState", "Result", "ExecMainCode", "ExecMainStatus")
    assert props == {"ActiveState": "inactive", "Result": "success", "ExecMainCode": "1",
                     "ExecMainStatus": "0"}, props  # exited (CLD_EXITED), status 0
    assert took < min(timeout_usec / 1e6, 10)
    ns.wait_for(lambda: "resourced stopping" in _daemon_lines(ns, invocation), 10,
                "the daemon's last words")
    stopping = f"Got notification message from PID {pid} (STOPPING=1)"

    def told():
        messages = [e.get("MESSAGE", "") for e in _unit_messages(ns, invocation)]
        return messages if any(m.endswith(stopping) for m in messages) else None

    messages = ns.wait_for(told, 10, stopping)
    assert not [m for m in messages if "Killing" in m]
    assert not ns.name_owned()


def _activations(ns) -> int:
    """How often the system bus asked systemd to start the unit for a caller."""
    wanted = "Activating via systemd: service name='org.resourced' unit='resourced.service'"
    return len([e for e in ns.journal("_SYSTEMD_UNIT=dbus.service")
                if wanted in e.get("MESSAGE", "")])


def test_bus_activation_starts_the_service(service):
    """With the unit stopped, the first call starts it through systemd (the activation
    file's SystemdService=), and gets its answer: from gpuctl, and from busctl."""
    ns = service.ns
    before = _activations(ns)
    for how in ("gpuctl", "busctl"):
        ns.systemctl("stop", UNIT)
        ns.systemctl("reset-failed", UNIT)  # the start rate limit (see ensure_running)
        assert not ns.name_owned() and not _active(ns)
        t = time.monotonic()
        if how == "gpuctl":  # an outsider: reading needs no authorization
            answer = json.loads(ns.gpuctl("status", "--json", user=service.login("bob")).stdout)
            assert len(answer["gpus"]) == NGPUS
        else:
            cp = ns.run("busctl", "call", *MANAGER, "Describe", user=service.login("alice"))
            assert cp.stdout.startswith('s "{') and '\\"mode\\": \\"system\\"' in cp.stdout
        took = time.monotonic() - t
        FIGURES[f"bus activation to answer ({how})"] = f"{took:.2f} s"
        assert _active(ns)
        assert ns.name_owned()
    # Both through systemd (SystemdService=), not by dbus-daemon itself (Exec=/bin/false).
    ns.wait_for(lambda: _activations(ns) == before + 2, 10, "dbus-daemon's two activations")


def test_watchdog_kills_a_stalled_daemon_and_the_restart_keeps_claims(service, owner):
    ns = service.ns
    alice = service.claim("alice", owner("alice"), "--gpus", "1")
    root = service.claim(None, owner(), "--ram", "1G")
    before = ns.claims()
    dropin = f"{DROPIN_DIR}/60-sdt-watchdog.conf"
    # The daemon is killed with the unit's WatchdogSignal (SIGABRT), which dumps core:
    # none may reach the host. core_pattern is the host's; where it is a pipe, the kernel
    # runs the host's handler whatever the limit, so SIGKILL is used there instead.
    settings = "WatchdogSec=3s\nLimitCORE=0\n"
    if Path("/proc/sys/kernel/core_pattern").read_text().startswith("|"):
        settings += "WatchdogSignal=SIGKILL\n"
    ns.write(dropin, f"# tests/systemd: a short watchdog\n[Service]\n{settings}")
    held = None
    try:
        ns.systemctl("daemon-reload")
        ns.systemctl("restart", UNIT)
        props = ns.show(UNIT, "MainPID", "InvocationID", "NRestarts", "WatchdogUSec")
        assert props["WatchdogUSec"] == "3s"
        held = ns.host_pid(int(props["MainPID"]))
        os.kill(held, signal.SIGSTOP)  # its event loop stops: no more WATCHDOG=1
        t = time.monotonic()

        def restarted() -> bool:
            now = ns.show(UNIT, "MainPID", "ActiveState")
            return now["ActiveState"] == "active" and now["MainPID"] not in ("0", props["MainPID"])

        ns.wait_for(restarted, 30, "the daemon killed and started again")
        FIGURES["watchdog: SIGSTOP to active again"] = f"{time.monotonic() - t:.1f} s (3 s watchdog)"
        failed = ns.wait_for(lambda: [e for e in _unit_messages(ns, props["InvocationID"])
                                      if e.get("UNIT_RESULT")], 10, "systemd's verdict")
        assert failed[0]["UNIT_RESULT"] == "watchdog"
        assert any("Watchdog timeout" in e.get("MESSAGE", "")
                   for e in _unit_messages(ns, props["InvocationID"]))
        assert int(ns.show(UNIT, "NRestarts")["NRestarts"]) == int(props["NRestarts"]) + 1
        after = ns.claims()
        assert set(after) == {alice, root}
        for ref in (alice, root):
            assert after[ref]["gpus"] == before[ref]["gpus"]
            assert after[ref]["pools"] == before[ref]["pools"]
            assert after[ref]["owner_alive"]
    finally:
        if held is not None:
            try:
                os.kill(held, signal.SIGCONT)
            except ProcessLookupError:
                pass
        ns.run("rm", "-f", dropin)
        ns.systemctl("daemon-reload")
        ns.systemctl("restart", UNIT)
    assert ns.show(UNIT, "WatchdogUSec")["WatchdogUSec"] == "30s"
