"""How a command is stopped when what it runs on ends: SIGTERM, a grace, then SIGKILL.

``stop_signal`` is the one decision.  The runner takes it for a booking's job as it polls
(``runner.jobs.stop_step``); ``gpuctl run`` takes it in ``terminate``, from the two
threads started here: one stops the command at its claim's (or booking's) end, the
other forwards the daemon's reclaim requests and stops the command when its session is.
"""

import os
import signal
import time

STOP_GRACE = 10.0
"""Seconds from SIGTERM to SIGKILL under ``gpuctl run``, and from a stopped session's
reclaim signal to that SIGTERM (the runner's grace is ``[runner] grace``)."""


def stop_signal(sent: int | None, term_due: bool, grace_over: bool,
                kill_due: bool = False) -> int | None:
    """The signal to send a command being stopped now (None: none yet), given ``sent``, the
    last one sent: SIGTERM once it is due; SIGKILL once the grace has passed since that
    SIGTERM (``grace_over``), or at once when a hard end has come (``kill_due``); nothing
    after SIGKILL."""
    if sent == signal.SIGKILL:
        return None
    if kill_due or (sent == signal.SIGTERM and grace_over):
        return signal.SIGKILL
    return signal.SIGTERM if term_due and sent is None else None


def terminate(pid: int, grace: float = STOP_GRACE) -> None:
    """Stop ``pid`` now as ``stop_signal`` says: SIGTERM, SIGKILL ``grace`` seconds later.
    Blocks; OSError once the process is gone."""
    sent, term_at = None, time.monotonic()
    while sent != signal.SIGKILL:
        left = term_at + grace - time.monotonic()
        signum = stop_signal(sent, term_due=True, grace_over=left <= 0)
        if signum is None:
            time.sleep(left)
            continue
        os.kill(pid, signum)
        sent, term_at = signum, time.monotonic()


def forward_reclaims(bus: str, ref: str, pid: int, signum: int) -> None:
    """Send ``signum`` to the command whenever the daemon asks the claim back; when its
    session is stopped (``StopRequested``), send it, then ``terminate`` it STOP_GRACE
    seconds later (a thread with its own connection: the main thread waits for the
    command meanwhile).  Only the daemon's own signals count (``client.signals``)."""
    import threading

    from jeepney.low_level import HeaderFields

    from resourced.client import signals
    from resourced.protocol.names import CLAIM_IFACE, claim_path

    conn, heard = signals.listen(bus, [signals.rule(CLAIM_IFACE, member, claim_path(ref))
                                       for member in ("ReclaimRequested", "StopRequested")],
                                 25.0)

    def forward():
        with conn.filter(heard, bufsize=16) as requests:
            try:
                while True:
                    msg = conn.recv_until_filtered(requests)
                    if signals.is_owner_change(msg):
                        continue
                    os.kill(pid, signum)
                    if msg.header.fields.get(HeaderFields.member) == "StopRequested":
                        break
                time.sleep(STOP_GRACE)
                terminate(pid)
            except OSError:  # the command is gone, or the connection
                return

    threading.Thread(target=forward, name="reclaim-forwarder", daemon=True).start()


def stop_at_end(bus: str, ref: str, pid: int) -> None:
    """At the end of the claim (or booking) the command runs on, or when the claim can no
    longer be read, ``terminate`` the command.  The end is looked up again as it nears (an
    extended booking moves it); a thread with its own connection, on the daemon's clock."""
    import contextlib
    import threading

    from resourced.client.sync import Client
    from resourced.errors import ResourcedError
    from resourced.protocol.time import now_usec, seconds_of_usec

    def watch():
        with contextlib.suppress(OSError, ResourcedError), Client(bus=bus) as c:
            while True:
                until = c.allocation(ref)["allocation"]["until_usec"]
                left = seconds_of_usec(until - now_usec()) if until else 60.0
                if until and left <= 0:
                    break
                time.sleep(min(max(left, 0.05), 1.0))
        with contextlib.suppress(OSError):
            terminate(pid)

    threading.Thread(target=watch, name="end-watcher", daemon=True).start()
