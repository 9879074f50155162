"""What became of the claims that ended: the ledger forgets a claim when it ends, so a
second release (or an ``env`` on it) would only hear "unknown"; this remembers, for the
latest ``KEPT`` of them, when and how each ended."""

from collections import OrderedDict

from resourced.errors import NoSuchClaim, quoted
from resourced.protocol.time import iso_utc

KEPT = 10_000
"""Ended claims remembered (about 1 MB): a retry comes seconds after, not days."""


class Departed:
    """The end reason and instant of the latest ended claims, by id."""

    def __init__(self, kept: int = KEPT):
        self.kept = kept
        self._ended: OrderedDict[str, tuple[str, int]] = OrderedDict()

    def note(self, claim_id: str, reason: str, usec: int) -> None:
        self._ended[claim_id] = (reason, usec)
        self._ended.move_to_end(claim_id)
        while len(self._ended) > self.kept:
            self._ended.popitem(last=False)

    def refusal(self, claim_id: str) -> NoSuchClaim:
        """The error for a claim that is not live: when and how it ended, if known."""
        ended = self._ended.get(claim_id)
        if ended is None:
            return NoSuchClaim(f"no claim {quoted(claim_id)} (unknown or already released)")
        reason, usec = ended
        return NoSuchClaim(f"claim {claim_id} ended {iso_utc(usec)} ({reason})")
