"""The Python client: ``Client`` (blocking) and ``AsyncClient`` (asyncio).

Both speak to the daemon through jeepney, a small pure-Python D-Bus library that does not
import asyncio for blocking use, so scripts and ``gpuctl`` start fast.  ``_Base`` holds
the pure half (building messages, decoding replies, translating errors); the two classes
differ only in how a message travels.

Which bus: ``bus="session"`` or ``"system"``, else ``$RESOURCED_BUS``, else the session
bus when ``org.resourced`` is owned there, else the system bus.

    >>> from resourced import Client
    >>> with Client() as client:
    ...     claim = client.claim(mode="dev", gpus=1, task_name="tuning", owner_pid=os.getpid())
    ...     client.release(claim["allocation"]["ref"])

Errors raise ``resourced.ResourcedError`` subclasses with ``.code`` and ``.message``.
"""

import contextlib
import json
import os

from jeepney import DBusAddress, MessageFlag, MessageType, new_method_call
from jeepney.low_level import HeaderFields

from .bus.names import BUS_NAME, MANAGER_IFACE, MANAGER_PATH, RELEASE_FORCE
from .environment import claim_env
from .errors import DaemonUnreachable, InvalidRequest, NoSuchClaim, error_from_bus

__all__ = ["AsyncClient", "Client"]

BUSES = ("session", "system")
DEFAULT_TIMEOUT = 25.0

_MANAGER = DBusAddress(MANAGER_PATH, bus_name=BUS_NAME, interface=MANAGER_IFACE)
_DBUS = DBusAddress("/org/freedesktop/DBus", bus_name="org.freedesktop.DBus",
                    interface="org.freedesktop.DBus")
_PROPS = DBusAddress(MANAGER_PATH, bus_name=BUS_NAME, interface="org.freedesktop.DBus.Properties")
_ALLOCATION_KEYS = ("mode", "gpu_uuids", "gpu_indices", "pci_indices")
_PEER = DBusAddress(MANAGER_PATH, bus_name=BUS_NAME, interface="org.freedesktop.DBus.Peer")


def requested_bus(bus: str | None) -> str | None:
    """The bus named by the caller or $RESOURCED_BUS; None means: find it."""
    bus = bus or os.environ.get("RESOURCED_BUS") or None
    if bus is not None and bus not in BUSES:
        raise InvalidRequest(f"bus must be 'session' or 'system', not {bus!r}")
    return bus


class _Base:
    """Everything that does not depend on how messages travel."""

    def __init__(self, bus: str | None = None, timeout: float = DEFAULT_TIMEOUT,
                 interactive: bool = False):
        self._requested_bus = requested_bus(bus)
        self.timeout = timeout
        self.interactive = interactive
        self.bus: str | None = None  # the bus in use, once connected

    # -- messages ----------------------------------------------------------------------
    def _call(self, method: str, signature: str | None = None, body: tuple = ()):
        msg = new_method_call(_MANAGER, method, signature, body)
        if self.interactive:
            msg.header.flags |= MessageFlag.allow_interactive_authorization
        return msg

    def _claim_message(self, mode, gpus, owner_pid, label, task_name, member_pids=()):
        options = {"Mode": ("s", mode)}
        if owner_pid is not None:
            options["OwnerPID"] = ("u", owner_pid)
        if member_pids:
            options["MemberPIDs"] = ("au", list(member_pids))
        if label:
            options["Label"] = ("s", label)
        if task_name:
            options["TaskName"] = ("s", task_name)
        return self._call("Claim", "ua{sv}", (gpus, options))

    def _release_message(self, ref: str, force: bool):
        return self._call("Release", "st", (ref, RELEASE_FORCE if force else 0))

    @staticmethod
    def _get_property(name: str):
        return new_method_call(_PROPS, "Get", "ss", (MANAGER_IFACE, name))

    @staticmethod
    def _name_has_owner():
        return new_method_call(_DBUS, "NameHasOwner", "s", (BUS_NAME,))

    # -- replies -----------------------------------------------------------------------
    @staticmethod
    def _body(reply) -> tuple:
        if reply.header.message_type is MessageType.error:
            name = reply.header.fields.get(HeaderFields.error_name, "")
            text = reply.body[0] if reply.body and isinstance(reply.body[0], str) else ""
            raise error_from_bus(name, text)
        return reply.body

    @staticmethod
    def _decode_claim(body: tuple, use_index: bool = False) -> dict:
        ref, _path, grant = body
        allocation = {
            "ref": ref,
            "mode": grant["Mode"][1],
            "gpu_uuids": list(grant["GPUUUIDs"][1]),
            "gpu_indices": list(grant["GPUIndices"][1]),
            "pci_indices": list(grant["PCIIndices"][1]),
        }
        return {"allocation": allocation, "env": claim_env(allocation, use_index),
                "warnings": list(grant["Warnings"][1])}

    @staticmethod
    def _find_allocation(status: dict, ref: str, use_index: bool) -> dict:
        for c in status["claims"]:
            if c["id"] == ref:
                allocation = {"ref": ref, **{k: c[k] for k in _ALLOCATION_KEYS}}
                return {"allocation": allocation, "env": claim_env(allocation, use_index)}
        raise NoSuchClaim(f"no claim {ref!r} (unknown or already released)")

    def _release_gpu_message(self, gpu: str, reason: str):
        return self._call("ReleaseGPU", "ss", (gpu, reason))

    @staticmethod
    def _decode_verify(body: tuple) -> list[dict]:
        return [_plain(report) for report in body[0]]

    @staticmethod
    def _unreachable(bus: str, exc: Exception) -> DaemonUnreachable:
        return DaemonUnreachable(f"cannot reach the {bus} bus: {exc}")


class Client(_Base):
    """A blocking client. Use as a context manager, or call ``close()``."""

    _conn = None

    def _connection(self):
        if self._conn is None:
            self._conn, self.bus = self._open()
        return self._conn

    def _open(self):
        from jeepney.io.blocking import open_dbus_connection

        if self._requested_bus:
            return self._connect(open_dbus_connection, self._requested_bus), self._requested_bus
        try:
            conn = open_dbus_connection("SESSION")
        except (OSError, KeyError, ValueError):
            conn = None
        if conn is not None:
            if self._body(conn.send_and_get_reply(self._name_has_owner(), timeout=self.timeout))[0]:
                return conn, "session"
            conn.close()
        return self._connect(open_dbus_connection, "system"), "system"

    def _connect(self, opener, bus: str):
        try:
            return opener(bus.upper())
        except (OSError, KeyError, ValueError) as exc:
            raise self._unreachable(bus, exc) from exc

    def _send(self, msg) -> tuple:
        conn = self._connection()
        try:
            reply = conn.send_and_get_reply(msg, timeout=self.timeout)
        except (OSError, TimeoutError) as exc:
            raise self._unreachable(self.bus, exc) from exc
        return self._body(reply)

    def claim(self, mode: str = "dev", gpus: int = 1, task_name: str = "",
              owner_pid: int | None = None, label: str = "", use_index: bool = False,
              member_pids: tuple[int, ...] = ()) -> dict:
        """Claim GPUs; returns ``{"allocation": {"ref": ...}, "env": {...}, "warnings": [...]}``.

        ``member_pids`` are further processes of yours that belong to the claim from the
        start (their descendants too), besides the owner."""
        msg = self._claim_message(mode, gpus, owner_pid, label, task_name, member_pids)
        return self._decode_claim(self._send(msg), use_index)

    def release(self, ref: str, force: bool = False) -> list[str]:
        """Release a claim; returns warnings (e.g. the GPUs could not be checked).

        Raises ``StillInUse`` while the claim's processes still use its GPUs, unless forced.
        """
        return list(self._send(self._release_message(ref, force))[0])

    def release_gpu(self, gpu: str, reason: str) -> str:
        """Force-release whatever claim holds ``gpu`` (alias, index or UUID); returns its ref."""
        return self._send(self._release_gpu_message(gpu, reason))[0]

    def verify(self) -> list[dict]:
        """Per GPU: Status (OK, IDLE CLAIM, UNCLAIMED USE, FOREIGN PROCESS, MISSING, UNKNOWN),
        Claim, Processes (Pid, User, Command, Claim, Ambiguous, ...)."""
        return self._decode_verify(self._send(self._call("Verify")))

    def status(self) -> dict:
        """The daemon's whole view: GPUs, claims, backend."""
        return json.loads(self._send(self._call("Describe"))[0])

    def allocation(self, ref: str, use_index: bool = False) -> dict:
        """A live claim by reference, in the same shape ``claim`` returns."""
        return self._find_allocation(self.status(), ref, use_index)

    def resources(self) -> dict:
        """The advisory RAM/disk health: ``{"level": ..., "checks": [...]}`` (see README)."""
        return self.status()["health"]

    def free(self) -> int:
        """How many GPUs are free now."""
        return self._send(self._get_property("FreeGPUs"))[0][1]

    def ping(self) -> None:
        """A bare round trip to the daemon (org.freedesktop.DBus.Peer.Ping)."""
        self._send(new_method_call(_PEER, "Ping"))

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class AsyncClient(_Base):
    """The asyncio client. Use as ``async with AsyncClient() as client:``."""

    _router = None
    _router_cm = None

    async def _connection(self):
        if self._router is None:
            await self._open()
        return self._router

    async def _open(self):
        from jeepney.io.asyncio import open_dbus_router

        for bus in [self._requested_bus] if self._requested_bus else BUSES:
            cm = open_dbus_router(bus.upper())
            try:
                router = await cm.__aenter__()
            except (OSError, KeyError, ValueError) as exc:
                if self._requested_bus or bus == "system":
                    raise self._unreachable(bus, exc) from exc
                continue
            if bus == "session" and not self._requested_bus:
                reply = await router.send_and_get_reply(self._name_has_owner())
                if not self._body(reply)[0]:
                    await cm.__aexit__(None, None, None)
                    continue
            self._router, self._router_cm, self.bus = router, cm, bus
            return

    async def _send(self, msg) -> tuple:
        import asyncio

        router = await self._connection()
        try:
            reply = await asyncio.wait_for(router.send_and_get_reply(msg), self.timeout)
        except (OSError, asyncio.TimeoutError) as exc:
            raise self._unreachable(self.bus, exc) from exc
        return self._body(reply)

    async def claim(self, mode: str = "dev", gpus: int = 1, task_name: str = "",
                    owner_pid: int | None = None, label: str = "",
                    use_index: bool = False, member_pids: tuple[int, ...] = ()) -> dict:
        msg = self._claim_message(mode, gpus, owner_pid, label, task_name, member_pids)
        return self._decode_claim(await self._send(msg), use_index)

    async def release(self, ref: str, force: bool = False) -> list[str]:
        return list((await self._send(self._release_message(ref, force)))[0])

    async def release_gpu(self, gpu: str, reason: str) -> str:
        return (await self._send(self._release_gpu_message(gpu, reason)))[0]

    async def verify(self) -> list[dict]:
        return self._decode_verify(await self._send(self._call("Verify")))

    async def status(self) -> dict:
        return json.loads((await self._send(self._call("Describe")))[0])

    async def allocation(self, ref: str, use_index: bool = False) -> dict:
        return self._find_allocation(await self.status(), ref, use_index)

    async def free(self) -> int:
        return (await self._send(self._get_property("FreeGPUs")))[0][1]

    async def resources(self) -> dict:
        return (await self.status())["health"]

    async def level_changes(self, check: str | None = None):
        """Every LevelChanged from now on (of ``check``, if given), as an async iterator of
        ``{"check", "old", "new", "reason"}``; the subscription lasts as long as the loop."""
        from jeepney import MatchRule
        from jeepney.bus_messages import message_bus

        router = await self._connection()
        fields = dict(type="signal", interface=MANAGER_IFACE, member="LevelChanged",
                      path=MANAGER_PATH)
        # The bus resolves the well-known sender name; jeepney's local filter cannot (the
        # messages carry the daemon's unique name), so it matches on the rest.
        rule = MatchRule(sender=BUS_NAME, **fields)
        with router.filter(MatchRule(**fields), bufsize=64) as queue:
            await router.send_and_get_reply(message_bus.AddMatch(rule))
            try:
                while True:
                    name, old, new, reason = (await queue.get()).body
                    if check is None or name == check:
                        yield {"check": name, "old": old, "new": new, "reason": reason}
            finally:
                with contextlib.suppress(Exception):  # closing: the bus drops it with us anyway
                    await router.send(message_bus.RemoveMatch(rule))

    async def wait_level_change(self, check: str | None = None,
                                levels: tuple[str, ...] | None = None,
                                timeout: float | None = None) -> dict:
        """Wait for the next LevelChanged (of ``check``, to one of ``levels``, if given);
        raises ``TimeoutError`` after ``timeout`` seconds.  A training loop can checkpoint
        and stop on STOP::

            change = await client.wait_level_change(levels=("STOP",))
        """
        import asyncio

        async with asyncio.timeout(timeout):
            async with contextlib.aclosing(self.level_changes(check)) as changes:
                async for change in changes:
                    if levels is None or change["new"] in levels:
                        return change

    async def ping(self) -> None:
        await self._send(new_method_call(_PEER, "Ping"))

    async def close(self) -> None:
        if self._router_cm is not None:
            await self._router_cm.__aexit__(None, None, None)
            self._router = self._router_cm = None

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        await self.close()


def _plain(value):
    """jeepney's (signature, value) variants, unwrapped all the way down."""
    if isinstance(value, tuple) and len(value) == 2 and isinstance(value[0], str):
        return _plain(value[1])
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value
