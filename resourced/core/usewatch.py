"""No-show and idle reclamation: which claims went unused long enough, on trustworthy
evidence only.

Each sweep says, per watched claim, what the evidence showed: USED, UNUSED or UNKNOWN
(the driver did not answer, or a process on its GPUs cannot be attributed: another pid
namespace).  A claim is due when the evidence said UNUSED, without a break, for its whole
window:

- an active booking (``no_show_after``): none of its owner's processes was ever seen on
  its GPUs (one process at 0 % utilisation is use); once used, it is never a no-show;
- a claim (``idle_after``): no process at all on its GPUs; use starts the window again.

An UNKNOWN starts the window again: missing or ambiguous evidence never releases
anything.  Pure: the sweep gives the times; the engine releases (it never kills).
"""

from dataclasses import dataclass

USED, UNUSED, UNKNOWN = "used", "unused", "unknown"


@dataclass
class _Watch:
    since: int           # the start of the current unbroken stretch of UNUSED
    used: bool = False   # ever seen USED


class UseWatch:
    def __init__(self):
        self._watches: dict[str, _Watch] = {}

    def observe(self, seen: dict[str, str], now: int, windows: dict[str, tuple[int, bool]]
                ) -> list[str]:
        """Take one sweep's evidence (claim id -> USED | UNUSED | UNKNOWN) at ``now``;
        ``windows`` gives each claim's (window in microseconds, once_used_never_due).
        Returns the claims due now.  Claims not in ``seen`` are forgotten."""
        for gone in self._watches.keys() - seen.keys():
            del self._watches[gone]
        due = []
        for claim_id, what in seen.items():
            window, sticky = windows[claim_id]
            watch = self._watches.setdefault(claim_id, _Watch(now))
            if what == USED:
                watch.used = True
            if what != UNUSED:
                watch.since = now  # the unbroken stretch starts again
                continue
            if sticky and watch.used:
                continue
            if now - watch.since >= window:
                due.append(claim_id)
        return due
