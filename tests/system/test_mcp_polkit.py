"""resourced-mcp on a shared machine: it runs as the user who starts it, so the daemon and
polkit decide what its tools may do, as for gpuctl (users from conftest: alice and dave
are in the access group).  The SDK's own stdio client starts the server as alice."""

import json

import anyio
from mcp import ClientSession
from mcp.client import stdio

from .conftest import BUS_NAME, MANAGER_IFACE, MANAGER_PATH

TIMEOUT = 30
REFUSED = "InteractiveAuthorizationRequired: "  # release-other and manage: a challenge


def as_user(rig, key: str, scenario):
    """``await scenario(session)`` with a resourced-mcp run as test user ``key``."""
    async def main():
        with anyio.fail_after(TIMEOUT):
            argv = [*rig._as_user(key), str(rig.venv / "bin/resourced-mcp")]
            params = stdio.StdioServerParameters(command=argv[0], args=argv[1:],
                                                 env=rig.user_env(), cwd=str(rig.dir))
            async with stdio.stdio_client(params) as (read, write), \
                    ClientSession(read, write) as s:
                await s.initialize()
                return await scenario(s)

    return anyio.run(main)


def live(rig) -> tuple[set[str], set[str]]:
    def call(member, *args):
        return rig.root_call(BUS_NAME, MANAGER_PATH, MANAGER_IFACE, member, *args)[0]
    claims = {c["id"] for c in json.loads(call("Describe"))["claims"]}
    bookings = {b["id"] for b in json.loads(call("ListBookings", "a{sv}",
                                                 ({"All": ("b", True)},)))
                if b["state"] != "ended"}
    return claims, bookings


def test_destructive_tools_are_refused_for_another_users_claim_and_booking(rig, clean_claims):
    claim = rig.gpuctl("dave", "claim", "--gpus", 1, "--owner-pid", rig.sleepers["dave"])
    booking = rig.gpuctl("dave", "book", "--gpus", 1, "--for", "1h", "--at", "+2h")
    assert claim.returncode == 0 and booking.returncode == 0, (claim.stderr, booking.stderr)
    ref, booked = claim.stdout.strip(), booking.stdout.strip()
    try:
        async def scenario(s):
            release = await s.call_tool("release", {"operation_id": "r1", "ref": ref,
                                                    "force": True})
            cancel = await s.call_tool("cancel", {"operation_id": "c1", "booking": booked,
                                                  "reason": "mine now"})
            mine = await s.call_tool("list", {})
            return release, cancel, mine

        release, cancel, mine = as_user(rig, "alice", scenario)

        assert release.is_error and release.content[0].text.startswith(REFUSED), release
        assert cancel.is_error, cancel  # someone else's booking: not yours, in words
        assert cancel.content[0].text.startswith(f"NotClaimOwner: {booked} is "
                                                 f"{rig.login('dave')}'s booking"), cancel
        assert mine.structured_content["claims"] == []  # the server runs as alice
        claims, bookings = live(rig)
        assert ref in claims and booked in bookings
    finally:
        rig.root_call(BUS_NAME, MANAGER_PATH, MANAGER_IFACE, "CancelBooking", "ssa{sv}",
                      (booked, "test clean-up", {}))
