"""org.freedesktop.DBus.ObjectManager at /org/resourced, as a client nobody here wrote sees
it: GLib's GDBusObjectManagerClient (through PyGObject, in the system python).

It must learn every object from GetManagedObjects and every change from InterfacesAdded /
InterfacesRemoved on /org/resourced: claims as they come and go (their objects are
exported lazily, so the daemon announces them itself), and checks replaced by a reload.
"""

import json
import os
import queue
import signal
import subprocess
import threading
import time

import pytest

from resourced.client.sync import Client

from ..conftest import stop_process

SYSTEM_PYTHON = "/usr/bin/python3"
TIMEOUT = 10.0
CLAIM = "org.resourced.Claim"
STANDARD = {"org.freedesktop.DBus.Peer", "org.freedesktop.DBus.Introspectable",
            "org.freedesktop.DBus.Properties"}

WATCHER = r'''
import json
import sys

import gi

gi.require_version("Gio", "2.0")
from gi.repository import Gio, GLib

address, seconds = sys.argv[1], float(sys.argv[2])


def emit(**event):
    print(json.dumps(event, default=str), flush=True)


def describe(obj):
    """{interface: {property: value}} from the proxies' caches (no calls made)."""
    out = {}
    for proxy in obj.get_interfaces():
        names = proxy.get_cached_property_names() or []
        out[proxy.get_interface_name()] = {
            n: proxy.get_cached_property(n).unpack() for n in names}
    return out


conn = Gio.DBusConnection.new_for_address_sync(
    address,
    Gio.DBusConnectionFlags.AUTHENTICATION_CLIENT
    | Gio.DBusConnectionFlags.MESSAGE_BUS_CONNECTION,
    None, None)
manager = Gio.DBusObjectManagerClient.new_sync(
    conn, Gio.DBusObjectManagerClientFlags.NONE, "org.resourced", "/org/resourced",
    None, None, None)


def added(_manager, obj):
    path = obj.get_object_path()
    event = {"event": "added", "path": path, "interfaces": describe(obj)}
    if "/claim/" in path:  # what the object itself answers, for comparison
        try:
            reply = conn.call_sync(
                "org.resourced", path, "org.freedesktop.DBus.Properties", "GetAll",
                GLib.Variant("(s)", ("org.resourced.Claim",)), GLib.VariantType("(a{sv})"),
                Gio.DBusCallFlags.NONE, 5000, None)
            event["get_all"] = reply.unpack()[0]
        except GLib.Error as exc:
            event["get_all_error"] = exc.message
    emit(**event)


def removed(_manager, obj):
    emit(event="removed", path=obj.get_object_path())


def interface_removed(_manager, obj, proxy):
    emit(event="interface-removed", path=obj.get_object_path(),
         interface=proxy.get_interface_name())


manager.connect("object-added", added)
manager.connect("object-removed", removed)
manager.connect("interface-removed", interface_removed)
emit(event="ready", owner=manager.get_name_owner(),
     objects={o.get_object_path(): describe(o) for o in manager.get_objects()})
loop = GLib.MainLoop()
GLib.timeout_add(int(seconds * 1000), loop.quit)
loop.run()
'''


def _gi_missing() -> str | None:
    if not os.access(SYSTEM_PYTHON, os.X_OK):
        return f"{SYSTEM_PYTHON} not found (GLib's object manager client runs in it)"
    code = "import gi; gi.require_version('Gio', '2.0'); from gi.repository import Gio"
    try:
        probe = subprocess.run([SYSTEM_PYTHON, "-c", code], check=False,
                               capture_output=True, text=True, timeout=30)
    except subprocess.TimeoutExpired:
        return f"{SYSTEM_PYTHON} could not import gi within 30 s"
    if probe.returncode:
        return ("PyGObject is not importable by the system python "
                f"(apt-get install python3-gi): {probe.stderr.strip()[-200:]}")
    return None


_MISSING = _gi_missing()
pytestmark = pytest.mark.skipif(_MISSING is not None, reason=_MISSING or "")


class Watcher:
    """The GLib script as a subprocess; its events as dicts, read on a thread."""

    def __init__(self, tmp_path, seconds: float = 60.0):
        script = tmp_path / "watch_objects.py"
        script.write_text(WATCHER)
        self.stderr = tmp_path / "watch_objects.err"
        with open(self.stderr, "w") as err:
            self.proc = subprocess.Popen(
                [SYSTEM_PYTHON, str(script), os.environ["DBUS_SESSION_BUS_ADDRESS"],
                 str(seconds)], stdout=subprocess.PIPE, stderr=err, text=True)
        self.events: queue.Queue = queue.Queue()
        self.seen: list[dict] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.events.put(json.loads(line))
        self.events.put(None)

    def next(self, predicate, timeout: float = TIMEOUT) -> dict:
        """The first event (from now) that ``predicate`` accepts."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                event = self.events.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError(f"no such event within {timeout}s; saw {self.seen}") from None
            if event is None:
                raise AssertionError(f"the watcher exited ({self.proc.wait(5)}): "
                                     f"{self.stderr.read_text()[-2000:]}; saw {self.seen}")
            self.seen.append(event)
            if predicate(event):
                return event

    def ready(self) -> dict:
        return self.next(lambda e: e["event"] == "ready", timeout=3 * TIMEOUT)["objects"]

    def close(self) -> None:
        stop_process(self.proc)
        self._reader.join(5)
        if not self._reader.is_alive():
            self.proc.stdout.close()


@pytest.fixture
def watcher(tmp_path):
    made: list[Watcher] = []

    def start() -> Watcher:
        made.append(Watcher(tmp_path))
        return made[-1]

    yield start
    for w in made:
        w.close()


def _is(kind: str, path: str):
    return lambda e: e["event"] == kind and e["path"] == path


def test_a_glib_object_manager_client_sees_claims_come_and_go(daemon, watcher):
    w = watcher()
    objects = w.ready()
    # GetManagedObjects: the objects exported at start, each with its standard interfaces
    assert "org.resourced.GPU" in objects["/org/resourced/gpu/0"]
    assert objects["/org/resourced/gpu/0"]["org.resourced.GPU"]["Index"] == 0
    assert "org.resourced.Pool" in objects["/org/resourced/pool/cpu"]
    assert STANDARD <= set(objects["/org/resourced/gpu/0"])
    assert not any("/claim/" in path for path in objects)

    with Client() as c:
        ref = c.claim(mode="dev", gpus=1, owner_pid=os.getpid(), label="om")["allocation"]["ref"]
        path = f"/org/resourced/claim/{ref}"
        added = w.next(_is("added", path))
        props = added["interfaces"][CLAIM]
        assert (props["Id"], props["State"], props["Label"]) == (ref, "granted", "om")
        assert set(added["interfaces"]) == STANDARD | {CLAIM}
        # announced from the record: the same as the object answers once exported
        assert "get_all_error" not in added, added
        assert props == added["get_all"]
        c.release(ref)
    w.next(_is("removed", path))
    assert not [e for e in w.seen if e["event"] == "interface-removed"], w.seen


def test_a_queued_claim_appears_when_it_queues(daemon, watcher):
    w = watcher()
    w.ready()
    with Client() as c:
        holder = c.claim(mode="dev", gpus=4, owner_pid=os.getpid())["allocation"]["ref"]
        w.next(_is("added", f"/org/resourced/claim/{holder}"))
        result: dict = {}

        def wait_for_one():
            with Client() as waiter:
                result["ref"] = waiter.claim(mode="dev", gpus=1, owner_pid=os.getpid(),
                                             wait=True, timeout=TIMEOUT)["allocation"]["ref"]

        thread = threading.Thread(target=wait_for_one, daemon=True)
        thread.start()
        try:
            queued = w.next(lambda e: e["event"] == "added" and "/claim/" in e["path"])
            assert queued["interfaces"][CLAIM]["State"] == "queued"
        finally:
            c.release(holder)
            thread.join(TIMEOUT)
        assert queued["path"] == f"/org/resourced/claim/{result['ref']}"
        w.next(_is("removed", f"/org/resourced/claim/{holder}"))
        c.release(result["ref"])
    w.next(_is("removed", queued["path"]))


def test_checks_replaced_by_a_reload_are_announced(start_daemon, watcher, tmp_path):
    config = tmp_path / "config.toml"
    config.write_text('[[check]]\nname = "mem"\ntype = "ram"\nwarn_free_pct = 10\n')
    daemon = start_daemon(args=["--config", str(config)])
    w = watcher()
    objects = w.ready()
    assert objects["/org/resourced/check/mem"]["org.resourced.Check"]["Name"] == "mem"

    config.write_text('[[check]]\nname = "memory"\ntype = "ram"\nwarn_free_pct = 10\n')
    os.kill(daemon.proc.pid, signal.SIGHUP)
    added = w.next(_is("added", "/org/resourced/check/memory"))
    assert added["interfaces"]["org.resourced.Check"]["Name"] == "memory"
    assert any(e["event"] == "removed" and e["path"] == "/org/resourced/check/mem"
               for e in w.seen) or w.next(_is("removed", "/org/resourced/check/mem"))
