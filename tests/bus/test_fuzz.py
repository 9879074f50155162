"""A seeded fuzzer over the whole bus API that dbus/org.resourced.xml documents.

Every method and property of every interface in the golden XML is called, on the live
objects that implement it and on bogus or stale ones, with hostile values (the edges of
each integer type, 1 MB strings, huge arrays, unknown and ill-typed a{sv} options, stale
and bogus references), wrong signatures, missing arguments, Properties Get/GetAll/Set on
unknown names and Set on read-only properties, and strings of invalid UTF-8 (the bus
itself drops a sender of those). The daemon must stay up, answer Ping within 2 s
throughout (a bound against a call that holds its loop, with margin for a loaded machine:
the slowest ping is in the report; latency figures belong to benchmarks/), reply to every call with a return or a named error, and log no traceback.

The seed fixes every choice; what the calls name that came from the daemon's replies
(claim ids, pids, UUIDs) differs from run to run, so a failure lists its calls in full.
RESOURCED_FUZZ_CALLS sets the number of calls (too few to reach every member fails the
coverage check), RESOURCED_FUZZ_SEED the seed. Both are read at import, before the fixtures
clear RESOURCED_* from the environment.
"""

import math
import os
import re
import reprlib
import threading
import time
import xml.etree.ElementTree as ET
from collections import Counter
from dataclasses import dataclass
from random import Random

from jeepney import DBusAddress, HeaderFields, MessageType, new_method_call
from jeepney.io.blocking import open_dbus_connection

from ..conftest import ROOT

CALLS = int(os.environ.get("RESOURCED_FUZZ_CALLS", "8000"))
SEED = int(os.environ.get("RESOURCED_FUZZ_SEED", "1729"))
GOLDEN = ROOT / "dbus" / "org.resourced.xml"
NAME = "org.resourced"
MANAGER_PATH = "/org/resourced"
PROPERTIES = "org.freedesktop.DBus.Properties"
CLAIM = "org.resourced.Claim"
STANDARD = (PROPERTIES, "org.freedesktop.DBus.Introspectable", "org.freedesktop.DBus.Peer",
            "org.freedesktop.DBus.ObjectManager")
PING_INTERVAL = 0.02
PING_LIMIT = 2.0
REFRESH_EVERY = 100
"""Calls between two looks at the daemon's objects (and whether it still runs)."""
REPLY_TIMEOUT = 5.0
METHOD_WEIGHT = 3
"""A method comes up this many times per argument (and per documented key) as a property."""
MIN_CLAIMS = 3
"""Fewer live Claim objects than this, and a few more are made (waiters always are)."""

INTS = {"y": (0, 2**8 - 1), "n": (-2**15, 2**15 - 1), "q": (0, 2**16 - 1),
        "i": (-2**31, 2**31 - 1), "u": (0, 2**32 - 1), "x": (-2**63, 2**63 - 1),
        "t": (0, 2**64 - 1)}
FLOATS = (0.0, -0.0, 1.0, -1.0, 0.5, 1e308, -1e308, 5e-324, math.inf, -math.inf, math.nan)
TYPES = ("s", "u", "i", "t", "x", "b", "d", "y", "n", "q", "o", "g", "v", "as", "au", "ay",
         "a{sv}", "a{ss}", "a{st}", "(su)", "aa{sv}")
SIGNATURES = ("", "s", "v", "a{sv}", "(uu)", "a" * 32 + "u")
MEGABYTE = "x" * 2**20
HOSTILE_STRINGS = ("", " ", "\n\t\r", "é☃\U0001F600\u202e", "../../../etc/passwd", "%s%n%x{0}",
                   "/org/resourced", "-1", "4294967296", "0x10", "GPU-", "1e3", "a" * 256,
                   "b" * 65536, "zzzzzzzz", "c" + "0" * 100, "*", "gpu0,gpu1")
BOGUS_PATHS = ("/", "/org", "/org/resourced/claim", "/org/resourced/claim/zzzzzzzz",
               "/org/resourced/claim/_", "/org/resourced/gpu/4294967295",
               "/org/resourced/gpu/0/x", "/org/resourced/pool/nosuch",
               "/org/resourced/check/_ff", "/org/resourced/" + "/".join("n" * 200))
BOGUS_MEMBERS = ("Bogus", "claim", "Release_", "Ping", "Introspect", "Get", "x" * 255)
# The bus drops a sender whose message holds invalid UTF-8: a string equal to the mark is
# sent, on a connection of its own, with these bytes (of the same length) in its place.
INVALID_UTF8_MARK = "@@invalid-utf8@@"
INVALID_UTF8 = b"\xc3\x28\xa0\xa1\xe2\x28\xa1\xf0\x28\x8c\xbc\xf0\x90\x28\xff\xfe"
DROPPED = "dropped by the bus"
HELD = "held while its claim waits"
HELD_WAIT = 0.3
"""Seconds a Claim with ReplyWhenGranted is given to answer before GetClaimByCall is to
confirm that it is kept because its claim waits."""
UNNAMED = {f"org.freedesktop.DBus.Error.{name}" for name in (
    "Failed",  # the catch-all
    "NoReply", "ServiceUnknown", "NameHasNoOwner", "Disconnected",  # from the bus: no daemon
)}
# Documented keys of an a{sv}, like "OwnerPID u (" or "Label s,".
DOC_KEY = re.compile(r"\b([A-Z]\w*) (a+\{s[ybnqiuxtdsogv]\}|a*[ybnqiuxtdsogv])(?=[\s,.;)])")
SHORT = reprlib.Repr()  # calls in reports: long strings and arrays cut short
SHORT.maxstring = SHORT.maxother = 60
SHORT.maxlist = SHORT.maxdict = SHORT.maxtuple = 4


@dataclass(frozen=True)
class Method:
    interface: str
    name: str
    signature: tuple[str, ...]
    keys: tuple[tuple[str, str], ...]
    """The a{sv} keys (with their types) that the method's documentation names."""


@dataclass
class Api:
    methods: list[Method]
    properties: dict[str, dict[str, str]]
    words: list[str]
    """The quoted words of the documentation ("run", "dev", ...)."""


def load_api(xml: str) -> Api:
    """Every interface, method (with its documentation's a{sv} keys) and property of ``xml``."""
    root = ET.fromstring(xml, ET.XMLParser(target=ET.TreeBuilder(insert_comments=True)))
    methods, properties = [], {}
    for iface in root.iter("interface"):
        name, doc = iface.get("name"), ""
        properties[name] = {}
        for el in iface:
            if el.tag is ET.Comment:
                doc = el.text
                continue
            if el.tag == "method":
                ins = tuple(a.get("type") for a in el.iter("arg") if a.get("direction") == "in")
                keys = tuple(dict.fromkeys(DOC_KEY.findall(doc)))
                methods.append(Method(name, el.get("name"), ins, keys))
            elif el.tag == "property":
                properties[name][el.get("name")] = el.get("type")
            doc = ""
    words = re.findall(r'"([^"\s]+)"', " ".join(c.text for c in root.iter(ET.Comment)))
    return Api(methods, properties, list(dict.fromkeys(words)))


def split_signature(sig: str) -> list[str]:
    """The complete types of a signature: "ua{sv}(su)" -> ["u", "a{sv}", "(su)"]."""
    types, start, depth = [], 0, 0
    for i, c in enumerate(sig):
        depth += c in "({"
        depth -= c in ")}"
        if depth == 0 and c != "a":
            types.append(sig[start:i + 1])
            start = i + 1
    return types


def is_named(error: str) -> bool:
    """A named error: ours but Internal, or a standard one but those of UNNAMED."""
    if error.startswith("org.resourced.Error."):
        return error != "org.resourced.Error.Internal"
    return error.startswith("org.freedesktop.DBus.Error.") and error not in UNNAMED


@dataclass
class Call:
    path: str
    interface: str | None
    member: str
    signature: str
    body: tuple

    def message(self):
        address = DBusAddress(self.path, NAME, self.interface)
        return new_method_call(address, self.member, self.signature or None, self.body)

    def __str__(self):
        return (f"{self.path} {self.interface}.{self.member} "
                f"sig={self.signature!r} body={SHORT.repr(self.body)}")


class Generator:
    """Calls drawn from ``rng``: every documented member in turn, each time a hostile way.

    Collections that ``rng`` chooses from are dicts used as ordered sets, so that a seed
    makes the same choices whatever the string hash seed."""

    def __init__(self, rng: Random, api: Api, pids: list[int]):
        self.rng = rng
        self.api = api
        self.all_keys = tuple(dict.fromkeys(k for m in api.methods for k in m.keys))
        self.targets = [m for m in api.methods
                        for _ in range(METHOD_WEIGHT * (1 + len(m.signature) + len(m.keys)))]
        self.targets += [(i, p) for i, props in api.properties.items() for p in props]
        self.round: list = []
        self.covered: set = set()
        self.strings = dict.fromkeys([*api.words, *api.properties,
                                      *(p for props in api.properties.values() for p in props)])
        self.ints = dict.fromkeys(pids)
        self.objects: dict[str, set[str]] = {}
        self.paths = dict.fromkeys(BOGUS_PATHS)

    def learn(self, value) -> None:
        """Keep the strings and numbers of a reply, so that later calls name real things."""
        if isinstance(value, str):
            if len(value) <= 256:
                self.strings[value] = None
        elif isinstance(value, int) and not isinstance(value, bool):
            self.ints[value] = None
        elif isinstance(value, dict):
            self.learn(list(value.items()))
        elif isinstance(value, (list, tuple)):
            for v in value:
                self.learn(v)

    def set_objects(self, objects: dict[str, set[str]]) -> None:
        """The live objects, as introspected; their paths stay on as stale ones later."""
        self.objects = objects
        self.paths.update(dict.fromkeys(objects))
        for path in objects:
            self.strings[path.rsplit("/", 1)[-1]] = None  # claim ids, GPU indices, pool names

    def live(self, interface: str) -> list[str]:
        return sorted(p for p, ifaces in self.objects.items() if interface in ifaces)

    def next_call(self) -> Call:
        if not self.round:
            self.round = self.rng.sample(self.targets, len(self.targets))
        target = self.round.pop()
        if self.rng.random() < 0.08:
            return self.odd_call(target)
        if isinstance(target, Method):
            return self.method_call(target)
        return self.property_call(*target)

    def path_for(self, interface: str) -> str:
        live = self.live(interface)
        if live and self.rng.random() < 0.9:
            return self.rng.choice(live)
        return self.rng.choice(list(self.paths))

    def method_call(self, m: Method) -> Call:
        r = self.rng
        sig = m.signature if r.random() < 0.75 else self.wrong_signature(m.signature)
        body = tuple(self.value(t, m.keys) for t in sig)
        interface = m.interface if r.random() < 0.95 else None
        call = Call(self.path_for(m.interface), interface, m.name, "".join(sig), body)
        if sig == m.signature and call.path in self.live(m.interface):
            self.covered.add((m.interface, m.name))
        return call

    def property_call(self, interface: str, prop: str) -> Call:
        r = self.rng
        target, path = (interface, prop), self.path_for(interface)
        right = path in self.live(interface)
        if r.random() < 0.15:
            interface = r.choice([*self.api.properties, *STANDARD, "", "org.bogus.Nope"])
            right = False
        if r.random() < 0.15:
            prop, right = self.string(), False
        ptype = self.api.properties.get(interface, {}).get(prop) or r.choice(TYPES)
        member, sig, body = r.choice([
            ("Get", ("s", "s"), (interface, prop)),
            ("Get", ("s", "s"), (interface, prop)),
            ("GetAll", ("s",), (interface,)),
            ("Set", ("s", "s", "v"), (interface, prop, self.variant(ptype))),
        ])
        if r.random() < 0.1:
            sig, right = self.wrong_signature(sig), False
            body = tuple(self.value(t) for t in sig)
        if right:
            self.covered.add(target)
        return Call(path, PROPERTIES, member, "".join(sig), body)

    def odd_call(self, target) -> Call:
        """A member that the interface lacks, a standard interface, or the wrong object."""
        r = self.rng
        interface = target.interface if isinstance(target, Method) else target[0]
        path = r.choice([self.path_for(interface), *self.paths])
        member, iface = r.choice([
            (r.choice(BOGUS_MEMBERS), interface),
            ("Introspect", "org.freedesktop.DBus.Introspectable"),
            ("GetMachineId", "org.freedesktop.DBus.Peer"),
            ("Ping", "org.freedesktop.DBus.Peer"),
            ("GetManagedObjects", "org.freedesktop.DBus.ObjectManager"),
            (r.choice(self.api.methods).name, r.choice([*self.api.properties, "org.bogus.Nope"])),
        ])
        sig = () if r.random() < 0.7 else self.wrong_signature(())
        return Call(path, iface, member, "".join(sig), tuple(self.value(t) for t in sig))

    def wrong_signature(self, sig: tuple[str, ...]) -> tuple[str, ...]:
        r = self.rng
        pick = r.randrange(4)
        if pick == 0 and sig:
            return sig[:r.randrange(len(sig))]  # missing arguments
        if pick == 1:
            return (*sig, r.choice(TYPES))  # one too many
        if pick == 2 and sig:
            return tuple(r.choice(TYPES) if r.random() < 0.5 else t for t in sig)
        return tuple(r.choice(TYPES) for _ in range(r.randrange(4)))

    # -- values ----------------------------------------------------------------------------
    def value(self, sig: str, keys=()):
        """A value of the complete type ``sig``, hostile more often than not; ``keys`` are
        the documented keys (and types) to use for an a{sv}."""
        r = self.rng
        if sig in INTS:
            lo, hi = INTS[sig]
            pick = r.random()
            if pick < 0.4:
                return r.choice([lo, hi, 0, 1, 2, hi // 2 + 1, -1 if lo else 3])
            if pick < 0.8:  # a number seen in a reply (a pid, an index, a size), clamped
                return min(max(r.choice(list(self.ints)), lo), hi)
            return r.randint(lo, hi)
        if sig == "b":
            return r.random() < 0.5
        if sig == "d":
            return r.choice(FLOATS)
        if sig == "s":
            return self.string()
        if sig == "o":
            return r.choice(list(self.paths))
        if sig == "g":
            return r.choice(SIGNATURES)
        if sig == "v":
            return self.variant(r.choice(TYPES))
        if sig == "ay":
            return r.randbytes(r.choice([0, 1, 16, 4096]))
        if sig == "a{sv}":
            return self.options(keys or self.all_keys)
        if sig.startswith("a{"):
            k, v = split_signature(sig[2:-1])
            return {self.value(k): self.value(v) for _ in range(r.choice([0, 1, 2, 3]))}
        if sig.startswith("a"):
            item = sig[1:]
            if item in INTS and r.random() < 0.05:
                return [self.value(item)] * 10000  # a huge array of one hostile number
            return [self.value(item) for _ in range(r.choice([0, 1, 2, 3]))]
        if sig.startswith("("):
            return tuple(self.value(t) for t in split_signature(sig[1:-1]))
        raise AssertionError(f"no values for type {sig!r}")

    def variant(self, sig: str) -> tuple:
        return (sig, self.value(sig))

    def string(self) -> str:
        r = self.rng
        pick = r.random()
        if pick < 0.02:
            return MEGABYTE
        if pick < 0.03:
            return INVALID_UTF8_MARK
        if pick < 0.7:
            return r.choice(list(self.strings))
        return r.choice(HOSTILE_STRINGS)

    def options(self, keys) -> dict:
        """An a{sv}: documented keys with their types, or any type; unknown keys too."""
        r = self.rng
        out = {}
        for _ in range(r.choice([0, 1, 1, 2, 2, 3, 4])):
            if keys and r.random() < 0.8:
                key, sig = r.choice(keys)
                if r.random() < 0.1:
                    sig = r.choice(TYPES)
            else:
                key, sig = self.string(), r.choice(TYPES)
            out[key] = self.variant(sig)
        return out


class Wire:
    """A jeepney connection to the bus, for messages of any signature and body."""

    def __init__(self, address: str):
        self.address = address
        self.conn = open_dbus_connection(address)

    def call(self, call: Call) -> tuple[str, object]:
        """("return", body), ("error", (name, message)), ("timeout", None) or (DROPPED, why)."""
        msg = call.message()
        if INVALID_UTF8_MARK.encode() in msg.serialise(serial=1):
            return self._invalid_utf8(msg)
        if call.member == "Claim" and call.body and isinstance(call.body[-1], dict) and \
                call.body[-1].get("ReplyWhenGranted") == ("b", True):
            return self._may_be_held(msg)
        try:
            return _sort(self.conn.send_and_get_reply(msg, timeout=REPLY_TIMEOUT))
        except TimeoutError:
            return "timeout", None

    def _may_be_held(self, msg) -> tuple[str, object]:
        """A Claim with ReplyWhenGranted: its answer, or HELD where GetClaimByCall finds
        its claim waiting (the answer comes at the grant, and is then ignored)."""
        serial = next(self.conn.outgoing_serial)
        self.conn.send(msg, serial=serial)
        deadline = time.monotonic() + HELD_WAIT
        try:
            while True:
                reply = self.conn.receive(timeout=max(0.0, deadline - time.monotonic()))
                if reply.header.fields.get(HeaderFields.reply_serial) == serial:
                    return _sort(reply)
        except TimeoutError:
            pass
        kind, body = self.call(Call(MANAGER_PATH, "org.resourced.Manager", "GetClaimByCall",
                                    "u", (serial,)))
        if kind == "return" and body[2]["State"][1] == "queued":
            return HELD, body[0]
        return "timeout", None

    def _invalid_utf8(self, msg) -> tuple[str, object]:
        """Send ``msg`` with invalid UTF-8 in place of the mark, on a connection of its own."""
        with open_dbus_connection(self.address) as conn:
            serial = next(conn.outgoing_serial)
            data = msg.serialise(serial=serial)
            conn.sock.sendall(data.replace(INVALID_UTF8_MARK.encode(), INVALID_UTF8))
            deadline = time.monotonic() + REPLY_TIMEOUT
            try:
                while True:
                    reply = conn.receive(timeout=max(0.0, deadline - time.monotonic()))
                    if reply.header.fields.get(HeaderFields.reply_serial) == serial:
                        return _sort(reply)
            except TimeoutError:
                return "timeout", None
            except OSError as exc:
                return DROPPED, exc

    def ping(self) -> float:
        """Seconds that a Peer.Ping to the daemon takes to return; inf if it does not."""
        msg = new_method_call(DBusAddress(MANAGER_PATH, NAME, "org.freedesktop.DBus.Peer"),
                              "Ping")
        start = time.monotonic()
        try:
            reply = self.conn.send_and_get_reply(msg, timeout=REPLY_TIMEOUT)
        except TimeoutError:
            return math.inf
        if reply.header.message_type is not MessageType.method_return:
            return math.inf
        return time.monotonic() - start

    def objects(self, interfaces) -> dict[str, set[str]] | None:
        """Each object of the daemon with those of ``interfaces`` that it has (introspected);
        None when the daemon does not answer."""
        found, todo = {}, ["/"]
        while todo:
            path = todo.pop()
            kind, body = self.call(
                Call(path, "org.freedesktop.DBus.Introspectable", "Introspect", "", ()))
            if kind != "return":
                return None
            node = ET.fromstring(body[0])
            if ifaces := {i.get("name") for i in node.iter("interface")} & set(interfaces):
                found[path] = ifaces
            todo += [f"{path.rstrip('/')}/{n.get('name')}" for n in node.findall("node")]
        return found

    def close(self) -> None:
        self.conn.close()


def _sort(reply) -> tuple[str, object]:
    """A reply as ("return", body) or ("error", (name, message))."""
    if reply.header.message_type is MessageType.error:
        return "error", (reply.header.fields[HeaderFields.error_name], *reply.body[:1])
    return "return", reply.body


class Fuzz:
    """The calls of one run and what came back."""

    def __init__(self, wire: Wire, gen: Generator):
        self.wire = wire
        self.gen = gen
        self.outcomes: Counter = Counter()
        self.failures: list[str] = []
        self.calls = 0
        self.slowest = (0.0, "")
        self.spans: list[tuple[float, float, str]] = []  # (sent, answered, call), each call

    def during(self, start: float, end: float) -> list[str]:
        """The calls in flight at some instant from ``start`` to ``end``, with their time."""
        return [f"  {(b - a) * 1000:.1f} ms: {call}" for a, b, call in self.spans
                if a < end and b > start]

    def send(self, call: Call) -> str:
        """Send ``call`` and record what came back; the kind of reply ("return", "error",
        "timeout" or DROPPED)."""
        start = time.monotonic()
        kind, detail = self.wire.call(call)
        end = time.monotonic()
        self.spans.append((start, end, str(call)))
        self.slowest = max(self.slowest, (end - start, str(call)))
        self.calls += 1
        if kind == "return":
            self.gen.learn(detail)
            self.outcomes["return"] += 1
        elif kind == "error":
            name, *message = detail
            self.outcomes[name] += 1
            if not is_named(name):
                self.failures.append(f"#{self.calls} {name} {SHORT.repr(message)}: {call}")
        else:
            self.outcomes[kind] += 1
            if kind not in (DROPPED, HELD):
                self.failures.append(f"#{self.calls} {kind}: {call}")
        return kind

    def refresh(self, owner_pid: int) -> bool:
        """Learn the live objects, first making claims if few are left; False if the daemon
        does not answer."""
        interfaces = self.gen.api.properties
        objects = self.wire.objects(interfaces)
        if objects and sum(CLAIM in found for found in objects.values()) < MIN_CLAIMS:
            self.make_claims(owner_pid)
            objects = self.wire.objects(interfaces)
        if objects is not None:
            self.gen.set_objects(objects)
        return objects is not None

    def make_claims(self, owner_pid: int) -> None:
        """A few claims of each kind (dev, reclaimable, VRAM, pools, a waiter)."""
        for gpus, options in [
            (1, {"Mode": ("s", "dev"), "OwnerPID": ("u", owner_pid), "Label": ("s", "fuzz")}),
            (1, {"Mode": ("s", "dev"), "Reclaimable": ("b", True)}),
            (0, {"VRAMBytes": ("t", 2**30)}),
            (0, {"Pools": ("a{st}", {"cpu": 1, "licences": 1})}),
            (2, {"Wait": ("b", True), "Priority": ("i", 5)}),
        ]:
            self.send(Call(MANAGER_PATH, "org.resourced.Manager", "Claim", "ua{sv}",
                           (gpus, options)))


class Pinger(threading.Thread):
    """Pings the daemon every PING_INTERVAL on a connection of its own, while calls run."""

    def __init__(self, address: str):
        super().__init__(daemon=True)
        self.wire = Wire(address)
        self.latencies: list[float] = []
        self.sent: list[float] = []
        self.stopping = threading.Event()

    def run(self) -> None:
        while True:
            self.sent.append(time.monotonic())
            self.latencies.append(self.wire.ping())
            if self.stopping.wait(PING_INTERVAL):
                return

    def stop(self) -> list[float]:
        self.stopping.set()
        self.join()
        self.wire.close()
        return self.latencies

    def slowest(self) -> tuple[float, float]:
        """When the slowest ping was sent, and when it came back."""
        latency, sent = max(zip(self.latencies, self.sent), default=(0.0, 0.0))
        return sent, sent + latency


def test_fuzz_every_method_and_property(start_daemon, tmp_path, owner):
    config = tmp_path / "config.toml"
    config.write_text(
        "[daemon]\nsample_interval = 1\n"
        '[[check]]\nname = "ram"\ntype = "ram"\nwarn_free_pct = 10\n'
        f'[[check]]\nname = "tmp disk"\ntype = "disk"\npath = "{tmp_path}"\n'
        'stop_used_pct = 99\n'
        '[[pool]]\nname = "licences"\ncapacity = 4\n'
    )
    daemon = start_daemon(args=["--config", str(config)])
    api = load_api(GOLDEN.read_text())
    gen = Generator(Random(SEED), api, [os.getpid(), owner.pid, daemon.proc.pid, 1])
    wire = Wire(daemon.bus.address)
    fuzz = Fuzz(wire, gen)
    print(f"fuzz: seed={SEED}")
    pinger = Pinger(daemon.bus.address)
    pinger.start()
    answers = True  # until the daemon's objects cannot be listed or a call times out
    try:
        for i in range(CALLS):
            if i % REFRESH_EVERY == 0 and not fuzz.refresh(owner.pid):
                answers = False
                break
            if fuzz.send(gen.next_call()) == "timeout":
                answers = False
                break
    finally:
        pings = pinger.stop()
        wire.close()

    alive = daemon.proc.poll() is None
    tracebacks = daemon.log().count("Traceback")
    named = {k: v for k, v in sorted(fuzz.outcomes.items()) if is_named(k)}
    unnamed = {k: v for k, v in sorted(fuzz.outcomes.items())
               if k not in ("return", DROPPED, HELD) and not is_named(k)}
    summary = (f"fuzz: seed={SEED} calls={fuzz.calls} returns={fuzz.outcomes['return']} "
               f"named errors={sum(named.values())} {named} "
               f"unnamed errors={sum(unnamed.values())} {unnamed} "
               f"{DROPPED} (invalid UTF-8)={fuzz.outcomes[DROPPED]} "
               f"{HELD}={fuzz.outcomes[HELD]} tracebacks={tracebacks} "
               f"pings={len(pings)} slowest ping={max(pings, default=math.inf) * 1000:.1f} ms "
               f"slowest call={fuzz.slowest[0] * 1000:.0f} ms daemon alive={alive} "
               f"answering={answers}")
    print(summary)
    report = "\n".join([summary, *fuzz.failures[:25], f"slowest call: {fuzz.slowest[1]}",
                        "calls in flight during the slowest ping:",
                        *fuzz.during(*pinger.slowest())[:10],
                        f"(rerun: RESOURCED_FUZZ_SEED={SEED})"])
    assert alive and answers and not fuzz.failures and not tracebacks, report
    assert max(pings, default=math.inf) < PING_LIMIT, report
    everything = {(m.interface, m.name) for m in api.methods}
    everything |= {(i, p) for i, props in api.properties.items() for p in props}
    assert not everything - gen.covered, f"never called right: {everything - gen.covered}"

