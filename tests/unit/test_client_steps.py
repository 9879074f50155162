"""The client's calls as steps (``resourced.client.steps``), run against a scripted bus:
what a call sends, how its answer is read, and the wait of a queued claim, blocking and
awaited alike."""

import asyncio
import collections
import inspect
import json

import pytest
from jeepney import DBusAddress, MessageType, new_method_call, new_signal
from jeepney.low_level import Endianness, Header, HeaderFields, Message

from resourced.client import connecting, steps, waiting
from resourced.client.calls import LEVEL_CHANGES, Calls, Leased
from resourced.errors import DaemonUnreachable, NoSuchClaim, QueueTimeout
from resourced.protocol.names import CLAIM_IFACE, MANAGER_IFACE, MANAGER_PATH


def grant(state: str = "granted") -> dict:
    return {"State": ("s", state), "Mode": ("s", "run"), "GPUUUIDs": ("as", ["GPU-a"]),
            "GPUIndices": ("au", [0]), "PCIIndices": ("au", [0]),
            "GPUMemoryBytes": ("at", [1]), "VRAMBytes": ("t", 0), "Pools": ("a{st}", {}),
            "Warnings": ("as", [])}


def claim_path(ref: str) -> str:
    return f"{MANAGER_PATH}/claim/{ref}"


DAEMON = ":1.7"  # the unique name owning org.resourced on the scripted bus
DRIVER = "org.freedesktop.DBus"


def signal(ref: str, member: str = "Granted", body=None, sender: str = DAEMON):
    if member in ("Granted", "Cancelled"):
        msg = new_signal(DBusAddress(claim_path(ref), interface=CLAIM_IFACE), member,
                         "a{sv}" if member == "Granted" else "s",
                         (grant() if body is None else body,))
    else:
        msg = new_signal(DBusAddress(MANAGER_PATH, interface=MANAGER_IFACE), member, "s", (ref,))
    msg.header.fields[HeaderFields.sender] = sender  # (the bus writes it; nobody forges it)
    return msg


def owner_changed(old: str, new: str, sender: str = DRIVER):
    msg = new_signal(DBusAddress("/org/freedesktop/DBus", interface=DRIVER),
                     "NameOwnerChanged", "sss", ("org.resourced", old, new))
    msg.header.fields[HeaderFields.sender] = sender
    return msg


def reply_to(serial: int, body=(), error: str | None = None):
    fields = {HeaderFields.reply_serial: serial}
    if error:
        fields[HeaderFields.error_name] = error
    kind = MessageType.error if error else MessageType.method_return
    return Message(Header(Endianness.little, kind, 0, 1, 0, -1, fields), body)


class Handle:
    def __init__(self, rule):
        self.rule = rule
        self.queue = collections.deque()


class Bus:
    """A scripted bus: ``answers`` by member (a body, an exception, or a list of them in
    turn), ``signals`` delivered one at a time as a call waits for the next message."""

    def __init__(self, answers=None, signals=(), owner: str | None = DAEMON):
        self.answers = dict(answers or {})
        self.signals = list(signals)
        self.handles = []
        self.sent = []  # (what, member, body) to the daemon, and the signals asked for
        self.owner = owner  # org.resourced's owner, as the bus driver answers it
        self.driver = []  # what was asked of the bus driver to follow the owner

    def answer(self, member):
        found = self.answers[member]
        if isinstance(found, list):
            found = found.pop(0) if len(found) > 1 else found[0]
        if isinstance(found, BaseException):
            raise found
        return found

    def deliver(self, msg):
        for handle in self.handles:
            if handle.rule.matches(msg):
                handle.queue.append(msg)

    def perform(self, step):
        if isinstance(step, steps.Listen):
            self.handles.append(Handle(step.rule))
            return self.handles[-1]
        if isinstance(step, steps.Post):
            member = step.message.header.fields[HeaderFields.member]
            self.sent.append(("post", member, step.message.body))
            found = self.answer(member)
            if isinstance(found, Message):
                found.header.fields[HeaderFields.reply_serial] = step.serial
                self.deliver(found)
            elif found is not None:
                self.deliver(reply_to(step.serial, found))
            return None
        if isinstance(step, steps.Next):
            while not step.handle.queue:
                if not self.signals:
                    raise TimeoutError
                found = self.signals.pop(0)
                if isinstance(found, BaseException):
                    raise found
                self.deliver(found)
            return step.handle.queue.popleft()
        if isinstance(step, steps.Subscribe):
            if step.rule.header_fields.get("sender") == DRIVER:
                self.driver.append(("Subscribe", step.rule.header_fields.get("member")))
            else:
                self.sent.append(("Subscribe", None, step.rule))
            return None
        if isinstance(step, steps.Raw):
            member = step.message.header.fields[HeaderFields.member]
            assert member == "GetNameOwner", member
            self.driver.append(("call", member))
            return (reply_to(0, (self.owner,)) if self.owner else
                    reply_to(0, ("no owner",), "org.freedesktop.DBus.Error.NameHasNoOwner"))
        if isinstance(step, steps.Sleep):
            self.sent.append(("Sleep", None, step.seconds))
            return None
        member = step.header.fields[HeaderFields.member]
        self.sent.append(("call", member, step.body))
        return self.answer(member)

    async def perform_async(self, step):
        await asyncio.sleep(0)
        return self.perform(step)

    def members(self):
        return [member for _, member, _ in self.sent]


@pytest.fixture
def client():
    return Calls(bus="session", timeout=5)


def test_a_call_sends_its_message_and_reads_its_answer(client):
    bus = Bus({"Get": (("u", 3),)})
    assert steps.run(Calls.free.steps(client), bus.perform) == 3
    assert bus.sent == [("call", "Get", (MANAGER_IFACE, "FreeGPUs"))]


def test_an_error_answer_is_raised_inside_the_call_which_may_catch_it(client):
    bus = Bus({"Release": NoSuchClaim("gone")})
    lease = Leased(client, {"allocation": {"ref": "c1"}, "env": {}, "warnings": []})
    steps.run(Leased.release.steps(lease), bus.perform)
    assert lease.released and bus.members() == ["Release"]
    with pytest.raises(NoSuchClaim):
        steps.run(Calls.release.steps(client, "c1"), bus.perform)


def test_a_held_wait_answers_with_the_grant(client):
    bus = Bus({"Claim": ("c1", claim_path("c1"), grant())})
    got = steps.run(Calls.claim.steps(client, gpus=1, wait=True), bus.perform)
    assert got["allocation"]["ref"] == "c1"
    [(what, _, (_, options))] = bus.sent
    assert what == "post" and options["ReplyWhenGranted"] == ("b", True)


def test_a_queued_claim_is_granted_by_its_own_signal(client):
    bus = Bus({"Claim": ("c1", claim_path("c1"), grant("queued"))},
              signals=[signal("c2"), signal("c1")])
    got = steps.run(Calls.claim.steps(client, gpus=1, wait=True, timeout=9), bus.perform)
    assert got["allocation"]["ref"] == "c1" and bus.members() == ["Claim"]


def test_a_cancelled_claim_raises_its_reason_and_leaves_no_trace(client):
    bus = Bus({"Claim": ("c1", claim_path("c1"), grant("queued")),
               "Release": NoSuchClaim("gone")},
              signals=[signal("c1", "Cancelled", "timeout")])
    with pytest.raises(QueueTimeout, match="c1"):
        steps.run(Calls.claim.steps(client, gpus=1, wait=True), bus.perform)
    assert bus.members() == ["Claim", "Release"]


def test_the_clients_own_limit_is_a_queue_timeout_and_the_claim_leaves(client):
    bus = Bus({"Claim": ("c1", claim_path("c1"), grant("queued")), "Release": ([],)})
    with pytest.raises(QueueTimeout, match="not granted in time"):
        steps.run(Calls.claim.steps(client, gpus=1, wait=True, timeout=0), bus.perform)
    assert bus.members() == ["Claim", "Release"]


def test_an_interrupted_held_wait_finds_its_claim_by_the_call_and_takes_it_out(client):
    bus = Bus({"Claim": None, "GetClaimByCall": ("c1", claim_path("c1"), grant()),
               "Release": ([],)}, signals=[KeyboardInterrupt()])
    with pytest.raises(KeyboardInterrupt):
        steps.run(Calls.claim.steps(client, gpus=1, wait=True), bus.perform)
    assert bus.members() == ["Claim", "GetClaimByCall", "Release"]
    serial = bus.sent[1][2][0]
    assert serial >= 1 << 31


def test_a_claim_interrupted_before_its_answer_is_taken_out_with_progress_too(client):
    bus = Bus({"Claim": None, "GetClaimByCall": ("c1", claim_path("c1"), grant("queued")),
               "Release": ([],)}, signals=[KeyboardInterrupt()])
    with pytest.raises(KeyboardInterrupt):
        steps.run(Calls.claim.steps(client, gpus=1, wait=True, progress=print), bus.perform)
    assert bus.members() == ["Claim", "GetClaimByCall", "Release"]


def test_a_daemon_restarted_under_a_held_call_is_asked_again_by_the_call(client):
    bus = Bus({"Claim": reply_to(0, ("gone",), error=waiting.NO_REPLY),
               "GetClaimByCall": [DaemonUnreachable("restarting"),
                                  ("c1", claim_path("c1"), grant("queued"))]},
              signals=[signal("c1")])
    got = steps.run(Calls.claim.steps(client, gpus=1, wait=True), bus.perform)
    assert got["allocation"]["ref"] == "c1"
    assert bus.members() == ["Claim", "GetClaimByCall", None, "GetClaimByCall"]


def test_progress_is_told_the_place_in_the_queue_as_it_moves(client):
    view = {"claims": [{"id": "c0", "state": "granted", "gpu_uuids": ["GPU-a"], "pools": {}},
                       {"id": "c1", "state": "queued", "gpus_requested": 1, "vram_bytes": 0,
                        "gpu_uuids": [], "pools": {}}],
            "queue": ["c1"], "pools": [{"name": "cpu", "unit": ""}]}
    bus = Bus({"Claim": ("c1", claim_path("c1"), grant("queued")),
               "Describe": (json.dumps(view),)},
              signals=[signal("c9", "ClaimNew"), signal("c1")])
    told = []
    steps.run(Calls.claim.steps(client, gpus=1, wait=True, progress=told.append), bus.perform)
    assert [(t["position"], t["waiting"], [h["id"] for h in t["holders"]]) for t in told] == [
        (1, 1, ["c0"]), (1, 1, ["c0"])]
    assert bus.sent[0][0] == "post" and "ReplyWhenGranted" not in bus.sent[0][2][1]
    assert ("Subscribe", None, waiting.QUEUE_CHANGES) in bus.sent


def test_awaited_the_same_steps_run_the_same_way(client):
    bus = Bus({"Claim": ("c1", claim_path("c1"), grant("queued"))}, signals=[signal("c1")])
    got = asyncio.run(steps.run_async(Calls.claim.steps(client, gpus=1, wait=True),
                                      bus.perform_async))
    assert got["allocation"]["ref"] == "c1"


def test_a_cancelled_await_takes_the_claim_out_of_the_queue(client):
    bus = Bus({"Claim": ("c1", claim_path("c1"), grant("queued")), "Release": ([],)},
              signals=[asyncio.CancelledError()])
    with pytest.raises(asyncio.CancelledError):
        asyncio.run(steps.run_async(Calls.claim.steps(client, gpus=1, wait=True),
                                    bus.perform_async))
    assert bus.members() == ["Claim", "Release"]


def level(check, new, sender=DAEMON):
    msg = new_signal(DBusAddress(MANAGER_PATH, interface=MANAGER_IFACE), "LevelChanged",
                     "ssss", (check, "OK", new, "why"))
    msg.header.fields[HeaderFields.sender] = sender
    return msg


def test_a_stream_hands_out_what_it_emits_and_stops_when_closed(client):
    bus = Bus(signals=[level("ram", "WARN"), level("disk", "STOP"),
                                         level("disk", "OK")])
    changes = steps.iterate(Calls.level_changes.steps(client, "disk"), bus.perform)
    assert next(changes)["new"] == "STOP"
    assert next(changes)["new"] == "OK"
    changes.close()
    assert bus.sent == [("Subscribe", None, LEVEL_CHANGES)]
    stop = steps.run(Calls.wait_level_change.steps(client, levels=("STOP",)),
                     Bus(signals=[level("ram", "WARN"), level("disk", "STOP")]).perform)
    assert stop["check"] == "disk"
    with pytest.raises(TimeoutError):
        steps.run(Calls.wait_level_change.steps(client, timeout=0), Bus().perform)


def test_a_definition_becomes_a_blocking_or_an_async_method_with_its_signature():
    class Both(steps.Defined):
        @steps.call
        def twice(self, n: int, *, also: str = "") -> int:
            """Twice n."""
            return 2 * (yield n)

    class Blocking(Both):
        _blocking = True

        def _run(self, call_steps):
            return steps.run(call_steps, lambda n: n + 1)

    class Awaited(Both):
        _blocking = False

        async def _run(self, call_steps):
            async def perform(n):
                return n + 1
            return await steps.run_async(call_steps, perform)

    assert Blocking().twice(2) == 6
    assert asyncio.run(Awaited().twice(2)) == 6
    assert inspect.iscoroutinefunction(Awaited.twice)
    assert str(inspect.signature(Awaited().twice)) == "(n: int, *, also: str = '') -> int"
    assert Awaited.twice.__doc__ == Blocking.twice.__doc__ == "Twice n."


def connect(client, session=None, answers=None):
    """Run the connecting steps against buses that open (or raise ``session``) and answer
    ``answers`` by member; what was done, and the bus chosen."""
    done = []

    def perform(step):
        if isinstance(step, steps.Open):
            done.append(("open", step.address))
            if step.address == "SESSION" and session is not None:
                raise session
            return None
        if isinstance(step, steps.Shut):
            done.append(("shut", None))
            return None
        member = step.message.header.fields[HeaderFields.member]
        done.append(("ask", member))
        return reply_to(0, answers[member])

    return steps.run(connecting.connect(client), perform), done


def test_the_session_bus_is_chosen_where_the_daemon_runs_or_can_start(monkeypatch):
    monkeypatch.delenv("RESOURCED_BUS", raising=False)
    monkeypatch.setattr(connecting.discovery, "preset_bus", lambda bus: bus)
    client = Calls(timeout=5)
    assert connect(client, answers={"NameHasOwner": (True,)}) == (
        "session", [("open", "SESSION"), ("ask", "NameHasOwner")])
    bus, done = connect(client, answers={"NameHasOwner": (False,),
                                         "ListActivatableNames": (["org.resourced"],)})
    assert bus == "session" and done[-1] == ("ask", "ListActivatableNames")
    bus, done = connect(client, answers={"NameHasOwner": (False,), "ListActivatableNames": ([],)})
    assert bus == "system" and done[-2:] == [("shut", None), ("open", "SYSTEM")]


def test_a_refused_session_socket_is_remembered_and_the_system_bus_tried(monkeypatch):
    monkeypatch.delenv("RESOURCED_BUS", raising=False)
    monkeypatch.setattr(connecting.discovery, "preset_bus", lambda bus: bus)
    client = Calls(timeout=5)
    refused = PermissionError(13, "Permission denied")
    assert connect(client, session=refused) == ("system", [("open", "SESSION"),
                                                          ("open", "SYSTEM")])
    assert client._session_refused is refused
    assert connect(Calls(bus="session", timeout=5))[1] == [("open", "SESSION")]


MANAGER = DBusAddress(MANAGER_PATH, bus_name="org.resourced", interface=MANAGER_IFACE)


@pytest.mark.parametrize("name, kwargs, method, signature, body", [
    ("release", {"ref": "c1", "force": True}, "Release", "st", ("c1", 1)),
    ("stop", {"session": "s", "dry_run": True}, "Stop", "a{sv}",
     ({"Session": ("s", "s"), "DryRun": ("b", True)},)),
    ("claim_job", {"job": "7", "gpus": ["0"], "name": "n"}, "ClaimJob", "sasa{sv}",
     ("7", ["0"], {"Name": ("s", "n")})),
    ("status_json", {}, "Describe", None, ()),
    ("bookings_json", {"all_users": True, "limit": 5}, "ListBookings", "a{sv}",
     ({"All": ("b", True), "Limit": ("u", 5)},)),
    ("report_job", {"ref": "b1", "state": "running"}, "ReportJob", "ssis",
     ("b1", "running", -1, "")),
    ("remove_notice", {"notice_id": "n1"}, "RemoveNotice", "s", ("n1",)),
])
def test_a_call_sends_the_message_the_bus_api_documents(name, kwargs, method, signature, body):
    sent = []

    def perform(step):
        sent.append(step)
        raise TimeoutError  # (what comes back does not matter here)

    with pytest.raises(TimeoutError):
        steps.run(getattr(Calls, name).steps(Calls(bus="session"), **kwargs), perform)
    expected = new_method_call(MANAGER, method, signature, body)
    assert sent[0].serialise(serial=3) == expected.serialise(serial=3)


# -- signals from anyone but the daemon (anyone may send a connection a signal) ----------
STRANGER = ":1.66"


def test_a_forged_grant_or_cancel_is_ignored_and_the_daemons_own_is_taken(client):
    bus = Bus({"Claim": ("c1", claim_path("c1"), grant("queued"))},
              signals=[signal("c1", "Cancelled", "forged", sender=STRANGER),
                       signal("c1", body={**grant(), "GPUUUIDs": ("as", ["GPU-theirs"])},
                              sender=STRANGER),
                       signal("c1")])
    got = steps.run(Calls.claim.steps(client, gpus=1, wait=True, timeout=9), bus.perform)
    assert got["env"]["CUDA_VISIBLE_DEVICES"] == "GPU-a"
    assert bus.members() == ["Claim"]
    assert bus.driver == [("Subscribe", "NameOwnerChanged"), ("call", "GetNameOwner")]


def test_only_forged_outcomes_leave_the_claim_waiting_until_its_time(client):
    bus = Bus({"Claim": ("c1", claim_path("c1"), grant("queued")), "Release": ([],)},
              signals=[signal("c1", sender=STRANGER), signal("c1", "Cancelled", "x",
                                                             sender=STRANGER)])
    with pytest.raises(QueueTimeout, match="not granted in time"):
        steps.run(Calls.claim.steps(client, gpus=1, wait=True, timeout=9), bus.perform)


def test_a_restarted_daemons_grant_counts_once_the_bus_driver_says_it_owns_the_name(client):
    bus = Bus({"Claim": ("c1", claim_path("c1"), grant("queued"))},
              signals=[owner_changed(DAEMON, ":1.9", sender=STRANGER),  # forged: ignored
                       signal("c1", sender=":1.9"),                     # so is this
                       owner_changed(DAEMON, ""), owner_changed("", ":1.9"),
                       signal("c1", sender=":1.9",
                              body={**grant(), "GPUUUIDs": ("as", ["GPU-b"])})])
    got = steps.run(Calls.claim.steps(client, gpus=1, wait=True, timeout=9), bus.perform)
    assert got["env"]["CUDA_VISIBLE_DEVICES"] == "GPU-b"


def test_level_changes_are_the_daemons_alone(client):
    bus = Bus(signals=[level("disk", "STOP", sender=STRANGER), level("disk", "WARN")])
    assert steps.run(Calls.wait_level_change.steps(client), bus.perform)["new"] == "WARN"
    with pytest.raises(TimeoutError):  # no daemon: nothing is anybody's to say
        steps.run(Calls.wait_level_change.steps(client, timeout=0),
                  Bus(signals=[level("disk", "STOP", sender=STRANGER)], owner=None).perform)


def test_a_lease_prints_as_what_it_holds_and_whether_it_still_does(client):
    from resourced.client.sync import Lease

    gpus = Lease(client, {"allocation": {"ref": "c1", "gpu_uuids": ["GPU-a", "GPU-b"]},
                          "env": {}, "warnings": []})
    assert repr(gpus) == "<Lease c1: GPU-a, GPU-b, held>"
    pool = Lease(client, {"allocation": {"ref": "c2", "gpu_uuids": [], "pools": {"cpu": 4}},
                          "env": {}, "warnings": []})
    pool.released = True
    assert repr(pool) == "<Lease c2: cpu 4, released>"
