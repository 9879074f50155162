"""The per-user service under a real ``systemd --user``: systemd-logind started as a unit,
lingering enabled for a test user (so ``user@UID.service`` runs her manager and her
session bus, dbus-user-session's ``dbus.socket``), then ``gpuctl service enable --user``
run by her, as README's single-user install says."""

import json
from pathlib import Path

import pytest

from .conftest import REQUIRED
from .harness import NGPUS

USER_UNIT = "resourced-user.service"
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
        ns.run("sh", "-c", 'mkdir -p "$(dirname "$1")" && cat > "$1"', "sh",
               f"{home}/.config/systemd/user/{USER_UNIT}.d/50-simulated-gpus.conf",
               user=login, env=env,
               input=f"[Service]\nEnvironment=RESOURCED_SIMULATED_GPUS={USER_GPUS}\n")
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
        ns.run("systemctl", "--user", "restart", USER_UNIT, user=login, env=env)
        after = ns.show(USER_UNIT, "MainPID", "StatusText", user_manager=login)
        assert after["MainPID"] != props["MainPID"]
        status = json.loads(ns.gpuctl("status", "--json", user=login, env=env).stdout)
        assert [c["id"] for c in status["claims"]] == [ref]
        assert after["StatusText"].endswith("1 claim(s)")
        # Its audit lines are in the journal too, under the user unit.
        granted = ns.wait_for(lambda: ns.journal(f"RESOURCED_CLAIM={ref}"), 10, "the journal")
        assert granted[0]["_SYSTEMD_USER_UNIT"] == USER_UNIT
        assert granted[0]["_UID"] == str(uid)
        # No start had to repair its state directory's mode (StateDirectoryMode=).
        lines = ns.journal(f"_SYSTEMD_USER_UNIT={USER_UNIT}", f"_UID={uid}")
        assert lines and not [e["MESSAGE"] for e in lines if "was mode" in e.get("MESSAGE", "")]

        disabled = ns.gpuctl("service", "disable", "--user", user=login, env=env, timeout=90)
        removed = [line for line in disabled.stdout.splitlines() if line.startswith("removed ")
                   and not line.endswith("/ (empty)")]
        assert len(removed) == 4, disabled.stdout
        assert ns.show(USER_UNIT, "ActiveState", user_manager=login)["ActiveState"] == "inactive"
    finally:
        ns.run("loginctl", "disable-linger", login, check=False)
        ns.systemctl("stop", f"user@{uid}.service", check=False)
