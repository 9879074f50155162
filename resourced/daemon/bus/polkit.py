"""Authorization through polkit, the way systemd's services do it (and, on a shared bus
with no polkit, from the caller's groups).

Rules (after systemd's bus-polkit helper): the subject is the caller's unique bus name,
never a pid; root is accepted without asking; interactivity comes only from the message's
ALLOW_INTERACTIVE_AUTHORIZATION flag; polkit missing or failing means *denied* (fail
closed); "challenge" becomes InteractiveAuthorizationRequired.  The check is awaited, so
other callers are served meanwhile; callers re-validate state after it returns.  On the
session bus (one user) there is no polkit: the bus itself admits only that user.

Every method of our interfaces is in ``METHOD_ACTIONS``; a test fails if one is missing.
"""

import logging
from typing import NamedTuple

from dbus_fast import Message, MessageFlag, MessageType, Variant

from resourced.errors import AccessDenied, InteractiveAuthorizationRequired
from resourced.protocol.names import BUS_DRIVER, CLAIM_IFACE, GPU_IFACE, MANAGER_IFACE

log = logging.getLogger("resourced")

CLAIM = "org.resourced.claim"
RESERVE = "org.resourced.reserve"
REQUEST_RECLAIM = "org.resourced.request-reclaim"
RELEASE_OTHER = "org.resourced.release-other"
MANAGE = "org.resourced.manage"
ACTIONS = (CLAIM, RESERVE, REQUEST_RECLAIM, RELEASE_OTHER, MANAGE)
GROUP_ACTIONS = frozenset({CLAIM, RESERVE, REQUEST_RECLAIM})
"""The one authorization table: what members of the access group may do without a
password. The rest is for administrators. On the system bus polkit decides, with
polkit/50-resourced.rules (a test holds its action ids to this set); on a shared bus
``GroupAuthority`` reads the set itself."""

READ = None
"""Reading needs no authorization."""
OWNER_OR_RELEASE_OTHER = "owner-or:" + RELEASE_OTHER
"""The claim's own user may; anyone else needs release-other."""
OWNER_OR_MANAGE = "owner-or:" + MANAGE
"""The booking's own user may; anyone else needs manage (and gives a reason)."""
OWNER = "owner"
"""Only the booking's own user (and root): no action makes it anyone else's."""

METHOD_ACTIONS = {
    (MANAGER_IFACE, "Claim"): CLAIM,
    (MANAGER_IFACE, "Release"): OWNER_OR_RELEASE_OTHER,
    (MANAGER_IFACE, "ReleaseGPU"): OWNER_OR_RELEASE_OTHER,
    (MANAGER_IFACE, "Confine"): OWNER,
    (MANAGER_IFACE, "Reload"): MANAGE,
    (MANAGER_IFACE, "Verify"): READ,
    (MANAGER_IFACE, "Describe"): READ,
    (MANAGER_IFACE, "GetClaim"): READ,
    (MANAGER_IFACE, "GetGrant"): OWNER_OR_MANAGE,
    (MANAGER_IFACE, "GetClaimByCall"): READ,
    (MANAGER_IFACE, "ListClaims"): READ,
    (MANAGER_IFACE, "ListGPUs"): READ,
    (MANAGER_IFACE, "ListPools"): READ,
    (MANAGER_IFACE, "Book"): RESERVE,
    (MANAGER_IFACE, "EditBooking"): OWNER_OR_MANAGE,
    (MANAGER_IFACE, "SetBookingEnd"): OWNER_OR_MANAGE,
    (MANAGER_IFACE, "CancelBooking"): OWNER_OR_MANAGE,
    (MANAGER_IFACE, "ListBookings"): READ,
    (MANAGER_IFACE, "GetBooking"): READ,
    (MANAGER_IFACE, "FindSlots"): READ,
    (MANAGER_IFACE, "AddBlackout"): MANAGE,
    (MANAGER_IFACE, "RemoveBlackout"): MANAGE,
    (MANAGER_IFACE, "ListBlackouts"): READ,
    (MANAGER_IFACE, "AddNotice"): MANAGE,
    (MANAGER_IFACE, "RemoveNotice"): MANAGE,
    (MANAGER_IFACE, "ListNotices"): READ,
    (MANAGER_IFACE, "Stop"): OWNER_OR_MANAGE,
    (MANAGER_IFACE, "ReportJob"): OWNER,
    (MANAGER_IFACE, "Usage"): READ,
    (MANAGER_IFACE, "Metrics"): READ,
    (MANAGER_IFACE, "Diagnose"): READ,
    (MANAGER_IFACE, "ClaimJob"): MANAGE,
    (MANAGER_IFACE, "ReleaseJob"): MANAGE,
    (CLAIM_IFACE, "Release"): OWNER_OR_RELEASE_OTHER,
}
_INTERFACES_WITHOUT_METHODS = (GPU_IFACE,)

IN_WORDS = {
    CLAIM: "claim GPUs",
    RESERVE: "book GPUs",
    REQUEST_RECLAIM: "ask for GPUs back",
    RELEASE_OTHER: "release other users' claims",
    MANAGE: "administer resourced (other users' claims and bookings, blackouts, notices)",
}
"""What each action lets one do, for the refusals a person reads."""

_AUTHORITY = dict(
    destination="org.freedesktop.PolicyKit1",
    path="/org/freedesktop/PolicyKit1/Authority",
    interface="org.freedesktop.PolicyKit1.Authority",
)
ALLOW_USER_INTERACTION = 1


class Authority:
    """Asks polkit whether the current caller may perform an action."""

    def __init__(self, bus, enabled: bool):
        self.bus = bus
        self.enabled = enabled

    async def check(self, msg: Message, uid: int, action: str, details: dict[str, str]) -> None:
        """Return if allowed; raise AccessDenied or InteractiveAuthorizationRequired if not."""
        if not self.enabled or uid == 0:
            return
        interactive = bool(msg.flags & MessageFlag.ALLOW_INTERACTIVE_AUTHORIZATION)
        try:
            reply = await self.bus.call(Message(
                **_AUTHORITY,
                member="CheckAuthorization",
                signature="(sa{sv})sa{ss}us",
                body=[["system-bus-name", {"name": Variant("s", msg.sender)}], action,
                      details, ALLOW_USER_INTERACTION if interactive else 0, ""],
            ))
        except Exception as exc:
            log.error("polkit check of %s failed: %s; denying", action, exc)
            raise AccessDenied(f"cannot check authorization for {action}") from exc
        if reply.message_type is not MessageType.METHOD_RETURN:
            log.error("polkit refused to check %s: %s %s; denying", action, reply.error_name,
                      reply.body[0] if reply.body else "")
            raise AccessDenied(f"cannot check authorization for {action}")
        authorized, challenge, _ = reply.body[0]
        if authorized:
            return
        if challenge:
            raise InteractiveAuthorizationRequired(
                f"to {IN_WORDS[action]} here, authenticate first (polkit action {action})")
        raise AccessDenied(f"uid {uid} may not {IN_WORDS[action]} on this machine (polkit "
                           f"action {action})")


class SharedAccess(NamedTuple):
    """Who administers a shared bus (the host account) and whose members use it."""

    host_uid: int
    host: str
    group: str
    gid: int


class GroupAuthority:
    """Authorization on a shared bus, which has no polkit: root and the host account may do
    everything, members of the group what ``GROUP_ACTIONS`` lists, anyone else nothing.
    The groups are the ones the bus vouches for (GetConnectionCredentials), asked once per
    connection."""

    def __init__(self, bus, host_uid: int, host: str, group: str, gid: int):
        self.bus = bus
        self.host_uid = host_uid
        self.host = host
        self.group = group
        self.gid = gid
        self._groups: dict[str, frozenset[int]] = {}

    async def check(self, msg: Message, uid: int, action: str, details: dict[str, str]) -> None:
        """Return if allowed; raise AccessDenied if not."""
        if uid in (0, self.host_uid):
            return
        if action not in GROUP_ACTIONS:
            raise AccessDenied(f"only the host account ({self.host}) and root may "
                               f"{IN_WORDS[action]} on this shared bus")
        if self.gid not in await self._groups_of(msg.sender):
            raise AccessDenied(f"uid {uid} is not in group {self.group}, whose members may "
                               f"{IN_WORDS[action]} on this shared bus")

    async def _groups_of(self, sender: str) -> frozenset[int]:
        groups = self._groups.get(sender)
        if groups is None:
            reply = await self.bus.call(Message(
                **BUS_DRIVER, member="GetConnectionCredentials", signature="s", body=[sender]))
            if reply.message_type is not MessageType.METHOD_RETURN:
                raise AccessDenied(f"the bus gave no credentials for {sender}")
            ids = reply.body[0].get("UnixGroupIDs")
            groups = frozenset(ids.value) if ids is not None else frozenset()
            if len(self._groups) >= 1024:
                self._groups.pop(next(iter(self._groups)))
            self._groups[sender] = groups
        return groups
