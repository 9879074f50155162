"""The per-user service under a real ``systemd --user``: systemd-logind started as a unit,
lingering enabled for a test user (so ``user@UID.service`` runs her manager and her
session bus, dbus-user-session's ``dbus.socket``), then ``gpuctl service enable --user``
run by her, as README's single-user install says, and the notification agent that
enable writes, started as README says (``systemctl --user enable --now``)."""

import json
from pathlib import Path

import pytest

from .conftest import REQUIRED
from .harness import NGPUS

USER_UNIT = "resourced.service"
NOTIFY_UNIT = "resourced-notify.service"
USER_GPUS = 2  # not NGPUS: the answers must come from her daemon, not the system one
# The user manager needs logind (systemd) and a session bus for it (dbus-user-session).
NEEDS = {Path("/lib/systemd/systemd-logind"): "systemd",
         Path("/usr/lib/systemd/user/dbus.socket"): "dbus-user-session"}


def test_the_user_service_under_systemd_user(service, owner):
    missing = sorted({package for path, package in NEEDS.items() if not path.exists()})
    if missing:
        reason = f"the user service needs the Debian packages {', '.join(missing)}"
        if REQUIRED:
            pytest.fail(f"{reason}; RESOURCED_TESTS_REQUIRE_SYSTEM=1 says it must run")
        pytest.skip(reason)
    ns, login = service.ns, service.login("carol")
    uid = service.uid("carol")
    env = ns.user_session_env(login)
    home = f"/home/{login}"
    ns.systemctl("start", "systemd-logind.service")
    ns.run("loginctl", "enable-linger", login)
    try:
        ns.wait_for(lambda: ns.show(f"user@{uid}.service", "ActiveState")["ActiveState"]
                    == "active", 30, f"user@{uid}.service")

        def write(path: str, text: str) -> None:
            ns.run("sh", "-c", 'mkdir -p "$(dirname "$1")" && cat > "$1"', "sh", path,
                   user=login, env=env, input=text)

        write(f"{home}/.config/systemd/user/{USER_UNIT}.d/50-simulated-gpus.conf",
              f"[Service]\nEnvironment=RESOURCED_SIMULATED_GPUS={USER_GPUS}\n")
        # A check at WARN from the start: the agent has a bubble to show.
        write(f"{home}/.config/resourced/config.toml",
              '[[check]]\nname = "ram"\ntype = "ram"\nwarn_used_pct = 0.01\n')
        # No notification server, whatever the host has: her own activation file (read
        # first) names a unit that does not exist, so a call fails at once. (A server the
        # bus activates but that cannot start without a display, dunst say, is never
        # answered for: the agent waits out its 25 s call timeout, twice, then goes on.)
        no_server = f"{home}/.local/share/dbus-1/services/org.freedesktop.Notifications.service"
        write(no_server, "[D-BUS Service]\nName=org.freedesktop.Notifications\n"
                         "Exec=/bin/false\nSystemdService=sdt-no-notifications.service\n")
        enabled = ns.gpuctl("service", "enable", "--user", user=login, env=env, timeout=90)
        assert f"{USER_UNIT} is enabled and running" in enabled.stdout

        props = ns.show(USER_UNIT, "ActiveState", "SubState", "StatusText", "Type", "MainPID",
                        user_manager=login)
        assert (props["ActiveState"], props["SubState"], props["Type"]) == \
            ("active", "running", "notify"), props
        assert props["StatusText"] == f"{USER_GPUS} GPU(s), {USER_GPUS} free, 0 claim(s)"
        status = json.loads(ns.gpuctl("status", "--json", user=login, env=env).stdout)
        assert len(status["gpus"]) == USER_GPUS != NGPUS

        ref = ns.gpuctl("claim", "--gpus", "1", "--owner-pid", str(owner("carol")),
                        user=login, env=env).stdout.strip()
        # The predecessor's README line, as its users type it (the unit has its name).
        ns.run("systemctl", "--user", "restart", "resourced", user=login, env=env)
        after = ns.show(USER_UNIT, "MainPID", "StatusText", user_manager=login)
        assert after["MainPID"] != props["MainPID"]
        status = json.loads(ns.gpuctl("status", "--json", user=login, env=env).stdout)
        assert [c["id"] for c in status["claims"]] == [ref]
        assert after["StatusText"].endswith("1 claim(s)")
        # Its audit lines are in the journal too, under the user unit (what
        # `journalctl --user -u resourced` matches).
        granted = ns.wait_for(lambda: ns.journal(f"RESOURCED_CLAIM={ref}"), 10, "the journal")
        assert granted[0]["_SYSTEMD_USER_UNIT"] == USER_UNIT
        assert granted[0]["_UID"] == str(uid)
        # No start had to repair its state directory's mode (StateDirectoryMode=).
        lines = ns.journal(f"_SYSTEMD_USER_UNIT={USER_UNIT}", f"_UID={uid}")
        assert lines and not [e["MESSAGE"] for e in lines if "was mode" in e.get("MESSAGE", "")]

        # The agent: a user unit that follows her daemon on her session bus; without a
        # notification server it says so and waits, active, for one to appear.
        ns.run("systemctl", "--user", "enable", "--now", NOTIFY_UNIT, user=login, env=env)

        def agent_said(text: str):
            found = [e.get("MESSAGE", "") for e in ns.journal(
                f"_SYSTEMD_USER_UNIT={NOTIFY_UNIT}", f"_UID={uid}")]
            return found if any(text in m for m in found) else None

        ns.wait_for(lambda: agent_said("watching org.resourced on the session bus (running)"),
                    10, "the agent watching her daemon")
        said = ns.wait_for(lambda: agent_said("cannot show "), 10, "its attempt at a bubble")
        agent = ns.show(NOTIFY_UNIT, "ActiveState", "SubState", "NRestarts", user_manager=login)
        assert (agent["ActiveState"], agent["SubState"], agent["NRestarts"]) == \
            ("active", "running", "0"), (agent, said)
        ns.run("rm", no_server, user=login)

        disabled = ns.gpuctl("service", "disable", "--user", user=login, env=env, timeout=90)
        removed = [line for line in disabled.stdout.splitlines() if line.startswith("removed ")
                   and not line.endswith("/ (empty)")]
        assert len(removed) == 8, disabled.stdout  # the units, the activation file, the pages
        for unit in (USER_UNIT, NOTIFY_UNIT):
            assert ns.show(unit, "ActiveState", user_manager=login)["ActiveState"] == "inactive"
    finally:
        ns.run("loginctl", "disable-linger", login, check=False)
        ns.systemctl("stop", f"user@{uid}.service", check=False)
