"""An outsider on the shared system bus (bob: outside the access group, Debian's default
bus policy) sends every signal a client acts on, addressed to the victim's connections
(a unicast signal passes every match rule), and nothing changes: alice's run goes on, and
her waiting claim still waits and is granted by the daemon alone.

Each signal is also sent as if from ``org.resourced``'s new owner (a forged
``NameOwnerChanged`` first): a client that believed it would take the outsider for the
daemon."""

import json
import subprocess
import time

import pytest

from .conftest import NGPUS, ok

pytestmark = pytest.mark.usefixtures("clean_claims")

FORGE_PY = r'''
import sys
from jeepney import DBusAddress, new_signal
from jeepney.bus_messages import message_bus
from jeepney.io.blocking import open_dbus_connection
from jeepney.low_level import HeaderFields

victim_uid, claim_id = int(sys.argv[1]), sys.argv[2]
claim = f"/org/resourced/claim/{claim_id}"
MANAGER = ("/org/resourced", "org.resourced.Manager")
CLAIM = (claim, "org.resourced.Claim")
with open_dbus_connection("SYSTEM") as conn:
    ours = conn.unique_name
    SIGNALS = [
        (("/org/freedesktop/DBus", "org.freedesktop.DBus"), "NameOwnerChanged", "sss",
         ("org.resourced", "", ours)),
        (CLAIM, "StopRequested", "us", (0, "forged")),
        (CLAIM, "ReclaimRequested", "si", ("c0000000", 5)),
        (CLAIM, "Ending", "ts", (1, "")),
        (CLAIM, "Cancelled", "s", ("forged",)),
        (CLAIM, "Granted", "a{sv}", ({"GPUs": ("as", ["GPU-forged"])},)),
        (MANAGER, "NoticeAdded", "ss", ("nforged", "forged notice")),
        (MANAGER, "LevelChanged", "ssss", ("ram", "OK", "STOP", "forged")),
        (MANAGER, "ClaimRemoved", "sos", (claim_id, claim, "forged")),
        (MANAGER, "BookingChanged", "ssa{sv}", (claim_id, "ended", {})),
    ]
    names = conn.send_and_get_reply(message_bus.ListNames()).body[0]
    victims = [n for n in names if n.startswith(":") and n != ours and
               conn.send_and_get_reply(message_bus.GetConnectionUnixUser(n)).body[0] == victim_uid]
    for destination in victims:
        for (path, interface), member, signature, body in SIGNALS:
            msg = new_signal(DBusAddress(path, interface=interface), member, signature, body)
            msg.header.fields[HeaderFields.destination] = destination
            conn.send(msg)
    conn.send_and_get_reply(message_bus.GetId())  # routed by now
print(len(victims))
'''

WAIT_PY = r'''
import json, sys
from resourced.client.sync import Client
with Client(bus="system") as c:
    got = c.claim(gpus=1, wait=True, owner_pid=int(sys.argv[1]), timeout=30,
                  progress=lambda seen: print("queued", flush=True))
    print(json.dumps(got["env"]), flush=True)
'''


def forge_as_outsider(rig, claim_id: str) -> int:
    """Every signal, from bob to each of alice's connections; how many there were."""
    sent = ok(rig.run_as("bob", [str(rig.venv / "bin/python"), "-c", FORGE_PY,
                                 str(rig.users["alice"].pw_uid), claim_id]))
    return int(sent)


def claims(rig) -> dict[str, dict]:
    return {c["id"]: c for c in json.loads(ok(rig.gpuctl("root", "status", "--json")))["claims"]}


def test_an_outsiders_signals_leave_a_run_running(rig):
    run = subprocess.Popen([*rig._as_user("alice"), str(rig.venv / "bin/gpuctl"), "run",
                            "--session", "outsider", "--", "sleep", "30"],
                           env=rig.user_env(), cwd=rig.dir, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True)
    try:
        [ref] = rig.wait_for(lambda: list(claims(rig)), 10, "the run's claim")
        assert forge_as_outsider(rig, ref) >= 1
        time.sleep(1)  # a forged stop ended the run within 0.25 s when it was obeyed
        assert run.poll() is None and ref in claims(rig)

        ok(rig.gpuctl("alice", "stop", "--session", "outsider"))  # the daemon's word ends it
        run.wait(15)
        assert ref not in claims(rig)
    finally:
        if run.poll() is None:
            run.kill()
        run.communicate(timeout=5)


def test_an_outsider_neither_grants_nor_cancels_a_waiting_claim(rig):
    held = ok(rig.gpuctl("dave", "claim", "--gpus", NGPUS, "--owner-pid",
                         rig.sleepers["dave"])).strip()
    waiter = subprocess.Popen([*rig._as_user("alice"), str(rig.venv / "bin/python"), "-c",
                               WAIT_PY, str(rig.sleepers["alice"])], env=rig.user_env(),
                              cwd=rig.dir, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True)
    try:
        assert waiter.stdout.readline().strip() == "queued"
        [ref] = [r for r, c in claims(rig).items() if c["state"] == "queued"]
        assert forge_as_outsider(rig, ref) >= 1
        time.sleep(1)  # a forged Granted or Cancelled ended the wait at once when obeyed
        assert waiter.poll() is None, waiter.communicate()  # neither granted nor cancelled
        assert claims(rig)[ref]["state"] == "queued"

        ok(rig.gpuctl("dave", "release", "--allocation", held))
        out, err = waiter.communicate(timeout=15)
        env = json.loads(out.strip().splitlines()[-1])
        assert waiter.returncode == 0, err
        assert "GPU-forged" not in json.dumps(env)
        assert claims(rig)[ref]["state"] == "granted"
    finally:
        if waiter.poll() is None:
            waiter.kill()
            waiter.communicate(timeout=5)
