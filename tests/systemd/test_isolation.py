"""Device isolation under the real systemd, with the service as `service enable --system`
installed it and `isolation = "opt-in"`: a command run with --isolate opens its own GPU's
node and the driver's (ENXIO: allowed, and no driver behind these nodes) but not another
GPU's (EPERM: the scope's device filter); its scope ends with its claim, and takes its
processes with it.

The GPUs are simulated; their nodes are made with mknod (major 195, minors 0 to 3, and 255
for nvidiactl), as the driver's would be."""

import json
import re
import subprocess
import time
from pathlib import Path

import pytest

from .harness import CONFIG, NGPUS, UNIT

PROBE = r"""
import errno, json, os
seen = {}
for name in ("nvidia0", "nvidia1", "nvidiactl", "null"):
    try:
        os.close(os.open("/dev/" + name, os.O_RDWR))
        seen[name] = "opened"
    except OSError as exc:
        seen[name] = errno.errorcode[exc.errno]
seen["path"] = open("/proc/self/cgroup").read().strip().split("::", 1)[-1]
seen["cgroup"] = seen["path"].rsplit("/", 1)[-1]
print(json.dumps(seen))
"""
SCOPES = "resourced-claim-*.scope"


def _with_isolation(text: str, value: str) -> str:
    text = re.sub(r"(?m)^isolation = .*\n", "", text)
    line = f'isolation = "{value}"\n'
    if re.search(r"(?m)^\[daemon\]\s*$", text):
        return re.sub(r"(?m)^\[daemon\]\s*\n", "[daemon]\n" + line, text, count=1)
    return "[daemon]\n" + line + text


def _scopes(ns) -> list[str]:
    listed = ns.run("systemctl", "list-units", "--all", "--plain", "--no-legend", SCOPES)
    return [line.split()[0] for line in listed.stdout.splitlines() if line.strip()]


def _probe(ns, *gpuctl_args: str, user: str | None) -> dict:
    """What the command of ``gpuctl run ARGS`` opens, run by ``user`` from a session."""
    done = ns.gpuctl("run", *gpuctl_args, "--", "/usr/bin/python3", "-c", PROBE, user=user,
                     session=user is not None)
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_with_isolation_off_isolate_is_refused_in_words(service):
    """(Before ``opt_in`` turns it on: the default configuration.)"""
    done = service.ns.gpuctl("run", "--isolate", "--", "true", user=service.login("alice"),
                             check=False)

    assert done.returncode == 2, done.stderr
    assert 'isolation is off on this machine' in done.stderr
    assert '[daemon] isolation = "opt-in"' in done.stderr


@pytest.fixture(scope="module")
def opt_in(rig):
    """isolation = "opt-in" in the service's configuration, and the GPUs' nodes."""
    ns = rig.ns
    for minor in range(NGPUS):
        ns.run("mknod", "-m", "0666", f"/dev/nvidia{minor}", "c", "195", str(minor),
               check=False)
    ns.run("mknod", "-m", "0666", "/dev/nvidiactl", "c", "195", "255", check=False)
    original = ns.run("cat", CONFIG).stdout
    ns.write(CONFIG, _with_isolation(original, "opt-in"))
    ns.systemctl("reload", UNIT)
    ns.wait_for(lambda: ns.gpuctl("run", "--isolate", "--dry-run", "--", "true",
                                  user=rig.login("alice"), check=False).returncode == 0, 10,
                "isolation in force")
    yield rig
    ns.write(CONFIG, original)
    ns.systemctl("reload", UNIT)


def test_an_isolated_command_opens_its_gpu_and_no_other(opt_in, service):
    ns, alice = service.ns, service.login("alice")

    seen = _probe(ns, "--isolate", user=alice)

    assert seen["cgroup"].startswith("resourced-claim-") and seen["cgroup"].endswith(".scope")
    # in its user's slice still: the user's limits and logind's clean-up keep holding it
    assert seen["path"].startswith(f"/user.slice/user-{service.uid('alice')}.slice/"), seen
    assert (seen["nvidia0"], seen["nvidiactl"], seen["null"]) == ("ENXIO", "ENXIO", "opened")
    assert seen["nvidia1"] == "EPERM"
    ns.wait_for(lambda: _scopes(ns) == [], 10, "no scope left after the run")
    assert ns.claims() == {}


def test_root_asking_for_isolation_is_told_no_root_process_is_confined(opt_in, service):
    done = service.ns.gpuctl("run", "--isolate", "--", "true", check=False)
    assert done.returncode != 0
    assert "root's commands are never confined" in done.stderr
    assert _scopes(service.ns) == []


def test_without_isolate_every_node_opens(opt_in, service):
    seen = _probe(service.ns, user=service.login("alice"))

    assert (seen["nvidia0"], seen["nvidia1"], seen["nvidiactl"]) == ("ENXIO",) * 3
    assert not seen["cgroup"].startswith("resourced-claim-")


def test_an_isolated_claim_shows_so_and_its_release_ends_its_scope(opt_in, service, owner):
    ns, alice = service.ns, service.login("alice")
    ref = service.claim("alice", owner("alice"), "--isolate")
    assert ns.claims()[ref]["isolated"] is True
    assert f"{ref}" in ns.gpuctl("status").stdout and " isolated " in ns.gpuctl("status").stdout
    started = time.monotonic()
    worker = subprocess.Popen(ns.command(str(ns.venv / "bin/gpuctl"), "run", "--allocation", ref,
                                         "--", "sleep", "300", user=alice, session=True),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        scope = f"resourced-claim-{ref}.scope"
        ns.wait_for(lambda: _scopes(ns) == [scope], 10, "the claim's scope")
        verified = json.loads(ns.gpuctl("verify", "--json", check=False).stdout)
        assert any(r["claim"] == ref and r["isolated"] for r in verified["gpus"]), verified

        ns.gpuctl("release", "--allocation", ref, "--force", user=alice)

        ns.wait_for(lambda: _scopes(ns) == [], 15, "the scope gone with its claim")
        worker.wait(15)  # its command was stopped with the scope
        assert time.monotonic() - started < 30
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait(5)


def test_always_isolates_every_command_and_only_root_may_opt_out(opt_in, service):
    ns, alice = service.ns, service.login("alice")
    opt = ns.run("cat", CONFIG).stdout
    ns.write(CONFIG, _with_isolation(opt, "always"))
    ns.systemctl("reload", UNIT)
    try:
        ns.wait_for(lambda: _probe(ns, user=alice)["nvidia1"] == "EPERM", 10,
                    "every command isolated")
        refused = ns.gpuctl("run", "--no-isolate", "--", "true", user=alice, check=False)
        assert refused.returncode == 8, refused.stderr
        assert _probe(ns, "--no-isolate", user=None)["nvidia1"] == "ENXIO"  # root may
    finally:
        ns.write(CONFIG, opt)
        ns.systemctl("reload", UNIT)
        ns.wait_for(lambda: _probe(ns, user=alice)["nvidia1"] == "ENXIO", 10,
                    "opt-in again")


def test_a_restarted_daemon_keeps_its_claims_scopes_and_stops_a_stray_one(opt_in, service,
                                                                          owner):
    ns, alice = service.ns, service.login("alice")
    ref = service.claim("alice", owner("alice"), "--isolate")
    worker = subprocess.Popen(ns.command(str(ns.venv / "bin/gpuctl"), "run", "--allocation", ref,
                                         "--", "sleep", "300", user=alice, session=True),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    stray = subprocess.Popen(ns.command("systemd-run", "--scope", "--unit",
                                        "resourced-claim-zzzzzzz", "sleep", "300"),
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        ns.wait_for(lambda: sorted(_scopes(ns)) == [f"resourced-claim-{ref}.scope",
                                                    "resourced-claim-zzzzzzz.scope"],
                    10, "the claim's scope and a stray one")

        ns.systemctl("restart", UNIT)

        ns.wait_for(lambda: _scopes(ns) == [f"resourced-claim-{ref}.scope"], 15,
                    "the stray scope stopped, the live claim's kept")
        stray.wait(15)
        assert worker.poll() is None and ref in ns.claims()
    finally:
        for proc in (worker, stray):
            if proc.poll() is None:
                proc.kill()
                proc.wait(5)


def test_an_isolated_bookings_command_runs_confined(opt_in, service):
    ns, alice = service.ns, service.login("alice")
    state = "/tmp/sdt-alice-state"
    ns.run("install", "-d", "-o", alice, "-m", "0700", state)
    env = {"XDG_STATE_HOME": state}
    out = f"{state}/probe.json"
    script = PROBE.replace("print(json.dumps(seen))", f"open({out!r}, 'w').write(json.dumps(seen))")
    ref = ns.gpuctl("book", "--isolate", "--for", "10m", "--", "/usr/bin/python3", "-c", script,
                    user=alice, env=env).stdout.strip()
    listed = json.loads(ns.gpuctl("bookings", "--json", user=alice, env=env).stdout)
    assert [b["isolated"] for b in listed if b["id"] == ref] == [True]
    runner = subprocess.Popen(ns.command(str(ns.venv / "bin/gpuctl"), "runner", user=alice,
                                         env=env, session=True),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        seen = ns.wait_for(lambda: json.loads(ns.run("cat", out, check=False).stdout or "null"),
                           20, "the booked command's probe")
        assert (seen["nvidia0"], seen["nvidia1"]) == ("ENXIO", "EPERM")
        assert seen["cgroup"] == f"resourced-claim-{ref}.scope"
    finally:
        runner.terminate()
        runner.wait(10)
        ns.gpuctl("cancel", ref, user=alice, env=env, check=False)
        ns.run("rm", "-rf", state)


CONFINE_PY = r"""
import sys
from resourced.client.sync import Client
from resourced.errors import ResourcedError
try:
    with Client(bus="system") as c:
        c.confine(sys.argv[1], int(sys.argv[2]))
except ResourcedError as exc:
    print(type(exc).__name__, exc.message)
"""


def test_confine_is_for_an_isolated_granted_claim_of_ones_own(opt_in, service, owner):
    ns = service.ns
    alice_pid, bob_pid = owner("alice"), owner("bob")
    plain = service.claim("alice", alice_pid)
    isolated = service.claim("alice", alice_pid, "--isolate")

    def confine(ref: str, pid: int, user: str) -> str:
        return ns.python(CONFINE_PY, ref, str(pid), user=service.login(user)).stdout.strip()

    assert confine(plain, alice_pid, "alice") == f"InvalidArgs claim {plain} is not isolated " \
        "(claim with --isolate)"
    assert confine(isolated, bob_pid, "alice").startswith("NotProcessOwner")
    assert confine(isolated, alice_pid, "bob").startswith("NotClaimOwner")
    assert _scopes(ns) == []


HELPER = ("org.resourced.Isolation", "/org/resourced/Isolation", "org.resourced.Isolation")
HELPER_UNIT = "resourced-isolation.service"


def _ask_helper(ns, claim_id: str, uid: int, pid: int) -> subprocess.CompletedProcess:
    """Confine, called on the helper directly as the daemon's account (a compromised
    daemon could send anything)."""
    return ns.run("busctl", "call", *HELPER, "Confine", "suaua(ss)t", claim_id, str(uid),
                  "1", str(pid), "0", "10000000", user="resourced", check=False)


def _cgroup(ns, pid: int) -> str:
    return ns.run("cat", f"/proc/{pid}/cgroup", check=False).stdout.strip()


def test_the_helper_moves_no_root_service_or_other_users_process(opt_in, service, owner):
    ns = service.ns
    alice_uid = service.uid("alice")
    bob = subprocess.Popen(ns.command("sleep", "300", user=service.login("bob"), session=True))
    try:
        bobs = int(ns.wait_for(lambda: ns.run("pgrep", "-u", service.login("bob"), "-x", "sleep",
                                              check=False).stdout.split()[:1], 10,
                               "bob's process")[0])
        cases = {
            "root's": (owner(None), "runs as root"),
            "bob's": (bobs, f"belongs to uid {service.uid('bob')}, not to the claim's user"),
            "alice's service": (owner("alice"), f"outside user-{alice_uid}.slice"),
        }
        for what, (pid, why) in cases.items():
            before = _cgroup(ns, pid)
            done = _ask_helper(ns, "zzrefused", alice_uid, pid)
            assert done.returncode != 0 and why in done.stderr, (what, done.stderr)
            assert _cgroup(ns, pid) == before, what  # not moved
        assert _scopes(ns) == []
    finally:
        bob.kill()
        bob.wait(5)


RACE_PY = r"""
import json, subprocess, sys, time
venv_python, confine_py, ref, alice, alice_uid = sys.argv[1:6]
as_user = lambda login: ["setpriv", f"--reuid={login}", f"--regid={login}", "--init-groups", "--"]
victim = subprocess.Popen(["systemd-run", "--scope", "--quiet", f"--slice=user-{alice_uid}.slice",
                           "--", *as_user(alice), "sleep", "300"])
deadline = time.monotonic() + 20
while not (f"/user.slice/user-{alice_uid}.slice/" in open(f"/proc/{victim.pid}/cgroup").read()
           and f"Uid:\t{alice_uid}\t" in open(f"/proc/{victim.pid}/status").read()):
    assert time.monotonic() < deadline, "alice's process never ran in her slice"
    time.sleep(0.01)
caller = subprocess.Popen([*as_user(alice), venv_python, "-c", confine_py, ref, str(victim.pid)],
                          stdout=subprocess.PIPE, text=True)
# The daemon has checked the pid once it asks for the helper, which starts slowly here.
deadline = time.monotonic() + 20
while subprocess.run(["systemctl", "is-active", "resourced-isolation.service"],
                     capture_output=True, text=True).stdout.strip() != "activating":
    assert time.monotonic() < deadline, "the helper was never asked for"
    time.sleep(0.01)
victim.kill()
victim.wait()
print(victim.pid, flush=True)
sys.stdin.readline()  # the pid is taken again
print(caller.communicate(timeout=30)[0].strip(), flush=True)
"""
RECYCLE_SH = """
for i in $(seq 20); do
    echo $(($1 - 1)) > /proc/sys/kernel/ns_last_pid
    setpriv --reuid=$2 --regid=$2 --clear-groups -- sleep 300 </dev/null >/dev/null 2>&1 &
    [ $! = $1 ] && break
    kill -9 $!
done
echo $!
"""


def test_a_pid_taken_again_before_the_helper_moves_it_stays_out(opt_in, service, owner):
    """The pid-reuse race: alice's process passes the daemon's check, ends, and its pid is
    bob's before the helper (slow to start here) moves it.  /proc/sys is read-only inside,
    so the pid is taken again from outside, in the namespace's pid namespace."""
    ns = service.ns
    ref = service.claim("alice", owner("alice"), "--isolate")
    dropin = f"/run/systemd/system/{HELPER_UNIT}.d/slow.conf"
    ns.write(dropin, "[Service]\nExecStartPre=/bin/sleep 2\n")
    ns.systemctl("daemon-reload")
    ns.systemctl("stop", HELPER_UNIT)
    race = subprocess.Popen(ns.command(
        "python3", "-c", RACE_PY, str(ns.venv / "bin/python"), CONFINE_PY, ref,
        service.login("alice"), str(service.uid("alice"))),
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    stranger = None
    try:
        pid = int(race.stdout.readline())
        stranger = int(subprocess.run(
            ["nsenter", "-t", str(ns.init[0]), "-p", "--", "sh", "-c", RECYCLE_SH, "sh",
             str(pid), str(service.uid("bob"))],
            capture_output=True, text=True, check=True, timeout=10).stdout)
        assert stranger == pid  # the race is set up
        race.stdin.write("go\n")
        race.stdin.flush()
        answer = race.stdout.readline().strip()
        assert "belongs to uid" in answer, answer  # refused by the helper

        ns.gpuctl("release", "--allocation", ref, "--force", user=service.login("alice"))

        ns.wait_for(lambda: _scopes(ns) == [], 15, "no scope")
        cgroup = _cgroup(ns, stranger)
        assert cgroup and f"resourced-claim-{ref}" not in cgroup  # alive, where it was
    finally:
        race.kill()
        race.wait(5)
        if stranger:
            ns.run("kill", "-9", str(stranger), check=False)
        ns.run("rm", "-rf", str(Path(dropin).parent))
        ns.systemctl("daemon-reload")
