"""gpuctl notify end to end on private buses, against a fake resourced and a fake
notification server (dbus-fast, in a thread of this process), without the real daemon."""

import asyncio
import contextlib
import json
import os
import shutil
import subprocess
import sys
import threading
import time

import pytest
from dbus_fast.aio import MessageBus
from dbus_fast.service import ServiceInterface, dbus_method, dbus_signal

from resourced.linux.privatebus import PrivateBus

from ..conftest import eventually, gpuctl, stop_process

DATA_OK = {"name": "data", "type": "disk", "path": "/data", "level": "OK", "reason": "fine",
           "free_bytes": 50, "total_bytes": 100, "free_pct": 50.0, "used_pct": 50.0,
           "limits": {"stop_free_gib": 10}}
REASON = "free 9.5G <= stop_free_gib 10"
PLAIN = "9.5G free; the limit is 10G free. Jobs should stop writing to it."  # what a bubble says


def health(**levels) -> dict:
    checks = [{**DATA_OK, "level": level, "reason": reason}
              for level, reason in levels.values()]
    return {"level": "OK", "checks": checks}


class FakeManager(ServiceInterface):
    """Just enough of org.resourced.Manager: Describe and the LevelChanged signal."""

    def __init__(self, health: dict):
        super().__init__("org.resourced.Manager")
        self.health = health
        self.describes = 0

    @dbus_method()
    def Describe(self) -> "s":
        self.describes += 1
        return json.dumps({"gpus": [], "claims": [], "health": self.health})

    @dbus_signal()
    def LevelChanged(self, check: "s", old: "s", new: "s", reason: "s") -> "ssss":
        return [check, old, new, reason]


class FakeNotifications(ServiceInterface):
    """org.freedesktop.Notifications that records its calls and hands out ids."""

    def __init__(self, capabilities=("body",)):
        super().__init__("org.freedesktop.Notifications")
        self.calls: list[tuple] = []
        self.next_id = 1
        self.capabilities = list(capabilities)
        self.asked = 0   # GetCapabilities calls

    @dbus_method()
    def Notify(self, app_name: "s", replaces_id: "u", app_icon: "s", summary: "s", body: "s",
               actions: "as", hints: "a{sv}", expire_timeout: "i") -> "u":
        nid = replaces_id
        if not nid:
            nid, self.next_id = self.next_id, self.next_id + 1
        self.calls.append(("Notify", {
            "app_name": app_name, "replaces_id": replaces_id, "summary": summary, "body": body,
            "urgency": hints["urgency"].value, "urgency_signature": hints["urgency"].signature,
            "expire_timeout": expire_timeout, "actions": actions, "id": nid}))
        return nid

    @dbus_method()
    def CloseNotification(self, nid: "u"):
        self.calls.append(("CloseNotification", nid))
        self.NotificationClosed(nid, 3)

    @dbus_method()
    def GetCapabilities(self) -> "as":
        self.asked += 1
        return self.capabilities

    @dbus_method()
    def GetServerInformation(self) -> "ssss":
        return ["fake", "resourced tests", "1", "1.2"]

    @dbus_signal()
    def NotificationClosed(self, nid: "u", reason: "u") -> "uu":
        return [nid, reason]

    @dbus_signal()
    def ActionInvoked(self, nid: "u", action_key: "s") -> "us":
        return [nid, action_key]

    @dbus_signal()
    def ActivationToken(self, nid: "u", token: "s") -> "us":
        return [nid, token]


class Services:
    """An event loop in a thread hosting the fakes; the test drives it synchronously."""

    def __init__(self):
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.buses: list[MessageBus] = []
        self.bus_of: dict[int, MessageBus] = {}   # id(interface) -> its connection

    def run(self, coro, timeout: float = 10):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    async def _serve(self, address: str, name: str, path: str, iface) -> MessageBus:
        bus = await MessageBus(bus_address=address).connect()
        bus.export(path, iface)
        await bus.request_name(name)
        self.buses.append(bus)
        self.bus_of[id(iface)] = bus
        return bus

    def resourced(self, address: str, health: dict) -> tuple[MessageBus, FakeManager]:
        iface = FakeManager(health)
        return self.run(self._serve(address, "org.resourced", "/org/resourced", iface)), iface

    def notifications(self, address: str, capabilities=("body",)) -> FakeNotifications:
        iface = FakeNotifications(capabilities)
        self.run(self._serve(address, "org.freedesktop.Notifications",
                             "/org/freedesktop/Notifications", iface))
        return iface

    def emit(self, iface: FakeManager, *args: str) -> None:
        self.signal(iface.LevelChanged, *args)

    def signal(self, method, *args) -> None:
        """Emit a dbus-fast signal (``iface.Member``) from the services' loop; it is on its
        way to the agent, ahead of any signal sent after, once this returns."""
        async def emit():
            method(*args)
            for bus in self.buses:
                await sent_on(bus)
        self.run(emit())

    def stop(self, bus: MessageBus) -> None:
        async def stop():
            bus.disconnect()
            await bus.wait_for_disconnect()
        self.run(stop())
        self.buses.remove(bus)

    def close(self) -> None:
        for bus in list(self.buses):
            with contextlib.suppress(Exception):  # best effort at teardown
                self.stop(bus)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)


async def sent_on(bus: MessageBus) -> None:
    """Return once the bus has routed what ``bus`` sent before: it answers in order."""
    from dbus_fast import Message

    await bus.call(Message(destination="org.freedesktop.DBus", path="/org/freedesktop/DBus",
                           interface="org.freedesktop.DBus", member="GetId"))


class AgentProcess:
    """``python -m resourced.cli notify`` with its log in a file."""

    def __init__(self, tmp_path, env: dict, bus: str):
        self.log_path = tmp_path / f"agent-{time.monotonic_ns()}.log"
        self._log = open(self.log_path, "w")  # noqa: SIM115 - open while the agent runs
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "resourced.cli", "notify", "--bus", bus],
            env=env, stdout=self._log, stderr=subprocess.STDOUT)

    def log(self) -> str:
        return self.log_path.read_text()

    def wait_log(self, text: str, timeout: float = 10) -> None:
        def seen():
            if self.proc.poll() is not None:
                raise AssertionError(f"agent exited with {self.proc.returncode}:\n{self.log()}")
            return text in self.log()
        eventually(seen, timeout)

    def stop(self) -> int:
        code = stop_process(self.proc)
        self._log.close()
        return code


@pytest.fixture
def buses():
    """Two private buses: ``session`` (notifications, and the daemon in session mode) and
    ``system`` (standing in for the system bus)."""
    with PrivateBus() as session, PrivateBus() as system:
        yield session, system


@pytest.fixture
def services():
    s = Services()
    yield s
    s.close()


@pytest.fixture
def agents(tmp_path, request):
    started: list[AgentProcess] = []

    def start(env: dict, bus: str = "session") -> AgentProcess:
        env = {**{k: v for k, v in os.environ.items() if not k.startswith("RESOURCED_")},
               **env}
        started.append(AgentProcess(tmp_path, env, bus))
        return started[-1]

    yield start
    for agent in started:
        rc = agent.stop()
        failed = getattr(request.node, "rep_call", None) and request.node.rep_call.failed
        if failed:
            print(f"--- agent log ---\n{agent.log()}")
        assert "Traceback" not in agent.log()
        assert rc in (0, -15)


def notifies(server: FakeNotifications) -> list[dict]:
    return [args for name, args in server.calls if name == "Notify"]


def settled(services, manager: FakeManager, server: FakeNotifications) -> list[tuple]:
    """The server's calls once the agent has acted on every signal sent before: it takes
    them one at a time, in order, so a bubble for one more check comes after all they
    caused (that bubble is left out)."""
    services.emit(manager, "marker", "OK", "WARN", "the marker")
    marked = eventually(lambda: [i for i, (name, args) in enumerate(server.calls)
                                 if name == "Notify" and args["body"] == "the marker"],
                        what="the marker's bubble")
    return server.calls[:marked[0]]


def _three_changes(services, manager, server):
    """OK->STOP, STOP->WARN, WARN->OK: one bubble, replaced in place, then closed."""
    services.emit(manager, "data", "OK", "STOP", REASON)
    eventually(lambda: len(server.calls) >= 1)
    first = notifies(server)[0]
    assert first["urgency"] == 2 and first["urgency_signature"] == "y"
    assert first["replaces_id"] == 0
    assert first["summary"] == "Disk /data is full"
    assert first["body"] == PLAIN
    assert first["app_name"] == "resourced"
    assert first["actions"] == []      # this server has no "actions" capability

    services.emit(manager, "data", "STOP", "WARN", "free 15G <= warn_free_gib 20")
    eventually(lambda: len(server.calls) >= 2)
    second = notifies(server)[1]
    assert (second["replaces_id"], second["urgency"]) == (first["id"], 1)
    assert second["summary"] == "Disk /data is filling up"

    services.emit(manager, "data", "WARN", "OK", "fine")
    eventually(lambda: len(server.calls) >= 3)
    assert settled(services, manager, server)[2:] == [("CloseNotification", first["id"])]


def test_one_bubble_per_check_on_a_session_daemon(buses, services, agents):
    session, _ = buses
    server = services.notifications(session.address)
    _, manager = services.resourced(session.address, health(data=("OK", "fine")))
    agent = agents(session.env())
    agent.wait_log("watching org.resourced on the session bus (running)")
    assert manager.describes == 1
    _three_changes(services, manager, server)


def test_one_bubble_per_check_on_a_system_daemon(buses, services, agents):
    session, system = buses
    server = services.notifications(session.address)
    _, manager = services.resourced(system.address, health(data=("OK", "fine")))
    env = {"DBUS_SESSION_BUS_ADDRESS": session.address,
           "DBUS_SYSTEM_BUS_ADDRESS": system.address}
    agent = agents(env, bus="system")
    agent.wait_log("watching org.resourced on the system bus (running)")
    _three_changes(services, manager, server)


def test_signals_from_others_are_ignored(buses, services, agents):
    session, _ = buses
    server = services.notifications(session.address)
    _, manager = services.resourced(session.address, health(data=("OK", "fine")))
    agent = agents(session.env())
    agent.wait_log("(running)")
    impostor = FakeManager(health())

    async def impostor_emits():
        # another connection sends the same signal from the same path, without the name
        bus = await MessageBus(bus_address=session.address).connect()
        bus.export("/org/resourced", impostor)
        impostor.LevelChanged("data", "OK", "STOP", "spoofed")
        await sent_on(bus)
        bus.disconnect()
    services.run(impostor_emits())
    # the agent gets the spoofed signal before this one: any bubble of it would come first
    services.emit(manager, "ram", "OK", "WARN", "low")
    eventually(lambda: len(server.calls) >= 1)
    assert [c["body"] for c in notifies(server)] == ["low"]


def test_the_daemon_goes_away_and_comes_back(buses, services, agents):
    session, _ = buses
    server = services.notifications(session.address)
    bus, _ = services.resourced(session.address, health(data=("STOP", REASON)))
    agent = agents(session.env())
    agent.wait_log("(running)")
    # at start, the current level is shown
    eventually(lambda: len(notifies(server)) == 1)
    first = notifies(server)[0]
    assert (first["urgency"], first["body"]) == (2, PLAIN)

    services.stop(bus)
    agent.wait_log("org.resourced went away")
    _, manager = services.resourced(session.address, health(data=("WARN", "nearly full")))
    agent.wait_log("org.resourced is back")
    eventually(lambda: len(notifies(server)) == 2)
    again = notifies(server)[1]
    assert (again["replaces_id"], again["urgency"], again["body"]) == (first["id"], 1,
                                                                      "nearly full")
    services.emit(manager, "data", "WARN", "OK", "fine")
    eventually(lambda: ("CloseNotification", first["id"]) in server.calls)


def test_a_daemon_that_starts_later_is_picked_up(buses, services, agents):
    session, _ = buses
    server = services.notifications(session.address)
    agent = agents(session.env())
    agent.wait_log("watching org.resourced on the session bus (not running yet)")
    _, manager = services.resourced(session.address, health(data=("OK", "fine")))
    agent.wait_log("org.resourced is back")
    services.emit(manager, "data", "OK", "STOP", REASON)
    eventually(lambda: len(notifies(server)) == 1)


def test_no_notification_server_at_first(buses, services, agents):
    session, _ = buses
    _, manager = services.resourced(session.address, health(data=("OK", "fine")))
    agent = agents(session.env())
    agent.wait_log("(running)")
    services.emit(manager, "data", "OK", "STOP", REASON)
    agent.wait_log("no notification server")

    server = services.notifications(session.address)
    # the level that could not be shown appears with the server
    eventually(lambda: len(notifies(server)) == 1)
    shown = notifies(server)[0]
    assert (shown["urgency"], shown["replaces_id"]) == (2, 0)
    services.emit(manager, "data", "STOP", "WARN", "nearly full")
    eventually(lambda: len(notifies(server)) == 2)
    assert notifies(server)[1]["replaces_id"] == shown["id"]


def test_the_notification_server_restarts(buses, services, agents):
    session, _ = buses
    server = services.notifications(session.address)
    _, manager = services.resourced(session.address, health(data=("OK", "fine")))
    agent = agents(session.env())
    agent.wait_log("(running)")
    services.emit(manager, "data", "OK", "WARN", "nearly full")
    eventually(lambda: len(notifies(server)) == 1)

    services.stop(services.bus_of[id(server)])
    fresh = services.notifications(session.address)
    # the new server knows nothing of the old ids: the bubble is shown anew, not replaced
    eventually(lambda: len(notifies(fresh)) == 1)
    assert notifies(fresh)[0]["replaces_id"] == 0
    services.emit(manager, "data", "WARN", "STOP", REASON)
    eventually(lambda: len(notifies(fresh)) == 2)
    assert notifies(fresh)[1]["replaces_id"] == notifies(fresh)[0]["id"]


def test_the_agent_exits_1_when_its_bus_is_gone(tmp_path):
    bus = PrivateBus().start()
    code = ("import sys, resourced.notify.service as n; n.KEEPALIVE_INTERVAL = 0.2; "
            "from resourced.cli import main; sys.exit(main(['notify', '--bus', 'session']))")
    log = tmp_path / "agent.log"
    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, "-c", code], stdout=out, stderr=out,
                                env={**os.environ, **bus.env()})
    try:
        eventually(lambda: "watching org.resourced" in log.read_text(), 10)
        bus.stop()
        assert proc.wait(10) == 1
    finally:
        bus.stop()
        if proc.poll() is None:
            proc.kill()
            proc.wait(5)
    assert log.read_text().splitlines()[-1] == "gpuctl: lost the connection to the session bus"


# -- actions: a click on a bubble opens gpuctl in a terminal ------------------------------

ACTIONS = ("body", "actions")


class Terminal:
    """$TERMINAL for the agent: a script that writes its arguments (and the activation
    token it was given) as one line to a file, instead of opening a window."""

    def __init__(self, tmp_path):
        bin_dir = tmp_path / "bin"
        bin_dir.mkdir()
        self.argv_file = tmp_path / "terminal-argv"
        script = bin_dir / "record-terminal"
        script.write_text('#!/bin/sh\nprintf "%s|%s\\n" "${XDG_ACTIVATION_TOKEN:-}" "$*" '
                          f'>> "{self.argv_file}"\n')
        script.chmod(0o755)
        self.env = {"TERMINAL": str(script), "PATH": f"{bin_dir}:{os.environ.get('PATH', '')}"}

    def lines(self) -> list[str]:
        return self.argv_file.read_text().splitlines() if self.argv_file.exists() else []


@pytest.fixture
def terminal(tmp_path):
    return Terminal(tmp_path)


def _stop_bubble(buses, services, agents, env: dict):
    """An agent (with ``env`` added) under a notification server with actions, and the
    bubble it shows for a check going OK -> STOP: (server, manager, agent, bubble)."""
    session, _ = buses
    server = services.notifications(session.address, ACTIONS)
    _, manager = services.resourced(session.address, health(data=("OK", "fine")))
    agent = agents({**session.env(), **env})
    agent.wait_log("(running)")
    services.emit(manager, "data", "OK", "STOP", REASON)
    eventually(lambda: len(notifies(server)) == 1)
    return server, manager, agent, notifies(server)[0]


def test_a_clicked_health_bubble_opens_gpuctl_resources(buses, services, agents, terminal):
    server, manager, agent, bubble = _stop_bubble(buses, services, agents, terminal.env)
    assert bubble["actions"] == ["default", "Show details"]
    services.emit(manager, "data", "STOP", "WARN", "free 15G <= warn_free_gib 20")
    eventually(lambda: len(notifies(server)) == 2)
    assert notifies(server)[1]["actions"] == ["default", "Show details"]
    assert server.asked == 1           # once per server, not once per bubble

    # not ours, not our key: nothing opens
    services.signal(server.ActionInvoked, bubble["id"] + 100, "default")
    services.signal(server.ActionInvoked, bubble["id"], "some-other-key")
    services.signal(server.ActivationToken, bubble["id"], "token-1")
    services.signal(server.ActionInvoked, bubble["id"], "default")
    agent.wait_log("opened gpuctl resources --bus session in")
    assert agent.log().count("opened gpuctl") == 1  # the signals before it opened nothing
    (line,) = eventually(lambda: terminal.lines(), 10)
    token, argv = line.split("|", 1)
    assert token == "token-1"
    assert argv.startswith("-e sh -c ") and argv.endswith("gpuctl resources --bus session")


def test_actions_follow_the_notification_server(buses, services, agents, terminal):
    """A new server is asked again: one without actions gets bubbles without them."""
    session, _ = buses
    server = services.notifications(session.address, ACTIONS)
    _, manager = services.resourced(session.address, health(data=("OK", "fine")))
    agent = agents({**session.env(), **terminal.env})
    agent.wait_log("(running)")
    services.emit(manager, "data", "OK", "WARN", "nearly full")
    eventually(lambda: len(notifies(server)) == 1)
    old_id = notifies(server)[0]["id"]

    services.stop(services.bus_of[id(server)])
    plain = services.notifications(session.address)
    eventually(lambda: len(notifies(plain)) == 1)
    assert (plain.asked, notifies(plain)[0]["actions"]) == (1, [])
    agent.wait_log("the notification server does not support actions")
    # the old server's id means nothing now, even if this one says it
    services.signal(plain.ActionInvoked, old_id, "default")
    services.emit(manager, "data", "WARN", "STOP", REASON)  # taken after that signal
    eventually(lambda: len(notifies(plain)) == 2)
    assert "opened gpuctl" not in agent.log() and terminal.lines() == []


def test_an_action_from_someone_else_opens_nothing(buses, services, agents, terminal):
    session, _ = buses
    server, _, agent, bubble = _stop_bubble(buses, services, agents, terminal.env)
    nid = bubble["id"]

    async def impostor_invokes():
        from dbus_fast import Message, MessageType

        bus = await MessageBus(bus_address=session.address).connect()
        dbus = await bus.introspect("org.freedesktop.DBus", "/org/freedesktop/DBus")
        daemon = bus.get_proxy_object("org.freedesktop.DBus", "/org/freedesktop/DBus", dbus)
        iface = daemon.get_interface("org.freedesktop.DBus")
        agent_name = [name for name in await iface.call_list_names() if name.startswith(":")
                      and await iface.call_get_connection_unix_process_id(name)
                      == agent.proc.pid]
        assert len(agent_name) == 1
        # broadcast (the bus drops it: the match names the server) and sent to the agent
        for destination in (None, agent_name[0]):
            await bus.send(Message(
                message_type=MessageType.SIGNAL, destination=destination,
                path="/org/freedesktop/Notifications",
                interface="org.freedesktop.Notifications", member="ActionInvoked",
                signature="us", body=[nid, "default"]))
        await sent_on(bus)
        bus.disconnect()
    services.run(impostor_invokes())
    services.signal(server.ActionInvoked, nid, "default")    # the server itself: it opens
    agent.wait_log("opened gpuctl resources")
    assert agent.log().count("opened gpuctl") == 1  # the impostor's came first: not opened
    assert len(eventually(lambda: terminal.lines(), 10)) == 1


def test_a_booking_bubble_opens_gpuctl_bookings(buses, services, agents, terminal):
    session, _ = buses
    server = services.notifications(session.address, ACTIONS)
    manager = NoticeManager(health())
    bus = services.run(services._serve(session.address, "org.resourced", "/org/resourced",
                                       manager))
    mine = FakeUser()
    bus.export(f"/org/resourced/user/{os.getuid()}", mine)
    agent = agents({**session.env(), **terminal.env})
    agent.wait_log("(running)")
    services.signal(mine.BookingChanged, "bmine01", "started", _record("bmine01"))
    services.signal(manager.NoticeAdded, "n1", "GPU 3 is replaced on Friday")
    eventually(lambda: len(notifies(server)) == 2)
    booking, notice = notifies(server)
    assert booking["actions"] == ["default", "Show bookings"]
    assert notice["actions"] == []
    services.signal(server.ActionInvoked, notice["id"], "default")
    services.signal(server.ActionInvoked, booking["id"], "default")
    agent.wait_log("opened gpuctl bookings")
    assert agent.log().count("opened gpuctl") == 1  # the notice's bubble opens nothing
    (line,) = eventually(lambda: terminal.lines(), 10)
    assert line.endswith("gpuctl bookings --bus session")


def test_without_a_terminal_the_agent_says_so_once_and_goes_on(buses, services, agents,
                                                               tmp_path):
    empty = tmp_path / "empty-path"
    empty.mkdir()
    server, manager, agent, _ = _stop_bubble(buses, services, agents,
                                             {"TERMINAL": "", "PATH": str(empty)})
    for _ in range(2):
        services.signal(server.ActionInvoked, notifies(server)[0]["id"], "default")
    agent.wait_log("no terminal")
    services.emit(manager, "data", "STOP", "OK", "fine")   # still at work
    eventually(lambda: ("CloseNotification", notifies(server)[0]["id"]) in server.calls)
    assert agent.log().count("no terminal") == 1


# -- gpuctl resources, which reads the same "health" key of Describe ----------------------

def test_gpuctl_resources_shows_the_daemons_figures(buses, services):
    session, _ = buses
    services.resourced(session.address, {"level": "STOP", "checks": [
        {**DATA_OK, "level": "STOP", "reason": REASON, "free_bytes": 9 * 1024**3,
         "total_bytes": 100 * 1024**3, "free_pct": 9.0, "used_pct": 91.0},
        {**DATA_OK, "name": "ram", "type": "ram", "path": None, "level": "ERROR",
         "reason": "cannot read /proc/meminfo", "free_bytes": None, "total_bytes": None,
         "free_pct": None, "used_pct": None, "limits": {"warn_free_pct": 15}}]})
    env = {**os.environ, **session.env()}
    done = subprocess.run([sys.executable, "-m", "resourced.cli", "resources"], env=env,
                          capture_output=True, text=True, timeout=30, check=False)
    assert (done.returncode, done.stderr) == (0, "")
    lines = done.stdout.splitlines()
    assert lines[0].split() == ["CHECK", "TYPE", "PATH", "LEVEL", "FREE", "TOTAL", "USED%",
                                "LIMITS", "REASON"]
    assert lines[1].split()[:8] == ["data", "disk", "/data", "STOP", "9G", "100G", "91.0",
                                    "stop_free_gib=10"]
    assert lines[1].endswith(REASON)
    assert lines[2].split()[:8] == ["ram", "ram", "-", "ERROR", "-", "-", "-",
                                    "warn_free_pct=15"]
    assert lines[-1] == "health: STOP"

    done = subprocess.run([sys.executable, "-m", "resourced.cli", "resources", "--json"],
                          env=env, capture_output=True, text=True, timeout=30, check=False)
    data = json.loads(done.stdout)
    assert (done.returncode, data["source"], data["level"]) == (0, "daemon", "STOP")
    assert [c["name"] for c in data["checks"]] == ["data", "ram"]


def test_gpuctl_resources_measures_locally_when_the_daemon_is_unreachable(buses, tmp_path):
    session, _ = buses
    config = tmp_path / "config.toml"
    config.write_text(f"""
[[check]]
name = "tmp"
type = "disk"
path = "{tmp_path}"
warn_used_pct = 0

[[check]]
name = "gone"
type = "disk"
path = "{tmp_path}/gone"
stop_free_gib = 1
""")
    env = {**os.environ, **session.env(), "DBUS_SYSTEM_BUS_ADDRESS": "unix:path=/nonexistent"}
    done = subprocess.run([sys.executable, "-m", "resourced.cli", "resources", "--json",
                           "--config", str(config)], env=env, capture_output=True, text=True,
                          timeout=30, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stderr == f"daemon unreachable: measured locally from {config}\n"
    data = json.loads(done.stdout)
    assert data["source"] == "local"
    tmp, gone = data["checks"]
    assert (tmp["level"], tmp["reason"].startswith("used ")) == ("WARN", True)
    assert (gone["level"], gone["limits"]) == ("ERROR", {"stop_free_gib": 1})
    assert data["level"] == "WARN"

    done = subprocess.run([sys.executable, "-m", "resourced.cli", "resources", "--config",
                           str(tmp_path / "missing.toml")], env=env, capture_output=True,
                          text=True, timeout=30, check=False)
    assert done.returncode == 2
    assert done.stderr.startswith("gpuctl: ") and "Traceback" not in done.stderr


@pytest.mark.skipif(not all(shutil.which(tool) for tool in ("dunst", "dunstctl", "dbus-send",
                                                             "busctl", "Xvfb")),
                    reason="needs dunst, dunstctl, dbus-send, busctl and Xvfb (Debian: "
                           "apt-get install dunst dbus-bin systemd xvfb)")
def test_with_a_real_dunst(buses, services, agents, tmp_path, terminal):
    """dunst has actions: ``dunstctl action 0`` invokes the bubble's default action."""
    session, _ = buses
    display = f":{90 + os.getpid() % 50}"
    xvfb = subprocess.Popen(["Xvfb", display, "-nolisten", "tcp"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    env = {**os.environ, **session.env(), "DISPLAY": display}
    dunst = None
    try:
        eventually(lambda: os.path.exists(f"/tmp/.X11-unix/X{display[1:]}"), 10,
                   what="Xvfb's socket")
        dunst = subprocess.Popen(["dunst", "-config", "/dev/null"], env=env,
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        _, manager = services.resourced(session.address, health(data=("OK", "fine")))
        agent = agents({**session.env(), **terminal.env})
        agent.wait_log("(running)")

        def has_dunst():
            done = subprocess.run(["busctl", f"--address={session.address}", "status",
                                   "org.freedesktop.Notifications"],
                                  capture_output=True, timeout=5, check=False)
            return done.returncode == 0
        eventually(has_dunst, 10)
        services.emit(manager, "data", "OK", "STOP", REASON)
        agent.wait_log("the notification server supports actions")

        def clicked():
            # the bubble may not be on screen yet; "action 0" is the topmost one
            subprocess.run(["dunstctl", "action", "0"], env=env, capture_output=True,
                           timeout=5, check=False)
            return terminal.lines()
        eventually(clicked, 15, interval=0.5)
        assert terminal.lines()[0].endswith("gpuctl resources --bus session")
        services.emit(manager, "data", "STOP", "OK", "fine")   # closed bubbles go to history

        def in_history():
            done = subprocess.run(["dunstctl", "history"], env=env, capture_output=True,
                                  text=True, timeout=5, check=False)
            return "Disk /data is full" in done.stdout
        eventually(in_history, 10)
        assert "cannot show" not in agent.log()
    finally:
        for proc in (dunst, xvfb):
            if proc is not None:
                proc.terminate()
                proc.wait(5)


class FakeUser(ServiceInterface):
    """org.resourced.User: the per-user BookingChanged signal."""

    def __init__(self):
        super().__init__("org.resourced.User")

    @dbus_signal()
    def BookingChanged(self, booking_id: "s", what: "s", booking: "a{sv}") -> "ssa{sv}":
        return [booking_id, what, booking]


class NoticeManager(FakeManager):
    @dbus_signal()
    def NoticeAdded(self, notice_id: "s", text: "s") -> "ss":
        return [notice_id, text]


def _record(ref: str, ended_by: int = -1, reason: str = "") -> dict:
    from dbus_fast import Variant

    return {"Id": Variant("s", ref), "State": Variant("s", "ended"),
            "StartUSec": Variant("t", 1_796_115_600_000_000),
            "EndUSec": Variant("t", 1_796_119_200_000_000), "GPUIndices": Variant("au", [1]),
            "EndedBy": Variant("i", ended_by), "Reason": Variant("s", reason)}


def test_calendar_signals_of_mine_become_bubbles_and_others_do_not(buses, services, agents):
    session, _ = buses
    server = services.notifications(session.address)
    manager = NoticeManager(health())
    bus = services.run(services._serve(session.address, "org.resourced", "/org/resourced",
                                       manager))
    mine, theirs = FakeUser(), FakeUser()
    bus.export(f"/org/resourced/user/{os.getuid()}", mine)
    bus.export(f"/org/resourced/user/{os.getuid() + 1}", theirs)
    agent = agents(session.env())
    agent.wait_log("(running)")

    async def emit():
        theirs.BookingChanged("bother", "started", _record("bother"))
        mine.BookingChanged("bmine01", "created", _record("bmine01"))  # I did it: no bubble
        mine.BookingChanged("bmine01", "started", _record("bmine01"))
        mine.BookingChanged("bmine01", "ended", _record("bmine01", os.getuid() + 1,
                                                        "disk replacement"))
        manager.NoticeAdded("n1", "GPU 3 is replaced on Friday")
    services.run(emit())
    eventually(lambda: len(notifies(server)) >= 3)
    shown = [(args["summary"], args["body"], args["urgency"])
             for name, args in settled(services, manager, server) if name == "Notify"]
    assert shown[0][0] == "Booking bmine01 has started" and "gpu1" in shown[0][1]
    assert shown[1] == ("Booking bmine01 was cancelled by an administrator",
                        "disk replacement", 2)
    assert shown[2] == ("Notice from the administrators", "GPU 3 is replaced on Friday", 1)
    assert len(shown) == 3


def test_with_the_real_daemon_a_booking_ends_in_one_bubble_and_a_blackout_is_warned(
        clocked_daemon, clock, services, agents):
    daemon = clocked_daemon()
    server = services.notifications(daemon.bus.address)
    ref = gpuctl("book", "--gpus", "1", "--for", "1h", "--at", "10:00").stdout.strip()
    agent = agents({**daemon.bus.env(), "TZ": "UTC",
                    **{k: v for k, v in os.environ.items() if k.startswith("RESOURCED_SIMULATED")}})
    agent.wait_log("(running)")
    for start, end, reason in (("09:30", "09:45", "other"), ("10:30", "10:45", "driver update")):
        added = gpuctl("blackout", "add", "--from", start, "--until", end, "--reason", reason)
        assert added.returncode == 0, added.stderr

    def bubbles() -> list[str]:
        return [f"{n['summary']} | {n['body']}" for n in notifies(server)
                if not n["body"].startswith("marker ")]

    def signalled(count: int) -> list[str]:
        """The bubbles, once ``count`` have come and every signal the daemon sent with
        them is shown: the agent takes its signals in order, and a notice added now is
        signalled after them (its bubble is left out)."""
        eventually(lambda: len(bubbles()) >= count, 10)
        marker = f"marker {len(notifies(server))}"
        assert gpuctl("notice", "add", marker).returncode == 0
        eventually(lambda: any(n["body"] == marker for n in notifies(server)), 10)
        return bubbles()

    def timed(count: int) -> list[str]:
        """The bubbles, once ``count`` have come and the agent's blackout timer, which
        looks at the clock by itself, has had time to add one."""
        eventually(lambda: len(bubbles()) >= count, 10)
        time.sleep(1.5)  # nothing more may come: the agent's own timer looks once a second
        return bubbles()

    added = (f"Booking {ref} falls in a maintenance window | An administrator blocked that "
             "time; the booking stays. See gpuctl blackout list.")
    assert signalled(1) == [added]
    clock.set("2026-12-01T09:26:00Z")  # the other blackout is over none of my bookings
    assert len(timed(1)) == 1
    clock.set("2026-12-01T10:00:00Z")
    assert signalled(2)[1].startswith(f"Booking {ref} has started")
    clock.set("2026-12-01T10:26:00Z")  # warn_before (300 s) before the blackout over it
    assert timed(3)[2] == ("Maintenance begins at today 10:30 | driver update, until today "
                           f"10:45. Booking {ref} falls in it: save your work.")
    clock.set("2026-12-01T10:56:00Z")  # its claim's Ending and its "ending": one bubble
    ending = f"Booking {ref} ends at today 11:00 | Save your work: gpu0 go back then."
    assert signalled(4)[3:] == [ending]


def test_with_the_real_daemon_a_claim_of_mine_that_must_end_is_told_once(
        clocked_daemon, clock, services, agents, owner):
    """``Ending`` of a claim: the agent asks the daemon (the client's claim_properties)
    whether it is mine and not a booking's, then shows one bubble."""
    daemon = clocked_daemon()
    server = services.notifications(daemon.bus.address)
    agent = agents({**daemon.bus.env(), "TZ": "UTC",
                    **{k: v for k, v in os.environ.items() if k.startswith("RESOURCED_SIMULATED")}})
    agent.wait_log("(running)")
    claimed = gpuctl("claim", "--gpus", "1", "--for", "1h", "--owner-pid", str(owner.pid))
    assert claimed.returncode == 0, claimed.stderr
    ref = claimed.stdout.strip()
    clock.set("2026-12-01T09:56:00Z")  # warn_before (300 s) before its end at 10:00
    eventually(lambda: notifies(server), 10)
    assert [(n["summary"], n["body"]) for n in notifies(server)] == [
        (f"Claim {ref} must give its GPUs back at today 10:00", "Its time is up then.")]
